"""Every touch of Scrapy or aiohttp internals that may move between releases.

Downloader slots, the downloader's set of active requests, the engine's
wake-up call, Scrapy's aiohttp download handler (a private module) and the
connection pool inside aiohttp's connector are not a stable public API (an
open Scrapy proposal may replace download slots altogether), so nothing else
in the package reaches into them or names anything private of Scrapy or
aiohttp. :func:`check_compatible` refuses, at start-up, a Scrapy or aiohttp
older than the package's floors or one that lacks a name it uses, and starts
on a newer one that has them all with one WARNING.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec, TypeVar

import aiohttp
import scrapy
from scrapy.core import engine as _scrapy_engine
from scrapy.core.engine import ExecutionEngine
from scrapy.http import Headers
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.httpobj import urlparse_cached

from scrapy_hostqueue.exceptions import (
    FrontierFileError,
    HostQueueSettingsError,
    RedisFrontierError,
    UnsupportedDependencyError,
)

if TYPE_CHECKING:
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.client_reqrep import ClientRequest
    from aiohttp.tracing import Trace
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


# -- versions ------------------------------------------------------------------

#: The Scrapy releases the tests run against, as ``(floor, end)``: 2.19.x.
#: The floor is ``install_requires``'s; a newer release that has every private
#: name used here starts with a WARNING.
SCRAPY_TESTED = ((2, 19), (2, 20))
#: aiohttp: the floor is Scrapy 2.19's own (``install_requires`` repeats it);
#: the tests run up to 3.14.
AIOHTTP_TESTED = ((3, 13, 3), (3, 15))


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


def _tested_range(tested: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    first, end = tested
    if len(first) == 2 and end == (first[0], first[1] + 1):
        return f"{_dotted(first)}.x"
    return f"{_dotted(first)} to {end[0]}.{end[1] - 1}"


#: The libraries checked, by the name their users know.
_LIBRARIES = (("Scrapy", scrapy, SCRAPY_TESTED), ("aiohttp", aiohttp, AIOHTTP_TESTED))


def _tested() -> str:
    return " and ".join(f"{name} {_tested_range(tested)}" for name, _, tested in _LIBRARIES)


def _tested_versions() -> str:
    installed = ", ".join(f"{name} {module.__version__}" for name, module, _ in _LIBRARIES)
    return f"{_tested()}; installed: {installed}"


def _release(installed: str) -> tuple[int, ...] | None:
    # The release numbers only: a pre-release of a version (2.19.1rc1)
    # counts as that version.
    match = re.match(r"\d+(?:\.\d+)*", installed)
    if match is None:
        return None
    return tuple(int(part) for part in match.group().split("."))


def _assigned_in_init(cls: type, name: str) -> bool:
    """Whether an ``__init__`` in *cls*'s MRO assigns (or reads) the attribute *name*.

    Instance attributes exist only on instances, which cannot be built before the event loop runs.
    """
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        code = getattr(init, "__code__", None)
        if code is not None and name in code.co_names:
            return True
    return False


def _missing_names(*, handler: bool) -> list[str]:
    """Return the private names this module uses that are missing.

    The private names this module uses that the installed Scrapy and
    aiohttp lack (those of the download handler only with *handler*).
    """
    missing = []
    if not _assigned_in_init(ExecutionEngine, "_slot"):
        missing.append("scrapy.core.engine.ExecutionEngine._slot")
    engine_slot = getattr(_scrapy_engine, "_Slot", None)
    if engine_slot is None or not _assigned_in_init(engine_slot, "inprogress"):
        missing.append("scrapy.core.engine._Slot.inprogress")
    if not handler:
        return missing
    if _SCRAPY_IMPORT_ERROR is not None:
        missing.append(f"scrapy.core.downloader.handlers._aiohttp ({_SCRAPY_IMPORT_ERROR})")
    else:
        for name in ("_read_response", "_extract_headers", "_make_request"):
            if not callable(getattr(_ScrapyAiohttpHandler, name, None)):
                missing.append(f"scrapy AiohttpDownloadHandler.{name}")
        for name in ("_bind_address", "_session"):
            if not _assigned_in_init(_ScrapyAiohttpHandler, name):
                missing.append(f"scrapy AiohttpDownloadHandler.{name}")
    if not callable(getattr(aiohttp.TCPConnector, "_create_connection", None)):
        missing.append("aiohttp.TCPConnector._create_connection")
    for name in ("_conns", "_acquired"):
        if not _assigned_in_init(aiohttp.BaseConnector, name):
            missing.append(f"aiohttp.BaseConnector.{name}")
    if "_retry_connection" not in getattr(aiohttp.ClientSession, "ATTRS", ()):
        missing.append("aiohttp.ClientSession._retry_connection")
    return missing


#: The versions already warned about as untested, so that a process logs
#: the WARNING once, not once per component.
_warned_untested: set[str] = set()


def check_compatible(*, handler: bool = False) -> None:
    """Refuse to start with a Scrapy or aiohttp this package cannot use.

    Refuse to start with a Scrapy or aiohttp older than this package's
    floors, or one without a private name it uses (*handler*: also those of
    the download handler): better one clear line at start-up than an
    AttributeError in the middle of a crawl. A release newer than those the
    tests run against, with every name in place, starts with one WARNING.
    """
    releases = [(name, module.__version__, tested) for name, module, tested in _LIBRARIES]
    if any((_release(version) or ()) < tested[0] for _, version, tested in releases):
        floors = " and ".join(f"{name} >= {_dotted(tested[0])}" for name, _, tested in releases)
        raise UnsupportedDependencyError(
            f"scrapy-hostqueue needs {floors}, and is tested with {_tested_versions()}. "
            "Upgrade them (pip install -U scrapy aiohttp)."
        )
    missing = _missing_names(handler=handler)
    if missing:
        raise UnsupportedDependencyError(
            f"scrapy-hostqueue is tested with {_tested_versions()}, which lack "
            f"{', '.join(missing)}. Install Scrapy 2.19 (pip install 'scrapy~=2.19.0'), "
            "or remove scrapy_hostqueue.AiohttpDownloadHandler from DOWNLOAD_HANDLERS to "
            "use Scrapy's default HTTP/1.1 handler "
            "(scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler)."
        )
    untested = ", ".join(
        f"{name} {version}"
        for name, version, tested in releases
        if (_release(version) or ()) >= tested[1]
    )
    if untested and untested not in _warned_untested:
        _warned_untested.add(untested)
        logger.warning(
            "scrapy-hostqueue is not tested with %s (tested with %s); it has every "
            "private name the package uses, so the crawl starts",
            untested,
            _tested(),
        )


# -- refusing to start ---------------------------------------------------------

#: The errors a component refuses to start with, reported as one line.
_REFUSALS = (
    HostQueueSettingsError,
    UnsupportedDependencyError,
    FrontierFileError,
    RedisFrontierError,
)


def refuses_at_start_up(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Wrap a component's ``from_crawler`` (or the add-on's ``update_settings``).

    Check the installed versions first, and have a refusal (a bad setting, an unknown version)
    reported as one ERROR line.

    ``scrapy crawl`` runs each crawl in an asyncio task that re-raises what
    the crawl's start-up raised and leaves it to asyncio, which logs "Task
    exception was never retrieved" and a traceback when the task is
    collected. The refusal is still raised (the command exits with status 1,
    and a caller of ``Crawler.crawl_async()`` gets it); only that task's
    report of it becomes the line.
    """

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            check_compatible()
            return func(*args, **kwargs)
        except _REFUSALS as error:
            report_refusal(error)
            raise

    return wrapper


