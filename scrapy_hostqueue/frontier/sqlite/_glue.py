"""The SQLite frontier (``HOSTQUEUE_FRONTIER = "sqlite"``, the default with ``JOBDIR``).

Its Scrapy glue, the group-commit timer, and taking over a ``JOBDIR`` saved by the in-memory store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import call_later

from scrapy_hostqueue._recorder import stat_key
from scrapy_hostqueue.frontier._codec import RequestCodec
from scrapy_hostqueue.frontier._dupefilter import dupefilter_on
from scrapy_hostqueue.frontier._jobdir import JOBDIR_STATE_UNREADABLE, load_state, state_path
from scrapy_hostqueue.frontier.memory import MemoryStore
from scrapy_hostqueue.frontier.sqlite._store import FrontierFile, SqliteStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.utils.asyncio import CallLaterResult
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from scrapy_hostqueue.frontier import HostState, RequestStore

logger = logging.getLogger(__name__)

#: Seconds between two commits of the frontier file (group commit): after a
#: ``kill -9``, requests acknowledged in the last such window are fetched again.
COMMIT_INTERVAL = 0.5
#: The ``finish_reason`` of a crawl whose frontier file could not be written.
FRONTIER_WRITE_FAILED = "hostqueue_frontier_write_failed"


class SqliteFrontier:
    """The SQLite frontier.

    The store on a frontier file, which is the job (committed every :data:`COMMIT_INTERVAL`), and
    the seen fingerprints in it in place of ``requests.seen``. A ``hostqueue.state`` the in-memory
    store left in the ``JOBDIR`` is taken over into the file once.
    """

    queue = "disk"

    def __init__(
        self, crawler: Crawler, file: FrontierFile, jobdir: str | None, *, debug: bool
    ) -> None:
        assert crawler.stats is not None
        self._crawler = crawler
        self.file = file
        self._jobdir = jobdir
        self.codec: RequestCodec | None = RequestCodec(crawler.stats, debug)
        self._store: SqliteStore[Request] | None = None
        self._commits: CommitTimer | None = None

    @classmethod
    def open(cls, crawler: Crawler, path: str, jobdir: str | None, *, debug: bool) -> Self:
        """Open the frontier on the file at *path* and lock it."""
        return cls(crawler, FrontierFile(path), jobdir, debug=debug)

    def dupefilter(self) -> BaseDupeFilter:
        # The seen fingerprints live in the frontier file, committed with
        # their requests, instead of in JOBDIR/requests.seen.
        return dupefilter_on(self._crawler, self.file.seen)

    def make_store(
        self,
        dupefilter: BaseDupeFilter,
        state_factory: Callable[[str], HostState],
        **kwargs: Any,
    ) -> RequestStore[Request]:
        codec = self.codec
        assert codec is not None
        self._store = SqliteStore(
            MemoryStore(state_factory, **kwargs), self.file, codec.encode, codec.decode
        )
        return self._store

    def refusal(self) -> tuple[str, str] | None:
        return None

    def resume(
        self, spider: Spider, push: Callable[[Request], bool], refuse: Callable[[str], None]
    ) -> tuple[int, int]:
        """Start the frontier file's commits; take over a JOBDIR the in-memory store saved.

        Returns the requests resumed (no host blocks: the file keeps them with its hosts).
        """
        store = self._store
        assert self.codec is not None and store is not None
        self.codec.spider = spider
        resumed = store.resumed
        if self._jobdir:
            try:
                taken = take_over_saved_job(self._jobdir, store, push, spider)
            except Exception as error:
                logger.error(
                    "Cannot take over the job in JOBDIR %r: %s cannot be read (%s: %s). "
                    "The crawl closes before any request and leaves the file as it is. "
                    "Finish that job with HOSTQUEUE_FRONTIER = 'memory' (the store that "
                    "saved it), or delete %s to go on without its queued requests.",
                    self._jobdir,
                    state_path(self._jobdir),
                    type(error).__name__,
                    error,
                    state_path(self._jobdir),
                )
                refuse(JOBDIR_STATE_UNREADABLE)
                return resumed, 0
            if taken is not None:
                logger.info(
                    "Took over %d queued requests saved in %s into the frontier file %s",
                    taken,
                    state_path(self._jobdir),
                    store.file.path,
                )
                resumed += taken
        self._commits = CommitTimer(self._crawler, store)
        self._commits.start()
        logger.info(
            "HostQueueScheduler: frontier file %s (%s queued requests in it)",
            store.file.path,
            f"{len(store):,}",
        )
        return resumed, 0

    def stop(self) -> None:
        """Stop the frontier file's commits."""
        if self._commits is not None:
            self._commits.stop()

    def save(self, given_up: Iterable[tuple[str, Request]]) -> int:
        return 0  # every change is in the frontier file already

    def close(self, dupefilter: BaseDupeFilter, reason: str) -> Deferred[None] | None:
        return dupefilter.close(reason)  # type: ignore[no-any-return]


def _read_seen(path: str) -> list[bytes]:
    """Read the fingerprints in Scrapy's ``requests.seen``.

    The fingerprints in Scrapy's ``requests.seen`` (each a 2-byte
    big-endian length, then the fingerprint).
    """
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
    """Move a job the in-memory store saved in *jobdir* into the frontier file.

    Move a job the in-memory store saved in *jobdir* (``hostqueue.state``
    and ``requests.seen``) into the frontier file, then rename the state file
    ``hostqueue.state.imported``. Returns how many requests it took over,
    None if there was none; raises if the state file cannot be read.
    """
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
    """Commits the frontier file every :data:`COMMIT_INTERVAL` seconds.

    If a commit fails (a full disk), logs one ERROR line and closes the crawl: the file keeps its
    last commit, from which the crawl resumes.
    """

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
    "SqliteFrontier",
    "take_over_saved_job",
]
