"""Crawls for the tests: in this process, and as ``scrapy crawl`` subprocesses.

Settings and spiders for real crawls, the component paths they wire, and small local HTTP servers
whose answers a test scripts request by request (``serving``).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import math
import socket
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import scrapy
from scrapy import Request
from scrapy.crawler import Crawler
from scrapy.exceptions import CloseSpider
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from bench.runner import child_environment
from example_project.run_demo import PROJECT_DIR
from scrapy_hostqueue.monitor.extension import HostQueueMonitor
from scrapy_hostqueue.testing import LocalHosts
from tests.helpers.crawl_report import WATCHED

SCRAPY_HTTP11 = "scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler"
SCRAPY_AIOHTTP = "scrapy.core.downloader.handlers._aiohttp.AiohttpDownloadHandler"
OUR_HANDLER = "scrapy_hostqueue.AiohttpDownloadHandler"
SCHEDULER = "scrapy_hostqueue.HostQueueScheduler"
MIDDLEWARE = {"scrapy_hostqueue.AIMDMiddleware": 560}
ADDON = {"scrapy_hostqueue.Addon": 0}

# What a failed test's crawl report shows of a crawl is kept by this extension
# (tests/helpers/crawl_report.py); every crawl a test runs enables it.
WATCH = {"tests.helpers.crawl_report.CrawlWatch": 0}

# The type of the ``local_hosts`` fixture (conftest.py).
HostsFactory = Callable[..., LocalHosts]

BASE_SETTINGS: dict[str, Any] = {
    "TELNETCONSOLE_ENABLED": False,
    "EXTENSIONS": {"scrapy.extensions.remote_control.RemoteControl": None, **WATCH},
    "ROBOTSTXT_OBEY": False,
    "LOG_LEVEL": "INFO",
    "RETRY_ENABLED": True,
    "DOWNLOAD_TIMEOUT": 20,
    # A backstop: a crawl that stalls ends (and fails its test's assertions)
    # instead of hanging the suite.
    "CLOSESPIDER_TIMEOUT": 60,
    # The stock handler is explicit so that tests do not depend on what an
    # add-on may wire.
    "DOWNLOAD_HANDLERS": {"http": SCRAPY_HTTP11, "https": SCRAPY_HTTP11},
}


def settings(**overrides: Any) -> dict[str, Any]:
    merged = dict(BASE_SETTINGS)
    merged.update(overrides)
    return merged


class PageSpider(scrapy.Spider):
    """Starts from ``start_urls`` and follows every link when ``follow`` is set.

    Records the URL of every response in ``seen``.
    """

    name = "pages"
    start_urls: list[str]
    follow: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []
        self.statuses: list[int] = []

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            yield scrapy.Request(url, dont_filter=False)

    def parse(self, response: Response) -> Iterable[Any]:
        self.seen.append(response.url)
        self.statuses.append(response.status)
        if self.follow and hasattr(response, "css"):
            for href in response.css("a::attr(href)").getall():
                yield response.follow(href)


class StoppableSpider(PageSpider):
    """A PageSpider that closes itself once ``stop_at`` (monotonic) has passed."""

    stop_at: float = math.inf

    def parse(self, response: Response) -> Iterable[Any]:
        if time.monotonic() >= self.stop_at:
            raise CloseSpider("test_done")
        yield from super().parse(response)


class DirectDownloadSpider(StoppableSpider):
    """Each callback also downloads other pages of the same host, as a media pipeline does.

    Each callback also downloads ``direct_per_page`` other pages of the same
    host with ``engine.download_async``, as a media pipeline does.
    """

    direct_per_page = 3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.direct_statuses: list[int] = []

    async def parse(self, response: Response) -> AsyncIterator[Any]:  # type: ignore[override]
        self.seen.append(response.url)
        base, page = response.url.rsplit("/page/", 1)
        assert self.crawler.engine is not None
        downloads = [
            self.crawler.engine.download_async(
                Request(f"{base}/page/{5000 + int(page) * 10 + k}", dont_filter=True)
            )
            for k in range(self.direct_per_page)
        ]
        for answer in await asyncio.gather(*downloads):
            self.direct_statuses.append(answer.status)
        return
        yield


async def crawl(
    start_urls: list[str],
    *,
    follow: bool = False,
    spider_cls: type[PageSpider] = PageSpider,
    **overrides: Any,
) -> Crawler:
    """Run one crawl to the end and return its crawler.

    Tests read ``crawler.spider.seen`` and ``crawler.stats``.
    """
    crawler = get_crawler(spider_cls, settings(**overrides))
    await crawler.crawl_async(start_urls=start_urls, follow=follow)
    return crawler


def interleave(*lists: list[str]) -> list[str]:
    """Round-robin over several URL lists (as a broad crawl's start URLs come)."""
    out: list[str] = []
    for group in zip(*lists, strict=False):
        out.extend(group)
    return out


@contextmanager
def dropping_connections(address: str) -> Iterator[int]:
    """Return a port on *address* that drops connection attempts.

    A port on *address* that drops connection attempts, as an address behind
    a firewall that drops packets does: it listens with a backlog of 0 and
    never accepts, and its accept queue is filled at once, so that Linux drops
    the SYN of every later attempt, which stays unanswered until the client
    gives up. Yields the port.
    """
    with ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind((address, 0))
        listener.listen(0)
        port: int = listener.getsockname()[1]
        for _ in range(3):
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            filler.connect_ex((address, port))
        yield port


# -- local servers scripted per request ---------------------------------------


@dataclass
class Reply:
    """What a test server sends back for one request."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    head_delay: float = 0.0
    # Sent with chunked transfer encoding (no Content-Length), chunk_delay apart.
    chunks: list[bytes] | None = None
    chunk_delay: float = 0.0
    # Declared Content-Length; larger than len(body) truncates the body.
    declared_length: int | None = None
    # Close the connection without answering.
    drop: bool = False


@dataclass
class Received:
    host: str
    method: str
    target: str
    headers: dict[str, str]


Route = Callable[[Received], Reply]


def ok_reply(received: Received) -> Reply:
    return Reply(body=f"page {received.target}".encode())


class CountingServers:
    """HTTP/1.1 servers, one per loopback address, that count per host."""

    def __init__(self, route: Route = ok_reply, *, tls: ssl.SSLContext | None = None) -> None:
        self.route = route
        self.tls = tls
        self.ports: dict[str, int] = {}
        self.received: list[Received] = []
        self.in_flight: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        self.accepted: Counter[str] = Counter()
        self.open_connections = 0
        self.max_open_connections = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, addresses: list[str]) -> None:
        for address in addresses:
            server = await asyncio.start_server(
                lambda r, w, a=address: self._serve(a, r, w), address, 0, ssl=self.tls
            )
            self._servers.append(server)
            self.ports[address] = server.sockets[0].getsockname()[1]

    def url(self, address: str, path: str = "/") -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{address}:{self.ports[address]}{path}"

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    async def _serve(
        self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted[host] += 1
        self.open_connections += 1
        self.max_open_connections = max(self.max_open_connections, self.open_connections)
        try:
            keep_alive = True
            while keep_alive:
                received = await self._read(host, reader)
                if received is None:
                    break
                self.received.append(received)
                self.in_flight[host] += 1
                self.max_in_flight[host] = max(self.max_in_flight[host], self.in_flight[host])
                finished = False

                def finish() -> None:
                    # Called right before the last bytes go out: the client
                    # cannot send its next request before the count drops.
                    nonlocal finished
                    if not finished:
                        finished = True
                        self.in_flight[host] -= 1

                try:
                    keep_alive = await self._respond(received, writer, finish)
                except (ConnectionError, OSError):
                    keep_alive = False
                finally:
                    finish()
        except asyncio.CancelledError:
            pass
        finally:
            self.open_connections -= 1
            writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _read(host: str, reader: asyncio.StreamReader) -> Received | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            return None
        request_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        if length:
            await reader.readexactly(length)
        return Received(host, method, target, headers)

    async def _respond(
        self, received: Received, writer: asyncio.StreamWriter, finish: Callable[[], None]
    ) -> bool:
        reply = self.route(received)
        if reply.drop:
            finish()
            return False
        keep_alive = received.headers.get("connection", "").lower() != "close"
        truncated = reply.declared_length is not None and reply.declared_length > len(reply.body)
        if reply.head_delay:
            await asyncio.sleep(reply.head_delay)
        headers = dict(reply.headers)
        if reply.chunks is not None:
            headers["Transfer-Encoding"] = "chunked"
        else:
            length = len(reply.body) if reply.declared_length is None else reply.declared_length
            headers["Content-Length"] = str(length)
        if not keep_alive or truncated:
            headers["Connection"] = "close"
        head = f"HTTP/1.1 {reply.status} {HTTPStatus(reply.status).phrase}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        head_bytes = head.encode("latin-1") + b"\r\n"
        if reply.chunks is None:
            finish()
            writer.write(head_bytes + reply.body)
            await writer.drain()
            return keep_alive and not truncated
        writer.write(head_bytes)
        await writer.drain()
        for chunk in reply.chunks:
            if reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
        finish()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return keep_alive


@asynccontextmanager
async def serving(
    addresses: list[str], route: Route = ok_reply, *, tls: ssl.SSLContext | None = None
) -> AsyncIterator[CountingServers]:
    hosts = CountingServers(route, tls=tls)
    await hosts.start(addresses)
    try:
        yield hosts
    finally:
        await hosts.close()


@dataclass(frozen=True)
class Certificate:
    """A key and a self-signed certificate for one IP address, made now, in PEM files.

    The certificate is also the CA file a client trusts it with (``ssl_ca_certs``).
    """

    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path, address: str = "127.0.0.1", name: str = "cert") -> Certificate:
        """Write ``NAME.pem`` and ``NAME.key`` into *directory*."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"scrapy-hostqueue {name}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]),
                critical=False,
            )
            .sign(key, hashes.SHA256())
        )
        made = cls(directory / f"{name}.pem", directory / f"{name}.key")
        made.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        made.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return made

    def server_context(self, *, client_ca: Path | None = None) -> ssl.SSLContext:
        """Make a server's TLS context with this certificate.

        With *client_ca*, one that asks every client for a certificate that CA signed.
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(client_ca)
        return context


def start_demo_crawl(
    start_urls: Iterable[str],
    log: Path,
    settings: dict[str, Any] | None = None,
    *extra: str,
    log_mode: str = "ab",
) -> subprocess.Popen[bytes]:
    """Start ``scrapy crawl pages`` of the example project in a process of its own.

    ``scrapy crawl pages`` of the example project in a process of its own,
    from *start_urls*, with *settings* (``-s NAME=VALUE``) and *extra*
    arguments; its output goes to *log*.
    """
    command = [sys.executable, "-m", "scrapy", "crawl", "pages"]
    command += ["-a", "start_urls=" + ",".join(start_urls)]
    for name, value in (settings or {}).items():
        command += ["-s", f"{name}={value}"]
    command += extra
    WATCHED.process_started(log)
    with log.open(log_mode) as out:
        return subprocess.Popen(
            command, cwd=PROJECT_DIR, env=child_environment(), stdout=out, stderr=subprocess.STDOUT
        )


def start_demo_crawls(
    hosts: LocalHosts, tmp_path: Path, settings: dict[str, Any], count: int
) -> list[subprocess.Popen[bytes]]:
    """Start *count* :func:`start_demo_crawl` processes from the first page of every host.

    *count* :func:`start_demo_crawl` processes from the first page of every
    host, with *settings*; process N logs to ``workerN.log`` and writes its
    stats to ``statsN.json`` in *tmp_path*.
    """
    return [
        start_demo_crawl(
            [hosts.page_url(i, 0) for i in range(len(hosts))],
            tmp_path / f"worker{n}.log",
            {**settings, "DEMO_STATS_FILE": tmp_path / f"stats{n}.json"},
        )
        for n in range(count)
    ]


def run_command(
    command: list[str], cwd: Path, *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run *command* in *cwd* with the environment of a crawl process; return its text output.

    A non-zero exit is not an error: the caller asserts on ``returncode``.
    """
    return subprocess.run(
        command,
        cwd=cwd,
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def crawl_refused_at_start(*settings: str) -> str:
    """Return the one ERROR line of a ``scrapy crawl`` that *settings* stop at start.

    The one ERROR line of a ``scrapy crawl`` of the example project that
    *settings* (``NAME=VALUE``) stop at start: it exits non-zero, without a
    traceback.
    """
    command = [sys.executable, "-m", "scrapy", "crawl", "pages"]
    command += ["-a", "start_urls=http://127.0.0.1:9/"]
    for setting in settings:
        command += ["-s", setting]
    done = run_command(command, PROJECT_DIR, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if "ERROR" in line]
    assert len(errors) == 1, output[-3000:]
    return errors[0]


@contextmanager
def ended_at_exit(processes: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    """Kill the *processes* still running on the way out of the block.

    Kill, on the way out of the block, the *processes* still running (a
    failed assertion, a timeout), so that no crawl outlives its test.
    """
    try:
        yield
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


async def until(
    condition: Callable[[], Any], timeout: float = 10.0, what: str = "the condition"
) -> Any:
    """Poll *condition* (a plain function) on the running loop until it returns something true.

    Returns what it returned; fails the test after *timeout* seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what}: not seen in {timeout}s")


def monitor_of(crawler: Crawler) -> HostQueueMonitor | None:
    """Return the crawl's monitor extension, or None before its extensions are made."""
    extensions = getattr(crawler, "extensions", None)
    if extensions is None:
        return None
    return next((m for m in extensions.middlewares if isinstance(m, HostQueueMonitor)), None)
