"""The request store: where a crawl's queued requests and per-host state live.

The scheduler talks to its store only through :class:`RequestStore`, so the
store can be swapped without touching the scheduler: the in-memory store
(:mod:`scrapy_hostqueue.frontier.memory`) keeps everything in this process; the
SQLite store (:mod:`scrapy_hostqueue.frontier.sqlite._store`, the default with
``JOBDIR``) keeps the same contract in a file that survives the process; the
Redis store (:mod:`scrapy_hostqueue.frontier.redis._store`) shares it between the
processes of one crawl, each working the hosts it has leased.

The contract is at-least-once. A request handed out by :meth:`RequestStore.pop`
stays the store's, leased, until the scheduler acknowledges it
(:meth:`RequestStore.ack`) once its outcome has been taken over; a store that
outlives the process gives unacknowledged requests back on restart.
:meth:`RequestStore.finish` is a different moment: the request stopped holding
one of its host's places in flight (it left the downloader), which frees room
for the host's next request, while its lease may last until its callback has
run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from scrapy_hostqueue.frontier.memory import HostState, MemoryStore, Placement

__all__ = ["HostState", "MemoryStore", "Placement", "RequestStore"]

T = TypeVar("T")


class RequestStore(Protocol[T]):
    """What the scheduler needs of a request store.

    "Host" is the key the scheduler gives (the downloader slot key). Every
    method is synchronous and cheap: Scrapy's scheduler contract is
    synchronous, and the engine asks for the next request many times a second.
    Times are ``time.monotonic()`` seconds.
    """

    #: Requests a host may be handed beyond its limit (they wait at the send
    #: gate); 0 without a send gate.
    prefetch: int
    #: At most this many requests in flight for a silent host (0: its limit).
    silent_limit: int
    #: The crawl's global budget; a host gets at most its share of it among
    #: the active hosts (0: no share).
    budget: int
    #: Called with a host's key when the store forgets the host for good.
    on_forget: Callable[[str], None] | None
    #: What the AIMD middleware learned about a host (a small dict a JSON
    #: object holds), for a store that outlives the process to keep with the
    #: host; None without the middleware. Set by the scheduler.
    export_learned: Callable[[str], dict[str, float] | None] | None
    #: Gives the middleware back what :attr:`export_learned` gave, for a host
    #: the store resumed with requests queued (or in force: a block, an
    #: interval). A store that resumed hosts before it is set gives theirs
    #: back when it is set. Set by the scheduler.
    import_learned: Callable[[str, dict[str, float]], None] | None

    def __len__(self) -> int:
        """Requests queued (not handed out)."""

    @property
    def active(self) -> int:
        """Hosts holding an active-host place now."""

    # -- requests --------------------------------------------------------

    def push(self, key: str, rank: int, item: T) -> bool:
        """Queue *item* for host *key* (higher *rank* first, FIFO among
        equals); False, and nothing queued, if the host was given up."""

    def pop(self, now: float | None = None) -> tuple[str, T] | None:
        """Hand out the next request of a ready host, round-robin among ready
        hosts, or None. The request counts in flight for its host until
        :meth:`finish` and stays leased until :meth:`ack`."""

    def finish(self, key: str, overdue: bool = False) -> None:
        """One request of *key* is no longer in flight (*overdue*: one marked
        with :meth:`set_overdue`)."""

    def set_overdue(self, key: str) -> None:
        """One request of *key* in flight is overdue: it still counts against
        the host's limit, but does not keep the host's active place."""

    def overdue(self, key: str) -> int:
        """Requests of *key* in flight and overdue."""

    def ack(self, item: T) -> None:
        """*item*, handed out earlier, is done: its outcome (the requests and
        items its callback produced) has been taken over. Ends its lease."""

    def release(self, key: str, rank: int, item: T) -> None:
        """*item*, handed out earlier and not done, goes back to its host's
        queue, its lease ended (after :meth:`finish`, if it was in flight)."""

    def adopt(self, key: str, now: float) -> None:
        """Count a request that did not come from :meth:`pop` in flight for
        *key* until :meth:`finish`."""

    def give_up(self, key: str) -> list[T]:
        """Refuse *key* from now on; returns its queued requests."""

    def items(self) -> Iterator[tuple[str, int, T]]:
        """``(key, rank, item)`` of every queued request (O(requests))."""

    # -- hosts -----------------------------------------------------------

    def host_state(self, key: str) -> HostState:
        """The state of *key*, made on first sight."""

    def known_state(self, key: str) -> HostState | None:
        """The state of *key* if the store knows the host."""

    def queued(self, key: str) -> int: ...

    def inflight(self, key: str) -> int: ...

    def in_flight_cap(self, state: HostState) -> int:
        """How many requests a host in *state* may have in flight now."""

    def is_full(self, key: str) -> bool: ...

    def note_full(self, key: str, now: float) -> None: ...

    def hosts(self) -> Iterator[tuple[str, int, int, HostState]]:
        """``(key, queued, inflight, state)`` of every live host (O(hosts))."""

    def blocked(self, now: float) -> Iterator[tuple[str, HostState]]: ...

    def spaced(self, now: float) -> Iterator[tuple[str, float]]: ...

    def next_wakeup(self) -> float | None:
        """When the earliest blocked or idle host changes state, if any."""

    def set_limit(self, key: str, limit: int) -> None: ...

    def set_answering(self, key: str, answering: bool) -> None: ...

    def block_until(self, key: str, when: float, reason: str | None = None) -> None: ...

    def set_interval(self, key: str, interval: float, jitter: float | None = None) -> None: ...

    def space_until(self, key: str, when: float) -> None: ...

    def started(self, key: str, started_at: float, now: float) -> None:
        """The hand-out of *key* made at *started_at* reached the downloader
        at *now*: the host's interval between starts counts from then."""

    def unstart(self, key: str, started_at: float) -> None:
        """The hand-out of *key* made at *started_at* never went to the host."""

    def close(self) -> None:
        """Release what the store holds (files, connections)."""
