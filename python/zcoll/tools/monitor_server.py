"""The web application of ``zcoll monitor``: Starlette routes over one MonitorState.

==========================  ======================================================================
``GET /``                   the page (monitor_page.html): plotly charts, updated by server push
``GET /static/plotly.js``   plotly.min.js from the plotly package (nothing from the internet)
``GET /api/state``          the state as JSON (MonitorState.snapshot)
``GET /events``             Server-Sent Events: the state each time it changes (at most 4 a second;
                            after the first, only the steps since the one before: ``steps_from``)
``GET /metrics``            Prometheus text format (zcoll.observe.metrics.JobCollector)
``GET /api/history``        the latest runs of the history file
``POST /publish``           a rank's snapshot (zcoll.observe.live.Publisher)
==========================  ======================================================================

With a token (needed off loopback), every route wants it: ``Authorization: Bearer TOKEN``
(publishers, Prometheus' ``authorization`` setting) or ``?token=TOKEN`` once in the browser,
which then keeps it in a same-site cookie.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any

from ..observe import history as history_mod
from ..observe import metrics
from ..observe.monitor_state import MonitorState, clean

PAGE = Path(__file__).with_name("monitor_page.html")
PUSH_SECONDS = 0.25
CHECK_SECONDS = 0.05
HEARTBEAT_SECONDS = 10.0
MAX_BODY = 8 << 20


def plotly_js() -> Path:
    """plotly.min.js as the plotly package ships it."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("zcoll monitor needs the plotly package: pip install 'zcoll[monitor]'")
    path = Path(spec.origin).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"plotly.min.js is not where the plotly package keeps it ({path.parent})")
    return path


def _authorized(request: Any, token: str | None) -> bool:
    if not token:
        return True
    given = request.headers.get("authorization", "")
    given = given[7:] if given.lower().startswith("bearer ") else ""
    given = given or request.query_params.get("token", "") or request.cookies.get("zcoll_token", "")
    return hmac.compare_digest(given.encode(), token.encode())


class _Handlers:
    """The routes' handlers over one state (see the module docstring)."""

    def __init__(self, state: MonitorState, history: history_mod.History | None):
        from starlette import responses

        self.r = responses
        self.state, self.history = state, history
        self.page_html = PAGE.read_text(encoding="utf-8")
        self.script = plotly_js()

    async def page(self, _request: Any) -> Any:
        return self.r.HTMLResponse(self.page_html, headers={"Cache-Control": "no-store"})

    async def plotly(self, _request: Any) -> Any:
        return self.r.FileResponse(self.script, media_type="application/javascript")

    async def api_state(self, _request: Any) -> Any:
        return self.r.JSONResponse(self.state.snapshot())

    async def api_history(self, _request: Any) -> Any:
        if self.history is None:
            return self.r.JSONResponse({"runs": [], "error": self.state.history_error or "no history file"})
        try:  # off the event loop: a locked history file must not hold up the page's events
            runs = await asyncio.to_thread(self.history.runs, limit=20)
            return self.r.JSONResponse({"runs": clean(runs)})
        except history_mod.HistoryError as e:
            return self.r.JSONResponse({"runs": [], "error": str(e)})

    async def events(self, request: Any) -> Any:
        return self.r.StreamingResponse(_stream(request, self.state), media_type="text/event-stream",
                                        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})  # fmt: skip

    async def metrics(self, _request: Any) -> Any:
        text = metrics.exposition(metrics.JobCollector(lambda: _last_steps(self.state)))
        return self.r.Response(text, media_type=metrics.CONTENT_TYPE)

    async def publish(self, request: Any) -> Any:
        status, text = _publish(self.state, await request.body())
        return self.r.Response(text, status)


def make_app(
    state: MonitorState, token: str | None = None, history: history_mod.History | None = None
) -> Any:
    """The Starlette application (see the module docstring)."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    h = _Handlers(state, history)

    def guard(handler: Any) -> Any:
        async def wrapped(request: Any) -> Any:
            if not _authorized(request, token):
                return Response(
                    "zcoll monitor: a token is needed (?token=... or Authorization: Bearer)\n", 401
                )
            response = await handler(request)
            if token and request.query_params.get("token"):
                response.set_cookie("zcoll_token", token, httponly=True, samesite="strict")
            return response

        return wrapped

    routes = [
        Route("/", guard(h.page)),
        Route("/static/plotly.js", guard(h.plotly)),
        Route("/api/state", guard(h.api_state)),
        Route("/api/history", guard(h.api_history)),
        Route("/events", guard(h.events)),
        Route("/metrics", guard(h.metrics)),
        Route("/publish", guard(h.publish), methods=["POST"]),
    ]
    return _Publishing(Starlette(routes=routes), state, token)


class _Publishing:
    """POST /publish handled here, before Starlette: every rank posts once a period, and
    Starlette's request, routing and response objects for each post were a third of the
    monitor's CPU per post (CPU taken from the job when the monitor shares its machine). The
    same answers as the route (ok, 400, 413); a token that is not in the Authorization header
    (a browser's ?token= or cookie) goes the routes' way (guard)."""

    def __init__(self, app: Any, state: MonitorState, token: str | None):
        self.app, self.state = app, state
        self.auth = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/publish" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        if self.auth is not None:
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.auth):
                return await self.app(scope, receive, send)
        body, more = b"", True
        while more and len(body) <= MAX_BODY:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        await _answer(send, *_publish(self.state, body))


def _publish(state: MonitorState, body: bytes) -> tuple[int, str]:
    """A rank's posted snapshot into the state: (HTTP status, answer)."""
    if len(body) > MAX_BODY:
        return 413, "snapshot too large\n"
    try:
        state.publish(json.loads(body))
    except (ValueError, KeyError, TypeError) as e:
        return 400, f"zcoll monitor: not a rank's snapshot: {e}\n"
    return 200, "ok\n"


async def _answer(send: Any, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _last_steps(state: MonitorState) -> dict[str, Any]:
    """The state with each rank's last step only: all that /metrics reads of the series."""
    with state.lock:
        since = {str(k): v - 1 for k, v in state.step_totals.items()}
    return state.snapshot(since=since)


def _notes(state: MonitorState) -> list[str]:
    with state.lock:
        return state.notes()


async def _stream(request: Any, state: MonitorState) -> Any:
    """The state as an SSE event whenever its version changes (looked at every CHECK_SECONDS,
    sent at most every PUSH_SECONDS: a change after a quiet spell goes out within 50 ms), or its
    notes do (a rank gone silent publishes nothing that would change the version; looked at
    every second); a comment line now and then keeps proxies from closing the connection."""
    seen, notes, sent, looked, idle = -1, None, -math.inf, -math.inf, 0.0
    run, totals = None, None  # the steps the page has: after the first push only new ones go
    while not await request.is_disconnected():
        now = time.monotonic()
        changed = state.version != seen
        if not changed and now - looked >= 1.0:
            looked, changed = now, _notes(state) != notes
        if changed and now - sent >= PUSH_SECONDS:
            seen, sent = state.version, now
            snap = state.snapshot(since=totals if run == state.run else None)
            notes, run, totals = snap["notes"], snap["run"], snap["step_totals"]
            yield f"data: {json.dumps(snap)}\n\n"
            idle = 0.0
        elif idle >= HEARTBEAT_SECONDS:
            yield ": keep-alive\n\n"
            idle = 0.0
        await asyncio.sleep(CHECK_SECONDS)
        idle += CHECK_SECONDS
