"""The host timeline file: JSON Lines, one row per interval and host.

Written by :class:`~scrapy_hostqueue.stats.HostQueueStats` when
``HOSTQUEUE_TIMELINE_FILE`` is set; read by ``python -m scrapy_hostqueue plot``.

A host row::

    {"t": 12.0, "dt": 1.0, "host": "example.com", "in_flight": 4, "fetched": 37,
     "failed": 0, "queued": 120, "limit": 4, "blocked": false}

``t`` is the end of the interval in seconds since the spider opened, ``dt`` its
length, ``fetched`` the responses downloaded in it (retried and redirected ones
included), ``failed`` the downloads that ended in it without a response (a
connection refused or reset, a DNS failure, a timeout: what a dead or hanging
host gives; files written before it existed have no ``failed``, read as 0).
``in_flight`` (the host's requests sent and not yet answered: with
``HOSTQUEUE_PREFETCH``, those past the send gate; for a host that has left the
scheduler's tables, and under another scheduler, its requests inside Scrapy's
downloader), ``queued``, ``limit`` and ``blocked`` (a Retry-After, back-off or
error cool-down block running) are sampled at ``t``. Under a scheduler other
than ``HostQueueScheduler``, ``queued`` and ``limit`` are ``null`` and
``blocked`` is ``false``. Each interval has at most ``HOSTQUEUE_STATS_MAX_HOSTS`` host rows
(the busiest) and one aggregate row with ``"host": "_other"`` that adds up
every other host, says how many there were (``hosts``) and how many were
blocked (``blocked_hosts``), and has ``"limit": null``.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from dataclasses import dataclass
from typing import IO, Any

from scrapy_hostqueue._errors import TimelineError

#: The host of the aggregate row of each interval.
OTHER_HOSTS = "_other"

_FIELDS = ("t", "dt", "host", "in_flight", "fetched", "queued", "limit", "blocked")


@dataclass
class HostSample:
    """The state of one host at one sampling time."""

    host: str
    in_flight: int
    queued: int | None  # None: unknown (not HostQueueScheduler)
    limit: int | None
    blocked_for: float = 0.0  # seconds until a running block ends
    block_reason: str | None = None
    overdue: int = 0  # of in_flight, requests in flight past the host's overdue time


class TimelineWriter:
    """Appends one interval at a time to a JSON Lines file (truncated at start)."""

    def __init__(self, path: str, max_hosts: int, *, queues_known: bool = True) -> None:
        self.path = path
        self.max_hosts = max_hosts
        #: False under a scheduler that does not tell its queues: ``queued``
        #: is then ``null`` in every row.
        self.queues_known = queues_known
        self.rows = 0
        self._file: IO[str] | None = open(path, "w", encoding="utf-8")  # noqa: SIM115

    def write(
        self,
        t: float,
        dt: float,
        samples: list[HostSample],
        fetched: dict[str, int],
        failed: dict[str, int] | None = None,
    ) -> None:
        """One interval: the busiest *max_hosts* hosts, then the aggregate row."""
        if self._file is None:
            raise ValueError(f"timeline {self.path} is closed")
        failed = failed or {}

        def busyness(sample: HostSample) -> tuple[int, int]:
            host = sample.host
            return (
                sample.in_flight + fetched.get(host, 0) + failed.get(host, 0),
                sample.queued or 0,
            )

        sampled = {sample.host for sample in samples}
        # A host that finished within the interval is no longer sampled; its
        # responses and failures still count.
        samples = samples + [
            HostSample(host, 0, None, None)
            for host in dict.fromkeys([*fetched, *failed])
            if host not in sampled
        ]
        top = heapq.nlargest(self.max_hosts, samples, key=busyness)
        named = {sample.host for sample in top}
        lines = []
        t, dt = round(t, 3), round(dt, 3)
        for sample in top:
            row = {
                "t": t,
                "dt": dt,
                "host": sample.host,
                "in_flight": sample.in_flight,
                "overdue": sample.overdue,
                "fetched": fetched.get(sample.host, 0),
                "failed": failed.get(sample.host, 0),
                "queued": sample.queued,
                "limit": sample.limit,
                "blocked": sample.blocked_for > 0,
            }
            lines.append(json.dumps(row, separators=(",", ":")))
        rest = [sample for sample in samples if sample.host not in named]
        blocked_hosts = sum(1 for sample in rest if sample.blocked_for > 0)
        other = {
            "t": t,
            "dt": dt,
            "host": OTHER_HOSTS,
            "in_flight": sum(sample.in_flight for sample in rest),
            "overdue": sum(sample.overdue for sample in rest),
            "fetched": sum(fetched.get(sample.host, 0) for sample in rest),
            "failed": sum(failed.get(sample.host, 0) for sample in rest),
            "queued": sum(sample.queued or 0 for sample in rest) if self.queues_known else None,
            "limit": None,
            "blocked": blocked_hosts > 0,
            "hosts": len(rest),
            "blocked_hosts": blocked_hosts,
        }
        lines.append(json.dumps(other, separators=(",", ":")))
        self._file.write("\n".join(lines) + "\n")
        # Flushed per interval so the file can be watched during the crawl.
        self._file.flush()
        self.rows += len(lines)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _check_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise TimelineError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [name for name in _FIELDS if name not in row]
    if missing:
        raise TimelineError(f"{where}: missing {', '.join(missing)}")
    # Files written before "failed" and "overdue" existed have none.
    row.setdefault("failed", 0)
    row.setdefault("overdue", 0)
    for name in ("t", "dt", "in_flight", "overdue", "fetched", "failed", "queued"):
        value = row[name]
        if value is None and name == "queued":
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise TimelineError(f"{where}: {name} must be a number >= 0, got {value!r}")
    if not isinstance(row["host"], str):
        raise TimelineError(f"{where}: host must be a string, got {row['host']!r}")
    return row


def read_timeline(path: str) -> list[dict[str, Any]]:
    """Every row of a timeline file, checked; raises :class:`TimelineError`."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}, line {number}"
                try:
                    row = json.loads(line)
                except ValueError as error:
                    raise TimelineError(f"{where}: not JSON ({error})") from None
                rows.append(_check_row(row, where))
    except OSError as error:
        raise TimelineError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise TimelineError(f"{path}: not a UTF-8 text file") from None
    if not rows:
        raise TimelineError(f"{path}: no timeline rows")
    return rows


