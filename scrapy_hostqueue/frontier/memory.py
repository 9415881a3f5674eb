"""Per-host queues, the ring of ready hosts and the active-host cap.

Pure logic: no Scrapy or Twisted import, an injectable clock, opaque items.
"Host" is whatever key the caller gives (the scheduler passes the downloader
slot key).

Every live host (queued work, work in flight, or an IDLE place) is in
exactly one standing (:class:`Standing`):

* READY: queued work, in flight below its limit, not blocked, and either
  holding an active place or the active-host cap has room. It sits in the
  ring bucket of its head rank; buckets are served highest rank first,
  round-robin within.
* PREFETCH: queued work, in flight at its limit but below the limit plus
  ``prefetch``, and no interval between starts. Sits in a heap by head rank
  (FIFO among equals), served only when no host is READY, so an extra
  request waiting downstream never takes part of the global limit from a host that
  could send at once.
* FULL: in flight at or above its limit (plus ``prefetch`` if it has no
  interval; ``silent_limit``, without prefetch, for a silent host), or, with
  ``await_start``, its last hand-out not started yet. Leaves on
  :meth:`MemoryStore.finish`, when a silent host answers, or on
  :meth:`MemoryStore.started`.
* BLOCKED: blocked until a time (Retry-After, back-off, delay between
  starts). Sits in a timer heap, released by :meth:`MemoryStore.pop`.
* CAPPED: idle, ready, but the active-host cap is reached. Sits in one of
  two FIFOs (answering and silent hosts), released when an active host gives
  its place up.
* DRAINED: work in flight, nothing queued. Leaves on enqueue or finish.
* ENDING: queued work and work in flight, but its turn is over while hosts
  wait for a place: it is handed nothing more. Leaves on finish.
* IDLE: holds an active place (under a cap) with nothing queued and nothing
  in flight, for ``grace`` seconds, in the timer heap: a spider's links come
  a moment after the response left the downloader. Leaves on enqueue, or
  retires when the grace is over (released by :meth:`MemoryStore.pop`).

A host takes an active place when it is first served and keeps it, across
moments with nothing in flight, while it has work it may start at once, for
a turn of ``turn`` requests or ``turn_seconds``, whichever ends first: with
nothing in flight it gives the place up when
it has nothing queued (after the ``grace``, IDLE), must wait for a time
(BLOCKED), or has had its turn (then it goes to the back of the CAPPED FIFO).
A host whose turn is over while hosts wait in the CAPPED FIFO gets no new
request (ENDING), so a host that always has requests in flight does not keep
its place for ever, and a slow host, whose turn lasts long, lets the hosts
waiting behind it take their turns. Kept places let the hosts being crawled
keep their keep-alive connections.

With a ``global_limit`` (``CONCURRENT_REQUESTS``), a host has at most its
share of it in flight (:meth:`MemoryStore.in_flight_cap`): while hosts wait
for a place, an equal part per place (one request at the defaults), so the
global limit goes to more hosts, each on one connection, rather than to more
connections on fewer hosts.

Hosts that answered their last request (``HostState.answering``) go before
silent ones (not heard from yet, or whose last request failed to connect or
timed out): in the ring, at the same priority, and for a free place. Silent
hosts that wait for a place end an answering host's turn, and get the next
free place, only while they hold fewer than half of the places. Many hosts
that hang until a timeout then take neither the whole global limit nor
every place from the hosts that answer, and hosts never heard from still get
their share of places.

Structures hold ``(token, host)`` entries and skip stale ones lazily: every
change of standing bumps the host's token, so moving a host is O(1) and no structure is
ever scanned. Each operation is O(1) amortised in the number of hosts, plus a
heap operation on the timer heap (log of the number of blocked hosts) and on a
host's own ranks (few distinct priorities in practice).
"""

from __future__ import annotations

import heapq
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T")


class Standing(Enum):
    """Where a live host sits in the store (see the module docstring)."""

    READY = "ready"
    PREFETCH = "prefetch"
    FULL = "full"
    BLOCKED = "blocked"
    CAPPED = "capped"
    DRAINED = "drained"
    ENDING = "ending"
    IDLE = "idle"


READY = Standing.READY
FULL = Standing.FULL
PREFETCH = Standing.PREFETCH
BLOCKED = Standing.BLOCKED
CAPPED = Standing.CAPPED
DRAINED = Standing.DRAINED
ENDING = Standing.ENDING
IDLE = Standing.IDLE


