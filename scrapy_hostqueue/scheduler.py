"""``HostQueueScheduler``: a queue per host and a ring of ready hosts."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.utils.asyncio import call_later
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.job import job_dir
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._config import HostQueueConfig, warn_unused_queue_settings
from scrapy_hostqueue._direct import DirectDownloads
from scrapy_hostqueue._frontier import (
    FrontierDupeFilter,
    RequestCodec,
    make_store,
    open_frontier,
    uses_scrapy_dupefilter,
)
from scrapy_hostqueue._job import Job
from scrapy_hostqueue._jobdir import STATE_FILE
from scrapy_hostqueue._overdue import OverdueRequests
from scrapy_hostqueue._recorder import get_recorder
from scrapy_hostqueue._redis_glue import LocalSeen, RedisFrontier
from scrapy_hostqueue._requests import MAX_REQUEUES, AutoSlot, RequestTable, request_rank
from scrapy_hostqueue.exceptions import HostBlocked, HostGivenUp
from scrapy_hostqueue.sendgate import SendGate, handlers_gate_sends
from scrapy_hostqueue.store import HostState, RequestStore

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.http import Response
    from scrapy.utils.asyncio import CallLaterResult
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from scrapy_hostqueue._contracts import PolicyHook
    from scrapy_hostqueue.store.sqlite import FrontierFile

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
    """A Scrapy scheduler that keeps a queue per host and hands out a request
    only for a host that is ready: it has queued work, fewer requests in flight
    than its limit, and is not blocked (Retry-After, back-off, download delay,
    Crawl-delay). Ready hosts take turns round-robin; at most
    ``HOSTQUEUE_MAX_ACTIVE_HOSTS`` hosts are worked on at once, each for a turn
    of up to ``HOSTQUEUE_TURN_REQUESTS`` requests.

    A request counts for its host from the moment :meth:`next_request` hands it
    out until it leaves the downloader, whatever its outcome, which holds the
    per-host limit at the server even where Scrapy's downloader does not.

    The queues and per-host state live in a request store (``RequestStore``,
    in ``scrapy_hostqueue.store``); each counted request has one record
    (``scrapy_hostqueue._requests``); the send gate (``SendGate``, in
    ``scrapy_hostqueue.sendgate``) holds the on-the-wire limit for the
    download handler. Requests that skip the scheduler are served by
    ``scrapy_hostqueue._direct``, the job on disk by ``scrapy_hostqueue._job``,
    overdue requests by ``scrapy_hostqueue._overdue``. This class is the
    Scrapy glue between them.
    """

    def __init__(  # noqa: PLR0917 - one optional store each
        self,
        crawler: Crawler,
        dupefilter: BaseDupeFilter,
        config: HostQueueConfig,
        jobdir: str | None = None,
        frontier: FrontierFile | None = None,
        redis: RedisFrontier | None = None,
    ) -> None:
        self.crawler = crawler
        self.df = dupefilter
        self.config = config
        self.jobdir = jobdir
        self.debug = crawler.settings.getbool("SCHEDULER_DEBUG")
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.recorder = get_recorder(crawler)
        self._autothrottle = crawler.settings.getbool("AUTOTHROTTLE_ENABLED")
        self._policy_hook: PolicyHook | None = None
        gate = handlers_gate_sends(crawler)
        self.prefetch = config.prefetch if gate else 0
        # Without the send gate the prefetched request waits in Scrapy's
        # downloader slot, which holds the limit as its concurrency (see
        # internals.hold_slot_concurrency). Not with the AIMD middleware (see
        # attach_policy).
        self._slot_prefetch = 0 if gate else config.prefetch
        # With a frontier file (JOBDIR, HOSTQUEUE_FRONTIER), the SQLite store.
        # With a Redis URL (HOSTQUEUE_FRONTIER), the Redis store.
        self._redis = redis
        shared = frontier is not None or redis is not None
        self._codec = RequestCodec(self.stats, self.debug) if shared else None
        self._queue_stat = "disk" if shared else "memory"
        ring: dict[str, Any] = {
            "max_active": config.max_active_hosts,
            "turn": config.turn_requests,
            "turn_seconds": config.turn_seconds,
            "grace": config.idle_grace,
            "prefetch": self.prefetch or self._slot_prefetch,
            # Without the send gate nothing downstream spaces the starts.
            "await_start": not self.prefetch,
            "remember": config.remember_hosts,
            # Across hosts only the priority counts: a host whose next request
            # is a start request takes its turn like any other.
            "ring_granularity": 2,
        }
        self._store: RequestStore[Request]
        if redis is None:
            self._store = make_store(frontier, self._codec, self._new_state, **ring)
        else:
            assert self._codec is not None
            self._store = redis.make_store(
                self._codec, self._fingerprint(dupefilter), self._new_state, **ring
            )
        self._records = RequestTable()
        self._budget = max(0, config.global_concurrency)
        self.gate = SendGate(
            self._store,
            self._records,
            self.recorder,
            enabled=bool(self.prefetch),
            backoff_codes=config.aimd_backoff_http_codes,
            may_send_back=self._may_send_back,
            room_changed=self._room_changed,
        )
        self._direct = DirectDownloads(
            self._store, self._records, self.gate, gated=bool(self.prefetch)
        )
        self._overdue = OverdueRequests(
            crawler,
            self._records,
            self._store,
            self.gate,
            self.recorder,
            gated=bool(self.prefetch),
            max_excused=config.max_overdue,
            debug=self.debug,
        )
        # Requests of given-up hosts on their way to their errbacks: queued
        # here, then handed out for the AIMD middleware to raise HostGivenUp.
        self._given_up: deque[tuple[str, Request]] = deque()
        self._wakeup: CallLaterResult | None = None
        self._wakeup_at = 0.0
        self._undo_hook: Any = None
        self._undo_done: Any = None
        self._job = Job(crawler, self._store, self._codec, jobdir, debug=self.debug)

    @classmethod
    @internals.refuses_at_start_up
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = HostQueueConfig.from_settings(crawler.settings)
        warn_unused_queue_settings(crawler.settings, logger)
        frontier = open_frontier(config.frontier_path)
        redis = RedisFrontier.open(crawler, config) if config.frontier_url else None
        dupefilter: BaseDupeFilter
        if redis is not None and uses_scrapy_dupefilter(crawler):
            # Each process drops its own duplicates; the push script in Redis
            # drops the others' (see _fingerprint).
            dupefilter = FrontierDupeFilter(crawler, LocalSeen())
        elif frontier is not None and uses_scrapy_dupefilter(crawler):
            # The seen fingerprints live in the frontier file, committed with
            # their requests, instead of in JOBDIR/requests.seen.
            dupefilter = FrontierDupeFilter(crawler, frontier.seen)
        else:
            dupefilter_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
            dupefilter = build_from_crawler(dupefilter_cls, crawler)
        return cls(crawler, dupefilter, config, job_dir(crawler.settings), frontier, redis)

    def _fingerprint(self, dupefilter: BaseDupeFilter) -> Any:
        """What the Redis store dedupes a request by across processes: its
        fingerprint, or None (not filtered) for ``dont_filter`` requests and
        crawls with a dupefilter of their own."""
        if not isinstance(dupefilter, FrontierDupeFilter):
            return lambda request: None
        fingerprinter = self.crawler.request_fingerprinter
        assert fingerprinter is not None

        def fingerprint(request: Request) -> bytes | None:
            return None if request.dont_filter else fingerprinter.fingerprint(request)

        return fingerprint

    # -- Scrapy scheduler interface ------------------------------------------

    def open(self, spider: Spider) -> Deferred[None] | None:
        self.spider = spider
        if not self._job.accept(spider):
            return None
        self.gate.register(self.crawler)
        self.recorder.host_view = self
        self._undo_hook = internals.on_request_leaving_downloader(
            self.crawler,
            self._request_left,
            self._overdue.excused if self.config.max_overdue else None,
        )
        # A handed-out request is acknowledged once the engine is done with it.
        self._undo_done = internals.on_request_done(self.crawler, self._store.ack)
        self.crawler.signals.connect(
            self._reached_downloader, signal=signals.request_reached_downloader
        )
        # response_downloaded, not response_received: a 429 turned into a retry
        # by RetryMiddleware never reaches the engine, but it reached the host.
        self.crawler.signals.connect(
            self._on_response_downloaded, signal=signals.response_downloaded
        )
        if self._autothrottle:
            self.crawler.signals.connect(
                self._follow_autothrottle, signal=signals.response_downloaded
            )
        cfg = self.config
        if self._redis is not None:
            assert self._codec is not None
            self._codec.spider = spider
            self._redis.start(lambda: internals.wake_engine(self.crawler))
            resumed = blocks = 0
        else:
            resumed, blocks = self._job.resume(self._push)
        logger.info(
            "HostQueueScheduler: per-host limit %s (unless DOWNLOAD_SLOTS or the AIMD "
            "middleware set it), max active hosts %s, prefetch %s, delays owned by %s%s",
            cfg.default_concurrency,
            cfg.max_active_hosts or "unlimited",
            self.prefetch
            or (
                f"{self._slot_prefetch} (in Scrapy's downloader slot, unless the AIMD "
                "middleware runs)"
                if self._slot_prefetch
                else 0
            ),
            "AutoThrottle" if self._autothrottle else "the scheduler",
            (
                f", resumed {resumed:,} requests and {blocks:,} host blocks still in force"
                " from JOBDIR"
                if resumed or blocks
                else ""
            ),
        )
        return self.df.open()

    def close(self, reason: str) -> Deferred[None] | None:
        # Each duty runs whatever the others do: the dupefilter must close
        # (and write requests.seen) even if saving the queue failed.
        for duty in (
            self._stop_timers,
            self._save_job,
            # Before spider_closed, so that Spider.closed() and extensions
            # that read the stats at the end see the per-host keys.
            self.recorder.flush,
            self._store.close,
        ):
            try:
                duty()
            except Exception:
                logger.exception("HostQueueScheduler: error while closing (%s)", duty.__name__)
        if self._redis is not None and self._job.opened:
            return deferred_from_coro(self._close_shared(reason))
        return self.df.close(reason)

    async def _close_shared(self, reason: str) -> None:
        """Hand back to the shared frontier what this process holds, then
        close the dupefilter."""
        assert self._redis is not None
        await self._redis.close(self.stats)
        closed = self.df.close(reason)
        if closed is not None:
            await maybe_deferred_to_future(closed)

    def _stop_timers(self) -> None:
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None
        self.gate.unregister(self.crawler)
        self._overdue.stop()
        self._job.stop()
        for undo in (self._undo_hook, self._undo_done):
            if undo is not None:
                undo()
        self._undo_hook = self._undo_done = None

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

    def next_request(self) -> Request | None:
        if self._given_up:
            # No host limit: the AIMD middleware fails them at once.
            host, request = self._given_up.popleft()
            self._records.give_up(request, host)
            self.stats.inc_value(f"scheduler/dequeued/{self._queue_stat}")
            self.stats.inc_value("scheduler/dequeued")
            return request
        store = self._store
        popped = store.pop()
        if popped is None:
            if len(store):
                self._schedule_wakeup()
            return None
        host, request = popped
        state = store.host_state(host)
        # A host with an interval: its start holds the host's next one back;
        # if a downloader middleware answers it instead, _request_left gives
        # that wait back.
        self._records.hand_out(request, host, state.last_start if state.next_gap else None)
        meta = request.meta
        if _DOWNLOAD_SLOT not in meta:
            # The key the downloader would write there itself, marked so that
            # a request built from this one's meta does not inherit it.
            meta[_DOWNLOAD_SLOT] = AutoSlot(host)
        self.stats.inc_value(f"scheduler/dequeued/{self._queue_stat}")
        self.stats.inc_value("scheduler/dequeued")
        if self.debug:
            logger.debug(
                "Handing out %s (host %s, %d in flight)", request, host, store.inflight(host)
            )
        return request

    @property
    def store(self) -> RequestStore[Request]:
        """The request store (for tests and diagnostics: the other parts of
        the package use the scheduler's methods)."""
        return self._store

    # -- HostView (stats) ----------------------------------------------------

    @property
    def active_hosts(self) -> int:
        return self._store.active

    @property
    def queued_requests(self) -> int:
        return len(self._store)

    def hosts(self) -> Iterator[tuple[str, int, int, HostState]]:
        return self._store.hosts()

    def known_state(self, host: str) -> HostState | None:
        return self._store.known_state(host)

    def in_flight_cap(self, state: HostState) -> int:
        return self._store.in_flight_cap(state)

    def overdue(self, host: str) -> int:
        """Requests of *host* in flight and overdue."""
        return self._store.overdue(host)

    def on_wire(self, host: str) -> int:
        """Requests of *host* sent and not yet answered: with prefetch, those
        past the send gate; without, those handed out and not yet back (with
        prefetch in the downloader slot, at most the limit of them)."""
        if self.prefetch:
            return self.gate.on_wire(host)
        inflight = self._store.inflight(host)
        if self._slot_prefetch:
            return min(inflight, self._store.host_state(host).limit)
        return inflight

    def sent_back_from_gate(self, request: Request) -> bool:
        """Whether *request* left the download handler because the send gate
        sent it back to the scheduler (its host got blocked), not because the
        download failed."""
        return request in self._records.sent_back

    # -- HostControl (the AIMD middleware) -------------------------------------

    def attach_policy(self, hook: PolicyHook) -> None:
        """Let *hook* choose the limit of every host from now on, and tell it
        when a host is forgotten.

        From then on a silent host (not heard from yet, or whose last request
        failed to connect or timed out) also gets one request at a time until
        it answers: an unknown host is sent no burst, and a dead or hanging
        one holds one download slot, not its whole limit. Only with a policy
        (the AIMD middleware), whose error budget gives up a host that never
        answers: without one, a dead host's every request is tried, and one
        at a time they would keep the crawl going long after the rest."""
        self._policy_hook = hook
        self._store.silent_limit = 1
        # A host's share of the budget among the active hosts caps it too.
        self._store.budget = self._budget
        # A request waiting in Scrapy's downloader slot is past the
        # middleware that holds a blocked host's requests back (a Retry-After
        # that comes in meanwhile): only the send gate can send it back.
        self._slot_prefetch = 0
        self._store.prefetch = self.prefetch
        self.gate.notes_status = True
        # It has answered once its response headers are in: a large first
        # download need not finish before the host gets its limit.
        self.crawler.signals.connect(self._headers_received, signal=signals.headers_received)
        self._store.on_forget = hook.forget_host
        # What the hook learned about a host lives in a store that outlives
        # the process (the SQLite store gives back the resumed hosts' now).
        self._store.export_learned = hook.learned
        self._store.import_learned = hook.relearn
        self._overdue.start(hook)

    def host_of(self, request: Request) -> str:
        return internals.host_key(self.crawler, request)

    def host_state(self, host: str) -> HostState:
        return self._store.host_state(host)

    def inflight(self, host: str) -> int:
        return self._store.inflight(host)

    def handed_out(self, request: Request) -> bool:
        """Whether *request* was handed out by :meth:`next_request` and has not
        left the downloader yet."""
        return self._records.handed_out(request) is not None

    def handed_out_for(self, request: Request) -> str | None:
        """The host *request* was handed out for (and counts for), or None if
        it was not handed out or has left the downloader."""
        record = self._records.handed_out(request)
        return None if record is None else record.host

    def is_full(self, host: str) -> bool:
        return self._store.is_full(host)

    def note_full(self, host: str, now: float) -> None:
        self._store.note_full(host, now)

    def requeues(self, request: Request) -> int:
        return self._records.requeues(request)

    def requeued(self, old: Request, new: Request) -> None:
        self._records.requeued(old, new)

    def host_silent(self, host: str) -> None:
        """*host*'s last request failed to connect or timed out: until it
        answers again, hosts that answer go before it (see the store)."""
        self._store.set_answering(host, False)

    def set_limit(self, host: str, limit: int) -> None:
        self._store.set_limit(host, limit)
        internals.apply_to_slot(self.crawler, host, concurrency=limit + self.prefetch)
        self.recorder.limit_changed(host, limit)
        self._room_changed(host)

    def block_until(self, host: str, when: float, reason: str) -> None:
        """Start no request for *host* before *when* (``time.monotonic()``);
        its requests waiting at the send gate go back to the queue."""
        self._store.block_until(host, when, reason)
        self.gate.blocked(host, when, reason)

    def set_interval(self, host: str, interval: float) -> None:
        """Minimum time between two request starts on *host*, without jitter
        (a robots.txt Crawl-delay is a minimum)."""
        self._store.set_interval(host, interval, jitter=0.0)

    def give_up(self, host: str) -> int:
        """Refuse the requests of *host*: those queued, returned (their
        number), and any that come later. Each is handed out once more, for
        the AIMD middleware to fail it with :class:`HostGivenUp`, so that its
        errback hears of it."""
        dropped = self._store.give_up(host)
        self._given_up.extend((host, request) for request in dropped)
        if dropped:
            internals.wake_engine(self.crawler)
        return len(dropped)

    def given_up_host(self, request: Request) -> str | None:
        """The host of *request* if it was handed out only to fail with
        HostGivenUp (its host was given up)."""
        record = self._records.get(request)
        if record is None or not record.given_up:
            return None
        self._records.leave(request)
        return record.host

    def host_given_up(self, host: str) -> bool:
        """Whether *host* was given up (see :meth:`give_up`)."""
        state = self._store.known_state(host)
        return state is not None and state.given_up

    # -- requests it did not hand out (see scrapy_hostqueue._direct) ---------

    def direct_delay(self, host: str, now: float, *, spacing: bool = True) -> float:
        return self._direct.delay(host, now, spacing=spacing)

    def has_room(self, host: str) -> bool:
        return self._direct.has_room(host)

    async def wait_for_room(self, host: str, timeout: float) -> bool:
        return await self._direct.wait_for_room(host, timeout)

    def adopt(self, request: Request, host: str, now: float) -> None:
        self._direct.adopt(request, host, now)

    def _room_changed(self, host: str) -> None:
        """*host* may have more on the wire now (a send slot freed, a higher
        limit, its first answer): let through what waits for that."""
        self.gate.open(host)
        self._direct.wake(host)

    def _may_send_back(self, request: Request) -> bool:
        """Whether a request held at the send gate by a block may go back to
        the scheduler: only the AIMD middleware (the policy hook) takes it
        there, at most MAX_REQUEUES times."""
        return self._policy_hook is not None and self._records.requeues(request) < MAX_REQUEUES

    # -- internals -----------------------------------------------------------

    def _new_state(self, host: str) -> HostState:
        concurrency, delay, jitter = internals.configured_slot(self.crawler.settings, host)
        limit = max(1, concurrency)
        if self._policy_hook is not None:
            limit = self._policy_hook.initial_limit(host, limit)
        self.recorder.host_seen(host)
        if self._autothrottle:
            # AutoThrottle owns slot.delay; the scheduler follows it (see
            # _follow_autothrottle) instead of applying DOWNLOAD_DELAY twice.
            delay = 0.0
        return HostState(limit, delay, jitter)

    def _push(self, request: Request) -> bool:
        meta = request.meta
        if type(meta.get(_DOWNLOAD_SLOT)) is AutoSlot:
            # The slot the scheduler wrote at hand-out for the request this
            # one was built from: key it by its own URL again.
            del meta[_DOWNLOAD_SLOT]
        host = internals.host_key(self.crawler, request)
        if not self._store.push(host, request_rank(request), request):
            self.recorder.requests_dropped(host)
            if self.debug:
                logger.debug("Refusing %s: host %s was given up", request, host)
            self._given_up.append((host, request))
        self.stats.inc_value(f"scheduler/enqueued/{self._queue_stat}")
        self.stats.inc_value("scheduler/enqueued")
        return True

    def _request_left(self, request: Request) -> None:
        self.gate.forget_status(request)
        record = self._records.get(request)
        if record is None:
            return
        host = record.host
        if self.debug:
            logger.debug("%s left the downloader (host %s, %s)", request, host, record.stage.value)
        if record.given_up:
            # Answered or refused by a downloader middleware before the AIMD
            # one: never counted.
            self._records.leave(request)
            return
        if record.unsent_at is not None:
            # Answered or refused by a downloader middleware (a cache hit,
            # robots.txt): it never went to the host.
            self._store.unstart(host, record.unsent_at)
        # The per-host request stats are taken here, off the engine's
        # next_request path: every request handed out leaves exactly once,
        # and the in-flight counts just before a leave reach every
        # high-water mark the hand-outs set.
        self.recorder.request_done(host, self._store.inflight(host), self._store.active)
        if record.on_wire:
            self.gate.release(request)
        elif not self.prefetch:
            # A request stops being on the wire when it gives back its send
            # slot, or, without the send gate, when it leaves.
            self.recorder.in_flight_seen(host, self.on_wire(host))
        self._records.leave(request)
        self._store.finish(host, record.overdue)
        self._overdue.left(record)
        self._direct.wake(host)

    def _reached_downloader(self, request: Request, spider: Spider) -> None:
        key = internals.host_key(self.crawler, request)
        # Before Scrapy queues it in its downloader slot.
        internals.hold_slot_concurrency(self.crawler, key)
        record = self._records.handed_out(request)
        if record is None:
            # robots.txt, media pipelines: the slot may exist since this
            # request only, with Scrapy's delay. Left there, that delay would
            # make the downloader hold the host's first handed-out request
            # (a page waiting for robots.txt) a whole delay in the downloader,
            # holding the global budget, while the scheduler counts the delay
            # from handing it out: the next page would follow at once.
            if not self._autothrottle:
                internals.apply_to_slot(self.crawler, key, delay=0.0)
            return
        host = record.host
        if not self.prefetch:
            # Without the send gate it goes to the host from here.
            record.sent_at = time.monotonic()
            if self._policy_hook is not None:
                # Only the AIMD middleware asks has_room.
                self._records.count_on_the_way(record)
        if record.unsent_at is not None:
            # It starts now, not when handed out: a downloader middleware may
            # have held it (for robots.txt), together with none of the host's
            # next requests, which wait for this (the store's await_start).
            unsent_at, record.unsent_at = record.unsent_at, None
            self._store.started(host, unsent_at, time.monotonic())
            self._schedule_wakeup()
        # Scrapy recreates garbage-collected slots from the settings: re-apply
        # the host's current limit, and keep delays out of the downloader,
        # where a waiting request would hold the global budget.
        internals.apply_to_slot(
            self.crawler,
            host,
            concurrency=self._store.host_state(host).limit + self.prefetch,
            delay=None if self._autothrottle else 0.0,
        )

    def _on_response_downloaded(self, response: Response, request: Request, spider: Spider) -> None:
        host = internals.host_key(self.crawler, request)
        self.recorder.response(host, response.status, request.meta.get("download_latency"))
        if self._policy_hook is not None:
            # First: a 429 blocks the host before its first answer gives it
            # its limit.
            self._policy_hook.learn(request, response)
        # It answered: it goes before hosts not heard from (see the store).
        self.answered(request)

    def _headers_received(self, request: Request, headers: Any = None, **_: Any) -> None:
        # Not at a 429 or 503: the host gets its limit when the whole answer
        # is in, once the AIMD middleware has blocked it. The add-on's handler
        # tells the status before this signal; with other handlers such an
        # answer mostly carries a Retry-After.
        record = self._records.get(request)
        if record is not None:
            # Answered: a long body is not a hung request.
            record.sent_at = None
        backoff = self.gate.take_status_read(request)
        if backoff:
            return
        if backoff is None and headers is not None and b"Retry-After" in headers:
            return
        host = self.answered(request)
        if host is None:
            return
        # Its response is not in yet, so nothing else makes the engine ask
        # for its next request, nor opens its send gate.
        internals.wake_engine(self.crawler)
        self._room_changed(host)

    def answered(self, request: Request) -> str | None:
        """*request* was answered: its host may now have its whole limit in
        flight. The host it was handed out (or adopted) for, which a
        downloader middleware after the AIMD one may have given another
        download_slot (a proxy's). Returns that host if it was silent."""
        record = self._records.get(request)
        host = record.host if record is not None and not record.given_up else self.host_of(request)
        state = self._store.known_state(host)
        if state is None or state.answering:
            return None
        self._store.set_answering(host, True)
        return host

    def _follow_autothrottle(self, response: Response, request: Request, spider: Spider) -> None:
        host = internals.host_key(self.crawler, request)
        delay = internals.slot_delay(self.crawler, host)
        if delay is not None:
            self._store.set_interval(host, delay)

    def _schedule_wakeup(self) -> None:
        when = self._store.next_wakeup()
        if when is None:
            return
        if self._wakeup is not None:
            if self._wakeup_at <= when:
                return
            self._wakeup.cancel()
        self._wakeup_at = when
        self._wakeup = call_later(max(0.0, when - time.monotonic()), self._woken)

    def _woken(self) -> None:
        self._wakeup = None
        internals.wake_engine(self.crawler)
