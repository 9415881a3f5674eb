"""What the scheduler's parts still hold when a crawl closes.

A crawl closes with ``finished`` once the engine sees nothing in progress and
nothing pending in the scheduler. Every request the spider asked for has then
been downloaded or has failed to its errback: nothing may be left queued in
the store, handed out and not back (counted in flight by the store, recorded,
waiting at the send gate or on the wire past it, overdue), or given up with a
given-up host and not yet failed. Whatever is left is a request the crawl
lost without a word; :func:`left_over` counts it per part, so that the
scheduler can say so (one ERROR, a stat) instead of a clean finish.

Nothing here imports Scrapy or Twisted: the parts come in through small
protocols, as the scheduler's ``Hosts`` holds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

#: Hosts named in the log line at most.
MAX_HOSTS_SHOWN = 10


class _Store(Protocol):
    def __len__(self) -> int: ...

    def hosts(self) -> Iterator[tuple[str, int, int, Any]]: ...

    def overdue(self, key: str) -> int: ...


class _Records(Protocol):
    def items(self) -> Iterator[tuple[Any, Any]]: ...


class _Gate(Protocol):
    def holding(self) -> Iterator[tuple[str, int, int]]: ...


@dataclass
class LeftOver:
    """Requests left in each part of the scheduler, and the hosts concerned (in the order met)."""

    parts: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, None] = field(default_factory=dict)

    def add(self, part: str, count: int, host: str | None) -> None:
        if count <= 0:
            return
        self.parts[part] = self.parts.get(part, 0) + count
        if host is not None:
            self.hosts[host] = None

    @property
    def lost(self) -> int:
        """Return the requests left.

        Queued, given up and not yet failed, and handed out and not back (the
        most any part counts of those: the parts that follow a handed-out
        request count it each).
        """
        parts = self.parts
        handed_out = max(
            parts.get("in flight", 0),
            parts.get("handed out", 0),
            parts.get("at the send gate", 0) + parts.get("on the wire", 0),
        )
        return parts.get("queued", 0) + parts.get("given up, not yet failed", 0) + handed_out

    def describe(self, limit: int = MAX_HOSTS_SHOWN) -> str:
        """``3 queued, 1 in flight; hosts: a, b (and 4 more)``."""
        counts = ", ".join(f"{count:,} {part}" for part, count in self.parts.items())
        hosts = list(self.hosts)
        named = ", ".join(host or "''" for host in hosts[:limit])
        more = f" (and {len(hosts) - limit:,} more)" if len(hosts) > limit else ""
        return f"{counts}; hosts: {named or 'none known'}{more}"


def left_over(
    store: _Store,
    records: _Records,
    gate: _Gate,
    given_up: Iterable[tuple[str, Any]],
) -> LeftOver:
    """Count what the scheduler's parts still hold.

    Count what *store*, *records* (the requests counted for a host until
    they leave the downloader), *gate* and *given_up* (requests of given-up
    hosts waiting to fail) still hold. O(hosts + requests left).
    """
    left = LeftOver()
    queued = len(store)
    for host, host_queued, in_flight, _state in store.hosts():
        left.add("queued", host_queued, host)
        left.add("in flight", in_flight, host)
        left.add("overdue", store.overdue(host), host)
    # Requests queued where no live host shows them (a store's backlog on
    # disk, the shared part of a crawl).
    left.add("queued", queued - left.parts.get("queued", 0), None)
    for _request, record in records.items():
        left.add("handed out", 1, record.host)
    for host, waiting, on_wire in gate.holding():
        left.add("at the send gate", waiting, host)
        left.add("on the wire", on_wire, host)
    for host, _request in given_up:
        left.add("given up, not yet failed", 1, host)
    return left