class HostState:
    """What the scheduler needs to know to decide whether a host is ready.

    The AIMD middleware changes it only through :class:`MemoryStore` methods, so
    the host's standing in the store is updated at once.
    """

    __slots__ = (
        "answering",
        "block_reason",
        "blocked_until",
        "full_at",
        "given_up",
        "interval",
        "jitter",
        "last_sent",
        "last_start",
        "limit",
        "next_gap",
    )

    def __init__(self, limit: int, interval: float = 0.0, jitter: float = 0.0) -> None:
        if limit < 1:
            raise ValueError(f"a host limit must be >= 1, got {limit!r}")
        self.limit = limit
        #: Minimum time between two request starts (download delay, Crawl-delay).
        self.interval = interval
        #: Relative random variation of the interval, as DOWNLOAD_DELAY_JITTER.
        self.jitter = jitter
        #: When the last request started, and the gap (``interval`` with jitter
        #: drawn at that start) before the next one may.
        self.last_start = float("-inf")
        self.next_gap = 0.0
        #: When the caller last put one of the host's requests on the wire (the
        #: scheduler's send gate; hand-out and send differ with prefetch).
        self.last_sent = float("-inf")
        #: When the host last had as many requests in flight as its limit (a
        #: hand-out or an adopted request filled it). Only such a host has shown
        #: that its limit is what holds it back (see the AIMD middleware).
        self.full_at = float("-inf")
        #: No request starts before this time (Retry-After, back-off).
        self.blocked_until = 0.0
        self.block_reason: str | None = None
        #: Queued requests were given up; new ones are given up too.
        self.given_up = False
        #: The host answered its last request (an HTTP response), as opposed to
        #: a host not heard from yet or whose last request failed to connect
        #: or timed out. Answering hosts go first (see :class:`MemoryStore`).
        self.answering = False

    def spaced_until(self) -> float:
        """When the interval since the last request start allows the next."""
        return self.last_start + self.next_gap

    def ready_at(self) -> float:
        return max(self.blocked_until, self.spaced_until())

    def __repr__(self) -> str:
        return (
            f"HostState(limit={self.limit}, interval={self.interval:g}, "
            f"blocked_until={self.blocked_until:.3f}, given_up={self.given_up})"
        )


class _Fifo(Generic[T]):
    """A first-in first-out queue on a list.

    A ``deque`` allocates a block of 64 slots (about 600 bytes) for even one
    item, and in a broad crawl most hosts hold a few requests. Here a popped
    slot is cleared and skipped, and the list drops the popped slots once they
    are half of it: O(1) amortised, and never more than twice the slots of
    the items queued.
    """

    __slots__ = ("head", "slots")

    def __init__(self) -> None:
        self.slots: list[T | None] = []
        self.head = 0

    def append(self, item: T) -> None:
        self.slots.append(item)

    def popleft(self) -> T:
        slots, head = self.slots, self.head
        item = slots[head]
        slots[head] = None
        head += 1
        if head == len(slots):
            slots.clear()
            head = 0
        elif head > 16 and head * 2 > len(slots):
            del slots[:head]
            head = 0
        self.head = head
        return item  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.slots) - self.head

    def __iter__(self) -> Iterator[T]:
        for index in range(self.head, len(self.slots)):
            yield self.slots[index]  # type: ignore[misc]


class _Host(Generic[T]):
    __slots__ = (
        "active",
        "active_since",
        "in_flight",
        "key",
        "overdue",
        "pending_start",
        "queued",
        "queues",
        "ranks",
        "served",
        "standing",
        "state",
        "token",
    )

    def __init__(self, key: str, state: HostState) -> None:
        self.key = key
        self.state = state
        self.queues: dict[int, _Fifo[T]] = {}
        self.ranks: list[int] = []  # heap of -rank, stale ranks skipped lazily
        self.queued = 0
        self.in_flight = 0
        #: Of ``in_flight``, the requests in flight far longer than the host
        #: usually takes (see :meth:`MemoryStore.set_overdue`).
        self.overdue = 0
        #: Whether the host holds one of the active-host places, since when,
        #: and how many requests it was handed since it took it.
        self.active = False
        self.active_since = 0.0
        self.served = 0
        #: With ``await_start``: when the hand-out whose start the host waits
        #: for was handed out (its ``last_start`` then), else None.
        self.pending_start: float | None = None
        self.standing = DRAINED
        self.token = 0

    def head_rank(self) -> int:
        ranks, queues = self.ranks, self.queues
        while -ranks[0] not in queues:
            heapq.heappop(ranks)
        return -ranks[0]

    def push(self, rank: int, item: T) -> None:
        queue = self.queues.get(rank)
        if queue is None:
            queue = self.queues[rank] = _Fifo()
            heapq.heappush(self.ranks, -rank)
        queue.append(item)
        self.queued += 1

    def pop(self) -> T:
        rank = self.head_rank()
        queue = self.queues[rank]
        item = queue.popleft()
        if not queue.slots:  # emptied (popleft clears the list then)
            del self.queues[rank]
        self.queued -= 1
        if not self.queued:
            self.ranks.clear()
        return item


