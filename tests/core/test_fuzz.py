"""Fuzzing with Hypothesis (tests/mpi/fuzz.py): the Python argument layer of every collective,
the compressors' constructors and compress / decompress, and the kernels' entry points, each
against a model of its contract. One rank, in a job of its own, so that a crash fails a case
instead of killing pytest. Here 600 examples per case (3,000 in all, about a minute); the long
run: `mpirun -n 1 python -m mpi4py tests/mpi/fuzz.py --examples=20000 --seed=N` (100,000)."""

import pytest
from mpi_util import case_names, script_job


@pytest.mark.parametrize("case", case_names("mpi/fuzz.py"))
def test_fuzz(case):
    script_job("mpi/fuzz.py", 1, "--examples=600", timeout=900).check(case, min_checks=1)


# -- what the fuzzing found, kept as plain tests -----------------------------------------------------
@pytest.fixture(scope="module")
def comm():
    import zcoll

    with zcoll.Communicator() as c:
        yield c


def test_root_takes_numpy_integers(comm):
    """A root from numpy (np.argmax, an index array) is an integer: it was refused as 'out of range'."""
    import numpy as np

    x = np.arange(4, dtype=np.float32)
    assert comm.broadcast(x, root=np.int64(0)) is x
    assert comm.reduce(x, root=np.int32(0)).tolist() == x.tolist()
    for bad, words in (
        (1.0, "must be an int"),
        (True, "must be an int"),
        (np.True_, "must be an int"),
        (None, "must be an int"),
        (np.int64(1), "out of range"),
        (2**70, "out of range"),
    ):
        with pytest.raises(ValueError, match=words):
            comm.broadcast(x, root=bad)


def test_decompress_refuses_the_payloads_own_bytes():
    """Payload arrays are views of its bytes: decoding into them overwrote what was still to be read."""
    import numpy as np
    import zcoll

    c = zcoll.Threshold(0.0, error_feedback=False)
    x = np.arange(1, 9, dtype=np.float32)
    p = c.compress(x)
    with pytest.raises(ValueError, match="shares memory with the payload"):
        c.decompress(p, out=p.arrays["values"])
    assert c.decompress(p).tolist() == x.tolist()


def test_block_beyond_64_bits_is_a_value_error():
    """It escaped as OverflowError, outside the ValueError / TypeError contract."""
    import zcoll

    for block in (2**63, 2**64 + 256, -(2**70)):
        with pytest.raises(ValueError, match="block must be a positive integer"):
            zcoll.GradientQuantizer(8, block=block)
