"""zcoll.tools.proc: how a dead job is explained (a watchdog's thread dump, a C++ exception, a
Python error, the deadline) and which label the ranks' progress files blame; a command run under a
deadline (stream) has its whole tree killed and says so. The tests' own launcher on run_tree:
tests/test_mpi_util.py."""

import sys

from zcoll.tools.proc import blamed, failure_reason, stream


def test_failure_reasons(tmp_path):
    """How a dead job is explained and which configuration is blamed (from the ranks' progress,
    as bench/ddp_step_job.py writes it)."""
    dump = [
        "[12:00:00] round 1/4",
        "Timeout (0:00:10)!",
        "Thread 0x00007f01 (most recent call first):",
        '  File "/x/torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py", line 589 in unpack_ps',
        "",
        "Thread 0x00007f02 (most recent call first):",
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait',
        "Current thread 0x00007f03 (most recent call first):",
        '  File "/x/torch/autograd/graph.py", line 979 in _engine_run_backward',
        '  File "/x/bench/ddp_step_job.py", line 195 in step',
        "Timeout (0:00:10)!",
        "Thread 0x00007f04 (most recent call first):",
        '  File "/x/other.py", line 1 in elsewhere',
    ]
    reason = failure_reason(dump, "timing job, round0")
    assert reason.startswith("hung (timing job, round0): no progress, ended by the watchdog"), reason
    assert "powerSGD_hook.py:589 unpack_ps" in reason and "graph.py:979 _engine_run_backward" in reason
    assert "threading.py" not in reason and "other.py" not in reason, "first dump, innermost frames only"
    cxx = [
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
        "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8192 vs 2048.",
    ]
    assert (
        failure_reason(cxx, "w") == "crashed (w): what():  [enforce fail at pair.cc:456] "
        "op.preamble.length <= op.nbytes. 8192 vs 2048."
    )
    py = ["[rank1]: Traceback (most recent call last):", "[rank1]: RuntimeError: Connection reset by peer"]
    assert failure_reason(py, "w") == "crashed (w): RuntimeError: Connection reset by peer"
    assert failure_reason(["(job killed after 9 s: --job-timeout)"], "w").startswith("hung (w): job killed")
    assert failure_reason(["bye"], "w") == "failed (w): exit without a message"

    progress = tmp_path / "progress"
    progress.mkdir()
    (progress / "rank0").write_text("round2 zcoll-int8 @default\n")
    (progress / "rank1").write_text("round2 zcoll-int8 @default\n")
    assert blamed(progress, ["gloo", "zcoll-int8"]) == ("zcoll-int8", "round2")
    (progress / "rank0").write_text("done -\n")
    (progress / "rank1").write_text("done -\n")
    assert blamed(progress, ["gloo", "zcoll-int8"]) is None, "a job that finished blames no one"


def test_stream_returns_the_lines_and_the_status():
    code = "import sys; print('one'); print('two', file=sys.stderr); sys.exit(3)"
    rc, lines = stream([sys.executable, "-c", code], None, timeout=60)
    assert rc == 3 and lines == ["one", "two"], (rc, lines)


def test_stream_kills_the_tree_past_its_deadline():
    sleeper = "[sys.executable, '-c', 'import time; time.sleep(60)']"
    code = (
        f"import subprocess, sys, time; subprocess.Popen({sleeper}); print('started', flush=True); "
        "time.sleep(60)"
    )
    rc, lines = stream([sys.executable, "-c", code], None, timeout=2, deadline="the test's deadline")
    assert rc != 0 and lines == ["started", "(job killed after 2 s: the test's deadline)"], (rc, lines)
    assert failure_reason(lines, "w") == "hung (w): job killed after 2 s: the test's deadline"
