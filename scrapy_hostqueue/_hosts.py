"""The hosts of a crawl: what the other parts ask of and tell the scheduler.

:class:`Hosts` owns the request store (through its interface,
``scrapy_hostqueue.frontier.RequestStore``), the record of every request counted
for a host (``_requests``), the send gate (``_sendgate``), the room for direct
downloads (``_direct``) and the overdue watch (``_overdue``). It answers the
queries and carries out the commands of ``HostControl`` (the AIMD
middleware) and ``HostView`` (the stats extension), both in ``_contracts``,
and keeps the records in step as requests reach the downloader, are answered
and leave it.

The scheduler creates it, feeds it Scrapy's signals and hands requests out of
its store; every other part reaches it as ``scheduler.hosts``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from scrapy import Request, signals
from scrapy.utils.asyncio import call_later

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._aimd import Adjustment
from scrapy_hostqueue._direct import DirectDownloads
from scrapy_hostqueue._leftover import LeftOver, left_over
from scrapy_hostqueue._overdue import OverdueRequests
from scrapy_hostqueue._recorder import get_recorder
from scrapy_hostqueue._requests import MAX_REQUEUES, RequestTable
from scrapy_hostqueue._sendgate import SendGate, handlers_gate_sends
from scrapy_hostqueue.frontier import HostState, RequestStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.utils.asyncio import CallLaterResult

    from scrapy_hostqueue._config import HostQueueConfig
    from scrapy_hostqueue._contracts import HostCommands, HostControl, HostView, PolicyHook

logger = logging.getLogger(__name__)

T = TypeVar("T")


class StoreView(Generic[T]):
    """The part of the stats' ``HostView`` that a request store answers by itself.

    A base: :class:`Hosts` adds what the send gate knows (``on_wire``,
    ``sent_back_from_gate``).
    """

    store: RequestStore[T]

    @property
    def active_hosts(self) -> int:
        return self.store.active

    @property
    def queued_requests(self) -> int:
        return len(self.store)

    def hosts(self) -> Iterator[tuple[str, int, int, HostState]]:
        return self.store.hosts()

    def known_state(self, host: str) -> HostState | None:
        return self.store.known_state(host)

    def in_flight_cap(self, state: HostState) -> int:
        return self.store.in_flight_cap(state)

    def overdue(self, host: str) -> int:
        """Count the requests of *host* in flight and overdue."""
        return self.store.overdue(host)

    def redis_figures(self) -> dict[str, Any] | None:
        """Return how much Redis holds this process back (None off the Redis frontier)."""
        return self.store.redis_figures()


class Hosts(StoreView[Request]):
    """The scheduler's hosts: the per-host queries and commands over its request store.

    The per-host query and command API of :class:`HostQueueScheduler`
    (``HostControl``, ``HostView``) over its request store.

    *open_store* makes the store, given the factory of a new host's state and
    the options of its ring of ready hosts; the scheduler chooses which store
    it is.
    """

    def __init__(
        self,
        crawler: Crawler,
        config: HostQueueConfig,
        open_store: Callable[..., RequestStore[Request]],
        *,
        debug: bool,
    ) -> None:
        self.crawler = crawler
        self.debug = debug
        self.recorder = get_recorder(crawler)
        self.autothrottle = crawler.settings.getbool("AUTOTHROTTLE_ENABLED")
        self._policy_hook: PolicyHook | None = None
        gate = handlers_gate_sends(crawler)
        self.prefetch = config.prefetch if gate else 0
        # Without the send gate the prefetched request waits in Scrapy's
        # downloader slot, which holds the limit as its concurrency (see
        # internals.hold_slot_concurrency). Not with the AIMD middleware (see
        # attach_policy).
        self.slot_prefetch = 0 if gate else config.prefetch
        self.store = open_store(
            self._new_state,
            max_active=config.max_active_hosts,
            turn=config.turn_requests,
            turn_seconds=config.turn_seconds,
            grace=config.idle_grace,
            prefetch=self.prefetch or self.slot_prefetch,
            # Without the send gate nothing downstream spaces the starts.
            await_start=not self.prefetch,
            remember=config.remember_hosts,
            # Across hosts only the priority counts: a host whose next request
            # is a start request takes its turn like any other.
            ring_granularity=2,
        )
        self.records = RequestTable()
        self._global_limit = max(0, config.global_concurrency)
        self.gate = SendGate(
            self.store,
            self.records,
            self.recorder,
            enabled=bool(self.prefetch),
            backoff_codes=config.aimd_backoff_http_codes,
            may_send_back=self._may_send_back,
            room_changed=self._room_changed,
        )
        #: Room for the requests that reach the downloader without the
        #: scheduler (the AIMD middleware holds them there).
        self.direct = DirectDownloads(
            self.store, self.records, self.gate, gated=bool(self.prefetch)
        )
        self._overdue = OverdueRequests(
            crawler,
            self.records,
            self.store,
            self.gate,
            self.recorder,
            gated=bool(self.prefetch),
            max_excused=config.max_overdue,
            debug=debug,
        )
        #: Requests excused from ``CONCURRENT_REQUESTS`` (overdue ones), for
        #: the downloader's count; None if none ever is.
        self.excused: Callable[[], int] | None = (
            self._overdue.excused if config.max_overdue else None
        )
        #: Requests of given-up hosts on their way to their errbacks: queued
        #: here, then handed out for the AIMD middleware to raise HostGivenUp.
        self.given_up_requests: deque[tuple[str, Request]] = deque()
        self._wakeup: CallLaterResult | None = None
        self._wakeup_at = 0.0
        #: The monitor's controls paused the crawl: nothing is handed out.
        self.paused = False

    def open(self) -> None:
        """Start with the crawl: the handler and the stats extension may find us."""
        self.gate.register(self.crawler)
        self.recorder.host_view = self

    def stop(self) -> None:
        """Stop with the crawl: cancel every timer."""
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None
        self.gate.unregister(self.crawler)
        self._overdue.stop()

    def left_over(self) -> LeftOver:
        """Count what the parts still hold (O(hosts + requests left): for a crawl's close)."""
        return left_over(self.store, self.records, self.gate, self.given_up_requests)

    def give_up_request(self, host: str, request: Request) -> None:
        """Give up *request*, which came in for *host*, a host given up.

        It goes to its errback (see :meth:`give_up`).
        """
        self.recorder.requests_dropped(host)
        if self.debug:
            logger.debug("Giving up %s: host %s was given up", request, host)
        self.given_up_requests.append((host, request))

    def next_given_up(self) -> Request:
        """Return the next request of a given-up host, handed out to fail."""
        host, request = self.given_up_requests.popleft()
        self.records.give_up(request, host)
        return request

    # -- HostView (stats): the store's part in StoreView ---------------------

    def on_wire(self, host: str) -> int:
        """Count the requests of *host* sent and not yet answered.

        With prefetch, those past the send gate; without, those handed out and not yet back (with
        prefetch in the downloader slot, at most the limit of them).
        """
        if self.prefetch:
            return self.gate.on_wire(host)
        in_flight = self.store.in_flight(host)
        if self.slot_prefetch:
            return min(in_flight, self.store.host_state(host).limit)
        return in_flight

    def sent_back_from_gate(self, request: Request) -> bool:
        """Whether the send gate sent *request* back to the scheduler.

        Whether *request* left the download handler because the send gate
        sent it back to the scheduler (its host got blocked), not because the
        download failed.
        """
        return request in self.records.sent_back

    # -- HostControl (the AIMD middleware) -------------------------------------

    def attach_policy(self, hook: PolicyHook) -> None:
        """Let *hook* choose the limit of every host from now on.

        It is told when a host is forgotten.

        From then on a silent host (not heard from yet, or whose last request
        failed to connect or timed out) also gets one request at a time until
        it answers: an unknown host is sent no burst, and a dead or hanging
        one holds one download slot, not its whole limit. Only with a policy
        (the AIMD middleware), whose error budget gives up a host that never
        answers: without one, a dead host's every request is tried, and one
        at a time they would keep the crawl going long after the rest.
        """
        self._policy_hook = hook
        self.store.silent_limit = 1
        # A host's share of the global limit among the active hosts caps it too.
        self.store.global_limit = self._global_limit
        # A request waiting in Scrapy's downloader slot is past the
        # middleware that holds a blocked host's requests back (a Retry-After
        # that comes in meanwhile): only the send gate can send it back.
        self.slot_prefetch = 0
        self.store.prefetch = self.prefetch
        self.gate.notes_status = True
        # It has answered once its response headers are in: a large first
        # download need not finish before the host gets its limit.
        self.crawler.signals.connect(self.on_headers_received, signal=signals.headers_received)
        self.store.on_forget = hook.forget_host
        # What the hook learned about a host lives in a store that outlives
        # the process (the SQLite store gives back the resumed hosts' now).
        self.store.export_learned = hook.learned
        self.store.import_learned = hook.relearn
        self._overdue.start(hook)
        # The scheduler opens before the spider does; with JOBDIR it may
        # already know hosts (resumed requests) with their configured limits.
        for host, _queued, _in_flight, _state in list(self.store.hosts()):
            configured = internals.configured_slot(self.crawler.settings, host)[0]
            self.set_limit(host, hook.initial_limit(host, configured))

    def host_of(self, request: Request) -> str:
        return internals.host_key(self.crawler, request)

    def host_state(self, host: str) -> HostState:
        return self.store.host_state(host)

    def handed_out_for(self, request: Request) -> str | None:
        """Return the host *request* was handed out for, if it is still out.

        The host ``next_request`` handed it out for (and that it counts for), or
        None if it was not handed out or has left the downloader.
        """
        record = self.records.handed_out(request)
        return None if record is None else record.host

    def held_back_since(self, host: str, started: float) -> bool:
        """Whether *host* had its whole limit in flight since *started*, or has now."""
        return self.store.host_state(host).full_at >= started or self.store.is_full(host)

    def held_below_limit(self, host: str) -> bool:
        """Whether *host*'s in-flight cap is below its limit, and the limit has room.

        The cap is one request at a time while the host is silent, or its share.
        With prefetch, the send gate holds the cap; without, fewer requests than
        the limit are handed out and not back.
        """
        state = self.store.host_state(host)
        if self.store.in_flight_cap(state) >= state.limit:
            return False
        return bool(self.prefetch) or self.store.in_flight(host) < state.limit

    def note_full(self, host: str, now: float) -> None:
        self.store.note_full(host, now)

    def requeues(self, request: Request) -> int:
        return self.records.requeues(request)

    def requeued(self, old: Request, new: Request) -> None:
        self.records.requeued(old, new)

    def host_silent(self, host: str) -> None:
        """*host*'s last request failed to connect or timed out.

        Until it answers again, hosts that answer go before it (see the store).
        """
        self.store.set_answering(host, False)

    def adjust(self, adjustment: Adjustment, now: float) -> int:
        """Apply what the AIMD rule decided for a host at *now*.

        Its new limit, a block, giving it up, each kept among the host's
        events with its reason. Returns the number of its queued requests
        given up (see :meth:`give_up`).
        """
        host = adjustment.host
        if adjustment.limit_changed:
            self.set_limit(host, adjustment.new_limit)
            self.recorder.limit_event(
                host, adjustment.old_limit, adjustment.new_limit, adjustment.reason
            )
        block, reason = adjustment.block, adjustment.block_reason
        if block is not None and block > 0 and reason is not None:
            self.block_until(host, now + block, reason)
            self.recorder.blocked(host, block, reason)
        if not adjustment.give_up:
            return 0
        dropped = self.give_up(host)
        self.recorder.host_given_up(host, dropped, adjustment.give_up_reason)
        return dropped

    def set_limit(self, host: str, limit: int) -> None:
        self.store.set_limit(host, limit)
        internals.apply_to_slot(self.crawler, host, concurrency=limit + self.prefetch)
        self.recorder.limit_changed(host, limit)
        self._room_changed(host)

    def block_until(self, host: str, when: float, reason: str) -> None:
        """Start no request for *host* before *when* (``time.monotonic()``).

        Its requests waiting at the send gate go back to the queue.
        """
        self.store.block_until(host, when, reason)
        self.gate.blocked(host, when, reason)

    def set_interval(self, host: str, interval: float) -> None:
        """Set the minimum time between two request starts on *host*.

        Minimum time between two request starts on *host*, without jitter
        (a robots.txt Crawl-delay is a minimum).
        """
        self.store.set_interval(host, interval, jitter=0.0)

    def give_up(self, host: str) -> int:
        """Give up *host* and its requests.

        Those queued, returned (their number), and any that come later. Each is
        handed out once more, for the AIMD middleware to fail it with
        ``HostGivenUp``, so that its errback hears of it.
        """
        dropped = self.store.give_up(host)
        self.given_up_requests.extend((host, request) for request in dropped)
        if dropped:
            internals.wake_engine(self.crawler)
        return len(dropped)

    def given_up_host(self, request: Request) -> str | None:
        """Return the host of *request* if it was handed out only to fail.

        The host of *request* if it was handed out only to fail with
        HostGivenUp (its host was given up).
        """
        record = self.records.get(request)
        if record is None or not record.given_up:
            return None
        self.records.leave(request)
        return record.host

    def answered(self, request: Request) -> str | None:
        """*request* was answered: its host may now have its whole limit in flight.

        The host it was handed out (or adopted) for, which a downloader middleware after the AIMD
        one may have given another download_slot (a proxy's). Returns that host if it was silent.
        """
        record = self.records.get(request)
        host = record.host if record is not None and not record.given_up else self.host_of(request)
        state = self.store.known_state(host)
        if state is None or state.answering:
            return None
        self.store.set_answering(host, True)
        return host

    # -- HostCommands (the monitor's controls) -----------------------------------

    @property
    def fails_given_up(self) -> bool:
        return self._policy_hook is not None

    def holds(self, host: str) -> bool:
        return bool(self.store.queued(host) or self.store.in_flight(host))

    def unblock(self, host: str) -> None:
        """End *host*'s block now, whatever its reason."""
        self.store.unblock(host)
        self._room_changed(host)
        internals.wake_engine(self.crawler)

    def set_ceiling(self, host: str, ceiling: int, now: float) -> tuple[int, int]:
        """Set *host*'s ceiling: the AIMD middleware's, or without it the host's limit.

        Returns the limit before and after; a change is kept among the host's events.
        """
        old = self.store.host_state(host).limit
        hook = self._policy_hook
        new = hook.set_ceiling(host, ceiling) if hook is not None else ceiling
        self.adjust(Adjustment(host, old, new, "monitor"), now)
        return old, new

    def pause(self, paused: bool) -> None:
        self.paused = paused
        if not paused:
            internals.wake_engine(self.crawler)

    # -- Scrapy's signals, as the scheduler connects them -----------------------

    def on_request_left(self, request: Request) -> None:
        """*request* left the downloader, whatever its outcome."""
        self.gate.forget_status(request)
        record = self.records.get(request)
        if record is None:
            return
        host = record.host
        if self.debug:
            logger.debug("%s left the downloader (host %s, %s)", request, host, record.stage.value)
        if record.given_up:
            # Answered or dropped by a downloader middleware before the AIMD
            # one: never counted.
            self.records.leave(request)
            return
        if record.unsent_at is not None:
            # Answered or dropped by a downloader middleware (a cache hit,
            # robots.txt): it never went to the host.
            self.store.unstart(host, record.unsent_at)
        # The per-host request stats are taken here, off the engine's
        # next_request path: every request handed out leaves exactly once,
        # and the in-flight counts just before a leave reach every
        # high-water mark the hand-outs set.
        self.recorder.request_done(host, self.store.in_flight(host), self.store.active)
        if record.on_wire:
            self.gate.off_the_wire(request)
        elif not self.prefetch:
            # A request stops being on the wire when it gives back its send
            # slot, or, without the send gate, when it leaves.
            self.recorder.in_flight_seen(host, self.on_wire(host))
        self.records.leave(request)
        self.store.finish(host, record.overdue)
        self._overdue.left(record)
        self.direct.wake(host)

    def on_reached_downloader(self, request: Request, spider: Spider) -> None:
        key = internals.host_key(self.crawler, request)
        # Before Scrapy queues it in its downloader slot.
        internals.hold_slot_concurrency(self.crawler, key)
        record = self.records.handed_out(request)
        if record is None:
            # robots.txt, media pipelines: the slot may exist since this
            # request only, with Scrapy's delay. Left there, that delay would
            # make the downloader hold the host's first handed-out request
            # (a page waiting for robots.txt) a whole delay in the downloader,
            # holding part of the global limit, while the scheduler counts the delay
            # from handing it out: the next page would follow at once.
            if not self.autothrottle:
                internals.apply_to_slot(self.crawler, key, delay=0.0)
            return
        host = record.host
        if not self.prefetch:
            # Without the send gate it goes to the host from here.
            record.sent_at = time.monotonic()
            if self._policy_hook is not None:
                # Only the AIMD middleware asks has_room.
                self.records.count_on_the_way(record)
        if record.unsent_at is not None:
            # It starts now, not when handed out: a downloader middleware may
            # have held it (for robots.txt), together with none of the host's
            # next requests, which wait for this (the store's await_start).
            unsent_at, record.unsent_at = record.unsent_at, None
            self.store.started(host, unsent_at, time.monotonic())
            self.schedule_wakeup()
        # Scrapy recreates garbage-collected slots from the settings: re-apply
        # the host's current limit, and keep delays out of the downloader,
        # where a waiting request would hold part of the global limit.
        internals.apply_to_slot(
            self.crawler,
            host,
            concurrency=self.store.host_state(host).limit + self.prefetch,
            delay=None if self.autothrottle else 0.0,
        )

    def on_response_downloaded(self, response: Response, request: Request, spider: Spider) -> None:
        host = internals.host_key(self.crawler, request)
        self.recorder.response(host, response.status, request.meta.get("download_latency"))
        if self._policy_hook is not None:
            # First: a 429 blocks the host before its first answer gives it
            # its limit.
            self._policy_hook.learn(request, response)
        # It answered: it goes before hosts not heard from (see the store).
        self.answered(request)

    def on_headers_received(self, request: Request, headers: Any = None, **_: Any) -> None:
        # Not at a 429 or 503: the host gets its limit when the whole answer
        # is in, once the AIMD middleware has blocked it. The add-on's handler
        # tells the status before this signal; with other handlers such an
        # answer mostly carries a Retry-After.
        record = self.records.get(request)
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

    def follow_autothrottle(self, response: Response, request: Request, spider: Spider) -> None:
        """AutoThrottle owns ``slot.delay``: the host's interval follows it."""
        host = internals.host_key(self.crawler, request)
        delay = internals.slot_delay(self.crawler, host)
        if delay is not None:
            self.store.set_interval(host, delay)

    # -- internals -----------------------------------------------------------

    def schedule_wakeup(self) -> None:
        """Wake the engine when the earliest blocked or spaced host becomes ready.

        It would otherwise wait for its 5-second heartbeat.
        """
        when = self.store.next_wakeup()
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

    def _new_state(self, host: str) -> HostState:
        concurrency, delay, jitter = internals.configured_slot(self.crawler.settings, host)
        limit = max(1, concurrency)
        if self._policy_hook is not None:
            limit = self._policy_hook.initial_limit(host, limit)
        self.recorder.host_seen(host)
        if self.autothrottle:
            # AutoThrottle owns slot.delay; the scheduler follows it (see
            # follow_autothrottle) instead of applying DOWNLOAD_DELAY twice.
            delay = 0.0
        return HostState(limit, delay, jitter)

    def _room_changed(self, host: str) -> None:
        """Let through what waits for *host*, which may have more on the wire now.

        A request went off the wire, its limit rose, or its first answer came.
        """
        self.gate.open(host)
        self.direct.wake(host)

    def _may_send_back(self, request: Request) -> bool:
        """Whether a request held at the send gate by a block may go back to the scheduler.

        Only the AIMD middleware (the policy hook) takes it there, at most MAX_REQUEUES times.
        """
        return self._policy_hook is not None and self.records.requeues(request) < MAX_REQUEUES


if TYPE_CHECKING:

    def _keeps_the_contracts(hosts: Hosts) -> tuple[HostControl, HostView, HostCommands]:
        # For mypy: Hosts is what the middleware, the stats and the monitor expect.
        return hosts, hosts, hosts


__all__ = ["Hosts"]
