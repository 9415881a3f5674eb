"""The monitor's snapshot: what ``/hosts.json`` serves, from plain figures.

Pure logic: no Scrapy or Twisted import, times given by the caller. The
extension gathers one :class:`HostRow` per host it knows of (the live hosts
of the frontier and the busiest hosts of the stats recorder) and the
crawl-wide :class:`CrawlFigures`; :class:`Snapshots` ranks the hosts, keeps
the top *top* ones and folds the rest into ``_other``, and derives rates and
the last minute's status mix from the snapshots it took before. One snapshot
costs O(hosts given + top); it keeps O(top) numbers per second of the last
minute.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from scrapy_hostqueue.monitor._controls import MONITOR

#: The ``version`` of the snapshot's schema (docs/monitor.rst).
SCHEMA_VERSION = 1
#: The row that stands for every host past the top ones.
OTHER = "_other"
#: Seconds over which pages/s is measured, and the status mix.
RATE_WINDOW = 10.0
MIX_WINDOW = 60.0
#: Points of a host's history the detail view charts.
HISTORY_POINTS = 120
#: The share of the last seconds the scheduler waited on Redis from which
#: Redis is what bounds the crawl.
REDIS_WAITED = 0.25

# Host states, in the order they take precedence. A blocked host's state is
# its block's reason.
GIVEN_UP = "given-up"
RETRY_AFTER = "retry-after"
BACKOFF = "backoff"
COOLDOWN = "error-cooldown"
CRAWL_DELAY = "crawl-delay"
DELAY = "delay"
IN_FLIGHT = "in-flight"
WAITING = "waiting"
READY = "ready"
IDLE = "idle"
BLOCKED_STATES = (RETRY_AFTER, BACKOFF, COOLDOWN, CRAWL_DELAY, MONITOR)
STATES = (IN_FLIGHT, READY, WAITING, *BLOCKED_STATES, DELAY, GIVEN_UP, IDLE)


#: A snapshot kept for rates: (monotonic time, responses, statuses, and
#: ``{host: (responses, statuses)}`` of its top hosts).
_Past = tuple[float, int, dict[str, int], dict[str, tuple[int, dict[str, int]]]]


@dataclass
class HostRow:
    """What is known of one host at the snapshot's time."""

    host: str
    queued: int
    in_flight: int  # sent and not answered
    cap: int  # what it may have in flight now (its limit, or less)
    limit: int
    rank: int  # busyness: higher ranks first, a stable order
    blocked_left: float = 0.0
    block_reason: str | None = None
    spaced_left: float = 0.0  # time until its delay lets the next request start
    interval: float = 0.0  # its delay between requests (0: none)
    given_up: bool = False
    overdue: int = 0
    live: bool = False  # held by this process's frontier (else known from the stats)


@dataclass
class HostDetail:
    """What the stats recorder counted of one of the top hosts."""

    responses: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    latency_p50: float | None = None
    latency_p95: float | None = None
    #: ``(age in seconds, kind, reason, before, after)``, oldest first.
    events: list[tuple[float, str, str, float, float]] = field(default_factory=list)


@dataclass
class CrawlFigures:
    """Crawl-wide figures at the snapshot's time."""

    time: float  # wall clock, for the reader
    uptime: float
    concurrent_requests: int  # 0: no limit
    max_active_hosts: int  # 0: no cap
    active_hosts: int
    queued: int
    responses: int
    statuses: dict[str, int]
    given_up_hosts: int = 0
    live_hosts: int = 0  # hosts with work in this process's frontier
    scheduler: bool = True  # HostQueueScheduler runs the crawl
    paused: bool = False  # by the monitor's controls
    process: dict[str, Any] = field(default_factory=dict)
    #: On the Redis frontier, how much Redis holds this process back
    #: (``RedisStore.redis_figures``); None on another.
    redis: dict[str, Any] | None = None


def host_state(row: HostRow, places_full: bool) -> str:
    """Return the one state a host is shown in (see :data:`STATES`)."""
    if row.given_up:
        return GIVEN_UP
    if row.blocked_left > 0:
        reason = row.block_reason or BACKOFF
        return reason if reason in BLOCKED_STATES else BACKOFF
    if row.in_flight > 0:
        return IN_FLIGHT
    if row.queued > 0:
        if row.spaced_left > 0:
            return DELAY
        return WAITING if places_full else READY
    return IDLE


def _blocker_text(row: HostRow, state: str) -> str:
    if state in BLOCKED_STATES:
        return f"{row.host} ({state}, {row.blocked_left:.1f}s left)"
    if state == DELAY:
        return f"{row.host} (delay)"
    return f"{row.host} ({row.in_flight}/{row.cap} in flight)"


