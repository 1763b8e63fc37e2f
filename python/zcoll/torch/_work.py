"""Work objects and the ordered executor behind the zcoll process group.

Every rank must issue collectives on a communicator in the same order, and a communicator may be
used by one thread at a time. So each process group owns one :class:`OrderedExecutor`:

1. A synchronous call (``opts.asyncOp`` false: ``dist.all_reduce(t)``) with nothing queued runs
   inline on the calling thread and returns a completed :class:`ZcollWork` (about 15 us of Python).
2. Anything else (``async_op=True``, DDP's buckets, hooks, or a synchronous call issued while
   asynchronous work is still queued) goes to one worker thread that runs operations in issue
   order. The work's future completes, with the list of output tensors, once the data is ready.
3. Callbacks attached with ``Future.then`` run on the worker while it holds the issue lock, so a
   collective issued from a callback is ordered identically on every rank. A callback must not
   block on another operation of the same process group (it would wait for itself).
4. ``shutdown()`` finishes the queue and joins the worker (also done at interpreter exit).
5. ``work.wait(timeout)``: when the operation is not done in time, the executor's ``on_timeout``
   (the communicator's ``abort``) makes the running collective fail on every rank with
   ``zcoll.TimeoutError`` naming the ranks that never arrived, and ``wait`` raises it.

Example::

    ex = OrderedExecutor("zcoll-pg0")
    work = ex.call(lambda: comm.allreduce(t, out=t), [t], async_op=True)
    work.wait()                       # or work.get_future().then(...)
    ex.shutdown()
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

from .._C import TimeoutError as ZcollTimeoutError

Future = torch.futures.Future


# After Work.wait(timeout) aborted the communicator: how long the collective may take to fail
# on its own (the watchdog's grace period to hear from the other ranks, and then some).
_ABORT_SECONDS = 5.0


def _seconds(timeout: Any) -> float:
    """A torch timeout (timedelta, or seconds) in seconds; 0 for none (torch's kNoTimeout)."""
    if timeout is None:
        return 0.0
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _wait_done(future: Future, seconds: float) -> bool:
    """Waits until the future is done or `seconds` have passed; True when done."""
    end = time.monotonic() + seconds
    while not future.done():
        if time.monotonic() >= end:
            return False
        time.sleep(0.001)
    return True


def _reraise(fut: Future) -> Any:
    # A Future whose exception was set from Python holds a value C++ cannot use (DDP crashed on
    # it); re-raising it inside .then() makes the derived future a real failed future.
    return fut.value()


def _source_rank(work: dist.Work) -> int:
    """The rank a receive without src got its message from (torch's ``Work._source_rank``)."""
    if work.source is None:
        raise ValueError("zcoll: a source rank is known only for the work of a recv or irecv")
    work.wait()
    return work.source[0]


class ZcollWork(dist.Work):
    """A zcoll operation in flight (or already done): ``wait()``, ``get_future()``,
    ``is_completed()``, ``result()``. The future's value is the list of output tensors.
    ``wait()`` raises the operation's own exception (the future, crossing C++, carries it as a
    RuntimeError quoting it)."""

    def __init__(
        self, future: Future, error: Optional[list] = None, on_timeout: Optional[Callable[[str], None]] = None
    ):
        super().__init__()
        self._future = future
        self._error = error  # [exception] once the operation failed on the worker
        self._on_timeout = on_timeout

    source: Optional[list] = None  # a receive's [peer rank], filled in when it completes
    _source_rank = source_rank = _source_rank

    def wait(self, timeout: Any = None) -> bool:
        seconds = _seconds(timeout)
        if seconds > 0 and not _wait_done(self._future, seconds):
            reason = f"Work.wait(timeout={seconds:g} s) expired"
            if self._on_timeout is not None:
                self._on_timeout(reason)  # the running collective fails on every rank
            if not _wait_done(self._future, _ABORT_SECONDS):
                raise ZcollTimeoutError(f"zcoll: {reason} and the operation is still running")
        try:
            self._future.wait()
        except Exception:
            if self._error:
                raise self._error[0] from None
            raise
        return True

    def get_future(self) -> Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:
            return False
        return True

    def exception(self) -> Optional[BaseException]:
        try:
            self.wait() if self._future.done() else None
        except Exception as e:
            return e
        return None

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._future.value()

    def synchronize(self) -> None:
        self.wait()


class DoneWork(dist.Work):
    """A work that finished inline (a synchronous call). Its future is made only when asked
    for: a synchronous ``dist.all_reduce`` never asks, and a Future costs ~2 us."""

    def __init__(self, value: Any):
        super().__init__()
        self._value = value
        self._future: Optional[Future] = None

    source: Optional[list] = None  # as ZcollWork's (class-level: no cost on the synchronous path)
    _source_rank = source_rank = _source_rank

    def wait(self, timeout: Any = None) -> bool:
        return True

    def get_future(self) -> Future:
        if self._future is None:
            self._future = Future()
            self._future.set_result(self._value)
        return self._future

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Optional[BaseException]:
        return None

    def result(self) -> List[torch.Tensor]:
        return self._value

    def synchronize(self) -> None:
        pass


def completed(value: Any) -> DoneWork:
    """A work that is already done, its future holding `value`."""
    return DoneWork(value)


class OrderedExecutor:
    """Runs one communicator's operations in issue order: inline when possible, else on one
    worker thread (started on first use)."""

    def __init__(self, name: str, on_timeout: Optional[Callable[[str], None]] = None):
        self.name = name
        self._on_timeout = on_timeout  # what Work.wait(timeout) calls when time is up
        self._lock = threading.RLock()  # held while issuing inline and while completing futures
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._pending = 0
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Operations queued or running on the worker."""
        return self._pending

    def call(self, fn: Callable[[], Any], value: Any, async_op: bool) -> dist.Work:
        """Runs fn() in order; the work's future then holds `value` (the output tensors), or what
        fn() returned when `value` is None."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: the process group has been shut down")
            on_worker = self._thread is not None and threading.current_thread() is self._thread
            if on_worker or (not async_op and self._pending == 0):
                result = fn()
                return completed(result if value is None else value)
            raw, error = Future(), []
            self._pending += 1
            self._ensure_thread()
            self._queue.put((fn, raw, value, error))
        return ZcollWork(raw.then(_reraise), error, self._on_timeout)

    def run_now(self, fn: Callable[..., Any], *args: Any) -> Optional[DoneWork]:
        """The synchronous fast path of call(): runs fn(*args) inline when nothing is queued
        (its work's value is ``[args[0]]``); None when it must queue (then use call())."""
        with self._lock:
            if self._closed or self._pending:
                return None
            fn(*args)
            return DoneWork([args[0]])

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, raw, value, error = item
            result = None
            try:
                result = fn()
            except BaseException as e:
                error.append(e)
            with self._lock:
                self._pending -= 1
                if not error:
                    raw.set_result(result if value is None else value)
                else:
                    raw.set_exception(error[0])

    def shutdown(self) -> None:
        """Runs what is queued, stops and joins the worker. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join()
