"""Scrapy glue of the SQLite store: which store a crawl gets, how a request
becomes bytes, the dupefilter on the frontier file, the group-commit timer,
and taking over a ``JOBDIR`` saved by the in-memory store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.dupefilters import BaseDupeFilter, RFPDupeFilter
from scrapy.utils.asyncio import call_later
from scrapy.utils.misc import load_object
from scrapy.utils.request import request_from_dict

from scrapy_hostqueue._recorder import stat_key
from scrapy_hostqueue.frontier._jobdir import load_state, state_path
from scrapy_hostqueue.frontier.memory import MemoryStore
from scrapy_hostqueue.frontier.sqlite._file import FRONTIER_FILE
from scrapy_hostqueue.frontier.sqlite._store import FrontierFile, SqliteStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.asyncio import CallLaterResult

    from scrapy_hostqueue.frontier import HostState, RequestStore

logger = logging.getLogger(__name__)

#: Seconds between two commits of the frontier file (group commit): after a
#: ``kill -9``, requests acknowledged in the last such window are fetched again.
COMMIT_INTERVAL = 0.5
#: The ``finish_reason`` of a crawl whose frontier file could not be written.
FRONTIER_WRITE_FAILED = "hostqueue_frontier_write_failed"


def open_frontier(path: str | None) -> FrontierFile | None:
    """The frontier file at *path* (see ``HostQueueConfig.frontier_path``),
    opened and locked; None for the in-memory store."""
    return None if path is None else FrontierFile(path)


def memory_job_refusal(jobdir: str | None) -> str | None:
    """Why the in-memory store refuses *jobdir*: it holds a frontier file,
    whose requests the in-memory store would not see. None if it does not."""
    if not jobdir:
        return None
    path = os.path.join(jobdir, FRONTIER_FILE)
    if not os.path.exists(path):
        return None
    return (
        f"JOBDIR {jobdir!r} holds the frontier file {path}, which the in-memory store "
        "(HOSTQUEUE_FRONTIER = 'memory') does not read: resumed with it, the crawl "
        "would lose the requests queued there. Finish this job with "
        "HOSTQUEUE_FRONTIER = 'sqlite' (the default with JOBDIR), or start a new JOBDIR."
    )


class RequestCodec:
    """Requests to bytes and back, as Scrapy's disk queues store them: the
    dict of ``Request.to_dict``, pickled, which ``request_from_dict`` reads.
    For a plain :class:`~scrapy.Request`, the fields equal to the defaults of
    its constructor are left out of the dict (``request_from_dict`` gives
    them their defaults again): a request a spider follows has a URL and a
    callback, and the 13 fields cost more than twice the time to write and to
    read. A request that cannot be pickled (a ``meta`` holding a response, a
    selector) stays in memory only, counted in ``scheduler/unserializable``,
    as with Scrapy's own scheduler."""

    def __init__(self, stats: StatsCollector, debug: bool) -> None:
        self.spider: Spider | None = None
        self._stats = stats
        self._debug = debug
        self._warned = False
        # The spider's method names by function, as Request.to_dict finds them.
        self._names: dict[Any, str] = {}

    def encode(self, request: Request) -> bytes | None:
        try:
            return pickle.dumps(self._to_dict(request), protocol=4)
        except Exception:
            self._stats.inc_value("scheduler/unserializable")
            if self._debug or not self._warned:
                self._warned = True
                logger.warning(
                    "Unable to serialize request %s: it is kept in memory only, and "
                    "lost if the crawl dies (this warning is shown once; "
                    "SCHEDULER_DEBUG=True shows all)",
                    request,
                )
            return None

    def _to_dict(self, request: Request) -> dict[str, Any]:
        """``request.to_dict(spider=self.spider)`` (less the defaults of a
        plain Request), with the names of the spider's methods used as
        callbacks remembered: ``to_dict`` finds each by listing the spider's
        members (``inspect.getmembers``) on every call, which cost more than
        the rest of the frontier's work for a request. Anything but a method
        already named goes through ``to_dict`` itself."""
        callback, errback = request.callback, request.errback
        try:
            d: dict[str, Any] = {"url": request.url}
            if callback is not None:
                d["callback"] = self._name(callback) if callable(callback) else callback
            if errback is not None:
                d["errback"] = self._name(errback) if callable(errback) else errback
        except KeyError:
            d = request.to_dict(spider=self.spider)
            for func, name in ((callback, d["callback"]), (errback, d["errback"])):
                if callable(func) and isinstance(name, str):
                    self._names[func.__func__] = name  # type: ignore[union-attr]
            return _lean(d) if type(request) is Request else d
        if type(request) is not Request:
            # A subclass's fields and defaults are its own: all of them.
            d["headers"] = dict(request.headers)
            for attr in request.attributes:
                d.setdefault(attr, getattr(request, attr))
            d["_class"] = request.__module__ + "." + request.__class__.__name__
            return d
        if request.method != "GET":
            d["method"] = request.method
        headers = request.headers
        if headers:
            d["headers"] = dict(headers)
        if request.body:
            d["body"] = request.body
        for attr in ("cookies", "meta", "flags", "cb_kwargs"):
            value = getattr(request, attr)
            if value:
                d[attr] = value
        if request.encoding != "utf-8":
            d["encoding"] = request.encoding
        if request.priority:
            d["priority"] = request.priority
        if request.dont_filter:
            d["dont_filter"] = request.dont_filter
        return d

    def _name(self, method: Any) -> str:
        """The name of the spider's *method* if known (KeyError if not)."""
        name = self._names[getattr(method, "__func__", None)]
        if getattr(getattr(self.spider, name, None), "__func__", None) is not method.__func__:
            del self._names[method.__func__]  # the spider changed since
            raise KeyError(name)
        return name

    def decode(self, data: bytes) -> Request:
        d = pickle.loads(data)  # our own file
        if "_class" in d:
            return request_from_dict(d, spider=self.spider)
        # request_from_dict for a plain Request, without its pass over the keys.
        spider = self.spider
        if spider is not None:
            for key in ("callback", "errback"):
                name = d.get(key)
                if name:
                    d[key] = _method(spider, name)
        return Request(**d)


