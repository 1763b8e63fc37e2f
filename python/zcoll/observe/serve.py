"""Serving HTTP from inside a job or a tool: a Starlette app on uvicorn, in a daemon thread.

One stack for every endpoint zcoll serves: guarded compression's per-rank ``/metrics``
(zcoll.observe.guard_metrics) and ``zcoll monitor``'s page, event stream, metrics and the ranks'
publishing endpoint (zcoll.tools.monitor_server).

Safe by default: ``bind()`` refuses an address other than loopback unless the caller passes
``public=True`` together with a token (the tools' ``--public`` and ``--token``); the socket is
bound here, before the server starts, so a port in use is a clear ``PortInUse`` at once instead
of a server thread dying in the background. Needs the ``monitor`` extra (starlette, uvicorn,
prometheus_client, plotly): ``pip install 'zcoll[monitor]'``.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
import threading
import time
from typing import Any

EXTRA = "pip install 'zcoll[monitor]' (starlette, uvicorn, prometheus_client, plotly)"
LOOPBACK = "127.0.0.1"
TICK_SECONDS = 1.0  # the server's housekeeping (Date header, should_exit) between wake-ups


class PortInUse(OSError):
    """The port is taken (by another monitor, or a rank of a job on the same machine)."""


class MissingDependency(ImportError):
    pass


def require() -> None:
    """ImportError naming the extra to install when the serving stack is missing."""
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise MissingDependency(f"zcoll: serving metrics or the monitor needs {e.name}: {EXTRA}") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int, public: bool = False, token: str | None = None) -> socket.socket:
    """A listening socket on host:port (port 0: any free port). Other than loopback only with
    public=True and a token: the page and the metrics must not be open to the network by
    accident."""
    if not is_loopback(host):
        if not public:
            raise PermissionError(
                f"zcoll: refusing to listen on {host}: only 127.0.0.1 by default; pass --public (and --token) "
                "to open it to other machines"
            )
        if not token:
            raise PermissionError(
                f"zcoll: listening on {host} needs a token (--token or ZCOLL_MONITOR_TOKEN)"
            )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and the
    # answers (headers, then body: two writes) to a kept-alive connection then waited for the
    # peer's delayed ACK, 40 ms each
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"zcoll: port {port} on {host} is in use (another monitor, or a job's metrics port?): pick "
                "another with --port, or 0 for any free one",
            ) from None
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class Server:
    """A uvicorn server of `app` on an already bound socket, in a daemon thread."""

    def __init__(self, app: Any, sock: socket.socket, name: str = "zcoll-http"):
        import uvicorn

        self.sock = sock
        self.host, self.port = sock.getsockname()[:2]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=1
        )  # an open event stream must not hold it
        self._server = uvicorn.Server(config)
        if hasattr(self._server, "on_tick"):  # uvicorn's loop as 0.29-0.55 have it; else theirs
            self._server.main_loop = self._main_loop  # instead of uvicorn's 10 wake-ups a second
        self._loop: Any = None
        self._wake: Any = None
        self._thread = threading.Thread(target=self._run, name=f"{name}:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError(f"zcoll: the HTTP server on port {self.port} did not start within 10 s")

    def _run(self) -> None:
        self._server.run(sockets=[self.sock])

    async def _main_loop(self) -> None:
        """uvicorn's main loop, which only refreshes the Date header and looks for should_exit,
        woken once every TICK_SECONDS instead of every 0.1 s (those wake-ups cost 2 ms of CPU a
        second on a busy machine, taken from the job it monitors), and at once by close()."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        while not await self._server.on_tick(counter):
            counter = (counter + 10) % 864000  # on_tick refreshes the Date header at multiples of 10
            try:
                await asyncio.wait_for(self._wake.wait(), TICK_SECONDS)
            except asyncio.TimeoutError:
                pass

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def close(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the loop has ended already
                pass
        self._thread.join(timeout)
        self.sock.close()


def serve(app: Any, host: str, port: int, public: bool = False, token: str | None = None) -> Server:
    """bind() then Server(): raises PortInUse, PermissionError or MissingDependency."""
    require()
    return Server(app, bind(host, port, public, token))