@dataclass
class Series:
    """Per-host series on a common time axis, ready to draw."""

    times: list[float]
    #: Where the first interval begins (rates hold over ``(previous time, time]``).
    start: float
    #: host -> in flight at each time
    in_flight: dict[str, list[float]]
    #: host -> responses per second over the interval ending at each time
    rate: dict[str, list[float]]
    #: host -> downloads that failed (no response) per second, likewise
    failed: dict[str, list[float]]


def _natural(name: str) -> list[tuple[int, int | str]]:
    """Sort key that puts 127.0.0.2 before 127.0.0.10."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name)]


def build_series(rows: list[dict[str, Any]], max_lines: int = 10) -> Series:
    """Give the *max_lines* hosts with the most responses a line each.

    Every other host (and the file's own aggregate rows) adds up into ``_other``, which gets a line
    only if it is not all zeros.
    """
    times = sorted({float(row["t"]) for row in rows})
    index = {t: i for i, t in enumerate(times)}
    totals: dict[str, float] = {}
    for row in rows:
        if row["host"] != OTHER_HOSTS:
            busy = row["fetched"] + row.get("failed", 0) + row["in_flight"]
            totals[row["host"]] = totals.get(row["host"], 0) + busy
    shown = heapq.nlargest(max_lines, totals, key=lambda host: (totals[host], host))
    # Ordered by name, not by volume, so a host keeps its place (and colour)
    # from one chart to the next, e.g. a stock crawl against this project's.
    names = [*sorted(shown, key=_natural), OTHER_HOSTS]
    in_flight = {name: [0.0] * len(times) for name in names}
    rate = {name: [0.0] * len(times) for name in names}
    failed = {name: [0.0] * len(times) for name in names}
    for row in rows:
        name = row["host"] if row["host"] in in_flight else OTHER_HOSTS
        i = index[float(row["t"])]
        in_flight[name][i] += row["in_flight"]
        if row["dt"] > 0:
            rate[name][i] += row["fetched"] / row["dt"]
            failed[name][i] += row.get("failed", 0) / row["dt"]
    if (
        not any(in_flight[OTHER_HOSTS])
        and not any(rate[OTHER_HOSTS])
        and not any(failed[OTHER_HOSTS])
    ):
        del in_flight[OTHER_HOSTS], rate[OTHER_HOSTS], failed[OTHER_HOSTS]
    start = max(0.0, min(float(row["t"]) - float(row["dt"]) for row in rows))
    return Series(times, min(start, times[0]), in_flight, rate, failed)
