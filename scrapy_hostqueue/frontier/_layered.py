"""What the stores that keep their queues elsewhere (a file, Redis) share.

They share a :class:`MemoryStore` in front that holds the ring, the per-host states and a window of
each host's queue, to which every host command and query goes.

Pure logic: no Scrapy or Twisted import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from scrapy_hostqueue.frontier.memory import HostState, MemoryStore

E = TypeVar("E")


class LayeredStore(Generic[E]):
    """The part of a request store that is the memory store's.

    The part of a :class:`~scrapy_hostqueue.frontier.RequestStore` that is the
    memory store's (*memory*, whose items are the subclass's entries). A host
    command that changes what must outlive the process (its limit, block or
    interval) calls :meth:`_changed`.
    """

    def __init__(self, memory: MemoryStore[E]) -> None:
        self._mem = memory

    def _changed(self, key: str) -> None:
        """Note that the state of *key* to save changed."""

    # -- the RequestStore attributes --------------------------------------------

    @property
    def prefetch(self) -> int:
        return self._mem.prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        self._mem.prefetch = value

    @property
    def global_limit(self) -> int:
        return self._mem.global_limit

    @global_limit.setter
    def global_limit(self, value: int) -> None:
        self._mem.global_limit = value

    @property
    def silent_limit(self) -> int:
        return self._mem.silent_limit

    @silent_limit.setter
    def silent_limit(self, value: int) -> None:
        self._mem.silent_limit = value

    @property
    def on_forget(self) -> Callable[[str], None] | None:
        return self._mem.on_forget

    @on_forget.setter
    def on_forget(self, value: Callable[[str], None] | None) -> None:
        self._mem.on_forget = value

    @property
    def active(self) -> int:
        return self._mem.active

    # -- requests in flight ----------------------------------------------------

    def set_overdue(self, key: str) -> None:
        self._mem.set_overdue(key)

    def overdue(self, key: str) -> int:
        return self._mem.overdue(key)

    def adopt(self, key: str, now: float) -> None:
        self._mem.adopt(key, now)

    # -- hosts -----------------------------------------------------------------

    def host_state(self, key: str) -> HostState:
        return self._mem.host_state(key)

    def known_state(self, key: str) -> HostState | None:
        return self._mem.known_state(key)

    def in_flight(self, key: str) -> int:
        return self._mem.in_flight(key)

    def in_flight_cap(self, state: HostState) -> int:
        return self._mem.in_flight_cap(state)

    def is_full(self, key: str) -> bool:
        return self._mem.is_full(key)

    def note_full(self, key: str, now: float) -> None:
        self._mem.note_full(key, now)

    def blocked(self, now: float) -> Iterator[tuple[str, HostState]]:
        return self._mem.blocked(now)

    def spaced(self, now: float) -> Iterator[tuple[str, float]]:
        return self._mem.spaced(now)

    def next_wakeup(self) -> float | None:
        return self._mem.next_wakeup()

    def set_limit(self, key: str, limit: int) -> None:
        self._mem.set_limit(key, limit)
        self._changed(key)

    def set_answering(self, key: str, answering: bool) -> None:
        self._mem.set_answering(key, answering)

    def block_until(self, key: str, when: float, reason: str | None = None) -> None:
        self._mem.block_until(key, when, reason)
        self._changed(key)

    def unblock(self, key: str) -> None:
        self._mem.unblock(key)
        self._changed(key)

    def redis_figures(self) -> dict[str, object] | None:
        """Return None: the Redis store says how much Redis holds it back."""
        return None

    def set_interval(self, key: str, interval: float, jitter: float | None = None) -> None:
        self._mem.set_interval(key, interval, jitter)
        self._changed(key)

    def space_until(self, key: str, when: float) -> None:
        self._mem.space_until(key, when)

    def started(self, key: str, started_at: float, now: float) -> None:
        self._mem.started(key, started_at, now)

    def unstart(self, key: str, started_at: float) -> None:
        self._mem.unstart(key, started_at)
