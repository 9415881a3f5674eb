"""Per-host stats in Scrapy's stats collector.

The key helpers and the recorder every component reports to.

Every key is built by :func:`stat_key` / :func:`host_stat_key`. The scheduler,
the AIMD middleware and the download handler report events to one
:class:`HostStatsRecorder` per crawler (:func:`get_recorder`).

Bounded cardinality: per-host counters live in the recorder's own table of at
most :data:`TRACKED_PER_NAMED` times ``HOSTQUEUE_STATS_MAX_HOSTS`` hosts. When
a host not in the table needs an entry and the table is full, the least busy
entry is folded into the aggregate host ``_other`` and the newcomer takes its
place with the evicted entry's busyness as a starting floor (the
"Space-Saving" heavy-hitters rule), so a host that is busy overall keeps its
own entry even if it shows up late in a crawl that meets many hosts. The
table tracks more hosts than get keys so that the floor rises slowly: with
room for only the named hosts, every newcomer would push out a host busier
than itself as soon as the floor passed it, and the keys would name the last
hosts met rather than the busiest. Per-host keys of the
``HOSTQUEUE_STATS_MAX_HOSTS`` busiest entries (the rest of the table adds up
under ``_other``) are written to the stats collector at every periodic log
line and when the spider closes; global keys are written as events happen.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from scrapy import signals

from scrapy_hostqueue._config import HostQueueConfig

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_hostqueue._contracts import HostView

logger = logging.getLogger(__name__)

#: Hosts the recorder's table tracks per host that gets its own stats keys.
TRACKED_PER_NAMED = 4

PREFIX = "hostqueue"
#: Hosts beyond HOSTQUEUE_STATS_MAX_HOSTS add up under this host key.
OTHER_HOSTS = "_other"
#: The host key of requests whose URL has no host (``data:``, ``file:``).
NO_HOST = "_nohost"
HOSTS_PREFIX = f"{PREFIX}/hosts/"
#: Hosts named in the periodic log line.
LOG_BUSIEST = 5
#: Limit changes, blocks and give-ups kept per tracked host, for the monitor.
EVENTS_PER_HOST = 12

#: One host event: ``(time.monotonic(), kind, reason, before, after)``. Kinds:
#: ``limit`` (*before* and *after* are the limits), ``block`` (*after* is its
#: length in seconds), ``given-up`` (*after* is the requests dropped).
HostEvent = tuple[float, str, str, float, float]


def stat_key(name: str) -> str:
    """Return the global key ``hostqueue/{name}``."""
    return f"{PREFIX}/{name}"


def host_stat_key(host: str, name: str) -> str:
    """Return the per-host key ``hostqueue/hosts/{host}/{name}``."""
    return f"{HOSTS_PREFIX}{host or NO_HOST}/{name}"


class LatencyHistogram:
    """Latencies in fixed logarithmic buckets.

    Bounded memory whatever the number of samples, quantiles within 4.4 % (16 buckets per doubling).
    """

    __slots__ = ("buckets", "count", "high", "total")

    PER_DOUBLING = 16
    # 2**-20 s (~1 µs) .. 2**20 s (~12 days): at most 641 buckets.
    LOWEST = -20 * PER_DOUBLING
    HIGHEST = 20 * PER_DOUBLING

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0.0
        self.high = 0.0

    def add(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        self.count += 1
        self.total += seconds
        self.high = max(self.high, seconds)
        index = self.LOWEST
        if seconds > 0:
            index = math.ceil(math.log2(seconds) * self.PER_DOUBLING)
            index = min(max(index, self.LOWEST), self.HIGHEST)
        self.buckets[index] = self.buckets.get(index, 0) + 1

    def merge(self, other: LatencyHistogram) -> None:
        self.count += other.count
        self.total += other.total
        self.high = max(self.high, other.high)
        for index, count in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + count

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Return the upper bound of the bucket holding the *q* quantile.

        The upper bound of the bucket holding the *q* quantile (capped at
        the largest sample), or None without samples.
        """
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                if index == self.HIGHEST:  # open-ended: anything above
                    return self.high
                return min(float(2.0 ** (index / self.PER_DOUBLING)), self.high)
        return self.high  # pragma: no cover - rank <= count


