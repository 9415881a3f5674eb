"""``HostQueueScheduler``: a queue per host and a ring of ready hosts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import Request, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import CloseSpider, IgnoreRequest
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.asyncio import call_later
from scrapy.utils.job import job_dir
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.request import request_from_dict

from scrapy_hostqueue import _gc
from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue._frontier import Frontier, HostPolicy
from scrapy_hostqueue.handler import AiohttpDownloadHandler
from scrapy_hostqueue.stats import get_recorder

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.http import Response
    from scrapy.settings import BaseSettings
    from scrapy.utils.asyncio import CallLaterResult
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: File in JOBDIR holding the queued requests and host blocks of a stopped crawl.
STATE_FILE = "hostqueue.state"
#: 2: every request pickled on its own (version 1 pickled their dicts in one
#: go, so one request that could not be pickled lost the whole state).
_STATE_VERSION = 2
_READABLE_STATE_VERSIONS = (1, 2)
#: ``request.meta`` key: how many times the request was sent back to the
#: scheduler because its host had become blocked or too recent.
META_REQUEUED = "hostqueue_requeued"
#: A request is sent back to the scheduler at most this many times.
MAX_REQUEUES = 3
#: ``request.meta`` key set at hand-out on a request without
#: ``meta["download_slot"]``: the slot the downloader then writes there is the
#: URL's, and a copy of the request for another URL (a redirect, a request
#: built from ``response.meta``) must not inherit it.
META_AUTO_SLOT = "hostqueue_auto_slot"
_DOWNLOAD_SLOT = "download_slot"


class HostBlocked(IgnoreRequest):
    """Raised at the send gate for a request whose host got blocked (a
    Retry-After, a back-off) while the request waited there; the AIMD
    middleware sends it back to the scheduler, which holds it until the block
    ends.

    Downloader middlewares ordered above the AIMD middleware see it in their
    ``process_exception`` first. It is not a failure of the host or of a
    proxy: a subclass of Scrapy's ``IgnoreRequest``, which middlewares that
    handle download failures (retries, proxy bans) leave alone. Such a
    middleware must return None for it, so that the request reaches the AIMD
    middleware and goes back to the queue.
    """

    def __init__(self, host: str, reason: str | None) -> None:
        super().__init__(f"host {host} is blocked ({reason}): the request goes back to the queue")
        self.host = host
        self.reason = reason


class HostGivenUp(IgnoreRequest):
    """What the errback of a request gets when its host was given up (too
    many connection failures in a row, see ``HOSTQUEUE_ERROR_MAX_COOLDOWNS``):
    the request was queued when that happened, or came later. A subclass of
    Scrapy's ``IgnoreRequest``, as for requests robots.txt forbids.

    ``last_error`` names the host's last failure
    (``"DownloadConnectionRefusedError: ..."``, ``"HTTP 503"``), or is None if
    it is no longer known.
    """

    def __init__(self, host: str, last_error: str | None = None) -> None:
        message = f"host {host} was given up after repeated connection failures"
        if last_error:
            message += f" (last: {last_error})"
        super().__init__(message)
        self.host = host
        self.last_error = last_error


class PolicyHook(Protocol):
    """What the AIMD middleware provides: the limit of a host the scheduler
    meets, and the moment the scheduler forgets a host (so that what the
    middleware learned about it is kept exactly as long)."""

    def initial_limit(self, host: str, configured: int) -> int: ...

    def forget_host(self, host: str) -> None: ...

    def response_downloaded(self, request: Request, response: Response) -> None: ...


def request_rank(request: Request) -> int:
    """Serving order within a host: higher priority first, and among equal
    priorities other requests before start requests, as Scrapy's own scheduler
    does. Across hosts, only the priority (``rank // 2``) counts."""
    return request.priority * 2 + (0 if request.meta.get("is_start_request") else 1)


#: Scrapy's queue classes, which this scheduler does not use.
UNUSED_QUEUE_SETTINGS = (
    "SCHEDULER_PRIORITY_QUEUE",
    "SCHEDULER_MEMORY_QUEUE",
    "SCHEDULER_DISK_QUEUE",
    "SCHEDULER_START_MEMORY_QUEUE",
    "SCHEDULER_START_DISK_QUEUE",
)


def _warn_unused_queue_settings(settings: BaseSettings) -> None:
    """One line naming the queue settings the project set, since this
    scheduler keeps its own queues and would silently ignore them: INFO when
    each is a FIFO queue class (the breadth-first recipe of Scrapy's docs,
    which these queues already follow), else a WARNING."""
    default = SETTINGS_PRIORITIES["default"]
    named = [name for name in UNUSED_QUEUE_SETTINGS if (settings.getpriority(name) or 0) > default]
    if not named:
        return
    fifo = all("Fifo" in getattr(settings[name], "__name__", str(settings[name])) for name in named)
    logger.log(
        logging.INFO if fifo else logging.WARNING,
        "%s: not used by HostQueueScheduler, which keeps a queue per host, "
        "FIFO among requests of the same priority (set DEPTH_PRIORITY to "
        "crawl breadth-first, > 0, or depth-first, < 0)",
        ", ".join(named),
    )


#: The ``finish_reason`` of a crawl that refused its JOBDIR.
JOBDIR_OF_SCRAPY_SCHEDULER = "hostqueue_jobdir_of_scrapy_scheduler"
#: The ``finish_reason`` of a crawl whose ``JOBDIR/hostqueue.state`` cannot be
#: read (damaged, from another version, or naming a callback the spider no
#: longer has): it closes before any request, and the file is left as it was.
JOBDIR_STATE_UNREADABLE = "hostqueue_jobdir_state_unreadable"


def _scrapy_job_refusal(jobdir: str | None) -> str | None:
    """Why a JOBDIR is refused: Scrapy's own scheduler left requests queued in
    it, which this scheduler cannot read, and the dupefilter's
    ``requests.seen`` would keep the crawl from finding them again, so they
    would be lost without a word. None if it is not."""
    if not jobdir:
        return None
    path = os.path.join(jobdir, "requests.queue", "active.json")
    try:
        with open(path, encoding="utf-8") as f:
            queued = json.load(f)
    except (OSError, ValueError):
        return None  # none (or nothing readable) to lose
    if not queued:
        return None
    return (
        f"JOBDIR {jobdir!r} holds requests queued by Scrapy's own scheduler "
        f"({os.path.join(jobdir, 'requests.queue')}), which HostQueueScheduler "
        "cannot read: resumed with it, the crawl would lose them (the "
        "dupefilter's requests.seen keeps their links from being found again). "
        "Finish this job with the scheduler that started it, or start a new "
        "JOBDIR; to resume it with HostQueueScheduler anyway, losing those "
        "requests, delete that directory."
    )


def _count_down(counts: dict[str, int], key: str) -> None:
    """One fewer for *key* in a table of per-host counts that keeps no zeros."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def _handlers_gate_sends(crawler: Crawler) -> bool:
    """Whether the http and https handlers call :meth:`HostQueueScheduler.acquire_send_slot`
    (this project's handler does), which prefetch needs to hold the limit."""
    handlers = crawler.settings.getwithbase("DOWNLOAD_HANDLERS")
    for scheme in ("http", "https"):
        path = handlers.get(scheme)
        if not path:
            return False
        try:
            cls = load_object(path) if isinstance(path, str) else path
        except (ImportError, NameError, ValueError):
            return False
        if not (isinstance(cls, type) and issubclass(cls, AiohttpDownloadHandler)):
            return False
    return True


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
    """

    def __init__(
        self,
        crawler: Crawler,
        dupefilter: BaseDupeFilter,
        config: HostQueueConfig,
        jobdir: str | None = None,
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
        gate = _handlers_gate_sends(crawler)
        self.prefetch = config.prefetch if gate else 0
        # Without the send gate the prefetched request waits in Scrapy's
        # downloader slot, which holds the limit as its concurrency (see
        # internals.hold_slot_concurrency). Not with the AIMD middleware (see
        # attach_policy).
        self._slot_prefetch = 0 if gate else config.prefetch
        self.frontier: Frontier[Request] = Frontier(
            self._new_policy,
            max_active=config.max_active_hosts,
            turn=config.turn_requests,
            grace=config.idle_grace,
            prefetch=self.prefetch or self._slot_prefetch,
            # Without the send gate nothing downstream spaces the starts.
            await_start=not self.prefetch,
            remember=config.remember_hosts,
            # Across hosts only the priority counts: a host whose next request
            # is a start request takes its turn like any other.
            ring_granularity=2,
        )
        # The send gate (used only with prefetch): requests past it per host,
        # and the requests waiting for it.
        self._sending: dict[str, int] = {}
        self._holding: set[Request] = set()
        # Requests the send gate sent back to the scheduler (HostBlocked),
        # until they are gone.
        self._sent_back: weakref.WeakSet[Request] = weakref.WeakSet()
        # Requests whose back-off status (429, 503) the handler has read and
        # the AIMD middleware has not seen yet, and how many per host: the
        # host sends nothing more until it has blocked the host.
        self._backing_off: set[Request] = set()
        self._backing_off_hosts: dict[str, int] = {}
        # The request whose status the handler read last and whether it asks
        # to back off, for the headers_received signal it sends next (see
        # status_read).
        self._status_read: tuple[Request, bool] | None = None
        self._send_waiters: dict[str, deque[tuple[asyncio.Future[None], Request]]] = {}
        self._gate_timers: dict[str, CallLaterResult] = {}
        self._handed_out: dict[Request, str] = {}
        # Requests that did not come from next_request but count for their
        # host (see adopt), and those waiting to (see wait_for_room).
        self._adopted: dict[Request, str] = {}
        self._room_waiters: dict[str, deque[asyncio.Future[None]]] = {}
        # Without the send gate: requests counted for a host that have
        # reached the download handler (or, not from next_request, passed the
        # AIMD middleware), and how many per host (see has_room).
        self._reached: dict[Request, str] = {}
        self._reached_per_host: dict[str, int] = {}
        # Handed-out requests of hosts with an interval between starts that
        # have not reached the downloader yet: (host, when handed out).
        self._unsent: dict[Request, tuple[str, float]] = {}
        # Requests of given-up hosts on their way to their errbacks: queued
        # here, then handed out (``_refusing``) for the AIMD middleware to
        # raise HostGivenUp.
        self._refused: deque[tuple[str, Request]] = deque()
        self._refusing: dict[Request, str] = {}
        self._wakeup: CallLaterResult | None = None
        self._wakeup_at = 0.0
        self._undo_hook: Any = None
        self._logged_unserializable = False
        # The finish reason when the crawl must close before its first
        # request (a JOBDIR this scheduler cannot resume), else None.
        self._refusal: str | None = None
        self._gc_held = False
        self._gc_threshold_raised = False
        self._opened = False

    @classmethod
    @internals.refuses_at_start_up
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = HostQueueConfig.from_settings(crawler.settings)
        _warn_unused_queue_settings(crawler.settings)
        dupefilter_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
        return cls(
            crawler,
            build_from_crawler(dupefilter_cls, crawler),
            config,
            job_dir(crawler.settings),
        )

    # -- Scrapy scheduler interface ------------------------------------------

    def open(self, spider: Spider) -> Deferred[None] | None:
        self.spider = spider
        refusal = _scrapy_job_refusal(self.jobdir)
        if refusal is not None:
            logger.error(refusal)
            self._refuse(JOBDIR_OF_SCRAPY_SCHEDULER)
            return None
        self._opened = True
        self._undo_hook = internals.on_request_leaving_downloader(self.crawler, self._request_left)
        self.crawler.signals.connect(
            self._reached_downloader, signal=signals.request_reached_downloader
        )
        # response_downloaded, not response_received: a 429 turned into a retry
        # by RetryMiddleware never reaches the engine, but it reached the host.
        self.crawler.signals.connect(self._response_downloaded, signal=signals.response_downloaded)
        if self._autothrottle:
            self.crawler.signals.connect(
                self._follow_autothrottle, signal=signals.response_downloaded
            )
        cfg = self.config
        gc_note = ""
        if cfg.gc_freeze:
            # Everything alive now (Scrapy, the spider, the components) lives
            # as long as the crawl: out of full garbage collections with it.
            # Before loading JOBDIR requests, which do not live that long.
            gc_note = f", {_gc.hold():,} start-up objects frozen out of full GC passes"
            self._gc_held = True
        if cfg.gc_young_threshold:
            young = _gc.raise_young_threshold(cfg.gc_young_threshold)
            self._gc_threshold_raised = True
            if young:  # 0: automatic collection was off, and stays off
                gc_note += f", young GC generation collected every {young:,} allocations"
        resumed = blocks = 0
        if self.jobdir:
            try:
                resumed, blocks = self._load_state()
            except Exception as error:
                # Closed before any request, without saving over the file:
                # the job is left as it was, for the user to mend or drop.
                logger.error(
                    "Cannot resume the job in JOBDIR %r: %s cannot be read (%s: %s). "
                    "The crawl closes before any request and leaves the file as it is. If "
                    "the spider lost a callback that queued requests name, give it "
                    "back; otherwise start a new JOBDIR, or delete %s to start "
                    "this job again from its start requests, losing the requests "
                    "queued in it (the dupefilter's requests.seen filters every "
                    "request it has seen before).",
                    self.jobdir,
                    self._state_path(),
                    type(error).__name__,
                    error,
                    self._state_path(),
                )
                self._refuse(JOBDIR_STATE_UNREADABLE)
        logger.info(
            "HostQueueScheduler: per-host limit %s (unless DOWNLOAD_SLOTS or the AIMD "
            "middleware set it), max active hosts %s, prefetch %s, delays owned by %s%s%s",
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
            gc_note,
        )
        return self.df.open()

    def _refuse(self, reason: str) -> None:
        """Close the crawl with *reason* once every component is open (the
        engine's way for a spider_opened handler that raises CloseSpider),
        before any request; close() then leaves the job as it was."""
        self._refusal = reason
        self.crawler.signals.connect(self._refuse_job, signal=signals.spider_opened)

    def _refuse_job(self, spider: Spider) -> None:
        assert self._refusal is not None
        raise CloseSpider(self._refusal)

    def close(self, reason: str) -> Deferred[None] | None:
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None
        for timer in self._gate_timers.values():
            timer.cancel()
        self._gate_timers.clear()
        if self._undo_hook is not None:
            self._undo_hook()
            self._undo_hook = None
        if self.jobdir and self._opened and self._refusal is None:
            try:
                self._save_state()
            except Exception:
                # The rest of the closing still runs: the dupefilter must
                # write requests.seen whatever happened here.
                logger.exception(
                    "Could not save the queued requests to %s: they are lost at this "
                    "stop (requests.seen keeps their links from being found again "
                    "when the job resumes)",
                    self._state_path(),
                )
        if self._gc_held:
            self._gc_held = False
            _gc.release()
        if self._gc_threshold_raised:
            self._gc_threshold_raised = False
            _gc.restore_young_threshold()
        # Before spider_closed, so that Spider.closed() and extensions that
        # read the stats at the end see the per-host keys.
        self.recorder.flush()
        return self.df.close(reason)

    def has_pending_requests(self) -> bool:
        return len(self.frontier) > 0 or bool(self._refused)

    def __len__(self) -> int:
        return len(self.frontier) + len(self._refused)

    def enqueue_request(self, request: Request) -> bool:
        if not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)
            return False
        return self._push(request)

    def next_request(self) -> Request | None:
        if self._refused:
            # No host limit: the AIMD middleware fails them at once.
            host, request = self._refused.popleft()
            self._refusing[request] = host
            self.stats.inc_value("scheduler/dequeued/memory")
            self.stats.inc_value("scheduler/dequeued")
            return request
        popped = self.frontier.pop()
        if popped is None:
            if len(self.frontier):
                self._schedule_wakeup()
            return None
        host, request = popped
        self._handed_out[request] = host
        policy = self.frontier.policy(host)
        if policy.next_gap:
            # Its start holds the host's next one back by the interval; if a
            # downloader middleware answers it instead, _request_left gives
            # that wait back.
            self._unsent[request] = (host, policy.last_start)
        meta = request.meta
        if _DOWNLOAD_SLOT not in meta:
            meta[META_AUTO_SLOT] = True
        self.stats.inc_value("scheduler/dequeued/memory")
        self.stats.inc_value("scheduler/dequeued")
        if self.debug:
            logger.debug(
                "Handing out %s (host %s, %d in flight)",
                request,
                host,
                self.frontier.inflight(host),
            )
        return request

    # -- API for the AIMD middleware -------------------------------------------

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
        self.frontier.silent_limit = 1
        # A request waiting in Scrapy's downloader slot is past the
        # middleware that holds a blocked host's requests back (a Retry-After
        # that comes in meanwhile): only the send gate can send it back.
        self._slot_prefetch = 0
        self.frontier.prefetch = self.prefetch
        # It has answered once its response headers are in: a large first
        # download need not finish before the host gets its limit.
        self.crawler.signals.connect(self._headers_received, signal=signals.headers_received)
        self.frontier.on_forget = hook.forget_host

    def host_of(self, request: Request) -> str:
        return internals.host_key(self.crawler, request)

    def handed_out(self, request: Request) -> bool:
        """Whether *request* was handed out by :meth:`next_request` and has not
        left the downloader yet."""
        return request in self._handed_out

    def handed_out_for(self, request: Request) -> str | None:
        """The host *request* was handed out for (and counts for), or None if
        it was not handed out or has left the downloader."""
        return self._handed_out.get(request)

    def host_busy(self, host: str) -> bool:
        """Whether *host* has requests handed out and not yet done."""
        return self.frontier.inflight(host) > 0

    def policy(self, host: str) -> HostPolicy:
        return self.frontier.policy(host)

    def on_wire(self, host: str) -> int:
        """Requests of *host* sent and not yet answered: with prefetch, those
        past the send gate; without, those handed out and not yet back (with
        prefetch in the downloader slot, at most the limit of them)."""
        if self.prefetch:
            return self._sending.get(host, 0)
        inflight = self.frontier.inflight(host)
        if self._slot_prefetch:
            return min(inflight, self.frontier.policy(host).limit)
        return inflight

    def host_silent(self, host: str) -> None:
        """*host*'s last request failed to connect or timed out: until it
        answers again, hosts that answer go before it (see Frontier)."""
        self.frontier.set_answering(host, False)

    def set_limit(self, host: str, limit: int) -> None:
        self.frontier.set_limit(host, limit)
        internals.apply_to_slot(self.crawler, host, concurrency=limit + self.prefetch)
        self.recorder.limit_changed(host, limit)
        self._room_changed(host)

    # -- the send gate (prefetch) ----------------------------------------------

    async def acquire_send_slot(self, request: Request) -> None:
        """Wait until *request*'s host may have one more request on the wire.

        With ``HOSTQUEUE_PREFETCH`` the scheduler hands a host up to that many
        requests beyond its limit, so that the next one is already waiting
        next to the connection pool when a response completes instead of
        crossing the engine first. The download handler calls this just
        before sending; the slot is freed when the handler has read the
        response (:meth:`response_downloaded`), or, for a back-off status or
        an error, when the request leaves the downloader (by then the AIMD
        middleware, which learns from a response as it comes in, has blocked
        the host for its Retry-After, before the next request may go).
        """
        if not self.prefetch:
            return
        host = self._handed_out.get(request)
        if host is None or request in self._holding:
            return
        waiters = self._send_waiters.get(host)
        if not waiters and self._may_send(host):
            self._take_send_slot(host, request)
            return
        policy = self.frontier.policy(host)
        if policy.blocked_until > time.monotonic() and self._may_send_back(request):
            raise self._send_back(request, host, policy.block_reason)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if waiters is None:
            waiters = self._send_waiters[host] = deque()
        waiters.append((future, request))
        self._open_gate(host)
        await future

    def status_read(self, request: Request, status: int) -> None:
        """The handler has read *request*'s status line, before its headers
        go out in ``headers_received`` and before its body. A status that
        asks the host to back off (429, 503) closes the host's send gate at
        once: a silent host gets its limit at its first headers, and a slow
        or large body must not let its limit through before the AIMD
        middleware has blocked the host."""
        backoff = status in self.config.aimd_backoff_http_codes
        if self._policy_hook is not None:
            self._status_read = (request, backoff)
        if backoff and request in self._holding:
            self._hold_back(request)

    def response_downloaded(self, request: Request, status: int) -> None:
        """The handler has read *request*'s whole response: free its send slot
        now, before the response crosses the downloader middlewares, unless
        the status asks the host to back off. Then the host sends nothing
        until that request leaves the downloader (the AIMD middleware blocks
        the host for its Retry-After as the response comes in): another of
        its requests finishing meanwhile must not let the next one through."""
        if request not in self._holding or request in self._backing_off:
            return
        if status in self.config.aimd_backoff_http_codes:
            self._hold_back(request)
        else:
            self._release_send_slot(self._holder(request), request)

    def _holder(self, request: Request) -> str:
        """The host *request*, past the send gate, holds a send slot of."""
        host = self._handed_out.get(request)
        return self._adopted[request] if host is None else host

    def _hold_back(self, request: Request) -> None:
        """Keep *request*'s host from sending until *request*, whose status
        asks it to back off, leaves the downloader (see response_downloaded)."""
        if request in self._backing_off:
            return  # its status read again (a download sent once more)
        host = self._holder(request)
        self._backing_off.add(request)
        self._backing_off_hosts[host] = self._backing_off_hosts.get(host, 0) + 1

    def _may_send(self, host: str) -> bool:
        policy = self.frontier.policy(host)
        return (
            self._sending.get(host, 0) < self.frontier.in_flight_cap(policy)
            and _gate_opens_at(policy) <= time.monotonic()
            and host not in self._backing_off_hosts
        )

    def _send_back(self, request: Request, host: str, reason: str | None) -> HostBlocked:
        """The exception that sends *request*, held at the send gate, back to
        the scheduler (see sent_back_from_gate)."""
        self._sent_back.add(request)
        return HostBlocked(host, reason)

    def _may_send_back(self, request: Request) -> bool:
        """Whether a request held at the send gate by a block may go back to
        the scheduler: only the AIMD middleware (the policy hook) takes it
        there, at most MAX_REQUEUES times."""
        return self._policy_hook is not None and request.meta.get(META_REQUEUED, 0) < MAX_REQUEUES

    def _take_send_slot(self, host: str, request: Request) -> None:
        self._sending[host] = self._sending.get(host, 0) + 1
        self._holding.add(request)
        self.frontier.policy(host).last_sent = time.monotonic()

    def _release_send_slot(self, host: str, request: Request) -> None:
        self._holding.discard(request)
        if request in self._backing_off:
            self._backing_off.discard(request)
            _count_down(self._backing_off_hosts, host)
        self.recorder.in_flight_seen(host, self.on_wire(host))
        _count_down(self._sending, host)
        self._room_changed(host)

    def _open_gate(self, host: str) -> None:
        waiters = self._send_waiters.get(host)
        while waiters and self._may_send(host):
            future, request = waiters.popleft()
            if not future.done():  # a cancelled download gave up its turn
                self._take_send_slot(host, request)
                future.set_result(None)
        if not waiters:
            self._send_waiters.pop(host, None)
            return
        opens_at = _gate_opens_at(self.frontier.policy(host))
        if opens_at > time.monotonic() and host not in self._gate_timers:
            self._gate_timers[host] = call_later(
                opens_at - time.monotonic(), self._gate_timer, host
            )

    def _gate_timer(self, host: str) -> None:
        self._gate_timers.pop(host, None)
        self._open_gate(host)

    def block_until(self, host: str, when: float, reason: str) -> None:
        """Start no request for *host* before *when* (``time.monotonic()``).

        Requests of *host* waiting at the send gate go back to the scheduler
        (see :class:`HostBlocked`) rather than wait there for the block's end,
        holding download budget and keeping the crawl from closing.
        """
        self.frontier.block_until(host, when, reason)
        waiters = self._send_waiters.get(host)
        if not waiters or when <= time.monotonic():
            return
        staying: deque[tuple[asyncio.Future[None], Request]] = deque()
        for future, request in waiters:
            if future.done():  # a cancelled download
                continue
            if self._may_send_back(request):
                future.set_exception(self._send_back(request, host, reason))
            else:
                staying.append((future, request))
        if staying:
            self._send_waiters[host] = staying
        else:
            del self._send_waiters[host]

    def set_interval(self, host: str, interval: float) -> None:
        """Minimum time between two request starts on *host*, without jitter
        (a robots.txt Crawl-delay is a minimum)."""
        self.frontier.set_interval(host, interval, jitter=0.0)

    def give_up(self, host: str) -> int:
        """Refuse the requests of *host*: those queued, returned (their
        number), and any that come later. Each is handed out once more, for
        the AIMD middleware to fail it with :class:`HostGivenUp`, so that its
        errback hears of it."""
        dropped = self.frontier.give_up(host)
        self._refused.extend((host, request) for request in dropped)
        if dropped:
            internals.wake_engine(self.crawler)
        return len(dropped)

    def refused_host(self, request: Request) -> str | None:
        """The host of *request* if it was handed out only to be refused
        (its host was given up)."""
        if not self._refusing:
            return None
        return self._refusing.pop(request, None)

    # -- requests it did not hand out -------------------------------------------
    #
    # ``engine.download_async`` requests (media pipelines, robots.txt, a
    # spider's own downloads) reach the downloader without next_request. The
    # AIMD middleware holds them until their host may take one more
    # (direct_delay, has_room, wait_for_room), then they count for the host
    # like a handed-out request (adopt) until they leave the downloader.

    def direct_delay(self, host: str, now: float, *, spacing: bool = True) -> float:
        """Seconds such a request must wait before it starts on *host*: until
        the host's block ends and, with *spacing*, its interval since the last
        start has passed."""
        policy = self.frontier.policy(host)
        when = policy.ready_at() if spacing else policy.blocked_until
        if spacing and self.prefetch:
            when = max(when, _gate_opens_at(policy))
        return when - now if when > now else 0.0

    def host_given_up(self, host: str) -> bool:
        """Whether *host* was given up (see :meth:`give_up`)."""
        policy = self.frontier.known_policy(host)
        return policy is not None and policy.given_up

    def has_room(self, host: str) -> bool:
        """Whether *host* may have one more request on the wire now.

        With the send gate, against the requests past it. Without, against
        the host's limit, every request handed out and not back counted, and
        a silent host's one request at a time against those that reached the
        download handler (or were adopted) only: a handed-out request may
        still be in a downloader middleware, perhaps waiting for this very
        download (a login or token middleware), and a host not heard from yet
        would keep such a download waiting for its first answer, which waits
        for the download."""
        if self.prefetch:
            return self._may_send(host)
        frontier = self.frontier
        policy = frontier.policy(host)
        reached = self._reached_per_host.get(host, 0)
        return frontier.inflight(host) < policy.limit and reached < frontier.in_flight_cap(policy)

    async def wait_for_room(self, host: str, timeout: float) -> bool:
        """Wait until a request of *host* leaves the downloader or its limit
        changes (True), or *timeout* seconds (False)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._room_waiters.get(host)
        if waiters is None:
            waiters = self._room_waiters[host] = deque()
        waiters.append(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            if not future.done():
                future.cancel()
                # Not woken: leave no stale entry behind.
                waiters.remove(future)
                if not waiters and self._room_waiters.get(host) is waiters:
                    del self._room_waiters[host]
        return True

    def adopt(self, request: Request, host: str, now: float) -> None:
        """Count *request*, which did not come from next_request, for *host*
        from now until it leaves the downloader."""
        self.frontier.adopt(host, now)
        self._adopted[request] = host
        if self.prefetch:
            self._take_send_slot(host, request)
        else:
            # From now: several let through at once would not all reach the
            # download handler before the next asks (an async middleware).
            self._count_on_the_way(host, request)

    def _count_on_the_way(self, host: str, request: Request) -> None:
        """Without the send gate: *request* counts against a silent host's
        one at a time (see has_room) until it leaves the downloader."""
        self._reached[request] = host
        self._reached_per_host[host] = self._reached_per_host.get(host, 0) + 1

    def _room_changed(self, host: str) -> None:
        """*host* may have more on the wire now (a send slot freed, a higher
        limit, its first answer): let through what waits for that."""
        if host in self._send_waiters:
            self._open_gate(host)
        if host in self._room_waiters:
            self._wake_room_waiters(host)

    def _wake_room_waiters(self, host: str) -> None:
        waiters = self._room_waiters.pop(host, None)
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)

    # -- internals -----------------------------------------------------------

    def _new_policy(self, host: str) -> HostPolicy:
        concurrency, delay, jitter = internals.configured_slot(self.crawler.settings, host)
        limit = max(1, concurrency)
        if self._policy_hook is not None:
            limit = self._policy_hook.initial_limit(host, limit)
        self.recorder.host_seen(host)
        if self._autothrottle:
            # AutoThrottle owns slot.delay; the scheduler follows it (see
            # _follow_autothrottle) instead of applying DOWNLOAD_DELAY twice.
            delay = 0.0
        return HostPolicy(limit, delay, jitter)

    def _push(self, request: Request) -> bool:
        meta = request.meta
        if meta.pop(META_AUTO_SLOT, None):
            # The downloader keyed this request (or the one it was copied
            # from) by its URL: key it by its own URL again.
            meta.pop(_DOWNLOAD_SLOT, None)
        host = internals.host_key(self.crawler, request)
        if not self.frontier.push(host, request_rank(request), request):
            self.recorder.requests_dropped(host)
            if self.debug:
                logger.debug("Refusing %s: host %s was given up", request, host)
            self._refused.append((host, request))
        self.stats.inc_value("scheduler/enqueued/memory")
        self.stats.inc_value("scheduler/enqueued")
        return True

    def _request_left(self, request: Request) -> None:
        if self._status_read is not None and self._status_read[0] is request:
            # Its headers_received never came (a body over DOWNLOAD_MAXSIZE).
            self._status_read = None
        if self._reached:
            reached = self._reached.pop(request, None)
            if reached is not None:
                _count_down(self._reached_per_host, reached)
        if self._refusing:
            # One that a middleware before the AIMD one answered or refused.
            self._refusing.pop(request, None)
        host = self._handed_out.pop(request, None)
        if host is None:
            # Or one the AIMD middleware adopted (it skipped next_request).
            if not self._adopted:
                return
            host = self._adopted.pop(request, None)
            if host is None:
                return
        elif self._unsent:
            unsent = self._unsent.pop(request, None)
            if unsent is not None:
                # Answered or refused by a downloader middleware (a cache
                # hit, robots.txt): it never went to the host.
                self.frontier.unstart(*unsent)
        # The per-host request stats are taken here, off the engine's
        # next_request path: every request handed out leaves exactly once,
        # and the in-flight counts just before a leave reach every
        # high-water mark the hand-outs set.
        self.recorder.request_done(host, self.frontier.inflight(host), self.frontier.active)
        if request in self._holding:
            self._release_send_slot(host, request)
        elif not self.prefetch:
            # A request stops being on the wire when it gives back its
            # send slot, or, without the send gate, when it leaves.
            self.recorder.in_flight_seen(host, self.on_wire(host))
        self.frontier.finish(host)
        if self._room_waiters:
            self._wake_room_waiters(host)

    def _reached_downloader(self, request: Request, spider: Spider) -> None:
        key = internals.host_key(self.crawler, request)
        # Before Scrapy queues it in its downloader slot.
        internals.hold_slot_concurrency(self.crawler, key)
        host = self._handed_out.get(request)
        if host is not None and not self.prefetch and self._policy_hook is not None:
            # Only the AIMD middleware asks has_room.
            self._count_on_the_way(host, request)
        if host is None:
            # robots.txt, media pipelines: the slot may exist since this
            # request only, with Scrapy's delay. Left there, that delay would
            # make the downloader hold the host's first handed-out request
            # (a page waiting for robots.txt) a whole delay in the downloader,
            # holding the global budget, while the scheduler counts the delay
            # from handing it out: the next page would follow at once.
            if not self._autothrottle:
                internals.apply_to_slot(self.crawler, key, delay=0.0)
            return
        unsent = self._unsent.pop(request, None) if self._unsent else None
        if unsent is not None:
            # It starts now, not when handed out: a downloader middleware may
            # have held it (for robots.txt), together with none of the host's
            # next requests, which wait for this (Frontier.await_start).
            self.frontier.started(*unsent, time.monotonic())
            self._schedule_wakeup()
        # Scrapy recreates garbage-collected slots from the settings: re-apply
        # the host's current limit, and keep delays out of the downloader,
        # where a waiting request would hold the global budget.
        internals.apply_to_slot(
            self.crawler,
            host,
            concurrency=self.frontier.policy(host).limit + self.prefetch,
            delay=None if self._autothrottle else 0.0,
        )

    def _response_downloaded(self, response: Response, request: Request, spider: Spider) -> None:
        host = internals.host_key(self.crawler, request)
        self.recorder.response(host, response.status, request.meta.get("download_latency"))
        if self._policy_hook is not None:
            # First: a 429 blocks the host before its first answer gives it
            # its limit.
            self._policy_hook.response_downloaded(request, response)
        # It answered: it goes before hosts not heard from (see Frontier).
        self.answered(request)

    def _headers_received(self, request: Request, headers: Any = None, **_: Any) -> None:
        # Not at a 429 or 503: the host gets its limit when the whole answer
        # is in, once the AIMD middleware has blocked it. The add-on's handler
        # tells the status before this signal; with other handlers such an
        # answer mostly carries a Retry-After.
        read = self._status_read
        if read is not None and read[0] is request:
            self._status_read = None
            if read[1]:
                return
        elif headers is not None and b"Retry-After" in headers:
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
        host = self._handed_out.get(request) or self._adopted.get(request) or self.host_of(request)
        policy = self.frontier.known_policy(host)
        if policy is None or policy.answering:
            return None
        self.frontier.set_answering(host, True)
        return host

    def sent_back_from_gate(self, request: Request) -> bool:
        """Whether *request* left the download handler because the send gate
        sent it back to the scheduler (its host got blocked), not because the
        download failed."""
        return request in self._sent_back

    def _follow_autothrottle(self, response: Response, request: Request, spider: Spider) -> None:
        host = internals.host_key(self.crawler, request)
        delay = internals.slot_delay(self.crawler, host)
        if delay is not None:
            self.frontier.set_interval(host, delay)

    def _schedule_wakeup(self) -> None:
        when = self.frontier.next_wakeup()
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

    # -- JOBDIR ----------------------------------------------------------------

    def _state_path(self) -> str:
        assert self.jobdir is not None
        return os.path.join(self.jobdir, STATE_FILE)

    def _save_state(self) -> None:
        requests: list[tuple[str, bytes]] = []
        unserializable = 0
        # Requests of given-up hosts too: the host may be back next time.
        queued = [(host, request) for host, _rank, request in self.frontier.items()]
        for host, request in [*queued, *self._refused]:
            try:
                # Pickled one by one: a request whose meta cannot be pickled
                # (a Selector, a Response) is lost alone, as with Scrapy's
                # disk queues.
                data = pickle.dumps(request.to_dict(spider=self.spider), protocol=4)
            except Exception:
                unserializable += 1
                if self.debug or not self._logged_unserializable:
                    logger.warning(
                        "Unable to serialize request %s; it is lost at this stop "
                        "(this warning is shown once; SCHEDULER_DEBUG=True shows all)",
                        request,
                    )
                    self._logged_unserializable = True
            else:
                requests.append((host, data))
        if unserializable:
            self.stats.inc_value("scheduler/unserializable", unserializable)
        now = time.monotonic()
        # Times are saved on the wall clock: the monotonic one restarts.
        to_wall = time.time() - now
        # Idle hosts too: a host blocked with nothing queued stays blocked
        # for the requests the resumed crawl will find for it.
        blocks = {
            host: (policy.blocked_until + to_wall, policy.block_reason)
            for host, policy in self.frontier.blocked(now)
        }
        # When each host with an interval between starts (DOWNLOAD_DELAY,
        # Crawl-delay) may start its next request: also after the resume.
        spacing = {host: when + to_wall for host, when in self.frontier.spaced(now)}
        state = {
            "version": _STATE_VERSION,
            "requests": requests,
            "blocks": blocks,
            "spacing": spacing,
        }
        path = self._state_path()
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "wb") as f:
                pickle.dump(state, f, protocol=4)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        logger.info("Saved %d queued requests to %s", len(requests), path)

    def _load_state(self) -> tuple[int, int]:
        """Queue the requests and restore the blocks saved at the last stop;
        returns how many requests and blocks still in force.

        Reads the whole file before changing anything: if any of it cannot be
        read, it raises and nothing is queued.
        """
        path = self._state_path()
        if not os.path.exists(path):
            return 0, 0
        with open(path, "rb") as f:
            state = pickle.load(f)  # our own file, in the user's JOBDIR
        version = state.get("version") if isinstance(state, dict) else None
        if version not in _READABLE_STATE_VERSIONS:
            raise ValueError(f"written by an incompatible scrapy-hostqueue (version {version!r})")
        requests = [
            request_from_dict(
                pickle.loads(data) if version >= 2 else data,
                spider=self.spider,
            )
            for _host, data in state["requests"]
        ]
        now = time.time()
        to_monotonic = time.monotonic() - now
        blocks = [
            (host, until + to_monotonic, reason)
            for host, (until, reason) in state["blocks"].items()
            if until > now
        ]
        spacing = [
            (host, when + to_monotonic)
            for host, when in state.get("spacing", {}).items()
            if when > now
        ]
        for request in requests:
            # Already seen by the dupefilter before the stop: not filtered again.
            self._push(request)
        for host, until, reason in blocks:
            self.frontier.block_until(host, until, reason)
        for host, when in spacing:
            self.frontier.space_until(host, when)
        return len(requests), len(blocks)


def _gate_opens_at(policy: HostPolicy) -> float:
    """When the send gate may let the host's next request onto the wire: not
    before its block ends, nor before the shortest gap its interval allows
    (``DOWNLOAD_DELAY``, Crawl-delay; the jitter's low end) since the last
    request it let through. A request handed out on time may have had to wait
    for a send slot, so the gap between hand-outs is not enough."""
    gap = policy.interval * max(0.0, 1.0 - policy.jitter) if policy.interval else 0.0
    return max(policy.blocked_until, policy.last_sent + gap)
