"""The crawl's job on disk: what a crawl resumes from and leaves behind.

With the in-memory store, ``JOBDIR/hostqueue.state`` (see ``_jobdir``) is read
at the start and written at a graceful stop. With the SQLite store, the
frontier file is the job: it is committed every ``COMMIT_INTERVAL`` (see
``_frontier``), and a ``hostqueue.state`` the in-memory store left is taken
over into it once. A ``JOBDIR`` this crawl cannot resume without losing
requests is refused: the crawl closes before its first request and leaves
the job as it was. With the Redis store, the job is the shared crawl in
Redis: this process joins it at the start and hands back what it holds at
the stop.

The dupefilter belongs to the job too (:func:`make_dupefilter`,
:func:`shared_fingerprint`): Scrapy's own keeps ``requests.seen`` in the
``JOBDIR``, the SQLite store keeps the fingerprints in its frontier file,
the Redis store in Redis.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from scrapy import signals
from scrapy.exceptions import CloseSpider
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue.frontier._jobdir import load_state, save_state, scrapy_job_refusal, state_path
from scrapy_hostqueue.frontier.sqlite._glue import (
    CommitTimer,
    FrontierDupeFilter,
    memory_job_refusal,
    take_over_saved_job,
    uses_scrapy_dupefilter,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred

    from scrapy_hostqueue.frontier import RequestStore
    from scrapy_hostqueue.frontier.redis._glue import RedisFrontier
    from scrapy_hostqueue.frontier.sqlite._glue import RequestCodec
    from scrapy_hostqueue.frontier.sqlite._store import FrontierFile, SqliteStore

logger = logging.getLogger(__name__)

#: The ``finish_reason`` of a crawl that refused its JOBDIR.
JOBDIR_OF_SCRAPY_SCHEDULER = "hostqueue_jobdir_of_scrapy_scheduler"
#: The ``finish_reason`` of a crawl whose ``JOBDIR/hostqueue.state`` cannot be
#: read (damaged, from another version, or naming a callback the spider no
#: longer has): it closes before any request, and the file is left as it was.
JOBDIR_STATE_UNREADABLE = "hostqueue_jobdir_state_unreadable"
#: The ``finish_reason`` of a crawl with the in-memory store on a JOBDIR that
#: holds a frontier file: it closes before any request, the file as it was.
JOBDIR_OF_SQLITE_FRONTIER = "hostqueue_jobdir_of_sqlite_frontier"


def make_dupefilter(
    crawler: Crawler, frontier: FrontierFile | None, redis: RedisFrontier | None
) -> BaseDupeFilter:
    """The crawl's dupefilter: ``DUPEFILTER_CLASS``, or in place of Scrapy's
    own, the same filter on the frontier file, or in front of Redis."""
    if redis is not None and uses_scrapy_dupefilter(crawler):
        # Each process drops its own duplicates; the push script in Redis
        # drops the others' (see shared_fingerprint).
        return FrontierDupeFilter(crawler, redis.seen)
    if frontier is not None and uses_scrapy_dupefilter(crawler):
        # The seen fingerprints live in the frontier file, committed with
        # their requests, instead of in JOBDIR/requests.seen.
        return FrontierDupeFilter(crawler, frontier.seen)
    dupefilter_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
    return build_from_crawler(dupefilter_cls, crawler)  # type: ignore[no-any-return]


def shared_fingerprint(
    crawler: Crawler, dupefilter: BaseDupeFilter
) -> Callable[[Request], bytes | None]:
    """What the Redis store dedupes a request by across processes: its
    fingerprint, or None (not filtered) for ``dont_filter`` requests and
    crawls with a dupefilter of their own."""
    if not isinstance(dupefilter, FrontierDupeFilter):
        return lambda request: None
    fingerprinter = crawler.request_fingerprinter
    assert fingerprinter is not None

    def fingerprint(request: Request) -> bytes | None:
        return None if request.dont_filter else fingerprinter.fingerprint(request)

    return fingerprint


class Job:
    """Opens, resumes and saves the job of a crawl with *store* (in
    *jobdir*, in *frontier*, the SQLite store's file, or with *redis* in a
    shared crawl; encoded by *codec*)."""

    def __init__(
        self,
        crawler: Crawler,
        store: RequestStore[Request],
        codec: RequestCodec | None,
        jobdir: str | None,
        *,
        frontier: FrontierFile | None = None,
        redis: RedisFrontier | None = None,
        debug: bool,
    ) -> None:
        self._crawler = crawler
        self._store = store
        self._frontier = frontier
        self._codec = codec
        self.jobdir = jobdir
        self._redis = redis
        self._debug = debug
        self._spider: Spider | None = None
        self._commits: CommitTimer | None = None
        #: The finish reason when the crawl must close before its first
        #: request (a JOBDIR it cannot resume), else None.
        self.refusal: str | None = None

    @property
    def _store_saves_itself(self) -> bool:
        """Whether the store keeps every change (in its file or in Redis),
        rather than the job saving it at the stop."""
        return self._frontier is not None or self._redis is not None

    @property
    def opened(self) -> bool:
        """Whether the crawl was accepted (:meth:`accept`)."""
        return self._spider is not None

    def accept(self, spider: Spider) -> bool:
        """Whether the crawl may go on with this JOBDIR; if not, it is
        refused (see :meth:`refuse`)."""
        refusal = scrapy_job_refusal(self.jobdir)
        if refusal is not None:
            logger.error(refusal)
            self.refuse(JOBDIR_OF_SCRAPY_SCHEDULER)
            return False
        if not self._store_saves_itself:
            refusal = memory_job_refusal(self.jobdir)
            if refusal is not None:
                logger.error(refusal)
                self.refuse(JOBDIR_OF_SQLITE_FRONTIER)
                return False
        self._spider = spider
        return True

    def resume(self, push: Callable[[Request], bool]) -> tuple[int, int]:
        """Queue what the job saved with *push* (its requests, already seen
        by the dupefilter) and restore its host blocks and spacing; start the
        frontier file's commits, or join the shared crawl. Returns the
        requests resumed and the host blocks still in force."""
        assert self._spider is not None
        if self._redis is not None:
            assert self._codec is not None
            self._codec.spider = self._spider
            self._redis.start(lambda: internals.wake_engine(self._crawler))
            return 0, 0
        if self._frontier is not None:
            # make_store built the SQLite store on this file.
            return self._open_frontier(cast("SqliteStore[Request]", self._store), push), 0
        if not self.jobdir:
            return 0, 0
        path = state_path(self.jobdir)
        try:
            saved = load_state(path, self._spider)
        except Exception as error:
            # Closed before any request, without saving over the file: the
            # job is left as it was, for the user to mend or drop.
            logger.error(
                "Cannot resume the job in JOBDIR %r: %s cannot be read (%s: %s). "
                "The crawl closes before any request and leaves the file as it is. If "
                "the spider lost a callback that queued requests name, give it "
                "back; otherwise start a new JOBDIR, or delete %s to start "
                "this job again from its start requests, losing the requests "
                "queued in it (the dupefilter's requests.seen filters every "
                "request it has seen before).",
                self.jobdir,
                path,
                type(error).__name__,
                error,
                path,
            )
            self.refuse(JOBDIR_STATE_UNREADABLE)
            return 0, 0
        if saved is None:
            return 0, 0
        for request in saved.requests:
            push(request)
        for host, until, reason in saved.blocks:
            self._store.block_until(host, until, reason)
        for host, when in saved.spacing:
            self._store.space_until(host, when)
        return len(saved.requests), len(saved.blocks)

    def _open_frontier(self, store: SqliteStore[Request], push: Callable[[Request], bool]) -> int:
        """Start the frontier file's commits; take over a JOBDIR the in-memory
        store saved. Returns the requests resumed."""
        assert self._codec is not None and self._spider is not None
        self._codec.spider = self._spider
        resumed = store.resumed
        if self.jobdir:
            try:
                taken = take_over_saved_job(self.jobdir, store, push, self._spider)
            except Exception as error:
                logger.error(
                    "Cannot take over the job in JOBDIR %r: %s cannot be read (%s: %s). "
                    "The crawl closes before any request and leaves the file as it is. "
                    "Finish that job with HOSTQUEUE_FRONTIER = 'memory' (the store that "
                    "saved it), or delete %s to go on without its queued requests.",
                    self.jobdir,
                    state_path(self.jobdir),
                    type(error).__name__,
                    error,
                    state_path(self.jobdir),
                )
                self.refuse(JOBDIR_STATE_UNREADABLE)
                return resumed
            if taken is not None:
                logger.info(
                    "Took over %d queued requests saved in %s into the frontier file %s",
                    taken,
                    state_path(self.jobdir),
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
        return resumed

    def refuse(self, reason: str) -> None:
        """Close the crawl with *reason* once every component is open (the
        engine's way for a spider_opened handler that raises CloseSpider),
        before any request; :meth:`save` then leaves the job as it was."""
        self.refusal = reason
        self._crawler.signals.connect(self._close_refused, signal=signals.spider_opened)

    def _close_refused(self, spider: Spider) -> None:
        assert self.refusal is not None
        raise CloseSpider(self.refusal)

    def stop(self) -> None:
        """Stop the frontier file's commits."""
        if self._commits is not None:
            self._commits.stop()

    def close(self, dupefilter: BaseDupeFilter, reason: str) -> Deferred[None] | None:
        """Close *dupefilter*, in a shared crawl once this process has handed
        back what it holds."""
        if self._redis is not None and self.opened:
            return deferred_from_coro(self._close_shared(dupefilter, reason))
        return dupefilter.close(reason)  # type: ignore[no-any-return]

    async def _close_shared(self, dupefilter: BaseDupeFilter, reason: str) -> None:
        assert self._redis is not None
        await self._redis.close(self._crawler.stats)
        closed = dupefilter.close(reason)
        if closed is not None:
            await maybe_deferred_to_future(closed)

    def save(self, given_up: Iterable[tuple[str, Request]]) -> int:
        """At the stop, write what the in-memory store holds (and *given_up*,
        the requests of given-up hosts) to the JOBDIR. Returns how many
        requests could not be serialised."""
        if self._store_saves_itself:
            return 0  # every change is in the frontier file or Redis already
        if not (self.jobdir and self._spider is not None and self.refusal is None):
            return 0
        path = state_path(self.jobdir)
        try:
            return save_state(path, self._store, given_up, self._spider, debug=self._debug)
        except Exception:
            logger.exception(
                "Could not save the queued requests to %s: they are lost at this "
                "stop (requests.seen keeps their links from being found again "
                "when the job resumes)",
                path,
            )
            return 0


__all__ = [
    "JOBDIR_OF_SCRAPY_SCHEDULER",
    "JOBDIR_OF_SQLITE_FRONTIER",
    "JOBDIR_STATE_UNREADABLE",
    "Job",
    "make_dupefilter",
    "shared_fingerprint",
]