#: What ``Request.to_dict`` gives for a plain Request's fields left at their
#: defaults (see RequestCodec._to_dict).
_DEFAULTS: dict[str, Any] = {
    "callback": None,
    "errback": None,
    "method": "GET",
    "headers": {},
    "body": b"",
    "cookies": {},
    "meta": {},
    "encoding": "utf-8",
    "priority": 0,
    "dont_filter": False,
    "flags": [],
    "cb_kwargs": {},
}


def _lean(d: dict[str, Any]) -> dict[str, Any]:
    """*d* (a plain Request's ``to_dict``) without the fields at their defaults."""
    return {
        key: value for key, value in d.items() if key not in _DEFAULTS or value != _DEFAULTS[key]
    }


def _method(spider: Spider, name: Any) -> Any:
    """The spider's method *name*, as ``request_from_dict`` finds it."""
    try:
        return getattr(spider, str(name))
    except AttributeError:
        raise ValueError(f"Method {name!r} not found in: {spider}") from None


def make_store(
    frontier: FrontierFile | None,
    codec: RequestCodec | None,
    state_factory: Callable[[str], HostState],
    **kwargs: Any,
) -> RequestStore[Request]:
    """The in-memory store, or with *frontier*, the SQLite store on it."""
    if frontier is None or codec is None:
        return MemoryStore(state_factory, **kwargs)
    return SqliteStore(MemoryStore(state_factory, **kwargs), frontier, codec.encode, codec.decode)


def uses_scrapy_dupefilter(crawler: Crawler) -> bool:
    """Whether the crawl uses Scrapy's own dupefilter (whose ``requests.seen``
    the frontier file replaces)."""
    return load_object(crawler.settings["DUPEFILTER_CLASS"]) is RFPDupeFilter