def why_not_faster(
    crawl: CrawlFigures, in_flight: int, states: dict[str, int], blockers: list[str]
) -> dict[str, str]:
    """One line on what bounds the crawl's speed now, and a key for it."""
    if not crawl.scheduler:
        return {"bound": "unknown", "text": "The scheduler is not HostQueueScheduler."}
    global_limit = crawl.concurrent_requests
    if global_limit and in_flight >= global_limit:
        return {
            "bound": "concurrent-requests",
            "text": f"Bound by CONCURRENT_REQUESTS: the global limit of {global_limit} "
            "requests is all in flight.",
        }
    if states.get(WAITING):
        return {
            "bound": "active-hosts",
            "text": (
                f"Bound by the active-host cap: {crawl.active_hosts} hosts hold the "
                f"{crawl.max_active_hosts} places, {states[WAITING]} wait for one "
                "(HOSTQUEUE_MAX_ACTIVE_HOSTS)."
            ),
        }
    redis = _redis_bound(crawl)
    if redis:
        # Before hosts "ready": on Redis, a held host's queue counts what
        # waits there for a refill.
        return {"bound": "redis", "text": redis}
    if states.get(READY):
        # The engine asks for a request whenever it has room: hosts that could
        # send wait for it to ask.
        return {
            "bound": "spider",
            "text": f"Bound by the spider and pipelines (or the CPU): {states[READY]} "
            "host(s) have a request ready that the engine has not asked for yet.",
        }
    if crawl.queued and blockers:
        return {
            "bound": "hosts",
            "text": "Bound by the hosts: their queued work waits on " + ", ".join(blockers) + ".",
        }
    if not crawl.queued:
        if in_flight:
            return {
                "bound": "spider",
                "text": "Bound by the spider and pipelines: nothing is queued beyond "
                "what is in flight.",
            }
        return {"bound": "idle", "text": "Nothing is queued or in flight."}
    return {"bound": "none", "text": "Requests are going out as fast as they are handed out."}


def _redis_bound(crawl: CrawlFigures) -> str:
    """Say how Redis holds the crawl back, or "" if it does not."""
    redis = crawl.redis
    if redis is None:
        return ""
    if redis["away"]:
        return (
            f"Bound by Redis: it has not answered for {redis['away']:.1f}s; no new work "
            "comes from it."
        )
    if redis["full"] and crawl.queued:
        return (
            f"Bound by Redis: it is full (maxmemory); {redis['kept_back']} new requests "
            "wait here for room."
        )
    if redis["waited"] >= REDIS_WAITED and crawl.queued:
        p95 = redis["round_trip_p95"]
        return (
            f"Bound by Redis: the scheduler had nothing to hand out while it waited on Redis "
            f"{redis['waited']:.0%} of the last 10s"
            + ("" if p95 is None else f" (round trip p95 {p95 * 1000:.0f} ms)")
            + "."
        )
    return ""


