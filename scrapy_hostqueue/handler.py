"""An aiohttp download handler whose connection pool matches the scheduler.

:class:`AiohttpDownloadHandler` is Scrapy 2.19's own aiohttp handler
(streaming, size limits, proxies, TLS settings, dataloss, the
``headers_received`` / ``bytes_received`` signals, error mapping and
``download_latency`` all come from Scrapy) with these changes:

* the ``ClientSession`` is created on the first download, inside the running
  event loop, so the handler also works under ``CrawlerProcess`` (Scrapy's
  handler creates it in ``__init__`` and fails there with "no running event
  loop");
* the pool is sized from this project's settings, so that it backstops
  politeness: per host the AIMD ceiling, in total the active-host cap times the
  ceiling, so the hosts the scheduler is working on keep their keep-alive
  connections; the total also bounds idle sockets;
* a DNS cache with ``HOSTQUEUE_DNS_CACHE_TTL``, which also remembers names
  that do not exist; names are resolved in ``REACTOR_THREADPOOL_MAXSIZE``
  threads of the handler's own, not in the event loop's default executor;
* opening a connection (name resolution, TCP, TLS, a proxy's tunnel) is
  bounded by ``HOSTQUEUE_CONNECT_TIMEOUT`` as well as the download's timeout,
  so that a host whose address drops connection attempts fails in seconds
  rather than after the whole ``DOWNLOAD_TIMEOUT``;
* per-host stats of connections opened and reused;
* ``download_latency`` leaves out the time a request waited for a free
  connection in the pool (kept in ``meta["hostqueue_pool_wait"]``);
* response headers keep the bytes the server sent, as with Scrapy's HTTP/1.1
  handler (Scrapy's aiohttp handler fails the download on a header byte that
  is not UTF-8, such as a Latin-1 file name in ``Content-Disposition``);
* a request without a body other than a POST or a PUT is sent without a
  ``Content-Length: 0`` header, as with the HTTP/1.1 handler;
* a URL whose host is an IPv4 address with a trailing dot (``127.0.0.1.``)
  reaches that address (aiohttp refuses it, and Scrapy's handler reports
  an unsupported URL scheme);
* a request is sent again by itself only as Twisted's pool does for the
  HTTP/1.1 handler: once, on a new connection, when the kept-alive connection
  it went out on fails before any answer (the server may have closed it while
  it was idle), and only for a bodiless GET, HEAD, OPTIONS, DELETE or TRACE.
  aiohttp's own retry would send any idempotent request again after any
  disconnection, on a fresh connection too, where the failure is the host's
  answer, unseen by the crawl's stats, retries and error budget.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp
from aiohttp import hdrs
from aiohttp.abc import AbstractResolver, ResolveResult
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
)
from scrapy.http import Headers
from scrapy.utils.asyncio import is_asyncio_available
from scrapy.utils.httpobj import urlparse_cached

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue._sendgate import GateClient, UsesSendGate, gate_of
from scrapy_hostqueue.exceptions import HostQueueSettingsError
from scrapy_hostqueue.stats import get_recorder

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiohttp.client_proto import ResponseHandler
    from aiohttp.client_reqrep import ClientRequest
    from aiohttp.connector import Connection
    from aiohttp.tracing import Trace
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

__all__ = ["AiohttpDownloadHandler"]

logger = logging.getLogger(__name__)


def _require_asyncio(crawler: Crawler) -> None:
    # is_asyncio_available() rather than is_asyncio_reactor_installed(): the
    # handler needs the asyncio event loop, not the Twisted reactor, and Scrapy
    # can also run on asyncio without any reactor (TWISTED_REACTOR_ENABLED=False).
    try:
        available = is_asyncio_available()
    except RuntimeError:
        # No reactor installed and no loop running yet: only possible, before
        # the loop starts, when Scrapy runs without a Twisted reactor.
        available = not crawler.settings.getbool("TWISTED_REACTOR_ENABLED", True)
    if not available:
        raise HostQueueSettingsError(
            "scrapy_hostqueue.AiohttpDownloadHandler needs the asyncio event loop, "
            "but the installed Twisted reactor is not the asyncio one. Set "
            "TWISTED_REACTOR = "
            '"twisted.internet.asyncioreactor.AsyncioSelectorReactor" '
            "(Scrapy's default) and make sure no other reactor is installed first."
        )


def _pool_limits(config: HostQueueConfig, settings: BaseSettings) -> tuple[int, int]:
    """``(total, per_host)`` connection limits; 0 means no limit.

    Per host: the most the scheduler may give one host, i.e. the AIMD ceiling
    (``CONCURRENT_REQUESTS_PER_DOMAIN`` unless ``HOSTQUEUE_AIMD_CEILING`` is
    set), a larger ``DOWNLOAD_SLOTS`` concurrency (that host's ceiling) or,
    for the scheduler without the AIMD middleware, a larger
    ``CONCURRENT_REQUESTS_PER_IP``. Total:
    ``HOSTQUEUE_MAX_ACTIVE_HOSTS`` (without that cap, ``CONCURRENT_REQUESTS``)
    x the ceiling, so that every host the scheduler is working on keeps its
    keep-alive connections between two of its requests
    (``CONCURRENT_REQUESTS`` bounds the requests in flight, not the idle
    sockets, which count against the total), and at least the requests that
    may be in flight plus ``HOSTQUEUE_MAX_OVERDUE``.
    """
    # HostQueueConfig.from_settings has checked that every entry is a dict
    # and its concurrency a number.
    slots: dict[str, Any] = settings.getdict("DOWNLOAD_SLOTS")
    largest = [config.aimd_ceiling, settings.getint("CONCURRENT_REQUESTS_PER_IP")]
    largest += [int(slot["concurrency"]) for slot in slots.values() if "concurrency" in slot]
    per_host = max(largest)
    hosts = config.max_active_hosts or max(config.global_concurrency, 0)
    if not hosts:
        return 0, per_host
    active = hosts * config.aimd_ceiling
    # Room for the requests in flight plus the overdue ones kept out of
    # CONCURRENT_REQUESTS (HOSTQUEUE_MAX_OVERDUE), which hold their
    # connections until they time out.
    global_limit = config.global_concurrency
    in_flight = (min(global_limit, active) if global_limit > 0 else active) + config.max_overdue
    return max(active, per_host, in_flight), per_host


#: Longest response status or header line accepted, in bytes.
_MAX_HEADER_LINE = 65_536

#: How aiohttp names the TLS context of a connection in its error messages
#: (Scrapy passes its context for every request, plain http too).
_SSL_CONTEXT_REPR = re.compile(r" ssl:<ssl\.SSLContext object at 0x[0-9a-fA-F]+>")


def _readable(error: Exception) -> Exception:
    """Return *error* without aiohttp's ``SSLContext`` address in its message.

    *error* with aiohttp's ``ssl:<ssl.SSLContext object at 0x...>`` taken out
    of its message (an address that tells the user nothing), as a new
    exception of the same class; *error* itself if there is none.
    """
    message = str(error)
    readable = _SSL_CONTEXT_REPR.sub("", message)
    if readable == message or len(error.args) != 1:
        return error
    try:
        return type(error)(readable)
    except Exception:  # an exception class with other arguments
        return error


#: Methods whose bodiless requests go again, once, on a new connection when
#: the kept-alive connection they went out on fails before any answer, as
#: Twisted's connection pool does for Scrapy's HTTP/1.1 handler.
_RESEND_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE", "TRACE"})


def _stale_connection(
    request: Request, download: _Download, error: DownloadFailedError, previous_latency: Any
) -> bool:
    """Whether *error* is a kept-alive connection that failed before any answer.

    Such a request may go again on a new connection (Scrapy sets ``download_latency`` when the
    headers arrive).
    """
    cause = error.__cause__
    return (
        download.connected
        and not download.opened
        and request.meta.get("download_latency") is previous_latency
        and isinstance(cause, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))
        and not isinstance(cause, aiohttp.ClientConnectorError)
        and request.method.upper() in _RESEND_METHODS
        and not request.body
    )


class _ConnectTimeout(Exception):
    """Opening a connection took longer than ``HOSTQUEUE_CONNECT_TIMEOUT``.

    Not an ``OSError`` nor an aiohttp error, so that it crosses aiohttp and
    Scrapy's handler as it is, to become a ``DownloadTimeoutError`` that says
    which timeout ran out (Scrapy's would name ``DOWNLOAD_TIMEOUT``).
    """

    def __init__(self, endpoint: str, seconds: float) -> None:
        super().__init__(endpoint, seconds)
        self.endpoint = endpoint
        self.seconds = seconds


def _endpoint(req: ClientRequest) -> str:
    """Where a request's connection goes, for error messages."""
    where = f"{req.host}:{req.port}"
    proxy = req.proxy
    if proxy is not None:
        where += f" through the proxy {proxy.host}:{proxy.port}"
    return where


class _Download:
    """What the connector learns about the download of the current task."""

    __slots__ = ("connect_seconds", "connected", "create_seconds", "host", "opened", "request")

    def __init__(self, host: str, request: Request) -> None:
        self.host = host
        self.request = request
        self.connected = False
        self.opened = False
        self.connect_seconds = 0.0
        self.create_seconds = 0.0

    @property
    def pool_wait(self) -> float:
        """Time spent getting a connection other than opening one.

        Waiting for a free slot under the pool's limits (near 0 when one was free).
        """
        return max(self.connect_seconds - self.create_seconds, 0.0)


#: The download running in the current task, for the connector, which aiohttp
#: calls with the request only.
_current_download: ContextVar[_Download | None] = ContextVar(
    "scrapy_hostqueue_download", default=None
)


#: getaddrinfo errors that say the name does not exist (as opposed to a
#: resolver that failed or timed out).
_NO_SUCH_NAME = frozenset(
    code
    for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)
#: Names the resolver remembers as missing, at most (the oldest go first).
_MISSING_NAMES_MAX = 10_000
#: Seconds a missing name is remembered, at most: while the network is down
#: getaddrinfo may say a live name does not exist (AI_ADDRCONFIG with no
#: address configured), and the crawl should find it again soon after.
_MISSING_TTL_MAX = 60.0


class _Resolver(AbstractResolver):
    """Name resolution in threads of the handler's own.

    aiohttp's resolver runs ``getaddrinfo`` in the event loop's default
    executor, ``min(32, CPUs + 4)`` threads shared with anything else, where
    a lookup that times out holds its thread for the resolver's whole timeout
    (cancelling the download does not stop it): a few dead domains then hold
    up every other name. Scrapy's docs have broad crawls raise
    ``REACTOR_THREADPOOL_MAXSIZE`` for DNS, which sizes these threads.

    A name that does not exist (NXDOMAIN) is remembered as such for
    *missing_ttl* seconds, at most ``_MISSING_TTL_MAX``: the host's retries
    and its other requests fail at once instead of each asking again. A
    failed lookup (a timeout, a resolver that is down) is not remembered.
    """

    def __init__(
        self, threads: int, missing_ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hostqueue-dns")
        self._missing_ttl = min(missing_ttl, _MISSING_TTL_MAX)
        self._clock = clock
        self._missing: dict[tuple[str, int], tuple[float, int | None, str]] = {}

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        key = (host, int(family))
        missing = self._missing.get(key)
        if missing is not None:
            until, code, message = missing
            if until > self._clock():
                raise socket.gaierror(code, message)
            del self._missing[key]
        try:
            infos = await asyncio.get_running_loop().run_in_executor(
                self._executor, _getaddrinfo, host, port, family
            )
        except socket.gaierror as error:
            if self._missing_ttl > 0 and error.errno in _NO_SUCH_NAME:
                self._remember_missing(key, error.errno, error.strerror or str(error))
            raise
        results: list[ResolveResult] = []
        for info_family, _, proto, _, address in infos:
            if info_family == socket.AF_INET6:
                if len(address) < 4:
                    continue  # a Python without IPv6
                # A link-local address needs its scope (interface) to connect.
                address_text = f"{address[0]}%{address[3]}" if address[3] else address[0]
            elif info_family == socket.AF_INET:
                address_text = address[0]
            else:
                continue
            results.append(
                ResolveResult(
                    hostname=host,
                    host=address_text,
                    port=address[1],
                    family=info_family,
                    proto=proto,
                    flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
                )
            )
        return results

    def _remember_missing(self, key: tuple[str, int], code: int | None, message: str) -> None:
        missing = self._missing
        if len(missing) >= _MISSING_NAMES_MAX:
            del missing[next(iter(missing))]
        missing[key] = (self._clock() + self._missing_ttl, code, message)

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _getaddrinfo(host: str, port: int, family: int) -> list[Any]:
    # socket.getaddrinfo looked up at each call (tests stand in for DNS).
    return socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG)


class _BoundedTCPConnector(internals.TCPConnector):
    """A ``TCPConnector`` whose ``limit`` also bounds idle keep-alive sockets.

    aiohttp counts only connections in use against ``limit``; idle ones stay
    open in the pool for ``keepalive_timeout`` (15 s), so a crawl over many
    hosts keeps one idle socket per host it has met. Before opening a
    connection this closes the longest-idle ones until in-use plus idle
    sockets fit in ``limit`` (it degrades to aiohttp's own behaviour if the
    pool's insides ever change).

    It also tells the download of the current task whether its connection was
    opened or reused and how long getting it took, with no aiohttp tracing
    (which would cost every request a dozen signal dispatches).
    """

    #: Whether the warning that the pool's insides changed was logged.
    shape_warned: ClassVar[bool] = False
    #: Seconds opening a connection may take (name resolution, TCP, TLS, a
    #: proxy's tunnel), 0 for no bound but the download's own timeout.
    connect_timeout: float = 0.0

    @staticmethod
    def host_busy(host: str) -> bool:
        """Whether *host* has requests in flight.

        Replaced by the handler with the scheduler's view when there is one.
        """
        return False

    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        download = _current_download.get()
        if download is None:
            return await super().connect(req, traces, timeout)
        started = time.monotonic()
        connection = await super().connect(req, traces, timeout)
        download.connect_seconds = time.monotonic() - started
        download.connected = True
        return connection

    async def create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> ResponseHandler:
        download = _current_download.get()
        started = time.monotonic()
        self._close_idle_over_limit()
        # Transports close their socket one loop iteration after close() (and
        # a connection released with "Connection: close" just before this one
        # was created is in the same state): yield once so those sockets are
        # really closed before this one connects.
        await asyncio.sleep(0)
        try:
            opening_started = time.monotonic()
            try:
                # No bound (None) with a connect timeout of 0.
                protocol = await asyncio.wait_for(
                    super().create_connection(req, traces, timeout), self.connect_timeout or None
                )
            except asyncio.TimeoutError:
                if not self.connect_timeout or (
                    time.monotonic() - opening_started < self.connect_timeout
                ):
                    raise  # not this timeout
                raise _ConnectTimeout(_endpoint(req), self.connect_timeout) from None
        finally:
            if download is not None:
                download.create_seconds += time.monotonic() - started
        if download is not None:
            download.opened = True
        return protocol

    def close_idle(self, host: str, port: int | None) -> None:
        """Close the idle kept-alive connections to *host*:*port*.

        One of them has just turned out closed by the server, and the others, idle as long, may be
        too.
        """
        idle_pools = self.idle_connections()
        if idle_pools is None:
            return
        for key in [k for k in idle_pools if k.host == host and k.port == port]:
            for protocol, _ in idle_pools.pop(key):
                protocol.abort()

    def _close_idle_over_limit(self) -> None:
        limit = self.limit
        if not limit:
            return
        idle_pools = self.idle_connections()
        acquired = self.connections_in_use()
        if idle_pools is None or acquired is None:
            if not _BoundedTCPConnector.shape_warned:
                _BoundedTCPConnector.shape_warned = True
                logger.warning(
                    "aiohttp %s changed its connection pool internals: idle "
                    "keep-alive connections are no longer counted against the "
                    "pool's total limit",
                    aiohttp.__version__,
                )
            return
        # The connection being created is already in `acquired` (as a
        # placeholder). Idle sockets never outnumber `limit`, so these scans
        # stay small however many hosts the crawl meets.
        excess = len(acquired) + sum(len(pool) for pool in idle_pools.values()) - limit
        busy = self.host_busy
        while excess > 0 and idle_pools:
            # Each pool is FIFO (oldest release first): evict the connection
            # idle the longest, preferring hosts with nothing in flight. In a
            # broad crawl the pool is full of hosts that are between two
            # requests; evicting theirs would make each of them reconnect
            # (and evict another's) on its next request.
            idle = [k for k in idle_pools if not busy(k.host)] or list(idle_pools)
            key = min(idle, key=lambda k: idle_pools[k][0][1])
            pool = idle_pools[key]
            protocol, _ = pool[0]
            del pool[0]
            if not pool:
                del idle_pools[key]
            # abort(): an idle connection has nothing in flight, and a TLS
            # close handshake would keep the socket open for a while.
            protocol.abort()
            excess -= 1


#: Methods whose bodiless requests still announce ``Content-Length: 0``, as
#: Twisted sends them for Scrapy's HTTP/1.1 handler.
_ANNOUNCE_EMPTY_BODY = frozenset({"POST", "PUT"})


def _ipv4_without_trailing_dot(url: Any) -> Any:
    """*url* (a ``yarl.URL``) without the trailing dot of an IPv4 host.

    ``127.0.0.1.`` is the address ``127.0.0.1`` (the WHATWG URL standard
    drops the empty last label before reading an IPv4 address; browsers and
    curl connect), but aiohttp refuses it as "not a canonical IPv4 address",
    which Scrapy reports as an unsupported URL scheme. A trailing dot after a
    name (``example.com.``) is a fully qualified name and stays. The request's
    URL in Scrapy stays as written; the connection and the ``Host`` header use
    the address.
    """
    host = getattr(url, "raw_host", None)
    if not isinstance(host, str) or not host.endswith("."):
        return url
    try:
        ipaddress.IPv4Address(host[:-1])
    except ValueError:
        return url
    return url.with_host(host[:-1])


class _ClientRequest(aiohttp.ClientRequest):
    """Sends no ``Content-Length: 0`` on a bodiless request other than POST and PUT.

    As Scrapy's HTTP/1.1 handler does.

    Scrapy passes every request's body, ``b""`` when there is none, and
    aiohttp announces any body it is given, even an empty one (and, for
    methods other than GET, HEAD, OPTIONS and TRACE, an absent one). A request
    whose method carries no content should not announce any (RFC 9110, 8.6),
    and some servers and firewalls refuse a GET that does. A length the
    request sets itself is sent as it is.
    """

    def __init__(self, method: str, url: Any, *, data: Any = None, **kwargs: Any) -> None:
        url = _ipv4_without_trailing_dot(url)
        if data != b"" or method.upper() in _ANNOUNCE_EMPTY_BODY:
            super().__init__(method, url, data=data, **kwargs)
            return
        # The session passes its merged headers as a case-insensitive mapping.
        told = hdrs.CONTENT_LENGTH in (kwargs.get("headers") or {})
        super().__init__(method, url, data=None, **kwargs)
        if not told:
            self.headers.pop(hdrs.CONTENT_LENGTH, None)


def _headers_sent_trace(gate: GateClient) -> aiohttp.TraceConfig:
    """Tell *gate* when a download's headers go out, on a new or kept-alive connection."""

    async def headers_sent(*_: Any) -> None:
        download = _current_download.get()
        if download is not None:
            gate.headers_sent(download.request)

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(headers_sent)
    return trace


class _SharedPool:
    """One session, pool and host table per crawler.

    Scrapy builds one handler instance per scheme, so ``http`` and ``https``
    get two instances; they share this so that the total limit holds across
    both.
    """

    def __init__(self, crawler: Crawler, config: HostQueueConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.total, self.per_host = _pool_limits(config, crawler.settings)
        # DNSCACHE_ENABLED=False turns Scrapy's own DNS cache off; honour it here.
        self.dns_cache = config.dns_cache_ttl > 0 and crawler.settings.getbool(
            "DNSCACHE_ENABLED", True
        )
        self.dns_threads = _dns_threads(crawler.settings)
        self.users = 0
        self.session: aiohttp.ClientSession | None = None
        self.connector: _BoundedTCPConnector | None = None
        self.resolver: _Resolver | None = None
        self._closed = False
        logger.info(
            "Download pool: %s connections per host, %s in total, DNS cache %s, "
            "%s DNS threads, connect timeout %s",
            self.per_host,
            self.total or "no limit",
            f"TTL {config.dns_cache_ttl:g} s" if self.dns_cache else "off",
            self.dns_threads,
            f"{config.connect_timeout:g} s" if config.connect_timeout else "DOWNLOAD_TIMEOUT",
            extra={"crawler": crawler},
        )

    def get_session(self, handler: AiohttpDownloadHandler) -> aiohttp.ClientSession:
        if self.session is None:
            if self._closed:
                raise RuntimeError("The download handler is closed")
            self.session = handler.new_session(self)
        return self.session

    async def release(self) -> None:
        self.users -= 1
        if self.users > 0:
            return
        self._closed = True
        _pools.pop(self.crawler, None)
        if self.session is not None:
            session, self.session = self.session, None
            await session.close()
        if self.resolver is not None:
            # Not the connector's to close: it did not create it.
            resolver, self.resolver = self.resolver, None
            await resolver.close()


_pools: weakref.WeakKeyDictionary[Crawler, _SharedPool] = weakref.WeakKeyDictionary()


def _dns_threads(settings: BaseSettings) -> int:
    """Threads for name resolution.

    ``REACTOR_THREADPOOL_MAXSIZE``, the setting Scrapy's docs have broad crawls raise for DNS.
    """
    threads = settings.getint("REACTOR_THREADPOOL_MAXSIZE", 10)
    if threads < 1:
        raise HostQueueSettingsError(
            f"REACTOR_THREADPOOL_MAXSIZE must be at least 1 (threads for name "
            f"resolution in AiohttpDownloadHandler), got {threads!r}"
        )
    return threads


class AiohttpDownloadHandler(UsesSendGate, internals.ScrapyAiohttpHandler):
    """Scrapy's aiohttp download handler with a pool that backstops the per-host limits.

    Scrapy's aiohttp download handler with a connection pool that backstops
    the per-host limits of ``HostQueueScheduler``.

    Use it for the ``http`` and ``https`` schemes in ``DOWNLOAD_HANDLERS`` (the
    ``scrapy_hostqueue.Addon`` does that). It needs the asyncio event loop and
    works under ``scrapy crawl``, ``AsyncCrawlerProcess`` and ``CrawlerProcess``.
    """

    # Scrapy's handler is flagged experimental and logs a warning about it at
    # every start; this subclass is the download path this project supports
    # and tests, so it does not repeat that warning.
    experimental: ClassVar[bool] = False

    def __init__(self, crawler: Crawler) -> None:
        _require_asyncio(crawler)
        # The session with Scrapy's options is created on the first download.
        super().__init__(crawler)
        pool = _pools.get(crawler)
        if pool is None:
            pool = _pools[crawler] = _SharedPool(
                crawler, HostQueueConfig.from_settings(crawler.settings)
            )
        pool.users += 1
        self._pool = pool
        self._released = False

    def new_session(self, pool: _SharedPool) -> aiohttp.ClientSession:
        # aiohttp's limit_per_host counts connections per (host, port, TLS)
        # endpoint, while Scrapy's slots (and this project's hosts) are keyed
        # by hostname alone: a site serving on two ports or on both http and
        # https gets the per-host limit on each endpoint. The scheduler holds
        # the hostname limit; the pool is the backstop per endpoint.
        pool.resolver = _Resolver(
            pool.dns_threads, pool.config.dns_cache_ttl if pool.dns_cache else 0.0
        )
        connector = _BoundedTCPConnector(
            local_addr=self.bind_address,
            limit=pool.total,
            limit_per_host=pool.per_host,
            resolver=pool.resolver,
            use_dns_cache=pool.dns_cache,
            # aiohttp annotates the TTL as int but takes any number of seconds.
            ttl_dns_cache=pool.config.dns_cache_ttl,  # type: ignore[arg-type]
            # A host that waits for an active place (or between turns) keeps
            # its idle connections that long, within the pool's total (see
            # _close_idle_over_limit); aiohttp's 15 s default made such a host
            # reconnect at its next turn.
            keepalive_timeout=pool.config.keepalive_timeout,
        )
        gate = gate_of(self.crawler)
        trace_configs = []
        if gate is not None:
            connector.host_busy = gate.host_busy  # type: ignore[method-assign]
            trace_configs.append(_headers_sent_trace(gate))
        connector.connect_timeout = pool.config.connect_timeout
        pool.connector = connector
        # The same session options as Scrapy's handler.
        session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            response_class=internals.CLIENT_RESPONSE_CLASS,
            request_class=_ClientRequest,
            trace_configs=trace_configs,
            # aiohttp refuses a response header line over 8,190 bytes, where
            # Scrapy's HTTP/1.1 handler takes long cookies and CSP headers.
            max_line_size=_MAX_HEADER_LINE,
            max_field_size=_MAX_HEADER_LINE,
            skip_auto_headers=(
                "Accept",
                "Accept-Encoding",
                "Content-Type",
                "User-Agent",
            ),
        )
        # aiohttp sends an idempotent request again after any disconnection
        # (a private switch, read at each request since aiohttp 3.10); the
        # handler sends it again itself, as Twisted does (_download).
        internals.disable_session_retry(session)
        return session

    @staticmethod
    def response_headers(response: Any) -> Headers:
        # aiohttp's decoded headers turn a byte that is not UTF-8 into a lone
        # surrogate, which Scrapy's Headers cannot encode back: the bytes the
        # server sent are taken instead, as the HTTP/1.1 handler does.
        return Headers(list(response.raw_headers))

    async def download_request(self, request: Request) -> Response:
        self.use_session(self._pool.get_session(self))
        # With HOSTQUEUE_PREFETCH, the scheduler hands a host one more
        # request than its limit; it waits here, before Scrapy's handler starts
        # its clock, for the host to have room on the wire.
        gate = gate_of(self.crawler)
        if gate is not None:
            await gate.acquire(request)
            response = await self._download(request)
            # The body is read and the connection back in the pool: the host's
            # next request may go now, unless the response asks to back off
            # (then the slot is freed once the request leaves the downloader).
            gate.body_read(request, response.status)
            return response
        return await self._download(request)

    async def read_response(self, response: Any, request: Request) -> Response:
        # Scrapy's handler reads the status line, sends headers_received,
        # then reads the body: the scheduler hears of a back-off status
        # before that signal (which gives a silent host its limit) and before
        # a slow body.
        gate = gate_of(self.crawler)
        if gate is not None:
            gate.status_read(request, response.status)
        return await super().read_response(response, request)

    async def _download(self, request: Request) -> Response:
        try:
            return await self._fetch(request)
        except _ConnectTimeout as timeout:
            # Like Scrapy's own timeout, retried by RetryMiddleware and counted
            # by the AIMD middleware against the host's error budget.
            raise DownloadTimeoutError(
                f"Opening a connection to {timeout.endpoint} for {request.url} took "
                f"longer than {timeout.seconds:g} seconds (HOSTQUEUE_CONNECT_TIMEOUT)."
            ) from None
        except (
            DownloadConnectionRefusedError,
            DownloadFailedError,
            CannotResolveHostError,
        ) as error:
            readable = _readable(error)
            if readable is error:
                raise
            raise readable from error.__cause__

    async def _fetch(self, request: Request) -> Response:
        host = internals.host_key(self.crawler, request)
        download = _Download(host, request)
        token = _current_download.set(download)
        # A retried request carries the latency of its previous attempt.
        previous_latency = request.meta.get("download_latency")
        try:
            try:
                return await super().download_request(request)
            except DownloadFailedError as error:
                if not _stale_connection(request, download, error, previous_latency):
                    raise
            # The kept-alive connection failed before any answer: once more,
            # on a new connection.
            self._connected(request, download, previous_latency)
            if self._pool.config.stats_enabled:
                get_recorder(self.crawler).inc(host, "resent_count")
            if self._pool.connector is not None:
                url = urlparse_cached(request)
                port = url.port or (443 if url.scheme == "https" else 80)
                self._pool.connector.close_idle(url.hostname or "", port)
            download = _Download(host, request)
            _current_download.set(download)
            return await super().download_request(request)
        finally:
            _current_download.reset(token)
            if download.connected:
                self._connected(request, download, previous_latency)

    def _connected(self, request: Request, download: _Download, previous_latency: Any) -> None:
        if self._pool.config.stats_enabled:
            name = "connections_opened_count" if download.opened else "connections_reused_count"
            # The crawler's one recorder keeps the key layout
            # (hostqueue/hosts/{host}/{name}) and the bounded table of named
            # hosts (HOSTQUEUE_STATS_MAX_HOSTS) for every component.
            get_recorder(self.crawler).inc(download.host, name)
        # Scrapy's handlers measure download_latency from just before sending
        # to the response headers. Here, "before sending" also includes any
        # wait for a free connection in this pool, which is this crawler's own
        # queueing, not the server's pace: it is taken out (and kept in
        # meta["hostqueue_pool_wait"]) so that AutoThrottle and the AIMD rule
        # see the server. Opening a connection stays in, as in Scrapy.
        wait = download.pool_wait
        request.meta["hostqueue_pool_wait"] = wait
        latency = request.meta.get("download_latency")
        if latency is not None and latency is not previous_latency:
            request.meta["download_latency"] = max(latency - wait, 0.0)

    async def close(self) -> None:
        if not self._released:
            self._released = True
            await self._pool.release()
