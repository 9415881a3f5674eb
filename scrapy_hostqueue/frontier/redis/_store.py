"""The Redis store: one crawl shared by several processes, one limit per host.

Pure logic plus an asyncio task: no Scrapy or Twisted import, and the
``redis`` client is passed in (see :mod:`scrapy_hostqueue.frontier.redis._glue`).

**Each host held by one process.** A process *claims* hosts that have queued
requests (see :mod:`scrapy_hostqueue.frontier.redis._db` for the keys), works
them with the in-memory store's ring, the AIMD middleware and the send gate
as a single process does, and gives a host back when it has been idle for
:data:`HOLD_GRACE` seconds, must wait longer than :data:`RELEASE_BLOCKED`
seconds (a Retry-After), holds more than its fair share (the crawl's hosts
over its processes, rounded down) while another process waits for hosts, or
at a graceful close. A host is worked by one process at a time, so
its limit, its block and its spacing hold for the crawl as a whole: its state
(limit, block and spacing as wall-clock times, what the AIMD middleware
learned) travels with it through Redis, and a host blocked by a Retry-After
is claimable again only when the block ends.

**Busy hosts shared within their limit.** A held host busy enough for two
processes (a deep queue, a limit of a few requests, no spacing) is lent in
part to a process that finds no host to claim, when ``share_hosts`` is on:
the holder keeps part of the host's limit and the co-holder gets the rest,
the two never having more than the limit in flight between them (see
:mod:`scrapy_hostqueue.frontier.redis._share`).

**Synchronous methods, asynchronous Redis.** The store's methods act on local
state and append to an ordered outbound log; an asyncio task (``RedisLink``,
in :mod:`scrapy_hostqueue.frontier.redis._link`) sends the log in batches (a
pipeline of Lua scripts), claims hosts when this process holds fewer than it
can work, reads the next
requests of the hosts it holds, renews this process's heartbeat and reclaims
what processes whose heartbeat expired held. The log keeps at-least-once: a
request's acknowledgement reaches Redis after the requests its callback
produced. A process holds only a *window* of each host's queue.

**Dupefilter.** The push script adds the request's fingerprint to the
crawl's fingerprints (exact, or a Bloom filter: see ``_db``) and queues the
request only if it is new, atomically. A
request pushed for a host this process holds is kept (leased to this
process in the same script) only once Redis has said it is new, so a page is
never crawled twice because two processes found its link at once.

**Faults.** Every script is idempotent (request ids are chosen by the
pushing process): a batch whose answer was lost with the connection is sent
again once Redis is back, after a resync that gives back what this process
was given and never heard of. While Redis is away the process goes on with
the requests it holds and hands out nothing new from Redis.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from scrapy_hostqueue.frontier._layered import LayeredStore
from scrapy_hostqueue.frontier.memory import HostState, MemoryStore
from scrapy_hostqueue.frontier.redis._capacity import Backlog, Capacity, HeldRequest
from scrapy_hostqueue.frontier.redis._db import RANK_LIMIT, part_prefix, partition_of, split_value
from scrapy_hostqueue.frontier.redis._share import (
    LOWERING,
    OFFER_WAIT,
    OFFERED,
    RECALLING,
    SHARE_END_DEPTH,
    SHARE_TURN,
    WORKING,
    Share,
    may_share,
)
from scrapy_hostqueue.frontier.redis._waits import RedisWaits

__all__ = ["HOLD_GRACE", "RELEASE_BLOCKED", "RedisStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Requests of a host read from Redis at once, and the count at which more are.
WINDOW = 16
REFILL_AT = 2
#: A held host keeps at most this many requests pushed for it in memory.
ACTIVE_WINDOW = 64
#: Seconds a held host with nothing to do stays held before it is given back.
HOLD_GRACE = 0.5
#: Seconds a held host that was never handed out stays held while this
#: process had no room for it (its other hosts kept its global limit busy) before
#: it is given back; and how recently this process must have had room
#: (nothing to hand out) to claim hosts.
UNUSED_GRACE = 1.0
#: A held host that must wait longer than this (seconds) is given back, to be
#: claimable again when its wait ends.
RELEASE_BLOCKED = 1.0
#: The block reason (the monitor's controls) of a blocked host that is kept
#: held however long it waits.
HELD_THROUGH = "monitor"
#: Seconds before a claim that found no host is tried again.
CLAIM_RETRY = 0.2
#: Seconds between two saves of the state of hosts that changed.
SAVE_INTERVAL = 1.0
#: Operations sent in one step of the task.
BATCH = 2_000
#: Requests kept back in memory while Redis is full; past it, in a file.
BACKLOG = 10_000
#: Seconds Redis may stay full with nothing queued or leased in the crawl
#: (nothing that could free memory) before the crawl stops, at least.
STUCK_FULL = 10.0


class _Entry(Generic[T]):
    """A request in a host's window.

    Its id in Redis ("" for one kept in memory only, its codec could not encode it), rank, and the
    request or its encoded form.
    """

    __slots__ = ("data", "item", "rank", "rid")

    def __init__(self, rid: str, rank: int, item: T | None, data: bytes | None = None) -> None:
        self.rid = rid
        self.rank = rank
        self.item = item
        self.data = data


@dataclass
class _Held:
    """A host this process holds."""

    remote: int = 0  # requests queued for it in Redis (as last heard)
    pending: int = 0  # pushes for it kept here once Redis answers
    unacked: int = 0  # handed out, not acknowledged
    served: int = 0  # handed out since the claim
    idle_since: float | None = None
    claimed_at: float = 0.0
    refilling: bool = False
    draining: bool = False
    #: This process's side of the host shared with another process, if it is.
    share: Share | None = None

    @property
    def co_held(self) -> bool:
        """Whether this process works a part of a host another holds."""
        return self.share is not None and not self.share.owner


class RedisStore(LayeredStore[_Entry[T]], Generic[T]):
    """A :class:`~scrapy_hostqueue.frontier.RequestStore` on a shared Redis.

    *memory* keeps the ring and the state of the hosts this process holds;
    *proc* is this process's id in the crawl (see
    :func:`~scrapy_hostqueue.frontier.redis._db.register`); *encode*, *decode*
    turn items into bytes and back (*encode* returns None for an item it
    cannot encode: it stays in memory only); *fingerprint* gives an item's
    fingerprint, or None for one the dupefilter must not filter.
    """

    #: What the AIMD middleware learned about a host (JSON-able), saved with
    #: the host's state; and restoring it when this process takes a host over.
    export_learned: Callable[[str], dict[str, float] | None] | None = None
    import_learned: Callable[[str, dict[str, float]], None] | None = None

    def __init__(  # noqa: PLR0917 - the parts of the store, then options
        self,
        memory: MemoryStore[_Entry[T]],
        crawl_id: str,
        proc: str,
        encode: Callable[[T], bytes | None],
        decode: Callable[[bytes], T],
        fingerprint: Callable[[T], bytes | None],
        *,
        max_hold: int,
        lease_timeout: float = 30.0,
        finish_grace: float = 3.0,
        wait_for_urls: bool = False,
        share_hosts: bool = False,
        window: int = WINDOW,
        wall_clock: Callable[[], float] = time.time,
        token: str = "",
        backlog: int = BACKLOG,
        spill_dir: str = "",
        where: str = "",
        prefixes: list[str] | None = None,
    ) -> None:
        super().__init__(memory)
        self.crawl_id = crawl_id
        #: The key prefixes of the crawl's partitions (see ``_db``).
        self.prefixes = prefixes or [part_prefix(crawl_id)]
        self.proc = proc
        #: The crawl's identity in Redis (see ``_db``): every script
        #: checks it.
        self.token = token
        #: Where the files of requests kept here go.
        self.spill_dir = spill_dir or tempfile.gettempdir()
        #: How full Redis is, and the pushes it refused, kept here.
        self.capacity = Capacity(
            Backlog(backlog, self.file_path("backlog")), where or crawl_id, memory.clock
        )
        self._backlog_told = 0  # the backlog count Redis was last told
        #: Set once Redis no longer holds the crawl: nothing more is handed
        #: out or sent.
        self.frontier_lost = False
        #: Set once Redis stayed full with nothing in the crawl that could
        #: free memory: the crawl stops.
        self.stuck_full = False
        self._stuck_since: float | None = None
        #: Why Redis no longer holds the crawl, in words ("" if unknown).
        self.lost_cause = ""
        #: Called once when Redis no longer holds the crawl (``"lost"``), or
        #: stays full for good (``"full"``).
        self.on_lost: Callable[[str], None] | None = None
        self._encode = encode
        self._decode = decode
        self._fingerprint = fingerprint
        self.max_hold = max(1, max_hold)
        self.lease_timeout = lease_timeout
        self.finish_grace = finish_grace
        self.wait_for_urls = wait_for_urls
        #: Whether busy hosts may be shared with processes that find no host.
        self.share_hosts = share_hosts
        self._window = max(2, window)
        self._wall = wall_clock
        self._held: dict[str, _Held] = {}
        self._known: dict[str, str] = {}  # ids leased to this process it knows of: their host
        self._leases: dict[int, tuple[T, str, str, int]] = {}  # handed out, by id(item)
        self.outbox: list[tuple[Any, ...]] = []
        self._next_id = 0
        #: The ids of the pushes sent in a batch whose answer was lost.
        self.resent: set[str] = set()
        self._unanswered = 0  # pushes sent or to send, not answered yet
        self._dirty: set[str] = set()
        self._claiming = False
        self._claim_after = 0.0
        #: The partition the next claim starts from (each claim the next one),
        #: and the hosts claimable in each partition as last read (None:
        #: not read yet).
        self._claim_next = partition_of(proc, len(self.prefixes))
        self.claimable: list[int | None] = [None] * len(self.prefixes)
        #: The parts of busy hosts offered in each partition, as last read.
        self.offered: list[int] = [0] * len(self.prefixes)
        #: When this process last had room for more hosts (nothing to hand
        #: out when asked, or nothing queued at all).
        self._room_at = memory.clock()
        self._saved_at = 0.0
        # Crawl-wide, as last read from Redis.
        self.remote_queued = 0
        self.remote_leased = 0
        self._others_hungry = False
        self._others_want_share = False  # other processes found no host at all
        self._hungry = False  # this process waits for hosts (as Redis said)
        #: Hosts held or claimable in the crawl, and live processes (as
        #: last read): a process holds at least ``hosts // processes``
        #: while others wait for hosts, and gives back what it holds beyond.
        self.share = (0, 1)
        self._quiet_since: float | None = None
        self._finished = False
        #: Called when this process got work from Redis, or the crawl finished.
        self.on_work: Callable[[], None] | None = None
        #: Called when Redis answers again after an outage.
        self.on_back: Callable[[], None] | None = None
        #: Whether Redis answers (False during an outage).
        self.connected = True
        #: How long the scheduler waited on Redis lately (for the monitor).
        self.waits = RedisWaits()
        #: Counters for the stats: duplicates Redis dropped, hosts claimed...
        self.counts: dict[str, int] = {
            "duplicates": 0,
            "claimed_hosts": 0,
            "released_hosts": 0,
            "refused": 0,
            "outages": 0,
            "lost_leases": 0,
            "lost_hosts": 0,
            "lent_hosts": 0,
            "shared_hosts": 0,
            "kept_back": 0,
        }
        #: Called when the task should step now (the local ring is starving,
        #: the log is long); set by the task.
        self.wake: Callable[[], None] | None = None
        #: Set at close: no more claims.
        self.closing = False
        #: Redis forgot this process (a claim answered -1): its next step
        #: renews the heartbeat, which registers it again, and says nothing
        #: more of the loss until then.
        self.unregistered = False

    # -- the RequestStore attributes --------------------------------------------

    def _changed(self, key: str) -> None:
        self._dirty.add(key)

    def __len__(self) -> int:
        """Count the requests left, here and in the shared crawl.

        Requests queued here, pushed and not answered yet, and queued in
        the shared crawl (as last read); plus one while the crawl is not
        finished (requests leased elsewhere may yet bring more), so that the
        scheduler keeps the crawl open.
        """
        return (
            len(self._mem)
            + self._unanswered
            + max(0, self.remote_queued)
            + (0 if self.finished() else 1)
        )

    @property
    def held_hosts(self) -> list[str]:
        return list(self._held)

    def finished(self) -> bool:
        """Whether the shared crawl has had nothing left for ``finish_grace`` seconds.

        Whether the shared crawl had nothing queued or leased anywhere for
        ``finish_grace`` seconds (never with ``wait_for_urls``).
        """
        return self._finished

    # -- requests ----------------------------------------------------------------

    def push(self, key: str, rank: int, item: T) -> bool:
        state = self._mem.known_state(key)
        if state is not None and state.given_up:
            return False
        data = self._encode(item)
        if data is None:
            # Kept in memory only, worked without a claim: rare (a meta that
            # cannot be pickled), and lost with the process.
            return self._mem.push(key, rank, _Entry("", rank, item))
        rank = max(-RANK_LIMIT, min(RANK_LIMIT, rank))
        self._next_id += 1
        rid = f"{self.proc}.{self._next_id}"
        fingerprint = self._fingerprint(item) or b""
        self._unanswered += 1
        if self._finished:
            self._finished = False
            self._quiet_since = None
        if self.capacity.holding:
            # Redis is full, or nearly: behind the requests kept here.
            self.capacity.backlog.append(HeldRequest(rid, fingerprint, key, rank, data))
            self.capacity.note_backlog()
            self.counts["kept_back"] += 1
            return True
        held = self._held.get(key)
        keep = (
            held is not None
            and not held.draining
            and not held.co_held
            and self._mem.queued(key) + held.pending < ACTIVE_WINDOW
        )
        if keep:
            assert held is not None
            held.pending += 1
        self.outbox.append(
            ("push", rid, fingerprint, key, rank, keep, data, item if keep else None)
        )
        if len(self.outbox) >= BATCH:
            self.kick()
        return True

    def pop(self, now: float | None = None) -> tuple[str, T] | None:
        if self.frontier_lost or self.stuck_full:
            return None  # what is here goes to the file of held requests
        popped = self._mem.pop(now)
        if popped is None:
            self._room_at = self._mem.clock() if now is None else now
            waits = self.waits
            waits.starved(self._room_at)
            wants = self._wants_hosts()
            if (
                waits.asked_since is None  # once per exchange, not at every pop
                and self.remote_queued > 0
                and (wants or any(held.refilling for held in self._held.values()))
            ):
                # Work from Redis is due: what comes next waits on it.
                waits.ask(self._room_at)
            if self.outbox or wants:
                # Starving: send what waits and claim now, not at the next tick.
                self.kick()
            return None
        key, entry = popped
        if self.waits.starved_since is not None:
            self.waits.fed(self._mem.clock() if now is None else now)
        held = self._held.get(key)
        item = self._lease(key, entry, held)
        if entry.rid and held is not None:
            held.served += 1
            if held.remote and self._mem.queued(key) <= REFILL_AT:
                self.kick()
        return key, item

    def _lease(self, key: str, entry: _Entry[T], held: _Held | None) -> T:
        """Hand out the item of *entry* from *key*'s window.

        Decoded if only its bytes are here, and leased until acknowledged if it is in Redis.
        """
        item = entry.item
        if item is None:
            assert entry.data is not None
            item = self._decode(entry.data)
        if entry.rid:
            self._leases[id(item)] = (item, entry.rid, key, entry.rank)
            if held is not None:
                held.unacked += 1
        return item

    def finish(self, key: str, overdue: bool = False) -> None:
        self._mem.finish(key, overdue)

    def ack(self, item: T) -> None:
        lease = self._leases.pop(id(item), None)
        if lease is None:
            return
        _item, rid, key, _rank = lease
        self._known.pop(rid, None)
        held = self._held.get(key)
        if held is not None:
            held.unacked -= 1
        self.outbox.append(("ack", rid, key))

    def give_back(self, key: str, rank: int, item: T) -> None:
        lease = self._leases.pop(id(item), None)
        if lease is None:
            self._mem.push(key, rank, _Entry("", rank, item))
            return
        # Back in its host's window, still leased to this process.
        held = self._held.get(key)
        if held is not None:
            held.unacked -= 1
        self._mem.push(key, rank, _Entry(lease[1], rank, item))

    def give_up(self, key: str) -> list[T]:
        """Refuse *key* from now on, crawl-wide.

        Returns the requests of its window, each leased until acknowledged (they go to their
        errbacks). Those queued in Redis are dropped there.
        """
        entries = self._mem.give_up(key)
        items = []
        held = self._held.get(key)
        for entry in entries:
            items.append(self._lease(key, entry, held))
        if held is not None:
            held.remote = 0
        self._dirty.add(key)
        self.outbox.append(("give_up", key))
        return items

    def items(self) -> Iterator[tuple[str, int, T]]:
        """``(key, rank, item)`` of the requests in this process's windows."""
        for key, rank, entry in self._mem.items():
            item = entry.item
            if item is None:
                assert entry.data is not None
                item = self._decode(entry.data)
            yield key, rank, item

    # -- hosts -----------------------------------------------------------------

    def queued(self, key: str) -> int:
        held = self._held.get(key)
        return self._mem.queued(key) + (held.remote if held is not None else 0)

    def hosts(self) -> Iterator[tuple[str, int, int, HostState]]:
        for key, queued, in_flight, state in self._mem.hosts():
            held = self._held.get(key)
            yield key, queued + (held.remote if held is not None else 0), in_flight, state

    def close(self) -> None:
        """Nothing to do here: ``RedisLink.close`` hands back what the process holds."""

    def set_limit(self, key: str, limit: int) -> None:
        """Set the AIMD middleware's limit for *key*.

        On a shared host, held down to this process's part.
        """
        held = self._held.get(key)
        share = held.share if held is not None else None
        if share is None:
            super().set_limit(key, limit)
            return
        if limit < 1:
            raise ValueError(f"a host limit must be >= 1, got {limit!r}")
        share.wanted = limit
        self._mem.set_limit(key, share.limit_here())
        if share.owner:
            self._changed(key)

    def block_until(self, key: str, when: float, reason: str | None = None) -> None:
        super().block_until(key, when, reason)
        held = self._held.get(key)
        if held is not None and held.share is not None:
            # The other holder must read it at its next step: write it now.
            self.kick()

    def redis_figures(self) -> dict[str, Any]:
        """Say how much Redis holds this process back now, for the monitor.

        ``waited``: the share of the last 10 s the scheduler had nothing to
        hand out while it waited on Redis (see ``_waits``);
        ``round_trip_p95``: of the last exchanges, in seconds (None before
        one); ``away``: seconds since Redis stopped answering, or has left an
        exchange unanswered for a second or more (0 while it answers);
        ``full``: Redis refuses new requests; ``kept_back``: new requests kept
        here meanwhile.
        """
        now = self._mem.clock()
        waits = self.waits
        p95 = waits.round_trip_p95()
        return {
            "waited": round(waits.share(now), 3),
            "round_trip_p95": None if p95 is None else round(p95, 6),
            "away": round(waits.silent_for(now), 3),
            "full": self.capacity.full_since is not None,
            "kept_back": len(self.capacity.backlog),
        }

    def sharing(self) -> bool:
        """Whether this process holds a host shared with another process."""
        return any(held.share is not None for held in self._held.values())

    # -- host state in Redis -----------------------------------------------------

    def _state(self, key: str) -> tuple[str, int]:
        """Return the state of *key* as JSON, and when it may be claimed again.

        The state of *key* as JSON, and when it may be claimed again (ms
        since the epoch, 0: now).
        """
        state = self._mem.known_state(key)
        if state is None:
            return "", 0
        now = self._mem.clock()
        to_wall = self._wall() - now
        held = self._held.get(key)
        share = held.share if held is not None else None
        saved: dict[str, Any] = {"limit": share.wanted if share is not None else state.limit}
        if state.interval:
            saved["interval"] = state.interval
        ready = 0.0
        if state.blocked_until > now:
            saved["blocked_until"] = state.blocked_until + to_wall
            saved["reason"] = state.block_reason
            ready = state.blocked_until
        spaced = state.spaced_until()
        if spaced > now:
            saved["spaced_until"] = spaced + to_wall
            ready = max(ready, spaced)
        if state.given_up:
            saved["given_up"] = True
        if self.export_learned is not None:
            learned = self.export_learned(key)
            if learned is not None:
                saved["learned"] = learned
        ready_ms = int((ready + to_wall) * 1000) if ready > now else 0
        return json.dumps(saved, separators=(",", ":")), ready_ms

    def _take_over(self, key: str, raw: bytes | str) -> None:
        """Apply the state *key* had when its last holder saved it."""
        self._mem.host_state(key)  # made now if new, with the configured limit
        if not raw:
            return
        try:
            state = json.loads(raw)
        except ValueError:
            return
        now = self._mem.clock()
        to_monotonic = now - self._wall()
        limit = state.get("limit")
        if isinstance(limit, int) and limit >= 1:
            self._mem.set_limit(key, limit)
        interval = state.get("interval")
        if isinstance(interval, (int, float)) and interval > 0:
            self._mem.set_interval(key, float(interval))
        blocked = state.get("blocked_until")
        if isinstance(blocked, (int, float)) and blocked + to_monotonic > now:
            self._mem.block_until(key, blocked + to_monotonic, state.get("reason"))
        spaced = state.get("spaced_until")
        if isinstance(spaced, (int, float)) and spaced + to_monotonic > now:
            self._mem.space_until(key, spaced + to_monotonic)
        learned = state.get("learned")
        if self.import_learned is not None and isinstance(learned, dict):
            self.import_learned(key, learned)

    # -- what the task does, synchronously ---------------------------------------

    def kick(self) -> None:
        if self.wake is not None:
            self.wake()

    def _wants_hosts(self) -> int:
        """How many hosts this process would claim now."""
        if self.closing or not self.connected:
            return 0
        if self._mem.clock() - self._room_at > UNUSED_GRACE:
            # The hosts held keep the budget busy: more would wait unused.
            return 0
        working = sum(1 for held in self._held.values() if not held.draining)
        return max(0, self.max_hold - working)

    def tick(self, now: float) -> None:
        """Append to the log what the held hosts need now: refills, saves, hand-backs.

        And a claim if this process can work more hosts.
        """
        mem = self._mem
        if not len(mem):
            # Nothing to hand out: room for more hosts, whether or not the
            # scheduler asked lately.
            self._room_at = now
        # One offer open at a time.
        offering = not self._others_want_share or any(
            held.share is not None and held.share.owner and not held.share.taken
            for held in self._held.values()
        )
        for key, held in list(self._held.items()):
            queued = mem.queued(key)
            in_flight = mem.in_flight(key)
            state = mem.known_state(key)
            if held.share is not None:
                self._tick_share(key, held, state, now)
            elif not offering and self._may_offer(key, held, state, now):
                assert state is not None
                offering = True
                held.share = Share(True, state.limit, state.limit // 2, state.limit, LOWERING, now)
                # Handed nothing more until it has its own part in flight.
                mem.set_limit(key, held.share.limit_here())
            if held.refilling:
                continue
            busy = bool(in_flight or held.unacked or held.pending)
            ready_at = state.ready_at() if state is not None else 0.0
            # Blocked from the monitor's page: kept, so that an unblock given
            # there finds the host held.
            long_wait = ready_at > now + RELEASE_BLOCKED and (
                state is None or state.block_reason != HELD_THROUGH
            )
            if not busy and (held.draining or long_wait):
                self._hand_back(key, held)
                continue
            if (
                not held.served
                and not busy
                and now - held.claimed_at >= UNUSED_GRACE
                and now - self._room_at >= UNUSED_GRACE
            ):
                # Never handed out: the other hosts held keep the budget busy
                # (hosts that answer go before hosts not heard from yet).
                # Another process may use it.
                self._hand_back(key, held)
                continue
            if queued or held.remote or busy:
                held.idle_since = None
            elif held.idle_since is None:
                held.idle_since = now
            elif now - held.idle_since >= HOLD_GRACE:
                self._hand_back(key, held)
                continue
            if held.remote and queued <= REFILL_AT and not held.draining and not long_wait:
                held.refilling = True
                self.outbox.append(("refill", key, self._window - queued))
        if self._others_hungry:
            self._give_up_surplus()
        if self._dirty and now - self._saved_at >= SAVE_INTERVAL:
            self._saved_at = now
            for key in self._dirty:
                kept = self._held.get(key)
                if kept is not None and not kept.co_held:
                    saved, ready = self._state(key)
                    self.outbox.append(("give_back", key, saved, ready, False, ()))
            self._dirty.clear()
        self._send_backlog()
        want = self._wants_hosts()
        if want and not self._claiming and now >= self._claim_after:
            self._claiming = True
            # A part of a busy host only while this process works none yet.
            part = self.share_hosts and not any(held.co_held for held in self._held.values())
            self.outbox.append(("claim", want, self._window, part, self._claim_partition(part)))

    def starving(self) -> bool:
        """Whether this process has nothing here to hand out."""
        return not len(self._mem)

    def part(self, key: str) -> int:
        """Return the index of the partition of the host *key*."""
        return partition_of(key, len(self.prefixes))

    def _claim_partition(self, part: bool = False) -> int:
        """Return the partition to claim from now, and turn to the next one.

        The first from the turn's that had hosts to claim when last read (or
        was not read yet); else, for a process that may take a part of a busy
        host (*part*), the first with one offered; else the turn's own.
        """
        n = len(self.prefixes)
        start = self._claim_next
        order = [(start + i) % n for i in range(n)]
        chosen = next(
            (k for k in order if self.claimable[k] is None or (self.claimable[k] or 0) > 0),
            next((k for k in order if part and self.offered[k] > 0), start),
        )
        self._claim_next = (chosen + 1) % n
        return chosen

    def _send_backlog(self) -> None:
        """Send as many requests kept back as Redis has room for now.

        Redis is told whether this process keeps any (the crawl is not finished while it does).
        """
        capacity = self.capacity
        backlog = capacity.backlog
        if backlog:
            acks = sum(1 for op in self.outbox[:BATCH] if op[0] == "ack")
            for held in backlog.take(capacity.budget(acks)):
                rid, fingerprint, key, rank, data = held
                self.outbox.append(("push", rid, fingerprint, key, rank, False, data, None))
        if bool(backlog) != bool(self._backlog_told):
            self._backlog_told = len(backlog)
            self.outbox.append(("backlog", len(backlog)))

    def refused_pushes(self, ops: list[tuple[Any, ...]]) -> bool:
        """Redis refused the pushes *ops* for lack of memory (nothing of them applied).

        Kept here, before the others kept back. True when this starts a spell worth a WARNING.
        """
        kept = []
        for _, rid, fingerprint, key, rank, keep, data, _item in ops:
            held = self._held.get(key)
            if keep and held is not None and held.pending:
                held.pending -= 1
            kept.append(HeldRequest(rid, fingerprint, key, rank, data))
        self.capacity.backlog.put_back(kept)
        self.counts["kept_back"] += len(kept)
        return self.capacity.refused()

    def lose_frontier(self, cause: str = "") -> None:
        """Redis no longer holds the crawl (*cause*: why, in words, if known).

        Hand out and send nothing more; what this process holds goes to a file
        (:meth:`held_requests`).
        """
        if self.frontier_lost:
            return
        self.frontier_lost = True
        self.lost_cause = cause
        if self.on_lost is not None:
            self.on_lost("lost")

    def _check_stuck(self, now: float) -> None:
        """Stop the crawl when Redis is full and nothing can free memory.

        Stop the crawl when Redis refuses new requests while nothing in
        the crawl can free memory (nothing queued or leased anywhere, nothing
        here): waiting would be for ever.
        """
        stuck = (
            self.capacity.full_since is not None
            and self.remote_queued <= 0
            and self.remote_leased <= 0
            and not len(self._mem)
            and not self._leases
        )
        if not stuck:
            self._stuck_since = None
            return
        if self._stuck_since is None:
            self._stuck_since = now
        if not self.stuck_full and now - self._stuck_since >= max(STUCK_FULL, self.lease_timeout):
            self.stuck_full = True
            if self.on_lost is not None:
                self.on_lost("full")

    def drop_unsent(self) -> None:
        """Forget the requests Redis has not taken (written to a file)."""
        pushes = [op for op in self.outbox if op[0] == "push"]
        self.outbox = [op for op in self.outbox if op[0] != "push"]
        self._unanswered -= len(pushes) + len(self.capacity.backlog)
        self.capacity.backlog.take(len(self.capacity.backlog))
        self.capacity.backlog.close()

    def held_requests(self) -> Iterator[tuple[HeldRequest, T | None]]:
        """Every request this process holds, with its item when it has it.

        Those of its windows, those handed out and not acknowledged, those not sent yet and those
        kept back. Requests kept in memory only (their codec could not encode them) have nothing to
        write.
        """
        for key, rank, entry in self._mem.items():
            item = entry.item
            if item is None:
                assert entry.data is not None
                item = self._decode(entry.data)
            data = entry.data if entry.data is not None else self._encode(item)
            if data is not None:
                fingerprint = self._fingerprint(item) or b""
                yield HeldRequest(entry.rid, fingerprint, key, rank, data), item
        for item, rid, key, rank in self._leases.values():
            data = self._encode(item)
            if data is not None:
                yield HeldRequest(rid, self._fingerprint(item) or b"", key, rank, data), item
        yield from self.unsent_requests()

    def unsent_requests(self) -> Iterator[tuple[HeldRequest, T | None]]:
        """List the requests this process pushed that Redis has not taken.

        Not sent yet, or kept back while Redis is full.
        """
        for op in self.outbox:
            if op[0] == "push":
                _, rid, fingerprint, key, rank, _keep, data, item = op
                yield HeldRequest(rid, fingerprint, key, rank, data), item
        for held in self.capacity.backlog.items():
            yield held, None

    def file_path(self, kind: str) -> str:
        """Return the file of this process's requests of *kind*.

        The file of this process's requests of *kind* (``backlog``:
        kept back while Redis is full; ``held``: what it held when Redis
        lost the crawl).
        """
        name = re.sub(r"[^\w.-]", "_", self.crawl_id)
        return os.path.join(self.spill_dir, f"hostqueue-{name}-{self.proc}-{kind}.jsonl")

    def _give_up_surplus(self) -> None:
        """Other processes wait for hosts.

        Drain the hosts this process holds beyond its fair share (the crawl's hosts over its
        processes, rounded down), those with the least in flight first, then those that were handed
        out the most. A draining host is handed nothing more and given back once nothing of it is in
        flight.
        """
        hosts, processes = self.share
        working = [
            (key, held)
            for key, held in self._held.items()
            if not held.draining and not held.co_held
        ]
        surplus = len(working) - hosts // processes
        if surplus <= 0:
            return
        mem = self._mem
        working.sort(key=lambda pair: (mem.in_flight(pair[0]) + pair[1].unacked, -pair[1].served))
        for key, held in working[:surplus]:
            held.draining = True
            self._give_back_window(key, release=False)

    def _forget_window(self, key: str) -> list[str]:
        """Take the requests of *key* out of its window in memory; returns their ids.

        Requests kept in memory only (no id) stay: there is nowhere else to keep them.
        """
        ids = []
        for entry in self._mem.remove_queued(key):
            if entry.rid:
                ids.append(entry.rid)
                self._known.pop(entry.rid, None)
            else:
                self._mem.push(key, entry.rank, entry)
        return ids

    def _let_go(self, key: str) -> _Held:
        """Stop holding *key* without a word to Redis.

        Redis gave it to another process or took it back (its window's requests are queued there
        again): forget its window, and give it its whole limit again if it was shared.
        """
        held = self._held.pop(key)
        self._forget_window(key)
        if held.share is not None:
            self._mem.set_limit(key, held.share.wanted)
        return held

    def _give_back_window(self, key: str, *, release: bool) -> None:
        ids = self._forget_window(key)
        held = self._held.get(key)
        if held is not None and held.co_held:
            # A co-holder saves no state; it ends its part (*release*) only
            # with nothing of the host in flight.
            end = "end" if release else ""
            self.outbox.append(("share", key, "c", self._block_ms(key), end, tuple(ids)))
        else:
            saved, ready = self._state(key)
            self._dirty.discard(key)
            self.outbox.append(("give_back", key, saved, ready, release, tuple(ids)))
        if held is not None:
            held.remote += len(ids)

    def _hand_back(self, key: str, held: _Held) -> None:
        self._give_back_window(key, release=True)
        del self._held[key]
        if held.share is not None:
            # Nothing of it in flight here (or the crawl closes): its whole
            # limit again, if this process holds it once more.
            self._mem.set_limit(key, held.share.wanted)
        else:
            self.counts["released_hosts"] += 1

    # -- busy hosts shared with another process ----------------------------------

    def _block_ms(self, key: str) -> int:
        """Return the block of *key* as wall-clock ms, 0 if it has none."""
        state = self._mem.known_state(key)
        now = self._mem.clock()
        if state is None or state.blocked_until <= now:
            return 0
        return int((state.blocked_until + self._wall() - now) * 1000)

    def _worth_sharing(self, key: str, held: _Held, state: HostState | None, now: float) -> bool:
        if state is None:
            return False
        limit = held.share.wanted if held.share is not None else state.limit
        return may_share(
            limit,
            interval=state.interval,
            blocked=state.ready_at() > now,
            given_up=state.given_up,
            answering=state.answering,
            queued=self._mem.queued(key) + held.remote,
            prefetch=self._mem.prefetch,
        )

    def _may_offer(self, key: str, held: _Held, state: HostState | None, now: float) -> bool:
        """Whether to lend a part of *key* to a process that found no host.

        Whether to lend a part of *key*, held here, to a process that
        found no host (see :mod:`scrapy_hostqueue.frontier.redis._share`).
        """
        return (
            self.share_hosts
            and self.connected
            and not self.closing
            and not held.draining
            and not held.refilling
            and now - held.claimed_at >= OFFER_WAIT
            and self._worth_sharing(key, held, state, now)
        )

    def _tick_share(self, key: str, held: _Held, state: HostState | None, now: float) -> None:
        """Move a shared host's hand-over on, and send its share step.

        The block this process saw, read back what the other holder saw.
        """
        share = held.share
        assert share is not None
        mem = self._mem
        if share.owner and share.phase == LOWERING:
            if (
                now - share.since > OFFER_WAIT
                or not self._others_want_share
                or not self.connected
                or self.closing
                or held.draining
                or not self._worth_sharing(key, held, state, now)
            ):
                # Nobody took it, or the host is no longer worth it: nothing
                # was offered in Redis, the whole limit is this process's.
                held.share = None
                mem.set_limit(key, share.wanted)
            elif mem.in_flight(key) <= share.limit - share.part:
                share.phase, share.since = OFFERED, now
                mem.set_limit(key, share.limit_here())
                self.outbox.append(("offer", key, share.limit, share.part))
            return
        if share.owner and share.phase == OFFERED:
            queued = mem.queued(key) + held.remote
            if (
                (not share.taken and now - share.since >= OFFER_WAIT)
                or share.wanted < 2
                or queued < SHARE_END_DEPTH * share.limit
                or state is None
                or state.interval
                or state.given_up
                or self.closing
            ):
                share.phase = RECALLING
        elif (
            not share.owner
            and share.phase == WORKING
            and now - share.since >= SHARE_TURN
            and (self._others_hungry or self._others_want_share)
        ):
            # Its turn is over while other processes wait: end the part.
            self._end_part(key, held)
        if not share.stepping:
            share.stepping = True
            what = "recall" if share.owner and share.phase == RECALLING else ""
            role = "o" if share.owner else "c"
            self.outbox.append(("share", key, role, self._block_ms(key), what, ()))

    def _end_part(self, key: str, held: _Held) -> None:
        """End a co-holder's part of *key*: it hands nothing more out of it.

        Its window goes back, and its part ends once nothing of it is in flight.
        """
        assert held.share is not None
        held.share.phase = RECALLING
        if not held.draining:
            held.draining = True
            self._give_back_window(key, release=False)

    def _shared_answer(self, op: tuple[Any, ...], result: Any) -> None:
        _, key, role, _block, what, _ids = op
        held = self._held.get(key)
        share = held.share if held is not None else None
        if held is None or share is None or share.owner != (role == "o") or what == "end":
            return
        share.stepping = False
        status, block, recalled = (int(value) for value in result)
        now = self._mem.clock()
        if block:
            when = block / 1000 + now - self._wall()
            if when > now:
                self._mem.block_until(key, when, "shared")
        if share.owner:
            if status == 0:
                # The co-holder has nothing in flight any more (or is dead):
                # the whole limit is this process's again.
                held.share = None
                self._mem.set_limit(key, share.wanted)
            else:
                share.taken = status == 2
        elif status == 0:
            # Not this process's any more (its heartbeat expired): its
            # window went back with its leases.
            self._let_go(key)
        elif recalled:
            self._end_part(key, held)

    def lost(self) -> None:
        """Drop what this process held, reclaimed when its heartbeat expired.

        Forget the windows (their requests are queued in Redis again). Said once per loss: the
        claims and the heartbeat that reach Redis before it registers this process again find it
        gone too.
        """
        if self.unregistered:
            return
        self.unregistered = True
        self.counts["lost_leases"] += 1
        logger.warning(
            "The shared frontier %s took back the %d hosts this process held: its "
            "heartbeat expired (HOSTQUEUE_LEASE_TIMEOUT = %g s); requests in flight "
            "finish, those in its windows go to other processes",
            self.crawl_id,
            len(self._held),
            self.lease_timeout,
        )
        for key in list(self._held):
            self._let_go(key)
        self._known.clear()

    def drop_hosts(self, keys: list[str]) -> None:
        """Redis says another process holds *keys* now.

        Forget their windows (requests in flight finish and are acknowledged).
        """
        for key in keys:
            if key not in self._held:
                continue
            self._let_go(key)
            self.counts["lost_hosts"] += 1
            logger.warning(
                "The shared frontier %s gave host %s to another process after Redis lost "
                "this process's claim of it (a failover to a replica that missed the last "
                "writes); requests of it in flight finish",
                self.crawl_id,
                key,
            )

    def _add_window(self, key: str, items: list[bytes]) -> int:
        for i in range(0, len(items), 2):
            rid = items[i].decode()
            _host, rank, data = split_value(items[i + 1])
            self._known[rid] = key
            self._mem.push(key, rank, _Entry(rid, rank, None, data))
        return len(items) // 2

    def answered(self, op: tuple[Any, ...], result: Any) -> bool:
        """Apply the answer to *op*; True if it gave this process work."""
        kind = op[0]
        if kind == "push":
            _, rid, _fp, key, rank, keep, _data, item = op
            self._unanswered -= 1
            self.resent.discard(rid)
            held = self._held.get(key)
            if keep and held is not None and held.pending:
                # (A host held again after this process lost it counts anew.)
                held.pending -= 1
            status = int(result)
            if status == 2 and held is not None:
                self._known[rid] = key
                self._mem.push(key, rank, _Entry(rid, rank, item))
                return True
            if status == 1 and held is not None:
                held.remote += 1
            elif status == 0:
                self.counts["duplicates"] += 1
            elif status == 3:
                self.counts["refused"] += 1
            return False
        if kind == "claim":
            self._claiming = False
            if result == -1:
                self.lost()
                return False
            if len(result) - 1 < op[1]:
                # Fewer than asked: that partition has no more for now.
                self.claimable[op[4]] = 0
            got = 0
            self._hungry = bool(int(result[0]))
            now = self._mem.clock()
            for claimed in result[1:]:
                host, state, left, items = claimed[:4]
                key = host.decode()
                if key in self._held:
                    continue
                held = _Held(remote=int(left), claimed_at=now)
                self._held[key] = held
                self._take_over(key, state)
                if len(claimed) > 4:
                    # A part of a host another process holds.
                    limit = self._mem.host_state(key).limit
                    held.share = Share(False, limit, int(claimed[4]), limit, WORKING, now)
                    held.share.taken = True
                    self._mem.set_limit(key, held.share.limit_here())
                    block = int(claimed[5])
                    if block:
                        when = block / 1000 + now - self._wall()
                        if when > now:
                            self._mem.block_until(key, when, "shared")
                    self.counts["shared_hosts"] += 1
                self._add_window(key, items)
                got += 1
            self.counts["claimed_hosts"] += got
            if got < op[1] and not any(n is None or n > 0 for n in self.claimable):
                # Every partition had too few: wait before asking again.
                self._claim_after = self._mem.clock() + CLAIM_RETRY
            return got > 0
        if kind == "refill":
            key = op[1]
            held = self._held.get(key)
            if held is None:
                return False
            held.refilling = False
            if result == -1:
                # Taken back (this process's heartbeat expired).
                self._let_go(key)
                return False
            left, items = result
            held.remote = int(left)
            return self._add_window(key, items) > 0
        if kind == "offer":
            held = self._held.get(op[1])
            share = held.share if held is not None else None
            if held is not None and share is not None and share.owner:
                if int(result):
                    self.counts["lent_hosts"] += 1
                else:  # no longer held here: nothing was offered
                    held.share = None
                    self._mem.set_limit(op[1], share.wanted)
            return False
        if kind == "share":
            self._shared_answer(op, result)
        return False

    def failed(self, ops: list[tuple[Any, ...]], *, sent: bool = False) -> list[tuple[Any, ...]]:
        """Return the ops of a batch that failed, to send again.

        Claims and refills are dropped (the tick asks again). With *sent*,
        Redis may have applied them (the answer was lost): the pushes are
        marked so.
        """
        kept = []
        for op in ops:
            if sent and op[0] == "push":
                self.resent.add(op[1])
            if op[0] == "claim":
                self._claiming = False
            elif op[0] == "refill":
                held = self._held.get(op[1])
                if held is not None:
                    held.refilling = False
            elif op[0] == "share" and op[4] != "end" and not op[5]:
                # A share step: the tick sends the next one.
                held = self._held.get(op[1])
                if held is not None and held.share is not None:
                    held.share.stepping = False
            else:
                kept.append(op)
        return kept

    def totals(  # noqa: PLR0917 - what the task read
        self,
        queued: Any,
        leased: Any,
        hungry: int,
        now: float,
        want_share: int = 0,
        backlog: int = 0,
    ) -> bool:
        """Take in the crawl-wide totals just read.

        The crawl-wide totals were read (*hungry*: other processes that
        wait for hosts; *want_share*: other processes that found no host at
        all; *backlog*: requests other processes keep back while Redis is
        full): True if the crawl just finished.
        """
        self.remote_queued = int(queued or 0)
        self.remote_leased = int(leased or 0)
        self._others_hungry = hungry > 0
        self._others_want_share = want_share > 0
        self._check_stuck(now)
        quiet = (
            self.remote_queued <= 0
            and self.remote_leased <= 0
            and not self.outbox
            and not self._unanswered
            and not len(self._mem)
            and not backlog
        )
        if not quiet or self.wait_for_urls:
            self._quiet_since = None
            self._finished = False
            return False
        if self._quiet_since is None:
            self._quiet_since = now
        if not self._finished and now - self._quiet_since >= self.finish_grace:
            self._finished = True
            return True
        return False

    def clock(self) -> float:
        return self._mem.clock()

    def wall(self) -> float:
        return self._wall()

    def resync_args(self, part: int = 0) -> list[Any]:
        """Return what this process knows it holds in the partition *part*, for the resync script.

        The host count, the hosts, then the request ids.
        """
        hosts = [key for key in self._held if self.part(key) == part]
        ids = [rid for rid, key in self._known.items() if self.part(key) == part]
        return [len(hosts), *hosts, *ids]

    def hand_back_all(self) -> None:
        """Give every held host back (a graceful close)."""
        for key, held in list(self._held.items()):
            self._hand_back(key, held)