class Snapshots:
    """Takes snapshots, keeping what rates and histories need of the last minute."""

    def __init__(self, top: int) -> None:
        self.top = max(1, top)
        self._past: deque[_Past] = deque()
        # Per top host: (monotonic time, in flight, limit, queued, pages/s).
        self._history: dict[str, deque[tuple[float, int, int, int, float]]] = {}

    def take(
        self,
        now: float,
        crawl: CrawlFigures,
        rows: Iterable[HostRow],
        detail: Callable[[str], HostDetail],
    ) -> dict[str, Any]:
        """Take the snapshot at monotonic time *now*.

        *detail* gives what the stats counted of one host (called for the top
        hosts only).
        """
        rows = list(rows)
        places_full = bool(crawl.max_active_hosts) and crawl.active_hosts >= crawl.max_active_hosts
        states = dict.fromkeys(STATES, 0)
        in_flight = 0
        blockers: list[tuple[float, str]] = []
        state_of: dict[str, str] = {}
        for row in rows:
            state = host_state(row, places_full)
            state_of[row.host] = state
            states[state] += 1
            in_flight += row.in_flight
            if row.queued and (
                state in BLOCKED_STATES
                or state == DELAY
                or (state == IN_FLIGHT and row.in_flight >= row.cap)
            ):
                blockers.append((row.queued, _blocker_text(row, state)))
        top = heapq.nlargest(self.top, rows, key=lambda row: (row.rank, row.host))
        shown = {row.host for row in top}
        folded = [row for row in rows if row.host not in shown]
        other = {
            "host": OTHER,
            "hosts": len(folded),
            "queued": sum(row.queued for row in folded),
            "in_flight": sum(row.in_flight for row in folded),
        }

        # A crawl younger than a window, or without a snapshot in the window
        # (the first one a reader asks for), counts from its start.
        start: _Past = (now - crawl.uptime, 0, {}, {})
        base = start if crawl.uptime <= MIX_WINDOW else self._baseline(now, MIX_WINDOW) or start
        rate_base = (
            start if crawl.uptime <= RATE_WINDOW else self._baseline(now, RATE_WINDOW) or start
        )
        host_counts: dict[str, tuple[int, dict[str, int]]] = {}
        hosts = []
        for row in top:
            info = detail(row.host)
            host_counts[row.host] = (info.responses, info.statuses)
            pages = _rate(now, info.responses, rate_base, row.host)
            last = next((e for e in reversed(info.events) if e[1] == "limit"), None)
            entry: dict[str, Any] = {
                "host": row.host,
                "state": state_of[row.host],
                "in_flight": row.in_flight,
                "cap": row.cap,
                "limit": row.limit,
                "queued": row.queued,
                "queued_crawl": None,
                "overdue": row.overdue,
                "block_reason": row.block_reason if row.blocked_left > 0 else None,
                "block_left": round(row.blocked_left, 3) if row.blocked_left > 0 else 0.0,
                "interval": row.interval,
                "pages_per_second": round(pages, 3),
                "responses": info.responses,
                "statuses": _minus(info.statuses, _host_base(base, row.host)),
                "latency_p50": _round(info.latency_p50),
                "latency_p95": _round(info.latency_p95),
                "last_change": None
                if last is None
                else {"ago": round(last[0], 3), "from": last[3], "to": last[4], "reason": last[2]},
            }
            history = self._history.get(row.host)
            if history is None:
                history = self._history[row.host] = deque(maxlen=HISTORY_POINTS)
            history.append((now, row.in_flight, row.limit, row.queued, round(pages, 3)))
            hosts.append(entry)
        for host in [host for host in self._history if host not in shown]:
            del self._history[host]

        self._past.append((now, crawl.responses, dict(crawl.statuses), host_counts))
        while self._past and self._past[0][0] < now - MIX_WINDOW - RATE_WINDOW:
            self._past.popleft()
        return {
            "version": SCHEMA_VERSION,
            "time": crawl.time,
            "uptime": round(crawl.uptime, 3),
            "process": crawl.process,
            "controls": False,
            "crawl": {
                "pages_per_second": round(_rate(now, crawl.responses, rate_base, None), 3),
                "responses": crawl.responses,
                "statuses": _minus(crawl.statuses, base[2] if base else {}),
                "statuses_total": dict(sorted(crawl.statuses.items())),
                "in_flight": in_flight,
                "queued": crawl.queued,
                "active_hosts": crawl.active_hosts,
                "max_active_hosts": crawl.max_active_hosts,
                "concurrent_requests": crawl.concurrent_requests,
                "given_up_hosts": crawl.given_up_hosts,
                "paused": crawl.paused,
                "hosts": len(rows),
                "live_hosts": crawl.live_hosts,
                "states": states,
                "redis": crawl.redis,
                "why": why_not_faster(
                    crawl, in_flight, states, [text for _, text in sorted(blockers)[::-1][:3]]
                ),
            },
            "hosts": hosts,
            "other": other,
        }

    def with_detail(
        self, snapshot: dict[str, Any], host: str, now: float, info: HostDetail
    ) -> dict[str, Any]:
        """Return *snapshot* with *host*'s events and history added to its row.

        The events come from *info*, the history from its last snapshots; only
        if it is one of the top hosts.
        """
        rows = []
        for shown in snapshot["hosts"]:
            row = dict(shown) if shown["host"] == host else shown
            if row is not shown:
                row["events"] = [
                    {"ago": round(e[0], 3), "kind": e[1], "reason": e[2], "from": e[3], "to": e[4]}
                    for e in info.events
                ]
                row["history"] = [
                    [round(now - t, 3), flight, limit, queued, rate]
                    for t, flight, limit, queued, rate in self._history.get(host, ())
                ]
            rows.append(row)
        return {**snapshot, "hosts": rows}

    def _baseline(self, now: float, window: float) -> _Past | None:
        """Return the oldest snapshot kept within *window* seconds of *now*."""
        for past in self._past:
            if past[0] >= now - window:
                return past
        return None


def _host_base(
    base: _Past | None,
    host: str,
) -> dict[str, int]:
    if base is None or host not in base[3]:
        return {}  # the crawl's start, or a host new among the top ones
    return base[3][host][1]


def _rate(
    now: float,
    count: int,
    base: _Past | None,
    host: str | None,
) -> float:
    """Responses per second since *base* (0 without one)."""
    if base is None or now <= base[0]:
        return 0.0
    if host is None:
        before = base[1]
    elif host in base[3]:
        before = base[3][host][0]
    elif not base[3] and not base[1]:
        before = 0  # the crawl's start
    else:
        return 0.0
    return max(0, count - before) / (now - base[0])


def _minus(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Return the counts added since *before*, without zeros."""
    diff = {key: value - before.get(key, 0) for key, value in now.items()}
    return {key: value for key, value in sorted(diff.items()) if value > 0}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
