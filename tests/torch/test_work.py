"""zcoll.torch._work: the ordered executor behind the zcoll process group (issue order, inline
when idle, errors through the future)."""

import threading

import pytest
from zcoll.torch._work import OrderedExecutor


def test_executor_runs_in_issue_order_and_inline_when_idle():
    ex = OrderedExecutor("test")
    log = []
    gate = threading.Event()
    w1 = ex.call(lambda: (gate.wait(5), log.append(1)), ["a"], async_op=True)
    w2 = ex.call(lambda: log.append(2), ["b"], async_op=False)  # queued: async work pending
    assert not w2.is_completed()
    gate.set()
    assert w2.get_future().wait() == ["b"] and w1.result() == ["a"] and log == [1, 2]
    w3 = ex.call(lambda: threading.current_thread().name, None, async_op=False)
    assert w3.is_completed() and w3.result() == threading.current_thread().name  # inline
    ex.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        ex.call(lambda: None, [], async_op=False)


def test_executor_delivers_errors_through_the_future():
    ex = OrderedExecutor("test")
    w = ex.call(lambda: 1 / 0, [], async_op=True)
    with pytest.raises(ZeroDivisionError):
        w.wait()
    assert w.is_completed() and not w.is_success() and isinstance(w.exception(), ZeroDivisionError)
    chained = w.get_future().then(lambda f: f.value())
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):  # through the C++ future
        chained.wait()
    ex.shutdown()