class MemoryStore(Generic[T]):
    """Per-host queues plus the ring of ready hosts.

    *state_factory* makes the state of a host seen for the first time.
    *max_active* caps the hosts holding an active place (0: no cap); *turn*
    is how many requests a host is handed in one turn at a place, and
    *turn_seconds* (0: no bound) how long a turn lasts at most; *grace* is
    how long (seconds) a host with nothing left to do keeps its place.
    *remember* bounds the states kept for hosts that went idle, so that a
    crawl meeting a million hosts does not keep a million idle entries.
    Hosts compete in the ring by ``head rank // ring_granularity``: with 2,
    ranks ``2p`` and ``2p + 1`` order requests within a host but are one
    priority ``p`` across hosts.
    """

    def __init__(
        self,
        state_factory: Callable[[str], HostState],
        *,
        max_active: int = 0,
        turn: int = 1,
        turn_seconds: float = 0.0,
        grace: float = 0.0,
        prefetch: int = 0,
        silent_limit: int = 0,
        await_start: bool = False,
        remember: int = 10_000,
        ring_granularity: int = 1,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if ring_granularity < 1:
            raise ValueError(f"ring_granularity must be >= 1, got {ring_granularity!r}")
        if turn < 1:
            raise ValueError(f"turn must be >= 1, got {turn!r}")
        if not turn_seconds >= 0:
            raise ValueError(f"turn_seconds must be >= 0, got {turn_seconds!r}")
        if silent_limit < 0:
            raise ValueError(f"silent_limit must be >= 0, got {silent_limit!r}")
        if not grace >= 0:
            raise ValueError(f"grace must be >= 0, got {grace!r}")
        self.grace = grace
        self._ring_granularity = ring_granularity
        self.turn = turn
        self.turn_seconds = turn_seconds
        self._state_factory = state_factory
        self.max_active = max_active
        #: Requests a host may have handed out beyond its limit; they wait
        #: at the send gate downstream for room on the wire.
        self.prefetch = prefetch
        #: The crawl's global limit (``CONCURRENT_REQUESTS``; 0: none): a
        #: host may have at most its share of it among the active hosts in
        #: flight (see :meth:`in_flight_cap`).
        self.global_limit = 0
        #: At most this many requests in flight for a silent host, and no
        #: prefetch (0: its limit, as for any host).
        self.silent_limit = silent_limit
        #: A host with an interval between starts is handed nothing more
        #: until the caller reports that its last hand-out started
        #: (:meth:`started`) or will not (:meth:`unstart`); its interval then
        #: counts from that start. For callers that cannot space the starts
        #: themselves: hand-outs waiting downstream for the same thing (a
        #: robots.txt) would otherwise start together.
        self.await_start = await_start
        self._remember = remember
        #: Called with a host's key when the store forgets the host for good
        #: (its state leaves both memories of idle hosts), so that state kept
        #: elsewhere about the host (the AIMD middleware's) lives exactly as long.
        self.on_forget: Callable[[str], None] | None = None
        #: What another part learned about a host, for a store that outlives
        #: the process: unused here (nothing outlives it).
        self.export_learned: Callable[[str], dict[str, float] | None] | None = None
        self.import_learned: Callable[[str, dict[str, float]], None] | None = None
        self.clock = clock
        self._rng = rng or random.Random()
        self._hosts: dict[str, _Host[T]] = {}
        # States of idle hosts, least recently used first, at most
        # `remember`; and those of idle hosts given up or blocked beyond the
        # moment they were pushed out of the first, at most `remember` more.
        self._retired: OrderedDict[str, HostState] = OrderedDict()
        self._kept: OrderedDict[str, HostState] = OrderedDict()
        self._buckets: dict[int, deque[tuple[int, _Host[T]]]] = {}
        self._bucket_ranks: list[int] = []  # heap of -rank
        self._ring_entries = 0  # entries in all buckets, stale ones included
        self._timers: list[tuple[float, int, int, _Host[T]]] = []
        # FIFO tiebreak among equal keys of the timer and prefetch heaps.
        self._seq = 0
        # Hosts waiting for a place: answering ones, and silent ones.
        self._capped: deque[tuple[int, _Host[T]]] = deque()
        self._capped_silent: deque[tuple[int, _Host[T]]] = deque()
        self._waiting = 0  # hosts in the CAPPED state
        self._waiting_silent = 0  # those of them that are silent
        self._active_silent = 0  # silent hosts holding a place
        #: Places silent hosts may take ahead of waiting answering hosts.
        self._silent_share = max(1, max_active // 2)
        # Heap of (-head rank, seq, token, host): the highest rank first,
        # FIFO among equals, as in the ring.
        self._prefetchable: list[tuple[float, int, int, _Host[T]]] = []
        self._queued = 0
        self.active = 0  # hosts holding an active-host place
        self.max_active_seen = 0

    # -- queries ---------------------------------------------------------

    def __len__(self) -> int:
        return self._queued

    @property
    def live_hosts(self) -> int:
        return len(self._hosts)

    def host_state(self, key: str) -> HostState:
        """Return the state of *key*, created from the factory on first sight."""
        host = self._hosts.get(key)
        if host is not None:
            return host.state
        state = self._retired.get(key)
        if state is not None:
            self._retired.move_to_end(key)
            return state
        state = self._kept.pop(key, None) or self._state_factory(key)
        self._remember_state(key, state)
        return state

    def is_full(self, key: str) -> bool:
        """Whether *key* has its whole limit in flight now."""
        host = self._hosts.get(key)
        return host is not None and host.in_flight >= host.state.limit

    def note_full(self, key: str, now: float) -> None:
        """Note *now* as the last moment *key* had its whole limit in flight.

        It goes to ``HostState.full_at``, if the host is known.
        """
        host = self._hosts.get(key)
        if host is not None:
            self._note_full(host, now)

    def in_flight_cap(self, state: HostState) -> int:
        """How many requests a host with *state* may have in flight now.

        Its limit, or ``silent_limit`` if that is lower and the host is silent,
        and at most its share of ``global_limit``. While hosts wait for a place,
        every place gets an equal part of the global limit (``global_limit /
        max_active``, rounded up); otherwise what the active silent hosts do not
        take, divided by the other active hosts, rounded up.
        """
        cap = state.limit
        if self.silent_limit and not state.answering:
            cap = min(cap, self.silent_limit)
        if not self.global_limit:
            return cap
        if self._waiting and self.max_active > 0:
            # The places are all taken and the global limit binds: a second
            # request in flight on one host would take the part a waiting
            # host could use, and open a second connection to the host for
            # the same pages per second crawl-wide.
            return min(cap, max(1, -(-self.global_limit // self.max_active)))
        # Silent hosts hold silent_limit each; the others share the rest.
        active, shared = self.active, self.global_limit
        if self.silent_limit:
            active -= self._active_silent
            shared -= self._active_silent * self.silent_limit
        if active > 1:
            # When the global limit binds, a host with more in flight than
            # its share only takes part of it from another host: the same
            # requests over more connections.
            share = max(1, -(-shared // active))
            if share < cap:
                return share
        return cap

    def known_state(self, key: str) -> HostState | None:
        """Return the state of *key* if the store knows the host, without creating one."""
        host = self._hosts.get(key)
        if host is not None:
            return host.state
        return self._retired.get(key) or self._kept.get(key)

    def queued(self, key: str) -> int:
        host = self._hosts.get(key)
        return host.queued if host is not None else 0

    def in_flight(self, key: str) -> int:
        host = self._hosts.get(key)
        return host.in_flight if host is not None else 0

    def standing(self, key: str) -> Standing | None:
        host = self._hosts.get(key)
        return host.standing if host is not None else None

    def _states(self) -> Iterator[tuple[str, HostState]]:
        """List ``(key, state)`` of every host, idle ones still remembered included.

        ``(key, state)`` of every host, idle hosts that are still
        remembered included (O(hosts)).
        """
        for host in self._hosts.values():
            yield host.key, host.state
        for idle in (self._retired, self._kept):
            yield from idle.items()

    def blocked(self, now: float) -> Iterator[tuple[str, HostState]]:
        """List ``(key, state)`` of every host blocked beyond *now*.

        ``(key, state)`` of every host blocked beyond *now*, idle hosts
        that are still remembered included (O(hosts): for a crawl's close).
        """
        for key, state in self._states():
            if state.blocked_until > now:
                yield key, state

    def spaced(self, now: float) -> Iterator[tuple[str, float]]:
        """List ``(key, when)`` of every host spaced beyond *now*.

        ``(key, when)`` of every host whose next request may not start
        before *when*, later than *now*, for its interval between starts
        (O(hosts): for a crawl's close).
        """
        for key, state in self._states():
            when = state.spaced_until()
            if when > now:
                yield key, when

    def space_until(self, key: str, when: float) -> None:
        """Start no request for *key* before *when*, as spacing restored after a stop.

        Start no request for *key* before *when*, as if its last request
        had started an interval before then (spacing restored after a stop);
        extends, never shortens, the wait its own starts set.
        """
        state = self.host_state(key)
        now = self.clock()
        if when > max(now, state.spaced_until()):
            state.last_start = now
            state.next_gap = when - now
            self._refresh(key)

    def hosts(self) -> Iterator[tuple[str, int, int, HostState]]:
        """Return ``(key, queued, in_flight, state)`` of every live host.

        O(hosts): for periodic reports, never on the request path.
        """
        for host in self._hosts.values():
            yield host.key, host.queued, host.in_flight, host.state

    def items(self) -> Iterator[tuple[str, int, T]]:
        """``(key, rank, item)`` of every queued item, in serving order per host."""
        for host in self._hosts.values():
            for rank in sorted(host.queues, reverse=True):
                for item in host.queues[rank]:
                    yield host.key, rank, item

    def next_wakeup(self) -> float | None:
        """When the earliest blocked host becomes ready or idle host gives its place up, if any."""
        timers = self._timers
        while timers:
            when, _, token, host = timers[0]
            if host.token == token and host.standing in (BLOCKED, IDLE):
                return when
            heapq.heappop(timers)
        return None

    # -- requests --------------------------------------------------------

    def push(self, key: str, rank: int, item: T) -> bool:
        """Queue *item* for host *key*; higher *rank* is served first, FIFO among equals.

        Returns False (and queues nothing) if the host was given up.
        """
        host = self._hosts.get(key)
        if host is None:
            state = self._recall(key)
            if state.given_up:
                self._remember_state(key, state)
                return False
            host = self._hosts[key] = _Host(key, state)
        elif host.state.given_up:
            return False
        granularity = self._ring_granularity
        raises_head = host.queued and rank // granularity > host.head_rank() // granularity
        host.push(rank, item)
        self._queued += 1
        if host.standing in (DRAINED, IDLE) or (host.standing in (READY, PREFETCH) and raises_head):
            self._place(host, self.clock())
        return True

    def pop(self, now: float | None = None) -> tuple[str, T] | None:
        """Return the next item of the next ready host, or None.

        The next item of the next ready host, round-robin among the ready
        hosts of the highest head rank, or None if no host is ready now.
        """
        if now is None:
            now = self.clock()
        self._release_timers(now)
        buckets, bucket_ranks = self._buckets, self._bucket_ranks
        while bucket_ranks:
            rank = -bucket_ranks[0]
            bucket = buckets[rank]
            if not bucket:
                heapq.heappop(bucket_ranks)
                del buckets[rank]
                continue
            token, host = bucket.popleft()
            self._ring_entries -= 1
            if host.token == token:
                if host.in_flight and host.in_flight >= self.in_flight_cap(host.state):
                    # Its share fell since it was placed (hosts came to wait
                    # for a place): placed again, behind the hosts that may
                    # send at once.
                    self._place(host, now)
                    continue
                served = self._serve_in_turn(host, now)
                if served is not None:
                    return served
        # finish() hands a freed slot to one capped host; if that host stopped
        # being ready before it was popped (blocked, emptied, given up), the
        # slot would stay unused while other capped hosts wait: pass it on.
        if self._release_capped(now):
            return self.pop(now)
        prefetchable = self._prefetchable
        while prefetchable:
            _, _, token, host = heapq.heappop(prefetchable)
            if host.token == token:
                served = self._serve_in_turn(host, now)
                if served is not None:
                    return served
        return None

    def _serve_in_turn(self, host: _Host[T], now: float) -> tuple[str, T] | None:
        """Serve *host* unless it must wait for a place or its turn is over.

        Serve *host*, taken from the ring or the prefetch heap, unless it
        must wait for a place (CAPPED: it holds none, perhaps with only
        adopted requests in flight, and the places are taken) or its turn is
        over (ENDING).
        """
        if not host.active and 0 < self.max_active <= self.active:
            self._set_capped(host)
            return None
        if not host.active and self._silent_share_taken(host):
            # Let out of the line for a free place while silent hosts held
            # fewer than their share, it finds them holding it now (other
            # silent hosts let out with it took their places first): the
            # place goes to an answering host that waits, and this host
            # goes back to the head of its line.
            self._set_capped(host, front=True)
            self._release_capped(now)
            return None
        if self._turn_over(host, now):
            self._place(host, now)  # ENDING
            return None
        return self._serve(host, now)

    def finish(self, key: str, overdue: bool = False) -> None:
        """Count a request handed out by :meth:`pop` for *key* as done (whatever its outcome).

        *overdue*: it was marked with :meth:`set_overdue`.
        """
        host = self._hosts.get(key)
        if host is None or host.in_flight <= 0:
            raise KeyError(f"no request in flight for host {key!r}")
        host.in_flight -= 1
        if overdue:
            host.overdue -= 1
        if not host.in_flight:
            host.pending_start = None
        if (host.in_flight == host.overdue and host.standing != CAPPED) or host.standing in (
            FULL,
            PREFETCH,
        ):
            # With nothing in flight (but overdue requests) the host may give
            # its active place up. A host waiting for a place (with adopted
            # requests in flight) keeps its turn in the line.
            self._place(host, self.clock())

    def set_overdue(self, key: str) -> None:
        """One request of *key* in flight is overdue.

        It still counts against the host's limit, but a host with nothing else in flight gives its
        active place up to a host that answers (a hanging host must not hold a place, as an idle one
        does not).
        """
        host = self._hosts.get(key)
        if host is None or host.overdue >= host.in_flight:
            raise KeyError(f"no request in flight for host {key!r} that is not overdue")
        host.overdue += 1
        if host.overdue == host.in_flight and host.standing != CAPPED:
            self._place(host, self.clock())

    def overdue(self, key: str) -> int:
        """Count the requests of *key* in flight and overdue."""
        host = self._hosts.get(key)
        return host.overdue if host is not None else 0

    def ack(self, item: T) -> None:
        """Nothing to do.

        A request leaves this store when handed out, and nothing outlives the process.
        """

    def give_back(self, key: str, rank: int, item: T) -> None:
        """Queue *item* again (see :meth:`finish` for its place in flight)."""
        self.push(key, rank, item)

    def close(self) -> None:
        """Nothing to release."""

    def remove_queued(self, key: str) -> list[T]:
        """Drop every queued item of *key* and return them."""
        host = self._hosts.get(key)
        if host is None or not host.queued:
            return []
        dropped = [item for rank in sorted(host.queues, reverse=True) for item in host.queues[rank]]
        host.queues.clear()
        host.ranks.clear()
        host.queued = 0
        self._queued -= len(dropped)
        self._place(host, self.clock())
        return dropped

    def trim(self, key: str, keep: int) -> list[T]:
        """Take out the queued items of *key* after its first *keep*.

        They are returned in serving order. The host's head, and so its place, stays as it was
        (``keep`` >= 1).
        """
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep!r}")
        host = self._hosts.get(key)
        if host is None or host.queued <= keep:
            return []
        excess = host.queued - keep
        taken: list[T] = []
        for rank in sorted(host.queues):  # the lowest rank is served last
            queue = host.queues[rank]
            while excess and len(queue):
                taken.append(queue.slots.pop())  # type: ignore[arg-type]
                excess -= 1
            if not len(queue):
                del host.queues[rank]
            if not excess:
                break
        host.queued -= len(taken)
        self._queued -= len(taken)
        taken.reverse()
        return taken

    # -- state changes --------------------------------------------------

    def set_limit(self, key: str, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a host limit must be >= 1, got {limit!r}")
        state = self.host_state(key)
        if state.limit != limit:
            state.limit = limit
            self._refresh(key)

    def set_answering(self, key: str, answering: bool) -> None:
        """Mark *key* as answering or silent.

        Whether *key* answered its last request (an HTTP response), or is
        silent (its last request failed to connect or timed out). A host the
        store does not know is left alone.
        """
        host = self._hosts.get(key)
        state = host.state if host is not None else self.known_state(key)
        if state is None or state.answering == answering:
            return
        if host is None:
            state.answering = answering
            return
        if host.active:
            self._active_silent += -1 if answering else 1
        capped = host.standing == CAPPED
        if capped:
            self._uncap(host)  # counted in its old class
        state.answering = answering
        if capped:
            self._set_capped(host)  # into the FIFO of its class
        elif host.standing in (READY, PREFETCH) or (self.silent_limit and host.standing == FULL):
            # Its rank in the ring changed, and with silent_limit, how many
            # requests it may have in flight.
            self._place(host, self.clock())

    def block_until(self, key: str, when: float, reason: str | None = None) -> None:
        """Start no request for *key* before *when* (extends, never shortens, a block)."""
        state = self.host_state(key)
        if when > state.blocked_until:
            state.blocked_until = when
            state.block_reason = reason
            self._refresh(key)

    def unblock(self, key: str) -> None:
        """End the block of *key* now, whatever its reason (the monitor's controls)."""
        state = self.known_state(key)
        if state is None or not state.blocked_until:
            return
        state.blocked_until = 0.0
        state.block_reason = None
        self._refresh(key)

    def redis_figures(self) -> dict[str, object] | None:
        """Return None: no Redis holds this store back."""
        return None

    def set_interval(self, key: str, interval: float, jitter: float | None = None) -> None:
        """Set the minimum time between two request starts for *key*."""
        if interval < 0:
            raise ValueError(f"an interval must be >= 0, got {interval!r}")
        state = self.host_state(key)
        state.interval = interval
        if jitter is not None:
            state.jitter = jitter
        # The gap since the last start is measured against the new interval.
        if state.next_gap != interval:
            state.next_gap = interval
            self._refresh(key)

    def unstart(self, key: str, started_at: float) -> None:
        """Note that the request of *key* handed out at *started_at* never reached the host.

        The request of *key* handed out at *started_at* never reached the
        host (a cache hit, a request a downloader middleware refused): the
        next start need not wait the interval drawn for it. Stock Scrapy
        likewise spaces only the requests that reach its downloader's queue.

        A later start keeps its own gap. Before this one, the host had waited
        out the previous gap, so nothing else is owed.
        """
        self._start_known(key, started_at, None)

    def started(self, key: str, started_at: float, now: float) -> None:
        """Note that the request of *key* handed out at *started_at* started at *now*.

        The request of *key* handed out at *started_at* started at *now*
        (it reached the downloader, past the downloader middlewares): if it
        is the host's last start, the interval before the next counts from
        *now*, and with ``await_start`` the host may be handed its next.
        """
        self._start_known(key, started_at, now)

    def _start_known(self, key: str, started_at: float, now: float | None) -> None:
        """Note what became of the hand-out of *key* at *started_at*.

        It started at *now*, or never will (None). See :meth:`started`, :meth:`unstart`.
        """
        host = self._hosts.get(key)
        if host is None:
            return
        state = host.state
        refresh = host.pending_start == started_at
        if refresh:
            host.pending_start = None
        if state.last_start == started_at:
            if now is None:
                if state.next_gap:
                    state.next_gap = 0.0
                    refresh = True
            elif now > started_at:
                state.last_start = now
                refresh = True
        if refresh:
            self._refresh(key)

    def adopt(self, key: str, now: float) -> None:
        """Count a request of *key* that :meth:`pop` did not hand out in flight.

        Count a request of *key* that :meth:`pop` did not hand out (a
        direct download) in flight from *now* until :meth:`finish`: the host
        is handed that much less, and its next start waits its interval after
        this one. The request takes no active-host place.
        """
        host = self._hosts.get(key)
        if host is None:
            host = self._hosts[key] = _Host(key, self._recall(key))
        host.in_flight += 1
        self._note_full(host, now)
        if host.state.interval:
            self._draw_gap(host.state, now)
        self._place(host, now)

    def give_up(self, key: str) -> list[T]:
        """Give up *key* (and any item pushed for it later); return its queued items."""
        self.host_state(key).given_up = True
        return self.remove_queued(key)

    # -- internals -------------------------------------------------------

    def _refresh(self, key: str) -> None:
        # An IDLE host, with nothing queued, is placed when it gets work or
        # its grace ends. A CAPPED one keeps its place in the FIFO unless it
        # must now wait for a time: then it waits BLOCKED, not counted among
        # the hosts waiting for a place (which end busy hosts' turns).
        host = self._hosts.get(key)
        if host is None or host.standing == IDLE:
            return
        now = self.clock()
        if host.standing == CAPPED and host.state.ready_at() <= now:
            return
        self._place(host, now)

    def _serve(self, host: _Host[T], now: float) -> tuple[str, T]:
        """Hand out the next item of *host* and put the host where it now belongs."""
        item = host.pop()
        self._queued -= 1
        self._start(host, now)
        self._place(host, now)
        return host.key, item

    def _start(self, host: _Host[T], now: float) -> None:
        host.in_flight += 1
        self._note_full(host, now)
        if not host.active:
            host.active = True
            host.active_since = now
            host.served = 0
            self.active += 1
            if not host.state.answering:
                self._active_silent += 1
            self.max_active_seen = max(self.max_active_seen, self.active)
        host.served += 1
        state = host.state
        self._draw_gap(state, now)
        if self.await_start and state.next_gap:
            host.pending_start = now

    @staticmethod
    def _note_full(host: _Host[T], now: float) -> None:
        if host.in_flight >= host.state.limit:
            host.state.full_at = now

    def _handed_out_at_most(self, host: _Host[T]) -> int:
        """In flight from which a host is handed nothing more.

        Its limit plus ``prefetch``, except that a host with a delay between
        request starts gets no prefetch (its next request may not go before the
        delay anyway, and would hold part of the global limit meanwhile), nor
        does a silent one, held to ``silent_limit`` until it answers, nor one
        with overdue requests (its next one would wait for them to time out,
        holding the global limit).
        """
        state = host.state
        cap = self.in_flight_cap(state)
        if state.interval or host.overdue or (self.silent_limit and not state.answering):
            return cap
        return cap + self.prefetch

    def _draw_gap(self, state: HostState, now: float) -> None:
        """Draw the gap before the next request may start, one having started at *now*."""
        state.last_start = now
        gap = state.interval
        if gap and state.jitter:
            gap = max(0.0, gap * (1 + self._rng.uniform(-state.jitter, state.jitter)))
        state.next_gap = gap

    def _place(self, host: _Host[T], now: float) -> None:
        if host.standing == CAPPED:
            self._uncap(host)
        # An IDLE host with nothing queued is placed only when its grace is
        # over (its timer): then it retires.
        was_idle = host.standing == IDLE
        host.token += 1
        # Requests in flight that are overdue do not keep a place.
        working = host.in_flight - host.overdue
        if not host.queued:
            if host.in_flight:
                host.standing = DRAINED
                if not working:
                    self._leave(host, now)
                return
            if host.active and self.grace and self.max_active and not was_idle:
                host.standing = IDLE
                self._push_timer(host, now + self.grace)
                return
            self._retire(host)
            self._leave(host, now)
            return
        state = host.state
        ready_at = state.ready_at()
        if ready_at > now:
            host.standing = BLOCKED
            self._push_timer(host, ready_at)
            if not working:
                self._leave(host, now)
        elif host.active and self._turn_done(host, now) and not working:
            # Its turn is over: behind the hosts waiting for a place.
            self._leave(host, now, requeue=True)
        elif self._turn_over(host, now):
            # Hosts wait: it starts nothing more, and goes behind them when
            # its last request finishes.
            host.standing = ENDING
        elif host.in_flight >= self._handed_out_at_most(host) or host.pending_start is not None:
            host.standing = FULL
            if not working:
                # Filled by overdue requests: it waits for them without a place.
                self._leave(host, now)
        elif not host.active and 0 < self.max_active <= self.active:
            # Without a place, whatever it has in flight (adopted requests).
            self._set_capped(host)
        elif host.in_flight >= self.in_flight_cap(state):
            # What it gets beyond its cap waits downstream, holding part of the global limit:
            # only when no host can send at once.
            host.standing = PREFETCH
            self._seq += 1
            rank = self._ring_rank(host)
            heapq.heappush(self._prefetchable, (-rank, self._seq, host.token, host))
            if self._crowded(len(self._prefetchable)):
                self._compact()
        else:
            host.standing = READY
            rank = self._ring_rank(host)
            bucket = self._buckets.get(rank)
            if bucket is None:
                bucket = self._buckets[rank] = deque()
                heapq.heappush(self._bucket_ranks, -rank)
            bucket.append((host.token, host))
            self._ring_entries += 1
            if self._crowded(self._ring_entries):
                self._compact()

    def _push_timer(self, host: _Host[T], when: float) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (when, self._seq, host.token, host))
        if self._crowded(len(self._timers)):
            self._compact()

    def _turn_done(self, host: _Host[T], now: float) -> bool:
        """Whether *host* has had ``turn`` requests, or ``turn_seconds``, at its place."""
        if host.served >= self.turn:
            return True
        return 0 < self.turn_seconds <= now - host.active_since

    def _turn_over(self, host: _Host[T], now: float) -> bool:
        """Whether *host* has had its turn at its place while hosts wait for one.

        For an answering host, answering hosts, or silent hosts holding fewer than their share of
        the places.
        """
        if not (self._waiting and host.active and self._turn_done(host, now)):
            return False
        if not host.state.answering or self._waiting > self._waiting_silent:
            return True
        return self._active_silent < self._silent_share

    def _silent_share_taken(self, host: _Host[T]) -> bool:
        """Whether *host*, without a place, stays out of the line for places.

        Whether *host*, without a place, is silent while silent hosts hold
        their share of the places and answering hosts wait for one. Hosts
        are let out of the line for places freed before any is taken, and
        a silent host counts among those holding one only at its first
        request: several places freed at once (hanging requests timing
        out together) would otherwise all go to silent hosts.
        """
        return (
            not host.state.answering
            and self._waiting > self._waiting_silent
            and self._active_silent >= self._silent_share
        )

    def _leave(self, host: _Host[T], now: float, requeue: bool = False) -> None:
        """Give the active place of *host*, with only overdue requests in flight, up.

        *host*, with nothing in flight but overdue requests, gives its
        active place up (if it holds one) to the first host waiting for one;
        with *requeue*, it waits behind them for its next turn.
        """
        if not host.active:
            return
        host.active = False
        self.active -= 1
        if not host.state.answering:
            self._active_silent -= 1
        if requeue:
            self._set_capped(host)
        self._release_capped(now)

    def _ring_rank(self, host: _Host[T]) -> int:
        """Return the rank *host* competes with across hosts (see ``ring_granularity``).

        Answering hosts before silent ones of the same priority.
        """
        return (host.head_rank() // self._ring_granularity) * 2 + host.state.answering

    def _uncap(self, host: _Host[T]) -> None:
        """Count CAPPED *host* no longer among the hosts waiting for a place.

        Its FIFO entry goes stale with its next token. The caller places it.
        """
        self._waiting -= 1
        if not host.state.answering:
            self._waiting_silent -= 1
        host.standing = READY  # until placed

    def _set_capped(self, host: _Host[T], front: bool = False) -> None:
        """Into the line of its class, at the back (*front*: at the head)."""
        if host.standing == CAPPED:
            self._uncap(host)
        silent = not host.state.answering
        self._waiting += 1
        if silent:
            self._waiting_silent += 1
        host.token += 1
        host.standing = CAPPED
        fifo = self._capped_silent if silent else self._capped
        if front:
            fifo.appendleft((host.token, host))
        else:
            fifo.append((host.token, host))
        if self._crowded(len(fifo)):
            self._compact()

    def _release_capped(self, now: float) -> bool:
        """Place capped hosts until one is READY; True if one is.

        Answering hosts first, unless silent ones wait holding fewer than their share of the places.
        """
        while self._waiting and (self.max_active <= 0 or self.active < self.max_active):
            silent_first = self._waiting_silent and self._active_silent < self._silent_share
            first, second = (
                (self._capped_silent, self._capped)
                if silent_first
                else (self._capped, self._capped_silent)
            )
            fifo = first if first else second
            if not fifo:
                return False
            token, host = fifo.popleft()
            if host.token == token:
                self._place(host, now)
                if host.standing == READY:
                    return True
        return False

    def _release_timers(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, token, host = heapq.heappop(timers)
            if host.token == token and host.standing in (BLOCKED, IDLE):
                self._place(host, now)

    def _crowded(self, size: int) -> bool:
        # Stale entries are skipped lazily, but one that sits where nothing
        # walks (a long block, a rank that higher ranks starve, a full cap)
        # would stay forever. A structure holds at most one valid entry per
        # live host, so past twice that it is mostly stale: compacting then
        # keeps every structure O(live hosts) at O(1) amortised cost.
        return size > 2 * len(self._hosts) + 64

    def _compact(self) -> None:
        """Drop stale entries from the ring, the timer heap, the capped FIFO and the prefetch heap.

        In place, because callers may hold references to these containers.
        """
        for heap in (self._timers, self._prefetchable):
            live = [e for e in heap if e[3].token == e[2]]
            heapq.heapify(live)
            heap[:] = live
        for fifo in (self._capped, self._capped_silent):
            kept = [e for e in fifo if e[1].token == e[0]]
            fifo.clear()
            fifo.extend(kept)
        buckets = self._buckets
        for rank in list(buckets):
            bucket = buckets[rank]
            kept = [e for e in bucket if e[1].token == e[0]]
            if kept:
                bucket.clear()
                bucket.extend(kept)
            else:
                del buckets[rank]
        self._bucket_ranks[:] = [-rank for rank in buckets]
        heapq.heapify(self._bucket_ranks)
        self._ring_entries = sum(len(bucket) for bucket in buckets.values())

    def _retire(self, host: _Host[T]) -> None:
        host.standing = DRAINED
        del self._hosts[host.key]
        self._remember_state(host.key, host.state)

    def _recall(self, key: str) -> HostState:
        """Return the state of *key*, from the memories of idle hosts or new.

        The state of *key*, which is not live, taken out of the memories
        of idle hosts, or a new one.
        """
        state = self._retired.pop(key, None) or self._kept.pop(key, None)
        return state if state is not None else self._state_factory(key)

    def _remember_state(self, key: str, state: HostState) -> None:
        """Keep the state of *key*, now idle, in the memory of idle hosts.

        Keep the state of *key*, now idle, pushing the least recently used
        idle host out of the memory if it is full. A host pushed out while it
        is given up, or blocked beyond now, is kept in a second memory of the
        same size, which forgets the oldest: a broad crawl that retires many
        hosts in a row does not forget a Retry-After still running or a host
        it gave up.
        """
        retired = self._retired
        retired[key] = state
        retired.move_to_end(key)
        if len(retired) <= self._remember:
            return
        now = self.clock()
        kept = self._kept
        while len(retired) > self._remember:
            old_key, old = retired.popitem(last=False)
            if old.given_up or old.blocked_until > now:
                kept[old_key] = old
                if len(kept) <= self._remember:
                    continue
                old_key, _ = kept.popitem(last=False)
            if self.on_forget is not None:
                self.on_forget(old_key)