def report_refusal(error: BaseException) -> None:
    """Have ``scrapy crawl``'s task log *error* as one ERROR line.

    If this runs in the task of a crawl started by Scrapy's
    ``AsyncCrawlerRunner`` (``scrapy crawl``), have that task log *error*
    as one ERROR line when it ends with it.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        return
    if task is None or not _is_crawl_task(task):
        return
    task.add_done_callback(functools.partial(_report_crawl_end, error))


def _is_crawl_task(task: asyncio.Task[Any]) -> bool:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", "") == "AsyncCrawlerRunner._crawl_and_track"


def _caused_by(raised: BaseException, error: BaseException) -> bool:
    """Whether *raised* was raised while *error* was being handled."""
    seen = set()
    context = raised.__context__
    while context is not None and id(context) not in seen:
        if context is error:
            return True
        seen.add(id(context))
        context = context.__context__
    return False


def _report_crawl_end(error: BaseException, task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    # Nothing else retrieves this task's exception: taking it here keeps
    # asyncio from reporting it as never retrieved.
    raised = task.exception()
    if raised is None:
        return
    if raised is error or _caused_by(raised, error):
        logging.getLogger("scrapy_hostqueue").error("The crawl did not start: %s", error)
        if raised is not error:
            # Scrapy 2.19 closes an engine that failed to open its spider
            # (a scheduler that refused to start) and fails again there,
            # with "Engine slot not assigned": a consequence, not news.
            logger.debug("Then, while stopping the crawl: %r", raised)
        return
    # Another error ended the crawl: reported as asyncio would have.
    task.get_loop().call_exception_handler(
        {"message": "Task exception was never retrieved", "exception": raised, "future": task}
    )


def crawl_task() -> asyncio.Task[Any] | None:
    """Return the task of the crawl being built by ``scrapy crawl``.

    The task of the crawl being built, when ``scrapy crawl`` (Scrapy's
    ``AsyncCrawlerRunner``) runs it: called from a component's
    ``from_crawler``. None otherwise.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        return None
    return task if task is not None and _is_crawl_task(task) else None


