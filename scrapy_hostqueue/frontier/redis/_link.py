"""The asyncio half of the Redis store: the task that talks to Redis.

:class:`RedisLink` sends the store's outbound log in batches (one pipeline of
Lua scripts per step: one call per partition for the pushes, one for the
acknowledgements), and in the same step claims hosts (from one partition,
each claim the next), reads the next requests of held hosts, renews the
heartbeat in every partition and reads the totals of some partitions in turn
(the crawl-wide figures are their sums); it retries with a back-off while
Redis is away, and hands everything back at a graceful close. The ``redis``
client is passed in (a ``redis.asyncio.Redis``, or a
``redis.asyncio.cluster.RedisCluster``: every command names a key of one
partition, so on a Redis Cluster the pipeline's commands go to the nodes
serving the partitions' slots).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_hostqueue.frontier.redis._capacity import is_oom
from scrapy_hostqueue.frontier.redis._check import lost_cause
from scrapy_hostqueue.frontier.redis._db import (
    FP_COST,
    LOST,
    QUEUED_BYTES,
    SCRIPTS,
    fingerprint_key,
    part_prefix,
)
from scrapy_hostqueue.frontier.redis._share import SHARE_TICK
from scrapy_hostqueue.frontier.redis._store import BATCH

if TYPE_CHECKING:
    from scrapy_hostqueue.frontier.redis._store import RedisStore

__all__ = ["RedisLink", "batched"]

logger = logging.getLogger(__name__)

#: Seconds between two steps when nothing wakes the task.
TICK = 0.05
#: Seconds between two reads of the crawl-wide totals.
TOTALS_INTERVAL = 0.25
#: What a replica answers a write with (after the ``READONLY`` code).
READONLY = "You can't write against a read only replica"
#: With several partitions, seconds pushes and acknowledgements wait after the
#: last ones sent while this process has work here (each partition's take one
#: script call each). In ``python -m bench.redis_scale --quick --parts a``, 1
#: and 2 processes, Redis commands per page: 12 partitions 8.0 and 10.1
#: without the wait, 5.6 and 7.2 with it; one partition 6.0 and 6.2.
GATHER = 0.5
#: Steps reading totals in which every partition's are read once.
TOTALS_TURNS = 4
#: Operations per script call.
CHUNK = 200
#: A process that wanted hosts (and held fewer than its fair share) within
#: this many milliseconds is waiting.
HUNGRY_MS = 2_000
#: Seconds between two reads of Redis's memory (``INFO memory``), and while
#: it refuses this process's new requests.
MEMORY_INTERVAL = 1.0
MEMORY_INTERVAL_FULL = 0.1
#: Longest back-off (seconds) between two tries while Redis is away.
BACKOFF_MAX = 5.0


@dataclass(frozen=True)
class _Totals:
    """What a partition said of itself when its totals were last read."""

    queued: int
    leased: int
    hungry: set[str]  # other processes waiting for hosts there
    owned: int
    claimable: int
    want_share: set[str]  # other processes that found no host there


class FrontierLost(Exception):
    """Redis no longer holds the crawl (a script answered :data:`LOST`)."""


def batched(ops: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """*ops* in the order a step sends them.

    Between two operations of other kinds, every push, then every acknowledgement, each in its
    order, so that one script call takes each run (a page's links pushed, then the page
    acknowledged, alternate). A page's acknowledgement stays after the pushes of the links found on
    it, which came before it; the other operations (claims, hand-backs, refills, shares) keep their
    place.
    """
    out: list[tuple[Any, ...]] = []
    pushes: list[tuple[Any, ...]] = []
    acks: list[tuple[Any, ...]] = []
    for op in ops:
        if op[0] == "push":
            pushes.append(op)
        elif op[0] == "ack":
            acks.append(op)
        else:
            out += pushes
            out += acks
            out.append(op)
            pushes, acks = [], []
    out += pushes
    out += acks
    return out


class RedisLink:
    """Runs *store*'s exchanges with Redis through *client*.

    *errors* are the client's errors that mean Redis is away (or restarted).
    """

    def __init__(
        self,
        store: RedisStore[Any],
        client: Any,
        errors: tuple[type[BaseException], ...],
        info: Callable[[str], Awaitable[dict[str, Any]]] | None = None,
        run_id: str = "",
        *,
        cluster: bool = False,
    ) -> None:
        self.store = store
        self.client = client
        self.errors = errors
        #: Reads a section of ``INFO`` of the Redis serving the crawl.
        self.info = info or client.info
        #: The server's ``run_id`` when this process joined the crawl.
        self.run_id = run_id
        #: Whether *client* is a Redis Cluster's (see :meth:`_ordered`).
        self.cluster = cluster
        self._joined = store.wall()
        self._keys_at_start: dict[str, int] | None = None
        #: The totals of each partition as last read, and the next to read.
        self._totals: list[_Totals | None] = [None] * len(store.prefixes)
        self._totals_next = 0
        self._sent_at = 0.0  # when the last exchange was sent (the store's clock)
        self.shas: dict[str, str] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        store.wake = self._wake.set

    def start(self) -> asyncio.Task[None]:
        """Start :meth:`run` as a task of the running loop."""
        self._task = asyncio.ensure_future(self.run())
        return self._task

    async def run(self) -> None:
        """Step until the store closes.

        Through an outage, log once and retry with a back-off, then resync and send the failed batch
        again.
        """
        store = self.store
        backoff = 0.1
        outage_at: float | None = None
        next_beat = next_totals = next_memory = 0.0
        resync = reloaded = False
        # Retried at least as often as the heartbeat is renewed.
        longest = min(BACKOFF_MAX, max(0.1, store.lease_timeout / 3))
        while not store.closing:
            try:
                if self.shas is None:
                    self.shas = await self.load_scripts()
                if resync:
                    await self.resync()
                    resync = False
                now = store.clock()
                if now >= next_memory:
                    full = store.capacity.full_since is not None
                    next_memory = now + (MEMORY_INTERVAL_FULL if full else MEMORY_INTERVAL)
                    await self.read_memory()
                beat, totals = now >= next_beat, now >= next_totals
                await self.step(beat=beat, totals=totals)
                if beat:
                    next_beat = now + store.lease_timeout / 3
                if totals:
                    next_totals = now + TOTALS_INTERVAL
            except FrontierLost:
                store.lose_frontier(await self.lost_cause())
                return
            except Exception as error:
                if LOST in str(error):
                    store.lose_frontier(await self.lost_cause())
                    return
                if type(error).__name__ == "NoScriptError" and not reloaded:
                    # A replica promoted by a failover (Redis 7 does not copy
                    # SCRIPT LOAD to replicas): load them there and send the
                    # batch again at once, not after the back-off. After an
                    # outage, a restart: the next exchange tells whether
                    # Redis still holds the crawl.
                    (logger.debug if outage_at is not None else logger.info)(
                        "The shared frontier at Redis lacks this package's scripts (a "
                        "failover to a replica, or a restart): loading them again"
                    )
                    self.shas = None
                    resync = reloaded = True
                    continue
                # A script refused by a server made a replica: a READONLY
                # error (Redis 7), or a script error that quotes it (6.2).
                demoted = READONLY in str(error)
                if not isinstance(error, self.errors) and not demoted:
                    logger.error("The shared frontier at Redis failed: %r", error)
                if outage_at is None:
                    outage_at = time.monotonic()
                    store.connected = False
                    store.waits.away(store.clock())
                    store.counts["outages"] += 1
                    logger.warning(
                        "Lost the shared frontier at Redis (%s): handing out no new work "
                        "from it, retrying; acknowledgements and new requests wait here",
                        error,
                    )
                resync = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, longest)
                if type(error).__name__ == "NoScriptError":
                    self.shas = None  # Redis restarted: load them again
                continue
            reloaded = False
            if outage_at is not None:
                logger.warning(
                    "The shared frontier at Redis is back after %.1f s",
                    time.monotonic() - outage_at,
                )
                outage_at = None
                store.connected = True
                backoff = 0.1
                if store.on_back is not None:
                    store.on_back()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), SHARE_TICK if store.sharing() else TICK)
            self._wake.clear()

    async def load_scripts(self) -> dict[str, str]:
        return {name: await self.client.script_load(src) for name, src in SCRIPTS.items()}

    async def lost_cause(self) -> str:
        """Say why Redis no longer holds the crawl, as far as ``INFO server`` tells.

        Why Redis no longer holds the crawl, as far as ``INFO server``
        tells ("" if it cannot).
        """
        try:
            server = await self.info("server")
        except Exception:  # away again: no cause given
            logger.debug("Could not read INFO server", exc_info=True)
            return ""
        since = self.store.wall() - self._joined
        uptime = float(server.get("uptime_in_seconds", 0))
        return lost_cause(self.run_id, str(server.get("run_id", "")), uptime, since)

    async def read_memory(self) -> None:
        """Tell the store how much memory Redis uses, of its ``maxmemory``."""
        info = await self.info("memory")
        maxmemory = int(info.get("maxmemory", 0))
        self.store.capacity.memory(int(info.get("used_memory", 0)), maxmemory)
        if maxmemory and self._keys_at_start is None:
            sizes = await self._key_sizes()
            self._keys_at_start = {"r": sizes[1], "fp": sizes[2]}

    async def _key_sizes(self) -> list[int]:
        """Read the requests in ``r``, the bytes of ``r``, and the fingerprints counted.

        Summed over the partitions.
        """
        pipe = self.client.pipeline(transaction=False)
        for p in self.store.prefixes:
            pipe.hlen(p + "r")
            pipe.memory_usage(p + "r")
            pipe.hget(p + "fp", "n")
        values = [int(value or 0) for value in await pipe.execute()]
        return [sum(values[i::3]) for i in range(3)]

    async def describe_keys(self) -> str:
        """Say what the crawl's keys hold now, and how they grew.

        What the crawl's keys hold now, and how they grew since this process
        started, in words for the log.
        """
        store = self.store
        p = store.prefixes[0] if len(store.prefixes) == 1 else part_prefix(store.crawl_id, "*")
        try:
            requests, r_size, fingerprints = await self._key_sizes()
        except Exception as error:  # MEMORY USAGE refused: a managed Redis
            logger.debug("Could not read the sizes of the crawl's keys", exc_info=True)
            return f"The sizes of the crawl's keys could not be read ({error})"
        queued, leased = store.remote_queued, store.remote_leased
        start = self._keys_at_start or {"r": r_size, "fp": fingerprints}
        return (
            f"The crawl's keys: {queued:,} requests queued in {p}l:* (about "
            f"{QUEUED_BYTES} B each besides the encoded request), {leased:,} leased; "
            f"{int(requests):,} requests in {p}r ({r_size / 1e6:,.1f} MB, "
            f"{(r_size - start['r']) / 1e6:+,.1f} MB since this process started); "
            f"{fingerprints:,} fingerprints in {p}f:* (about {FP_COST} B each, "
            f"{fingerprints - start['fp']:+,} since this process started)"
        )

    def _gathering(self, ops: list[tuple[Any, ...]], now: float, hurry: bool) -> bool:
        """Whether *ops* wait for more before they are sent.

        With several partitions, pushes and acknowledgements wait up to :data:`GATHER` seconds
        after the last ones sent, so that each partition's script call carries more of them; not
        when this process has nothing here to hand out, nor when *hurry*.
        """
        return (
            len(self.store.prefixes) > 1
            and not hurry
            and 0 < len(ops) < BATCH
            and now - self._sent_at < GATHER
            and not self.store.starving()
        )

    def _ordered(
        self, ops: list[tuple[Any, ...]]
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Split *ops* into those to send now and acknowledgements held back to the next step.

        On a Redis Cluster with several partitions, a pipeline's commands go to several nodes
        at once, in no order between them: an acknowledgement that follows a push in *ops*
        waits until the push is answered, so that a page is never done in Redis while the
        requests found on it are not there yet.
        """
        if not self.cluster or len(self.store.prefixes) == 1:
            return ops, []
        sent: list[tuple[Any, ...]] = []
        held: list[tuple[Any, ...]] = []
        pushed = False
        for op in ops:
            if op[0] == "ack" and pushed:
                held.append(op)
            else:
                pushed = pushed or op[0] == "push"
                sent.append(op)
        return sent, held

    def _partition(self, op: tuple[Any, ...]) -> int:
        """Return the index of the partition *op* goes to."""
        kind = op[0]
        if kind == "push":
            return self.store.part(op[3])
        if kind == "ack":
            return self.store.part(op[2])
        if kind == "claim":
            return int(op[4])
        if kind == "backlog":
            return 0
        return self.store.part(op[1])

    def _groups(self, ops: list[tuple[Any, ...]]) -> list[tuple[str, int, list[tuple[Any, ...]]]]:
        """Cut *ops* (as :func:`batched` orders them) into script calls.

        ``(kind, partition, ops)``: a run of pushes or acknowledgements
        becomes one call per partition (up to :data:`CHUNK` operations
        each), in the order of their first operation; any other operation
        one call.
        """
        out: list[tuple[str, int, list[tuple[Any, ...]]]] = []
        i = 0
        while i < len(ops):
            kind = ops[i][0]
            j = i + 1
            if kind not in ("push", "ack"):
                out.append((kind, self._partition(ops[i]), ops[i:j]))
                i = j
                continue
            while j < len(ops) and ops[j][0] == kind:
                j += 1
            by_part: dict[int, list[tuple[Any, ...]]] = {}
            for op in ops[i:j]:
                by_part.setdefault(self._partition(op), []).append(op)
            for part, group in by_part.items():
                for at in range(0, len(group), CHUNK):
                    out.append((kind, part, group[at : at + CHUNK]))
            i = j
        return out

    def _script_args(self, kind: str, group: list[tuple[Any, ...]], wall_ms: int) -> list[Any]:
        """Return the arguments of the script *kind* for *group* after the token."""
        store = self.store
        proc = store.proc
        if kind == "push":
            args: list[Any] = [proc]
            resent = store.resent
            for _, rid, fp, key, rank, keep, data, _item in group:
                flag = ("r" if rid in resent else "") + ("1" if keep else "0")
                args += [rid, fingerprint_key(fp) if fp else b"", key, rank, flag, data]
            return args
        if kind == "ack":
            return [proc] + [op[1] for op in group]
        op = group[0]
        if kind == "give_back":
            _, key, state, ready, release, ids = op
            return [proc, key, state, ready, "1" if release else "0", *ids]
        if kind == "claim":
            _, want, window, part, _partition = op
            return [proc, wall_ms, want, window, HUNGRY_MS, "1" if part else "0"]
        if kind == "offer":
            _, key, limit, part = op
            return [proc, key, limit, part, wall_ms]
        if kind == "share":
            _, key, role, block, what, ids = op
            return [proc, key, role, block, what, *ids]
        if kind == "refill":
            return [proc, op[1], op[2]]
        if kind == "backlog":
            return [proc, op[1]]
        return [op[1]]  # give_up

    def _totals_parts(self) -> list[int]:
        """Return the partitions whose totals this step reads, and turn to the next ones.

        Enough of them in turn that each is read at least once every four
        steps that read totals (about a second).
        """
        n = len(self.store.prefixes)
        count = -(-n // TOTALS_TURNS)
        parts = [(self._totals_next + i) % n for i in range(count)]
        self._totals_next = (self._totals_next + count) % n
        return parts

    async def step(self, *, beat: bool, totals: bool, hurry: bool = False) -> None:
        """One exchange.

        What the log holds (up to :data:`BATCH` operations), then the heartbeat in every partition
        (*beat*) and the totals (*totals*) of some partitions in turn (see :meth:`_gathering` for
        *hurry*).
        """
        store = self.store
        if self.shas is None:
            self.shas = await self.load_scripts()
        shas = self.shas
        now = store.clock()
        store.tick(now)
        taken = store.outbox[:BATCH]
        # Forgotten by Redis: register again now, not at the next beat.
        beat = beat or store.unregistered
        if self._gathering(taken, now, hurry):
            # The other operations go now, before pushes and acknowledgements
            # logged earlier: none of them needs those in Redis first.
            sent = [op for op in taken if op[0] not in ("push", "ack")]
            held_back = [op for op in taken if op[0] in ("push", "ack")]
        else:
            self._sent_at = now
            sent, held_back = self._ordered(taken)
        ops = batched(sent)
        if not ops and not beat and not totals:
            return
        prefixes, proc, token = store.prefixes, store.proc, store.token
        wall_ms = int(store.wall() * 1000)
        pipe = self.client.pipeline(transaction=False)
        plan = self._groups(ops)
        for kind, part, group in plan:
            # EVALSHA by name: redis-py's cluster pipelines block their
            # evalsha method in some releases (8.1), not the command.
            args = self._script_args(kind, group, wall_ms)
            pipe.execute_command("EVALSHA", shas[kind], 1, prefixes[part], token, *args)
        if beat:
            expiry = wall_ms + int(store.lease_timeout * 1000)
            for p in prefixes:
                pipe.execute_command(
                    "EVALSHA", shas["heartbeat"], 1, p, token, proc, wall_ms, expiry
                )
        read = self._totals_parts() if totals else []
        for part in read:
            p = prefixes[part]
            pipe.hmget(p + "stats", "queued", "leased")
            pipe.zrangebyscore(p + "hungry", wall_ms - HUNGRY_MS, "+inf")
            # The fair share: hosts held or claimable now, live processes.
            pipe.hlen(p + "owner")
            pipe.zcount(p + "avail", "-inf", wall_ms)
            pipe.zrangebyscore(p + "wantshare", wall_ms - HUNGRY_MS, "+inf")
            # Read alone, the totals of a Redis that lost the crawl would
            # say that it finished: its identity goes with them.
            pipe.get(p + "crawl")
            if len(prefixes) > 1:
                # Where a process with no host finds a part of a busy one.
                pipe.zcard(p + "offers")
        if totals:
            pipe.zcount(prefixes[0] + "procs", wall_ms, "+inf")
            pipe.hgetall(prefixes[0] + "backlog")
        waits = store.waits
        waits.sent(
            store.clock(),
            asks=any(op[0] in ("claim", "refill") or (op[0] == "push" and op[5]) for op in ops),
        )
        try:
            # Each answer on its own: Redis full refuses pushes, and only them.
            results = await pipe.execute(raise_on_error=False)
            self._check(results)
        except BaseException:
            store.outbox[: len(taken)] = store.failed(ops, sent=True) + held_back
            raise
        waits.answered(store.clock())
        store.outbox[: len(taken)] = held_back
        work = False
        refused: list[tuple[Any, ...]] = []
        retry: list[tuple[Any, ...]] = []
        accepted = False
        for (kind, _part, group), result in zip(plan, results, strict=False):
            if isinstance(result, Exception):  # Redis full: nothing applied
                if kind == "push":
                    refused += group
                else:
                    retry += group
            elif kind == "push":
                accepted = True
                for op, status in zip(group, result, strict=True):
                    work = store.answered(op, status) or work
            elif kind != "ack":
                work = store.answered(group[0], result) or work
        if retry:
            store.outbox[:0] = store.failed(retry)
        if refused and store.refused_pushes(refused):
            await self.read_memory()
            store.capacity.warn_full(await self.describe_keys())
        elif accepted:
            store.capacity.accepted()
        rest = results[len(plan) :]
        if beat:
            beaten, rest = rest[: len(prefixes)], rest[len(prefixes) :]
            answers = [answer for answer in beaten if not isinstance(answer, Exception)]
            if answers:
                if not all(int(answer[0]) for answer in answers):
                    store.lost()
                # Registered (again) from here on.
                store.unregistered = False
        if totals:
            work = self._take_totals(read, rest, now) or work
        if work and store.on_work is not None:
            store.on_work()

    def _take_totals(self, read: list[int], results: list[Any], now: float) -> bool:
        """Keep the totals of the partitions *read*, give the crawl's sums to the store.

        True if the crawl just finished.
        """
        store, proc = self.store, self.store.proc
        each = 6 if len(store.prefixes) == 1 else 7
        for n, part in enumerate(read):
            (queued, leased), hungry, owned, claimable, no_host, crawl, *offered = results[
                each * n : each * n + each
            ]
            if crawl is None or crawl.decode() != store.token:
                raise FrontierLost
            self._totals[part] = _Totals(
                int(queued or 0),
                int(leased or 0),
                {name.decode() for name in hungry} - {proc},
                int(owned),
                int(claimable),
                {name.decode() for name in no_host} - {proc},
            )
            store.claimable[part] = int(claimable)
            store.offered[part] = int(offered[0]) if offered else 0
        live, backlogs = results[each * len(read) :]
        backlog = sum(int(n) for name, n in backlogs.items() if name.decode() != proc)
        known = [totals for totals in self._totals if totals is not None]
        if len(known) < len(self._totals):
            # Not every partition read yet: not finished.
            backlog += 1
        store.share = sum(t.owned + t.claimable for t in known), max(1, int(live))
        return store.totals(
            sum(t.queued for t in known),
            sum(t.leased for t in known),
            len(set().union(*(t.hungry for t in known))),
            now,
            len(set().union(*(t.want_share for t in known))),
            backlog,
        )

    @staticmethod
    def _check(results: list[Any]) -> None:
        """Raise what a batch's answers hold other than Redis full.

        The crawl gone from Redis (:class:`FrontierLost`), else the first error (then the whole
        batch is sent again).
        """
        errors = [result for result in results if isinstance(result, Exception)]
        if any(LOST in str(error) for error in errors):
            raise FrontierLost
        for error in errors:
            if not is_oom(error):
                raise error

    async def resync(self) -> None:
        """Set this process and Redis straight after a lost connection or a failover.

        Give back what Redis handed this process that it never heard of
        (an answer lost with the connection); take back what this process
        holds that Redis forgot (writes a failover lost), and drop the hosts
        another process holds since.
        """
        if self.shas is None:
            self.shas = await self.load_scripts()
        store = self.store
        for part, p in enumerate(store.prefixes):
            _given_back, lost = await self.client.evalsha(
                self.shas["resync"], 1, p, store.token, store.proc, *store.resync_args(part)
            )
            store.drop_hosts([host.decode() for host in lost])

    async def stop(self) -> None:
        """Stop the task; say nothing more to Redis (it lost the crawl)."""
        self.store.closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 10.0)

    async def close(self, timeout: float = 10.0) -> str | None:
        """Stop the task.

        Send what the log holds; give back every held host (its window back to its queue, its state
        saved) and unregister. Returns None, or why it could not (Redis away).
        """
        store = self.store
        store.closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout)
            except Exception:  # it stopped, whatever it was doing
                logger.debug("The shared frontier's task ended with an error", exc_info=True)
        store.hand_back_all()
        deadline = time.monotonic() + timeout
        try:
            self.shas = await self.load_scripts()
            while store.outbox:
                if time.monotonic() > deadline:
                    raise asyncio.TimeoutError
                await self.step(beat=False, totals=False, hurry=True)
            for p in store.prefixes:
                await self.client.evalsha(self.shas["leave"], 1, p, store.token, store.proc)
        except Exception as error:  # Redis away, or refusing
            acks = sum(1 for op in store.outbox if op[0] == "ack")
            pushes = sum(1 for op in store.outbox if op[0] == "push")
            return (
                f"{error or 'timed out'}: {acks} acknowledgements and {pushes} new requests "
                "could not be sent; what this process held goes back to the crawl when its "
                f"lease expires (HOSTQUEUE_LEASE_TIMEOUT = {store.lease_timeout:g} s)"
            )
        return None
