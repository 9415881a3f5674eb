"""The monitor's web server: aiohttp on the crawl's asyncio loop.

It serves the page (``/``), the snapshot (``/hosts.json``) and, with
``prometheus_client``, ``/metrics``, each only with the token (``?token=``
or ``Authorization: Bearer``); and with the controls on, ``POST /control``,
with the token in the ``Authorization`` header or the body only, from the
page's own origin. It knows nothing of Scrapy: the owner gives it the
functions that make the snapshot and the metrics, and apply a control.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web

from scrapy_hostqueue.monitor._controls import BadControl, Control, parse_control

logger = logging.getLogger(__name__)

#: Answers that are made fresh: a browser or proxy must not keep them.
_NO_STORE = {"Cache-Control": "no-store"}


def page() -> str:
    """Return the self-contained HTML page."""
    return (
        resources.files("scrapy_hostqueue.monitor")
        .joinpath("page.html")
        .read_text(encoding="utf-8")
    )


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def url(address: str, port: int, token: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/?token={token}"


class MonitorServer:
    """The routes behind one token.

    *snapshot* takes the host whose history the page shows (or None);
    *metrics*, if given, returns Prometheus' text format; *control*, if
    given (the controls are on), applies a control given from an address and
    says what it did, or raises :class:`BadControl`.
    """

    def __init__(
        self,
        snapshot: Callable[[str | None], dict[str, Any]],
        metrics: Callable[[], bytes] | None = None,
        *,
        token: str | None = None,
        control: Callable[[Control, str], Awaitable[str]] | None = None,
    ) -> None:
        self.token = token or secrets.token_urlsafe(18)
        self._snapshot = snapshot
        self._metrics = metrics
        self._control = control
        self._runner: web.AppRunner | None = None
        self.port = 0
        #: Requests answered with the token (for benchmarks and tests).
        self.answered = 0
        self._page = page()

    @web.middleware
    async def _authorised(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.method == "POST":
            return await handler(request)  # /control reads its token from the body
        given = request.query.get("token", "")
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            given = header[len("Bearer ") :]
        if not self._token_ok(given):
            return web.Response(
                status=401, text="401: the monitor's URL carries a token (see the crawl's log)\n"
            )
        self.answered += 1
        return await handler(request)

    def _token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())

    async def _apply_control(self, request: web.Request) -> web.Response:
        """Apply the control posted: JSON or a form, the token in the header or the body.

        Not in the URL alone, and never from another origin's page: a form
        another site posts is refused (403) before its body is read.
        """
        origin = request.headers.get("Origin")
        if (origin is not None and origin != f"{request.scheme}://{request.host}") or (
            request.headers.get("Sec-Fetch-Site") == "cross-site"
        ):
            return _error(403, "controls are taken from the monitor's own page only")
        try:
            if request.content_type == "application/json":
                fields = await request.json()
                if not isinstance(fields, dict):
                    raise ValueError("not a JSON object")
            else:
                fields = dict(await request.post())
        except ValueError as error:
            return _error(400, f"unreadable body: {error}")
        given = str(fields.get("token", ""))
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            given = header[len("Bearer ") :]
        if not self._token_ok(given):
            return _error(401, "a control needs the token, in the Authorization header or the body")
        self.answered += 1
        if self._control is None:
            return _error(404, "the controls are off (HOSTQUEUE_MONITOR_CONTROLS)")
        remote = request.remote or "?"
        try:
            control = parse_control(fields)
            result = await self._control(control, remote)
        except BadControl as error:
            return _error(400, str(error))
        logger.info("Monitor control from %s: %s: %s", remote, control.describe(), result)
        return web.json_response({"ok": True, **control.as_dict(), "result": result})

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(text=self._page, content_type="text/html", headers=_NO_STORE)

    async def _hosts(self, request: web.Request) -> web.Response:
        body = json.dumps(self._snapshot(request.query.get("host") or None))
        return web.Response(text=body, content_type="application/json", headers=_NO_STORE)

    async def _prometheus(self, request: web.Request) -> web.Response:
        if self._metrics is None:
            return web.Response(
                status=404,
                text="404: /metrics needs prometheus_client (pip install prometheus-client)\n",
            )
        return web.Response(
            body=self._metrics(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8", **_NO_STORE},
        )

    async def start(self, address: str, port: int) -> int:
        """Listen on *address*:*port* (0: a free port); returns the port."""
        app = web.Application(middlewares=[self._authorised])
        app.router.add_get("/", self._index)
        app.router.add_get("/hosts.json", self._hosts)
        app.router.add_get("/metrics", self._prometheus)
        app.router.add_post("/control", self._apply_control)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, address, port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"ok": False, "error": message}, status=status, headers=_NO_STORE)