def fail_crawl(crawler: Crawler, error: BaseException, task: asyncio.Task[Any] | None) -> None:
    """Have the crawl end with *error* once its engine has stopped.

    Once its spider closed and its stats are written, ``scrapy crawl`` exits with status 1, and
    ``Crawler.crawl_async()`` raises *error*. *task* is the crawl's task (:func:`crawl_task`), whose
    end reports nothing more: the caller logged *error* already.

    Scrapy 2.19's ``ExecutionEngine.start_async()`` waits on the private
    ``_closewait`` deferred, which ``stop_async()`` fires after the
    ``engine_stopped`` signal; failed here first with *error* (and taken
    away, so that it is not fired twice), it makes the crawl raise.
    """

    def stopped() -> None:
        engine = _engine(crawler)
        closewait = getattr(engine, "_closewait", None)
        if closewait is not None and not closewait.called:
            engine._closewait = None
            closewait.errback(error)

    crawler.signals.connect(stopped, signal=scrapy.signals.engine_stopped, weak=False)
    if task is not None:
        task.add_done_callback(functools.partial(_quiet_crawl_end, error))


def _quiet_crawl_end(error: BaseException, task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    raised = task.exception()  # retrieved: asyncio reports nothing
    if raised is not None and raised is not error and not _caused_by(raised, error):
        task.get_loop().call_exception_handler(
            {"message": "Task exception was never retrieved", "exception": raised, "future": task}
        )


def _engine(crawler: Crawler) -> Any:
    """Return the crawler's engine, or None before the crawl starts.

    The crawler's engine, or None before the crawl starts (Scrapy 2.19's
    ``Crawler.engine`` raises then).
    """
    try:
        return crawler.engine
    except RuntimeError:
        return None


def host_key(crawler: Crawler, request: Request) -> str:
    """Return the key of the host a request belongs to.

    This is the one definition of "host" in the package: the downloader slot
    key, i.e. ``request.meta["download_slot"]`` when set, else the URL's
    hostname (lowercase, no port, IPv6 without brackets, "" for URLs without a
    host such as ``data:``), or its IP address with ``CONCURRENT_REQUESTS_PER_IP``.
    """
    engine = _engine(crawler)
    if engine is not None:
        return str(engine.downloader.get_slot_key(request))
    slot = request.meta.get("download_slot")
    if slot is not None:
        return str(slot)
    return urlparse_cached(request).hostname or ""


def configured_slot(settings: BaseSettings, key: str) -> tuple[int, float, float]:
    """``(concurrency, delay, jitter)`` that Scrapy gives a new slot for *key*."""
    per_slot: dict[str, dict[str, Any]] = settings.getdict("DOWNLOAD_SLOTS")
    slot_settings = per_slot.get(key, {})
    concurrency = int(
        slot_settings.get(
            "concurrency",
            settings.getint("CONCURRENT_REQUESTS_PER_IP")
            or settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
        )
    )
    delay = float(slot_settings.get("delay", settings.getfloat("DOWNLOAD_DELAY")))
    if "jitter" in slot_settings:
        jitter = float(slot_settings["jitter"])
    elif "randomize_delay" in slot_settings:
        jitter = 0.5 if slot_settings["randomize_delay"] else 0.0
    else:
        jitter = _default_jitter(settings)
    return concurrency, delay, jitter


def _default_jitter(settings: BaseSettings) -> float:
    """Return the jitter of slots without their own, as Scrapy 2.19's downloader reads it.

    ``DOWNLOAD_DELAY_JITTER``, unless the deprecated ``RANDOMIZE_DOWNLOAD_DELAY`` was set at a
    higher priority (``True``: the historical +/-50 %, ``False``: none).
    """
    randomize = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    jitter = settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0
    if randomize > max(SETTINGS_PRIORITIES["default"], jitter):
        return 0.5 if settings.getbool("RANDOMIZE_DOWNLOAD_DELAY") else 0.0
    return settings.getfloat("DOWNLOAD_DELAY_JITTER", 0.5)


def apply_to_slot(
    crawler: Crawler,
    key: str,
    *,
    concurrency: int | None = None,
    delay: float | None = None,
) -> None:
    """Mirror a host's limit (and delay) on its downloader slot, if it exists.

    Slots are garbage-collected when idle and recreated from the settings, so
    callers re-apply on ``request_reached_downloader``, which fires after the
    slot exists and before the downloader decides to send.
    """
    engine = _engine(crawler)
    if engine is None:
        return
    slot = engine.downloader.slots.get(key)
    if slot is None:
        return
    if concurrency is not None:
        slot.concurrency = concurrency
    if delay is not None:
        slot.delay = delay


def hold_slot_concurrency(crawler: Crawler, key: str) -> None:
    """Make the downloader slot *key* hold its concurrency exactly.

    Make the downloader slot *key*, if it exists, hold its concurrency
    exactly (see :class:`_StartingQueue`). Call it before the slot's first
    request is queued (``request_reached_downloader`` fires just before).
    """
    engine = _engine(crawler)
    if engine is None:
        return
    slot = engine.downloader.slots.get(key)
    if slot is not None and not isinstance(slot.queue, _StartingQueue):
        slot.queue = _StartingQueue(slot.queue, slot.transferring)


class _StartingQueue(deque):  # type: ignore[type-arg]
    """A downloader slot's queue that counts a request as transferring at once.

    A downloader slot's queue that counts a request as transferring as
    soon as the downloader takes it off the queue.

    Scrapy 2.19's downloader takes queued requests off while the slot has
    ``free_transfer_slots()``, but adds each to ``slot.transferring`` only
    when its download task first runs, a loop turn later: several taken off
    together all pass the check, and the host gets more than the slot's
    concurrency (on the asyncio reactor, without a download delay). Added
    here at once, the check holds.
    """

    __slots__ = ("_transferring",)

    def __init__(self, items: Iterable[Any], transferring: set[Any]) -> None:
        super().__init__(items)
        self._transferring = transferring

    def popleft(self) -> Any:
        item = super().popleft()
        self._transferring.add(item[0])
        return item


def on_request_leaving_downloader(
    crawler: Crawler,
    callback: Callable[[Request], None],
    excused: Callable[[], int] | None = None,
) -> Callable[[], None]:
    """Call *callback* whenever a request leaves the downloader, whatever the outcome.

    Response, exception, a middleware short-circuit (cache hit, IgnoreRequest, robots.txt), or a
    redirect/retry returned as a new request.

    ``Downloader.fetch`` adds every request to ``downloader.active`` before the
    downloader middlewares run and removes it in a ``finally`` clause; no
    signal covers all of these cases. Returns a function that undoes the hook.

    *excused* says how many of the requests in the downloader do not count
    against ``CONCURRENT_REQUESTS`` (the downloader's ``needs_backout`` is
    ``len(active) >= CONCURRENT_REQUESTS``): overdue requests, which must not
    hold the global limit the hosts that answer need.
    """
    engine = _engine(crawler)
    assert engine is not None
    downloader = engine.downloader
    original = downloader.active
    hooked = _LeaveNotifyingSet(original, callback, excused)
    downloader.active = hooked

    def undo() -> None:
        if downloader.active is hooked:
            downloader.active = set(hooked)

    return undo


def on_request_done(crawler: Crawler, callback: Callable[[Request], None]) -> Callable[[], None]:
    """Call *callback* when the engine is done with a request it downloaded.

    Its callback or errback has run and what it produced has been taken over (the requests it
    yielded are in the scheduler, its items went through the item pipelines), or the downloader
    answered it with a new request (a redirect, a retry), now in the scheduler.

    The engine keeps such requests in ``engine._slot.inprogress`` from the
    download until then, and removes them there; no signal marks that
    moment. Returns a function that undoes the hook. Without an engine slot
    (a scheduler opened outside a crawl) nothing is hooked: the requests stay
    leased.
    """
    engine = _engine(crawler)
    slot = getattr(engine, "_slot", None)
    if slot is None:
        return lambda: None
    hooked = _LeaveNotifyingSet(slot.inprogress, callback, None)
    slot.inprogress = hooked

    def undo() -> None:
        if slot.inprogress is hooked:
            slot.inprogress = set(hooked)

    return undo


class _LeaveNotifyingSet(set):  # type: ignore[type-arg]
    __slots__ = ("_callback", "_excused")

    def __init__(
        self,
        items: Iterable[Any],
        callback: Callable[[Any], None],
        excused: Callable[[], int] | None,
    ) -> None:
        super().__init__(items)
        self._callback = callback
        self._excused = excused

    def __len__(self) -> int:
        size = set.__len__(self)
        if self._excused is None:
            return size
        return max(0, size - self._excused())

    def __bool__(self) -> bool:
        # Whether requests are in the downloader at all (the engine's idle
        # check), excused ones included.
        return set.__len__(self) > 0

    def remove(self, item: Any) -> None:
        super().remove(item)
        try:
            self._callback(item)
        except Exception:
            logger.exception("Error while releasing %s", item)

    def discard(self, item: Any) -> None:
        if item in self:
            self.remove(item)


def wake_engine(crawler: Crawler) -> None:
    """Ask the engine to pull from the scheduler now.

    The engine otherwise retries a scheduler that returned None only after a
    finished download, a new request, or its 5-second heartbeat.
    """
    engine = _engine(crawler)
    slot = getattr(engine, "_slot", None)
    nextcall = getattr(slot, "nextcall", None)
    if nextcall is not None:
        nextcall.schedule()


def engine_closing(crawler: Crawler) -> bool:
    """Whether the crawl is stopping (or not running).

    No request should start waiting for anything then, since the engine waits for every request in
    progress before it closes.
    """
    engine = _engine(crawler)
    slot = getattr(engine, "_slot", None)
    return not getattr(engine, "running", False) or getattr(slot, "closing", None) is not None


def current_scheduler(crawler: Crawler) -> Any:
    engine = _engine(crawler)
    return engine.scheduler if engine is not None else None


def slot_delay(crawler: Crawler, key: str) -> float | None:
    """Return the current delay of *key*'s downloader slot, if the slot exists."""
    engine = _engine(crawler)
    if engine is None:
        return None
    slot = engine.downloader.slots.get(key)
    return None if slot is None else float(slot.delay)


# -- Scrapy's aiohttp download handler -------------------------------------------


class _HandlerUnavailable:
    """Stands in for Scrapy's handler when its private module is missing.

    The package still imports, and the handler refuses with a clear message when the crawl starts
    rather than with an ImportError at settings load.
    """

    lazy: ClassVar[bool] = False

    def __init__(self, crawler: Crawler) -> None:  # pragma: no cover
        raise NotImplementedError

    # Scrapy builds handlers with from_crawler() when the class has one, else
    # with cls() and no crawler: keep the path that reaches the subclass's
    # __init__ and its message.
    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cls(crawler)


# Scrapy's aiohttp handler lives in a private module (2.19 marks it
# experimental), so a Scrapy release may move or change it.
_SCRAPY_IMPORT_ERROR: ImportError | None = None
try:
    from scrapy.core.downloader.handlers._aiohttp import (
        AiohttpDownloadHandler as _ScrapyAiohttpHandler,
    )
    from scrapy.core.downloader.handlers._aiohttp import _ClientResponse
    from scrapy.utils.ssl import _make_ssl_context
except ImportError as exc:
    _SCRAPY_IMPORT_ERROR = exc
    _ScrapyAiohttpHandler = _HandlerUnavailable  # type: ignore[assignment,misc]
    _ClientResponse = aiohttp.ClientResponse  # type: ignore[assignment,misc]

#: The response class of Scrapy's handler (it keeps the peer's address and
#: TLS object, which aiohttp may lose before Scrapy reads them).
CLIENT_RESPONSE_CLASS: type[aiohttp.ClientResponse] = _ClientResponse


class ScrapyAiohttpHandler(_ScrapyAiohttpHandler):
    """Scrapy's aiohttp download handler, with public names for what a subclass changes.

    Scrapy's ``__init__`` creates the ``ClientSession`` at once, which needs a
    running event loop (absent under ``CrawlerProcess`` until the crawl
    starts). It is skipped on purpose: its base class's ``__init__`` runs
    here and the SSL context is built the same way; the subclass gives each
    download its session with :meth:`use_session`.
    """

    def __init__(self, crawler: Crawler) -> None:
        check_compatible(handler=True)
        super(_ScrapyAiohttpHandler, self).__init__(crawler)
        self._ssl_context = _make_ssl_context(crawler.settings)

    @property
    def bind_address(self) -> tuple[str, int] | None:
        """``DOWNLOAD_BIND_ADDRESS`` as Scrapy's handler reads it."""
        address: tuple[str, int] | None = self._bind_address
        return address

    def use_session(self, session: aiohttp.ClientSession) -> None:
        """Send the next downloads through *session*."""
        self._session = session

    @staticmethod
    def response_headers(response: Any) -> Headers:
        """Return the headers of an aiohttp response as a Scrapy ``Headers``."""
        return Headers(list(response.headers.items()))

    def _extract_headers(self, response: Any) -> Headers:  # type: ignore[override]
        return self.response_headers(response)

    async def read_response(self, response: Any, request: Request) -> Response:
        """Read a response whose status line and headers have arrived.

        Its headers, the ``headers_received`` / ``bytes_received`` signals, the body within the size
        limits.
        """
        return await super()._read_response(response, request)

    async def _read_response(self, response: Any, request: Request) -> Response:
        return await self.read_response(response, request)


# -- aiohttp's connector and session ---------------------------------------------


class TCPConnector(aiohttp.TCPConnector):
    """aiohttp's ``TCPConnector`` with public names for what the handler needs.

    aiohttp's ``TCPConnector`` with public names for opening a connection
    and for the pool's connections (aiohttp offers no public view of them).

    Reads two private attributes of aiohttp's ``BaseConnector`` (``_conns``,
    ``_acquired``, stable since aiohttp 3.0); :func:`check_compatible` checks
    that they exist, and the accessors give None if their shape changes.
    """

    async def create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> ResponseHandler:
        """Open a new connection for *req* (the pool had no idle one)."""
        return await super()._create_connection(req, traces, timeout)

    async def _create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> ResponseHandler:
        return await self.create_connection(req, traces, timeout)

    def idle_connections(self) -> dict[Any, Any] | None:
        """Return the idle kept-alive connections by endpoint key.

        The idle kept-alive connections by endpoint key (with ``host`` and
        ``port``), each a list of ``(protocol, released_at)``, oldest first;
        the pool's own dict, for closing some. None if aiohttp changed it.
        """
        pools = getattr(self, "_conns", None)
        return pools if isinstance(pools, dict) else None

    def connections_in_use(self) -> set[Any] | None:
        """Return the connections in use (and those being opened).

        None if aiohttp changed it.
        """
        acquired = getattr(self, "_acquired", None)
        return acquired if isinstance(acquired, set) else None


def disable_session_retry(session: aiohttp.ClientSession) -> None:
    """Keep *session* from sending an idempotent request again by itself.

    Keep *session* from sending an idempotent request again by itself
    after a disconnection (a private switch, read at each request since
    aiohttp 3.10).
    """
    if hasattr(session, "_retry_connection"):
        session._retry_connection = False