class HostCounters:
    """What the recorder knows about one host (or the aggregate)."""

    __slots__ = ("base", "counts", "events", "highs", "latency", "limit", "lows", "weight")

    def __init__(self, base: int = 0) -> None:
        #: Additive values (``*_count``, ``blocked_seconds``), by key name.
        self.counts: dict[str, float] = {}
        #: High-water marks (``max_*``) and low-water marks (``min_*``).
        self.highs: dict[str, float] = {}
        self.lows: dict[str, float] = {}
        self.limit: int | None = None
        self.latency = LatencyHistogram()
        #: Busyness: events recorded since the host got its entry, plus the
        #: floor it inherited then (see the module docstring).
        self.base = base
        self.weight = 0
        #: The host's last limit changes, blocks and give-up (made at the first).
        self.events: deque[HostEvent] | None = None

    def event(self, kind: str, reason: str, before: float, after: float) -> None:
        if self.events is None:
            self.events = deque(maxlen=EVENTS_PER_HOST)
        self.events.append((time.monotonic(), kind, reason, before, after))

    @property
    def priority(self) -> int:
        return self.base + self.weight

    def inc(self, name: str, value: float = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + value

    def high(self, name: str, value: float) -> None:
        if value > self.highs.get(name, -math.inf):
            self.highs[name] = value

    def low(self, name: str, value: float) -> None:
        if value < self.lows.get(name, math.inf):
            self.lows[name] = value

    def merge(self, other: HostCounters) -> None:
        """Add *other* into this entry (the current limit is not additive: dropped)."""
        for name, value in other.counts.items():
            self.inc(name, value)
        for name, value in other.highs.items():
            self.high(name, value)
        for name, value in other.lows.items():
            self.low(name, value)
        self.latency.merge(other.latency)

    def values(self, *, with_limit: bool = True) -> Iterator[tuple[str, float]]:
        """``(name, value)`` of every stat this entry has."""
        for name, value in self.counts.items():
            # Sums of seconds: millisecond precision is plenty in a stats dump.
            yield name, round(value, 3) if isinstance(value, float) else value
        yield from self.highs.items()
        yield from self.lows.items()
        if with_limit and self.limit is not None:
            yield "limit", self.limit
        mean = self.latency.mean()
        if mean is not None:
            yield "latency_mean", round(mean, 6)
            p95 = self.latency.quantile(0.95)
            assert p95 is not None
            yield "latency_p95", round(p95, 6)


class HostStatsRecorder:
    """Turns per-host events into stats, with bounded cardinality.

    Components call the event methods; :meth:`flush` writes the per-host keys
    of the (at most ``max_hosts``) named hosts and of the aggregate host.
    """

    def __init__(self, stats: StatsCollector, config: HostQueueConfig) -> None:
        self.stats = stats
        self.enabled = config.stats_enabled
        self.max_hosts = config.stats_max_hosts
        self._capacity = self.max_hosts * TRACKED_PER_NAMED
        self._table: dict[str, HostCounters] = {}
        # One (priority when pushed, tiebreak, host) entry per table entry;
        # priorities only grow, so a stale entry is re-pushed when popped.
        self._heap: list[tuple[int, int, str]] = []
        self._seq = itertools.count()
        self._floor = 0
        self.other = HostCounters()
        #: The scheduler's view of its hosts, when the scheduler is
        #: HostQueueScheduler (set when it opens).
        self.host_view: HostView | None = None
        #: The live monitor's snapshot of this process (``/hosts.json``'s
        #: form), when the monitor runs: the host log line reads it.
        self.snapshot: Callable[[], dict[str, Any]] | None = None

    # -- the bounded table ---------------------------------------------------

    def counters(self, host: str, weight: int = 1) -> HostCounters:
        """Return the entry that events of *host* go to (its own, or the aggregate).

        The event adds *weight* to the host's busyness.
        """
        host = host or NO_HOST
        entry = self._table.get(host)
        if entry is None:
            if self.max_hosts <= 0:
                return self.other
            if len(self._table) >= self._capacity:
                self._evict()
            entry = self._table[host] = HostCounters(self._floor)
            heapq.heappush(self._heap, (entry.priority, next(self._seq), host))
        entry.weight += weight
        return entry

    def _evict(self) -> None:
        heap, table = self._heap, self._table
        while True:
            priority, _, host = heapq.heappop(heap)
            entry = table[host]
            if entry.priority != priority:
                heapq.heappush(heap, (entry.priority, next(self._seq), host))
                continue
            del table[host]
            self.other.merge(entry)
            self._floor = priority
            return

    def named_hosts(self) -> list[str]:
        """Hosts that currently have their own keys, busiest first."""
        table = self._table
        return heapq.nlargest(self.max_hosts, table, key=lambda host: table[host].priority)

    def entry(self, host: str) -> HostCounters | None:
        """*host*'s own entry if the table tracks it, without counting an event."""
        return self._table.get(host or NO_HOST)

    def table_size(self) -> int:
        """Entries held (the tracked hosts and their heap entries), for tests of boundedness."""
        return len(self._table) + len(self._heap)

    def host_stats(self) -> dict[str, float]:
        """Every per-host key and its value, as :meth:`flush` writes them."""
        result: dict[str, float] = {}
        named = set(self.named_hosts())
        other = self.other
        if len(named) < len(self._table):
            # The tracked hosts without keys of their own add up under _other.
            other = HostCounters()
            other.merge(self.other)
            for host, entry in self._table.items():
                if host not in named:
                    other.merge(entry)
        for host in named:
            for name, value in self._table[host].values():
                result[host_stat_key(host, name)] = value
        for name, value in other.values(with_limit=False):
            result[host_stat_key(OTHER_HOSTS, name)] = value
        return result

    def flush(self) -> None:
        """Replace the per-host keys in the stats collector with the current ones."""
        if not self.enabled:
            return
        current = self.host_stats()
        replace = getattr(self.stats, "set_stats", None)
        if replace is None:
            # A collector with only the methods Scrapy itself calls: the
            # current keys are written, and a host no longer among the named
            # ones keeps its last values.
            for key, value in current.items():
                self.stats.set_value(key, value)
            return
        fresh = {
            key: value
            for key, value in self.stats.get_stats().items()
            if not key.startswith(HOSTS_PREFIX)
        }
        fresh.update(current)
        replace(fresh)

    # -- generic helpers ------------------------------------------------------

    def inc(self, host: str, name: str, count: float = 1) -> None:
        """Add *count* to the per-host counter *name* (e.g. ``connections_opened_count``)."""
        if self.enabled:
            self.counters(host).inc(name, count)

    def _global_inc(self, name: str, count: int = 1) -> None:
        self.stats.inc_value(stat_key(name), count)

    # -- scheduler events --------------------------------------------------

    def host_seen(self, host: str) -> None:
        if self.enabled:
            self._global_inc("hosts_seen_count")

    def request_done(self, host: str, handed_out: int, active_hosts: int) -> None:
        """Count a request handed out for *host* that left the downloader.

        *handed_out* and *active_hosts* are the counts just before it left (every high-water mark is
        seen at the next leave).
        """
        if not self.enabled:
            return
        entry = self.counters(host)
        entry.inc("request_count")
        entry.high("max_handed_out", handed_out)
        self.stats.max_value(stat_key("max_active_hosts"), active_hosts)

    def in_flight_seen(self, host: str, on_wire: int) -> None:
        """Note the requests of *host* on the wire, as one of them stops counting.

        *on_wire* requests of *host* were sent and not yet answered, just
        before one of them stopped counting (every high-water mark is seen
        then).
        """
        if self.enabled:
            # Not an event of its own for the busyness ranking: request_done
            # counts the request.
            self.counters(host, weight=0).high("max_inflight", on_wire)

    def response(self, host: str, status: int, latency: float | None) -> None:
        if not self.enabled:
            return
        entry = self.counters(host)
        entry.inc("response_count")
        entry.inc(f"status_count/{status}")
        if latency is not None:
            entry.latency.add(float(latency))

    def exception(self, host: str, name: str) -> None:
        if not self.enabled:
            return
        entry = self.counters(host)
        entry.inc("exception_count")
        entry.inc(f"exception_type_count/{name}")

    # -- host state events ------------------------------------------------

    def limit_changed(self, host: str, limit: int) -> None:
        if not self.enabled:
            return
        entry = self.counters(host)
        entry.limit = limit
        entry.high("max_limit", limit)
        entry.low("min_limit", limit)

    def limit_event(self, host: str, old: int, new: int, reason: str) -> None:
        """Keep a limit change of the AIMD rule among *host*'s events.

        For the monitor; not counted as an event of its own.
        """
        if self.enabled:
            self.counters(host, weight=0).event("limit", reason, old, new)

    def backoff(self, host: str, reason: str) -> None:
        if self.enabled:
            self.counters(host).inc(f"backoff_count/{reason}")

    def blocked(self, host: str, seconds: float, reason: str) -> None:
        if not self.enabled:
            return
        entry = self.counters(host)
        entry.event("block", reason, 0, max(0.0, float(seconds)))
        entry.inc(f"block_count/{reason}")
        entry.inc("blocked_seconds", max(0.0, float(seconds)))

    def unblocked(self, host: str, reason: str) -> None:
        """Keep the early end of *host*'s block among its events (the monitor's controls)."""
        if self.enabled:
            self.counters(host, weight=0).event("unblock", reason, 0, 0)

    def overdue(self, host: str, overdue_now: int) -> None:
        """Count a request of *host* that became overdue; *overdue_now* are overdue in the crawl."""
        if not self.enabled:
            return
        self._global_inc("overdue_count")
        self.stats.max_value(stat_key("max_overdue"), overdue_now)
        self.counters(host).inc("overdue_count")

    def host_parked(self, host: str) -> None:
        if not self.enabled:
            return
        self._global_inc("hosts_parked_count")
        self.counters(host).inc("parked_count")

    def host_given_up(self, host: str, dropped: int, reason: str = "error-budget") -> None:
        if not self.enabled:
            return
        self._global_inc("hosts_given_up_count")
        entry = self.counters(host)
        entry.inc("given_up_count")
        entry.event("given-up", reason, 0, dropped)
        self.requests_dropped(host, dropped)

    def requests_dropped(self, host: str, count: int = 1) -> None:
        """Count requests of a given-up host, dropped.

        Its queue when it was given up, and any request for it that arrives later.
        """
        if not self.enabled or not count:
            return
        self._global_inc("dropped_request_count", count)
        self.counters(host).inc("dropped_request_count", count)


_recorders: weakref.WeakKeyDictionary[Crawler, HostStatsRecorder] = weakref.WeakKeyDictionary()


def get_recorder(crawler: Crawler) -> HostStatsRecorder:
    """Return the crawler's one recorder, shared by every component.

    Its per-host keys are written to the stats when the spider closes.
    """
    recorder = _recorders.get(crawler)
    if recorder is None:
        assert crawler.stats is not None
        recorder = HostStatsRecorder(crawler.stats, HostQueueConfig.from_settings(crawler.settings))
        _recorders[crawler] = recorder
        # spider_closed runs before the stats collector dumps its stats.
        crawler.signals.connect(recorder.flush, signal=signals.spider_closed)
    return recorder
