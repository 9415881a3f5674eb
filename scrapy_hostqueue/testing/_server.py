"""The HTTP/1.1 server behind the local test hosts: one listener per host.

A raw asyncio server rather than a framework so each fault (reset, hang, truncated
or trickling body) and the in-flight accounting are under exact control.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import json
import logging
import math
import socket
import struct
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from scrapy_hostqueue.testing._spec import (
    HostSpec,
    SpecError,
    retry_after_seconds,
)
from scrapy_hostqueue.testing._state import HostState, Ticket

logger = logging.getLogger(__name__)

CONTROL_PREFIX = "/_hostqueue/"
MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024
SLOW_BODY_CHUNKS = 10
_PADDING = b"All work and no play makes a polite crawler. "


class _BadRequest(Exception):
    pass


class Request:
    """A parsed request head (and the small body control requests carry)."""

    def __init__(self, method: str, target: str, version: str, headers: dict[str, str]) -> None:
        self.method = method
        self.version = version
        self.headers = headers
        parts = urlsplit(target)
        self.path = parts.path or "/"
        self.query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        self.body = b""

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    """Read the next request on a connection, or None at a clean end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial.strip():
            raise _BadRequest("incomplete request head") from None
        return None
    except asyncio.LimitOverrunError:
        raise _BadRequest("request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise _BadRequest(f"bad request line {lines[0]!r}") from None
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(f"unsupported version {version!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise _BadRequest(f"bad header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    request = Request(method, target, version, headers)
    if "transfer-encoding" in headers:
        raise _BadRequest("chunked request bodies are not supported")
    length = headers.get("content-length", "0")
    if not length.isdigit() or int(length) > MAX_BODY:
        raise _BadRequest(f"bad Content-Length {length!r}")
    if int(length):
        request.body = await reader.readexactly(int(length))
    return request


def _head(
    status: int,
    headers: list[tuple[str, str]],
    *,
    keep_alive: bool,
) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"Date: {formatdate(usegmt=True)}",
        "Server: hostqueue-testing",
        *(f"{name}: {value}" for name, value in headers),
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
        "",
        "",
    ]
    return "\r\n".join(lines).encode("latin-1")


class _Answer:
    """Counts a page request as served just before the last bytes of its answer go out.

    Counts a page request as served (:meth:`HostState.served`) once, just
    before the last bytes of its answer go out: the client may read them, end
    its crawl and ask for the counts before this server's task runs again.
    """

    __slots__ = ("counted", "path", "state")

    def __init__(self, state: HostState, path: str) -> None:
        self.state = state
        self.path = path
        #: The status counted, or None if not yet.
        self.counted: int | None = None

    def __call__(self, status: int) -> None:
        if self.counted is None:
            self.counted = status
            self.state.served(status, self.path)


class HostGroup:
    """Every host of one :class:`~scrapy_hostqueue.testing.LocalHosts`, on one loop.

    ``control=True`` adds a listener on 127.0.0.1 that answers only the
    ``/_hostqueue/`` control paths (it works when every host refuses connections).
    """

    def __init__(self, specs: list[HostSpec], *, offset: int = 0, control: bool = False):
        self.states = [HostState(offset + i, spec) for i, spec in enumerate(specs)]
        self._offset = offset
        self._control = control
        self.control_port = 0
        self._servers: list[asyncio.Server] = []
        self._refusing: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._spec_changed: list[asyncio.Event] = []

    # --- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Bind every host (port 0: the kernel picks a free port per address)."""
        self._spec_changed = [asyncio.Event() for _ in self.states]
        try:
            for state in self.states:
                if state.spec.refuse:
                    state.port = self._bind_refusing(state.hostname)
                    continue
                server = await asyncio.start_server(
                    functools.partial(self._connection, state),
                    host=state.hostname,
                    port=0,
                    backlog=1024,
                    limit=MAX_HEAD,
                )
                self._servers.append(server)
                state.port = server.sockets[0].getsockname()[1]
            if self._control:
                server = await asyncio.start_server(
                    functools.partial(self._connection, None),
                    host="127.0.0.1",
                    port=0,
                    limit=MAX_HEAD,
                )
                self._servers.append(server)
                self.control_port = server.sockets[0].getsockname()[1]
        except BaseException:
            await self.close()
            raise

    def _bind_refusing(self, address: str) -> int:
        # Bound but never listening: the port stays ours (nobody else can take it)
        # and the kernel answers every connection attempt with a reset.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((address, 0))
        except OSError:
            sock.close()
            raise
        self._refusing.append(sock)
        port: int = sock.getsockname()[1]
        return port

    async def close(self) -> None:
        """Stop listening, drop every connection (hanging ones too), free the ports."""
        self._closing = True
        for server in self._servers:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for server in self._servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)
        self._servers.clear()
        for sock in self._refusing:
            sock.close()
        self._refusing.clear()

    def set_spec(self, index: int, spec: HostSpec) -> None:
        """Change host ``index``; requests waiting out their latency re-check it.

        Call on the group's loop.
        """
        state = self.states[index]
        if spec.refuse != state.spec.refuse:
            raise SpecError("refuse cannot change while the hosts run")
        state.spec = spec
        self._spec_changed[index].set()
        self._spec_changed[index] = asyncio.Event()

    # --- connections ------------------------------------------------------

    async def _connection(
        self,
        state: HostState | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # With no write buffer drain() returns only once the kernel has every byte,
        # so "in flight until the response is completely written" holds.
        writer.transport.set_write_buffer_limits(high=0)
        if state is not None:
            state.connection_opened()
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except _BadRequest as error:
                    await self._simple(writer, 400, str(error), keep_alive=False)
                    break
                if request is None:
                    break
                if not await self._dispatch(state, request, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # close() drops the connection. Ending normally rather than as
            # cancelled keeps Python 3.11's stream callback from logging the
            # cancellation as an error (a traceback per request in flight).
            if not self._closing:
                raise
        finally:
            self._tasks.discard(task)
            writer.close()
            if state is not None:
                state.connection_closed()

    async def _dispatch(
        self,
        state: HostState | None,
        request: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer one request; False when the connection must close."""
        if request.path.startswith(CONTROL_PREFIX):
            return await self._control_request(state, request, writer)
        if state is None:
            return await self._simple(writer, 404, "control listener only", request)
        if request.path == "/robots.txt":
            return await self._robots(state, request, writer)
        return await self._page_request(state, request, reader, writer)

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    async def _simple(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        text: str,
        request: Request | None = None,
        *,
        keep_alive: bool = True,
        content_type: str = "text/plain; charset=utf-8",
    ) -> bool:
        keep_alive = keep_alive and (request is None or request.keep_alive)
        body = text.encode()
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        head = _head(status, headers, keep_alive=keep_alive)
        send_body = request is None or request.method != "HEAD"
        await self._write(writer, head + body if send_body else head)
        return keep_alive

    async def _wait_latency(self, state: HostState, arrival: float) -> None:
        """Sleep until ``arrival + latency``, re-reading latency when the spec changes."""
        while True:
            event = self._spec_changed[state.index - self._offset]
            remaining = arrival + state.spec.latency - time.monotonic()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                return

    # --- robots.txt -------------------------------------------------------

    async def _robots(
        self, state: HostState, request: Request, writer: asyncio.StreamWriter
    ) -> bool:
        await self._wait_latency(state, time.monotonic())
        lines = ["User-agent: *", "Allow: /"]
        crawl_delay = state.spec.crawl_delay
        if crawl_delay is not None:
            lines.append(f"Crawl-delay: {crawl_delay:g}")
        keep_alive = await self._simple(writer, 200, "\n".join(lines) + "\n", request)
        state.robots_served()
        return keep_alive

    # --- pages ------------------------------------------------------------

    async def _page_request(
        self,
        state: HostState,
        request: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        ticket = state.arrive(time.monotonic(), request.path)
        answer = _Answer(state, request.path)
        status: int | None = None
        try:
            keep_alive, status = await self._page_response(
                state, ticket, request, reader, writer, answer=answer
            )
        finally:
            state.finish(status, request.path, counted=answer.counted)
        return keep_alive

    async def _page_response(
        self,
        state: HostState,
        ticket: Ticket,
        request: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        answer: _Answer,
    ) -> tuple[bool, int | None]:
        """Send the answer, calling *answer* before its last bytes.

        Returns (keep the connection, status or None if dropped).
        """
        spec = ticket.spec
        if ticket.throttled or (ticket.faulted and spec.fault == "throttle"):
            # A throttling server answers at once: the client learns nothing from
            # latency, only from the status and Retry-After.
            status = spec.throttle_status
            body = f"<html><body><h1>{status}</h1></body></html>".encode()
            sent = await self._send(state, request, writer, status, body, spec=spec, answer=answer)
            return sent, status
        if ticket.faulted and spec.fault == "hang":
            # Never answer; the request leaves when the client (or shutdown) gives up.
            while await reader.read(65536):
                pass
            return False, None
        await self._wait_latency(state, ticket.arrival)
        spec = state.spec
        status, body = self._page_body(state, request, spec)
        if ticket.faulted and spec.fault == "reset":
            sock = writer.get_extra_info("socket")
            if sock is not None:
                # Linger 0: close() sends RST instead of FIN.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False, None
        if ticket.faulted and spec.fault == "truncate":
            head, payload = self._encode(status, body, spec, keep_alive=False)
            await self._write(writer, head + payload[: len(payload) // 2])
            return False, None
        if ticket.faulted and spec.fault == "malformed":
            head, payload = self._encode(status, body, spec, keep_alive=False)
            # A header line without a colon after the status line: lenient
            # HTTP parsers skip it, strict ones (aiohttp's) refuse the response.
            head = head.replace(b"\r\n", b"\r\nX-Malformed header line\r\n", 1)
            answer(status)
            await self._write(writer, head + payload)
            return False, status
        trickle = spec.trickle if ticket.faulted and spec.fault == "slow-body" else 0.0
        keep_alive = await self._send(
            state, request, writer, status, body, spec=spec, trickle=trickle, answer=answer
        )
        return keep_alive, status

    def _page_id(self, state: HostState, request: Request, spec: HostSpec) -> int | None:
        if request.path == "/":
            return 0
        prefix, _, number = request.path.rpartition("/")
        if prefix != "/page" or not number.isdigit():
            return None
        page = int(number)
        if spec.pages is not None and page >= spec.pages:
            return None
        return page

    def _page_body(self, state: HostState, request: Request, spec: HostSpec) -> tuple[int, bytes]:
        page = self._page_id(state, request, spec)
        if page is None:
            return 404, b"<html><body><h1>404 Not Found</h1></body></html>"
        if spec.status != 200:
            text = f"<html><body><h1>{spec.status}</h1></body></html>"
            return spec.status, text.encode()
        return 200, self.render_page(state, page, spec)

    def page_url(self, index: int, page: int) -> str:
        state = self.states[index]
        return f"http://{state.hostname}:{state.port}/page/{page}"

    def render_page(self, state: HostState, page: int, spec: HostSpec) -> bytes:
        """HTML linking the page's children and its cross-host links."""
        position = state.index - self._offset
        urls = []
        for k in range(1, spec.links + 1):
            child = page * spec.links + k
            if spec.pages is None or child < spec.pages:
                urls.append(self.page_url(position, child))
        count = len(self.states)
        for k in range(1, spec.cross_links + 1):
            other = (position + k) % count
            if other == position:
                break
            target = page * max(spec.links, 1) + k
            other_pages = self.states[other].spec.pages
            if other_pages is not None:
                target %= other_pages
            urls.append(self.page_url(other, target))
        items = "".join(f'<li><a href="{url}">{url}</a></li>' for url in urls)
        padding = (_PADDING * (spec.body_size // len(_PADDING) + 1))[: spec.body_size]
        html = (
            "<!DOCTYPE html><html><head><meta charset=utf-8>"
            f"<title>{state.hostname} page {page}</title></head><body>"
            f"<h1>{state.hostname} page {page}</h1><ul>{items}</ul><p>"
        )
        return html.encode() + padding + b"</p></body></html>"

    def _encode(
        self,
        status: int,
        body: bytes,
        spec: HostSpec,
        *,
        keep_alive: bool,
        retry_after: str | None = None,
        head_only: bool = False,
    ) -> tuple[bytes, bytes]:
        headers = [("Content-Type", "text/html; charset=utf-8")]
        if status in (204, 304):
            body = b""
        else:
            if spec.gzip:
                body = gzip.compress(body, compresslevel=1, mtime=0)
                headers.append(("Content-Encoding", "gzip"))
            headers.append(("Content-Length", str(len(body))))
        if retry_after is not None:
            headers.append(("Retry-After", retry_after))
        return _head(status, headers, keep_alive=keep_alive), b"" if head_only else body

    async def _send(
        self,
        state: HostState,
        request: Request,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        *,
        spec: HostSpec,
        trickle: float = 0.0,
        answer: _Answer | None = None,
    ) -> bool:
        retry_after = None
        window = None
        if status in (429, 503) and spec.retry_after is not None:
            retry_after, window = self._retry_after(spec.retry_after)
        keep_alive = request.keep_alive
        head, payload = self._encode(
            status,
            body,
            spec,
            keep_alive=keep_alive,
            retry_after=retry_after,
            head_only=request.method == "HEAD",
        )
        if window is not None:
            # Opened before the bytes leave: no request the client sends after
            # reading this answer can arrive ahead of its window.
            state.open_retry_after_window(time.monotonic() + window)
        if trickle and payload:
            await self._write(writer, head)
            chunks = min(SLOW_BODY_CHUNKS, len(payload))
            size = math.ceil(len(payload) / chunks)
            for start in range(0, len(payload), size):
                await asyncio.sleep(trickle / chunks)
                if answer is not None and start + size >= len(payload):
                    answer(status)
                await self._write(writer, payload[start : start + size])
        else:
            if answer is not None:
                answer(status)
            await self._write(writer, head + payload)
        return keep_alive

    @staticmethod
    def _retry_after(value: str) -> tuple[str, float | None]:
        """Return the header to send and how long the window it opens runs (None: none)."""
        now = time.time()
        if value.startswith("date:"):
            # Rounded up: an HTTP-date has whole seconds and must not end early.
            target = math.ceil(now + float(value[5:]))
            return formatdate(target, usegmt=True), target - now
        return value, retry_after_seconds(value, now)

    # --- control ----------------------------------------------------------

    async def _control_request(
        self, state: HostState | None, request: Request, writer: asyncio.StreamWriter
    ) -> bool:
        try:
            status, payload = self.control(state, request)
        except (SpecError, ValueError, TypeError, KeyError) as error:
            status, payload = 400, {"error": str(error)}
        return await self._simple(
            writer,
            status,
            json.dumps(payload),
            request,
            content_type="application/json",
        )

    def _targets(self, state: HostState | None, request: Request) -> list[HostState]:
        which = request.query.get("host")
        if which is None:
            if state is None:
                raise ValueError("the control listener needs ?host=INDEX or ?host=all")
            return [state]
        if which == "all":
            return list(self.states)
        index = int(which)
        if not 0 <= index < len(self.states):
            raise ValueError(f"host {index} out of range 0..{len(self.states) - 1}")
        return [self.states[index]]

    def control(self, state: HostState | None, request: Request) -> tuple[int, Any]:
        """Answer a ``/_hostqueue/`` path: stats, reset, spec, hosts."""
        action = request.path[len(CONTROL_PREFIX) :].strip("/")
        targets = self._targets(state, request)
        single = "host" not in request.query or request.query["host"] != "all"
        if action == "stats":
            with_arrivals = request.query.get("arrivals", "1") not in ("0", "no")
            data = [
                s.snapshot(arrivals=with_arrivals).to_dict(arrivals=with_arrivals) for s in targets
            ]
            return 200, data[0] if single else data
        if action == "reset":
            if request.method != "POST":
                return 405, {"error": "use POST"}
            for target in targets:
                target.reset()
            return 200, {"reset": [t.hostname for t in targets]}
        if action == "spec":
            if request.method == "POST":
                spec = HostSpec.from_dict(json.loads(request.body or b"{}"))
                for target in targets:
                    self.set_spec(target.index - self._offset, spec)
            data = [t.spec.to_dict() for t in targets]
            return 200, data[0] if single else data
        if action == "hosts":
            return 200, [
                {"index": t.index, "hostname": t.hostname, "port": t.port, "spec": t.spec.to_dict()}
                for t in self.states
            ]
        return 404, {"error": f"unknown control path {request.path!r}"}