class FrontierDupeFilter(BaseDupeFilter):
    """Scrapy's ``RFPDupeFilter`` on the frontier file instead of
    ``requests.seen``: a fingerprint becomes durable in the same commit as
    its request, and the seen set stays on disk."""

    def __init__(self, crawler: Crawler, seen: Callable[[bytes], bool]) -> None:
        assert crawler.request_fingerprinter is not None
        self._fingerprinter = crawler.request_fingerprinter
        self._seen = seen
        self._stats = crawler.stats
        self.debug = crawler.settings.getbool("DUPEFILTER_DEBUG")
        self._logdupes = True

    def request_seen(self, request: Request) -> bool:
        return self._seen(self._fingerprinter.fingerprint(request))

    def log(self, request: Request, spider: Spider) -> None:
        if self.debug or self._logdupes:
            logger.debug(
                "Filtered duplicate request: %s%s",
                request,
                ""
                if self.debug
                else " - no more duplicates will be shown "
                "(see DUPEFILTER_DEBUG to show all duplicates)",
            )
            self._logdupes = False
        if self._stats is not None:
            self._stats.inc_value("dupefilter/filtered")


def _read_seen(path: str) -> list[bytes]:
    """The fingerprints in Scrapy's ``requests.seen`` (each a 2-byte
    big-endian length, then the fingerprint)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    out, pos = [], 0
    while pos + 2 <= len(data):
        size = int.from_bytes(data[pos : pos + 2], "big")
        out.append(data[pos + 2 : pos + 2 + size])
        pos += 2 + size
    return out


def take_over_saved_job(
    jobdir: str, store: SqliteStore[Request], push: Callable[[Request], bool], spider: Spider
) -> int | None:
    """Move a job the in-memory store saved in *jobdir* (``hostqueue.state``
    and ``requests.seen``) into the frontier file, then rename the state file
    ``hostqueue.state.imported``. Returns how many requests it took over,
    None if there was none; raises if the state file cannot be read."""
    path = state_path(jobdir)
    saved = load_state(path, spider)
    if saved is None:
        return None
    store.file.add_fingerprints(_read_seen(os.path.join(jobdir, "requests.seen")))
    for request in saved.requests:
        push(request)
    for host, until, reason in saved.blocks:
        store.block_until(host, until, reason)
    for host, when in saved.spacing:
        store.space_until(host, when)
    store.commit()
    os.replace(path, f"{path}.imported")
    return len(saved.requests)


class CommitTimer:
    """Commits the frontier file every :data:`COMMIT_INTERVAL` seconds; if a
    commit fails (a full disk), logs one ERROR line and closes the crawl:
    the file keeps its last commit, from which the crawl resumes."""

    def __init__(self, crawler: Crawler, store: SqliteStore[Request]) -> None:
        self._crawler = crawler
        self._store = store
        self._call: CallLaterResult | None = None
        self.failed = False

    def start(self) -> None:
        self._call = call_later(COMMIT_INTERVAL, self._tick)

    def stop(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None
        failure = self._store.file.failed
        if failure is not None and not self.failed:
            # The crawl ended before the next commit could tell.
            self.failed = True
            logger.error("The crawl stops: the frontier file %s", failure)

    def _tick(self) -> None:
        self._call = None
        started = time.monotonic()
        try:
            self._store.commit()
        except Exception as error:
            self.failed = True
            logger.error("The crawl stops: the frontier file %s", error)
            self._close_crawl()
            return
        if self._crawler.stats is not None:
            self._crawler.stats.max_value(
                stat_key("max_frontier_commit_seconds"), round(time.monotonic() - started, 4)
            )
        self.start()

    def _close_crawl(self) -> None:
        engine = self._crawler.engine
        task = asyncio.ensure_future(engine.close_spider_async(reason=FRONTIER_WRITE_FAILED))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)


__all__ = [
    "COMMIT_INTERVAL",
    "FRONTIER_WRITE_FAILED",
    "CommitTimer",
    "FrontierDupeFilter",
    "RequestCodec",
    "make_store",
    "memory_job_refusal",
    "open_frontier",
    "take_over_saved_job",
    "uses_scrapy_dupefilter",
]
