"""``HostQueueScheduler``: a queue per host and a ring of ready hosts."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.utils.job import job_dir

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._config import HostQueueConfig, warn_unused_queue_settings
from scrapy_hostqueue._hosts import Hosts
from scrapy_hostqueue._job import Job
from scrapy_hostqueue._recorder import stat_key
from scrapy_hostqueue._requests import MAX_REQUEUES, AutoSlot, request_rank
from scrapy_hostqueue.exceptions import HostBlocked, HostGivenUp
from scrapy_hostqueue.frontier import open_frontier
from scrapy_hostqueue.frontier._jobdir import STATE_FILE

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from scrapy_hostqueue.frontier import Frontier, RequestStore

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_REQUEUES",
    "STATE_FILE",
    "HostBlocked",
    "HostGivenUp",
    "HostQueueScheduler",
]

_DOWNLOAD_SLOT = "download_slot"


class HostQueueScheduler(BaseScheduler):
    """A Scrapy scheduler with a queue per host that hands out requests of ready hosts only.

    A Scrapy scheduler that keeps a queue per host and hands out a request
    only for a host that is ready: it has queued work, fewer requests in flight
    than its limit, and is not blocked (Retry-After, back-off, download delay,
    Crawl-delay). Ready hosts take turns round-robin; at most
    ``HOSTQUEUE_MAX_ACTIVE_HOSTS`` hosts are worked on at once, each for a turn
    of up to ``HOSTQUEUE_TURN_REQUESTS`` requests.

    A request counts for its host from the moment :meth:`next_request` hands it
    out until it leaves the downloader, whatever its outcome, which holds the
    per-host limit at the server even where Scrapy's downloader does not.

    This class is the Scrapy glue: the dupefilter, the scheduler interface and
    the signals. The queues and per-host state live in a request store, made
    by the frontier ``HOSTQUEUE_FRONTIER`` picks (``scrapy_hostqueue.frontier``),
    that ``self.hosts`` (``scrapy_hostqueue._hosts.Hosts``) owns, with the
    record of every counted request and the send gate; the AIMD middleware
    and the stats extension use ``scheduler.hosts`` only. The job on disk (or
    in Redis) is the frontier's, through ``scrapy_hostqueue._job``.
    """

    def __init__(
        self,
        crawler: Crawler,
        dupefilter: BaseDupeFilter,
        config: HostQueueConfig,
        frontier: Frontier,
        jobdir: str | None = None,
    ) -> None:
        self.crawler = crawler
        self.df = dupefilter
        self.config = config
        self.jobdir = jobdir
        self.debug = crawler.settings.getbool("SCHEDULER_DEBUG")
        assert crawler.stats is not None
        self.stats = crawler.stats
        #: The frontier HOSTQUEUE_FRONTIER picked: it makes the store and
        #: keeps the job (in memory, a SQLite file or Redis).
        self.frontier = frontier
        self._enqueued_stat = f"scheduler/enqueued/{frontier.queue}"
        self._dequeued_stat = f"scheduler/dequeued/{frontier.queue}"
        #: The hosts: their store, the records of their requests, the send
        #: gate; what the other parts ask of and tell the scheduler.
        self.hosts = Hosts(
            crawler,
            config,
            functools.partial(frontier.make_store, dupefilter),
            debug=self.debug,
        )
        # The request path reads these directly, one attribute each.
        self._store: RequestStore[Request] = self.hosts.store
        self._records = self.hosts.records
        self._given_up = self.hosts.given_up_requests
        self._undo_hooks: list[Any] = []
        self._job = Job(crawler, frontier, jobdir)

    @classmethod
    @internals.refuses_at_start_up
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = HostQueueConfig.from_settings(crawler.settings)
        warn_unused_queue_settings(crawler.settings, logger)
        debug = crawler.settings.getbool("SCHEDULER_DEBUG")
        frontier = open_frontier(crawler, config, debug=debug)
        return cls(crawler, frontier.dupefilter(), config, frontier, job_dir(crawler.settings))

    # -- Scrapy scheduler interface ------------------------------------------

    def open(self, spider: Spider) -> Deferred[None] | None:
        self.spider = spider
        if not self._job.accept(spider):
            return None
        hosts = self.hosts
        hosts.open()
        connect = self.crawler.signals.connect
        self._undo_hooks = [
            internals.on_request_leaving_downloader(
                self.crawler, hosts.on_request_left, hosts.excused
            ),
            # A handed-out request is acknowledged once the engine is done with it.
            internals.on_request_done(self.crawler, self._store.ack),
        ]
        connect(hosts.on_reached_downloader, signal=signals.request_reached_downloader)
        # response_downloaded, not response_received: a 429 turned into a retry
        # by RetryMiddleware never reaches the engine, but it reached the host.
        connect(hosts.on_response_downloaded, signal=signals.response_downloaded)
        if hosts.autothrottle:
            connect(hosts.follow_autothrottle, signal=signals.response_downloaded)
        resumed, blocks = self._job.resume(self._push)
        cfg = self.config
        logger.info(
            "HostQueueScheduler: per-host limit %s (unless DOWNLOAD_SLOTS or the AIMD "
            "middleware set it), max active hosts %s, prefetch %s, delays owned by %s%s",
            cfg.default_concurrency,
            cfg.max_active_hosts or "unlimited",
            hosts.prefetch
            or (
                f"{hosts.slot_prefetch} (in Scrapy's downloader slot, unless the AIMD "
                "middleware runs)"
                if hosts.slot_prefetch
                else 0
            ),
            "AutoThrottle" if hosts.autothrottle else "the scheduler",
            (
                f", resumed {resumed:,} requests and {blocks:,} host blocks still in force"
                " from JOBDIR"
                if resumed or blocks
                else ""
            ),
        )
        return self.df.open()

    def close(self, reason: str) -> Deferred[None] | None:
        if reason == "finished":
            self._check_nothing_left()
        # Each duty runs whatever the others do: the dupefilter must close
        # (and write requests.seen) even if saving the queue failed.
        for duty in (
            self.hosts.stop,
            self._job.stop,
            self._unhook,
            self._save_job,
            # Before spider_closed, so that Spider.closed() and extensions
            # that read the stats at the end see the per-host keys.
            self.hosts.recorder.flush,
            self._store.close,
        ):
            try:
                duty()
            except Exception:
                logger.exception("HostQueueScheduler: error while closing (%s)", duty.__name__)
        return self._job.close(self.df, reason)

    def _check_nothing_left(self) -> None:
        """Check that a crawl that finished has nothing left in any part.

        A request left there was lost without a word (see ``scrapy_hostqueue._leftover``).
        """
        try:
            left = self.hosts.left_over()
        except Exception:
            logger.exception("HostQueueScheduler: error while checking what is left at close")
            return
        if not left.parts:
            return
        self.stats.set_value(stat_key("lost_at_close_count"), left.lost)
        logger.error(
            "HostQueueScheduler: the crawl finished with %d request(s) left in the "
            "scheduler, never downloaded: %s",
            left.lost,
            left.describe(),
        )

    def _unhook(self) -> None:
        for undo in self._undo_hooks:
            undo()
        self._undo_hooks = []

    def _save_job(self) -> None:
        unserializable = self._job.save(self._given_up)
        if unserializable:
            self.stats.inc_value("scheduler/unserializable", unserializable)

    def has_pending_requests(self) -> bool:
        return len(self._store) > 0 or bool(self._given_up)

    def __len__(self) -> int:
        return len(self._store) + len(self._given_up)

    def enqueue_request(self, request: Request) -> bool:
        if not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        return self._push(request)

    def _push(self, request: Request) -> bool:
        meta = request.meta
        if type(meta.get(_DOWNLOAD_SLOT)) is AutoSlot:
            # The slot the scheduler wrote at hand-out for the request this
            # one was built from: key it by its own URL again.
            del meta[_DOWNLOAD_SLOT]
        host = internals.host_key(self.crawler, request)
        if not self._store.push(host, request_rank(request), request):
            self.hosts.give_up_request(host, request)
        self.stats.inc_value(self._enqueued_stat)
        self.stats.inc_value("scheduler/enqueued")
        return True

    def next_request(self) -> Request | None:
        if self.hosts.paused:
            return None  # the monitor's controls; resuming wakes the engine
        if self._given_up:
            # No host limit: the AIMD middleware fails them at once.
            request = self.hosts.next_given_up()
            self.stats.inc_value(self._dequeued_stat)
            self.stats.inc_value("scheduler/dequeued")
            return request
        store = self._store
        popped = store.pop()
        if popped is None:
            if len(store):
                self.hosts.schedule_wakeup()
            return None
        host, request = popped
        state = store.host_state(host)
        # A host with an interval: its start holds the host's next one back;
        # if a downloader middleware answers it instead, Hosts.on_request_left
        # gives that wait back.
        self._records.hand_out(request, host, state.last_start if state.next_gap else None)
        meta = request.meta
        if _DOWNLOAD_SLOT not in meta:
            # The key the downloader would write there itself, marked so that
            # a request built from this one's meta does not inherit it.
            meta[_DOWNLOAD_SLOT] = AutoSlot(host)
        self.stats.inc_value(self._dequeued_stat)
        self.stats.inc_value("scheduler/dequeued")
        if self.debug:
            logger.debug(
                "Handing out %s (host %s, %d in flight)", request, host, store.in_flight(host)
            )
        return request
