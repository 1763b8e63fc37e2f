"""The environment policy (csrc/common/env.h): every ZCOLL_* variable parsed in one place, a bad
value is a ValueError naming the variable and its valid values, an explicit argument beats the
environment, and `zcoll info` lists every setting with where it came from."""

import os
import sys

import pytest
from mpi_util import ROOT, run

from zcoll import _C

VARIABLES = [s["name"] for s in _C.env_settings()]


def _python(code: str, **env: str):
    """(exit status, output) of `python -c code` with env (the launcher drops inherited ZCOLL_*)."""
    return run([sys.executable, "-c", code], env=env, timeout=60)


@pytest.mark.parametrize(
    "name,value,expected",
    [
        ("ZCOLL_CHECK", "yes", "1"),
        ("ZCOLL_CHECK", "Off", "0"),
        ("ZCOLL_SEGMENT_BYTES", "64K", "65536"),
        ("ZCOLL_SEGMENT_BYTES", "1m", "1048576"),
        ("ZCOLL_PIPELINE_DEPTH", "8", "8"),
        ("ZCOLL_SIMD", "SCALAR", "scalar"),
        ("ZCOLL_WAIT", "yield", "yield"),
        ("ZCOLL_SHM_BYTES", "8M", "8388608"),
        ("ZCOLL_RESTART", "2", "2"),
        ("ZCOLL_CHECKPOINT_DIR", "/tmp/Run 1", "/tmp/Run 1"),  # text: kept as given
        ("ZCOLL_NODE_ID", "Rack1/node-03", "Rack1/node-03"),  # text, kept as given
    ],
)
def test_values_are_normalised(name, value, expected):
    assert _C.env_normalise(name, value) == expected


@pytest.mark.parametrize(
    "name,value",
    [
        ("ZCOLL_CHECK", "maybe"),
        ("ZCOLL_SEGMENT_BYTES", "-5"),
        ("ZCOLL_SEGMENT_BYTES", "12X"),
        ("ZCOLL_SEGMENT_BYTES", "2G"),
        ("ZCOLL_PIPELINE_DEPTH", "0"),
        ("ZCOLL_PIPELINE_DEPTH", "4.5"),
        ("ZCOLL_SIMD", "sse"),
        ("ZCOLL_WAIT", ""),
        ("ZCOLL_RESTART", "-1"),
        ("ZCOLL_NODE_ID", "n" * 256),
    ],
)
def test_bad_value_names_the_variable_and_valid_values(name, value):
    with pytest.raises(ValueError) as e:
        _C.env_normalise(name, value)
    assert name in str(e.value) and "expected" in str(e.value)


def test_unknown_variable_lists_known_ones():
    with pytest.raises(ValueError, match="ZCOLL_CHECK"):
        _C.env_get("ZCOLL_NOPE")


def test_bad_environment_fails_at_first_use_not_silently():
    rc, out = _python("import zcoll, numpy as np; zcoll._C.simd_level()", ZCOLL_SIMD="sse9")
    assert rc != 0 and "ZCOLL_SIMD='sse9' is not valid" in out, out
    rc, out = _python("import zcoll; print(zcoll.Communicator().wait_policy)", ZCOLL_WAIT="busy")
    assert rc != 0 and "ZCOLL_WAIT='busy'" in out, out


def test_text_variable_reads_back_as_given():
    code = "import zcoll; print(repr(zcoll._C.env_get('ZCOLL_CHECKPOINT_DIR')))"
    rc, out = _python(code, ZCOLL_CHECKPOINT_DIR="/tmp/ckpt dir")
    assert rc == 0 and out.strip() == "'/tmp/ckpt dir'", out
    rc, out = _python(code)
    assert rc == 0 and out.strip() == "''", out


def test_explicit_argument_beats_environment():
    code = "import zcoll; print(zcoll.Communicator()._check, zcoll.Communicator(check=False)._check)"
    rc, out = _python(code, ZCOLL_CHECK="on")
    assert rc == 0, out
    assert out.split() == ["True", "False"], out


def test_info_lists_every_setting_and_its_source():
    rc, out = run([sys.executable, "-m", "zcoll", "info"], env={"ZCOLL_PIPELINE_DEPTH": "6"}, timeout=60)
    assert rc == 0, out
    for name in VARIABLES:
        assert name in out
    line = next(l for l in out.splitlines() if "ZCOLL_PIPELINE_DEPTH" in l)
    assert "6" in line and "(environment)" in line
    line = next(l for l in out.splitlines() if "ZCOLL_SHM_BYTES" in l)
    assert "(default)" in line


def test_no_getenv_outside_the_policy():
    """One parse site: no other C++ or Python file reads a ZCOLL_* variable itself."""
    root = str(ROOT)
    offenders = []
    for top in ("csrc", "python"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                path = os.path.join(dirpath, f)
                if path.endswith(("env.cc",)) or not path.endswith((".cc", ".h", ".py", ".cu")):
                    continue
                text = open(path, encoding="utf-8").read()
                if "getenv(\"ZCOLL" in text or "environ.get(\"ZCOLL" in text or "environ[\"ZCOLL" in text:
                    offenders.append(os.path.relpath(path, root))
    assert not offenders, f"read ZCOLL_* variables through common/env.h instead: {offenders}"
