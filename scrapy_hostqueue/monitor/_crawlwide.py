"""The crawl-wide snapshot of a shared crawl: its processes' snapshots merged.

Pure logic: no Scrapy, Twisted or Redis import. Every process of a crawl on
the Redis frontier publishes its own snapshot (``_shared``); :func:`merge`
adds them up into one of the same schema, plus ``processes``, the list of
the processes seen. A host is held by one process at a time, or lent in part
to another: its counts add up, as does its limit among the processes with
work for it; its state and block are those of the process holding most of
its work.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any

from scrapy_hostqueue.monitor._snapshot import OTHER, SCHEMA_VERSION

#: Crawl-wide numbers that add up across processes.
_SUMS = (
    "pages_per_second",
    "responses",
    "in_flight",
    "queued",
    "active_hosts",
    "max_active_hosts",
    "concurrent_requests",
    "given_up_hosts",
    "hosts",
    "live_hosts",
)
#: Per-host numbers that add up across processes.
_HOST_SUMS = ("in_flight", "queued", "overdue", "responses", "pages_per_second")


def _add(into: dict[str, int], counts: dict[str, int]) -> None:
    for key, value in counts.items():
        into[key] = into.get(key, 0) + value


def merge(parts: list[dict[str, Any]], top: int, now: float) -> dict[str, Any]:
    """Merge the processes' snapshots into one of the whole crawl.

    *now* is the wall clock, for their age.
    """
    crawl: dict[str, Any] = dict.fromkeys(_SUMS, 0)
    statuses: dict[str, int] = {}
    statuses_total: dict[str, int] = {}
    states: dict[str, int] = {}
    bounds: Counter[str] = Counter()
    whys: dict[str, str] = {}
    processes = []
    rows: dict[str, list[dict[str, Any]]] = {}
    other: dict[str, Any] = {"host": OTHER, "hosts": 0, "queued": 0, "in_flight": 0}
    for part in sorted(parts, key=lambda p: (p["process"]["hostname"], p["process"]["pid"])):
        figures = part["crawl"]
        for name in _SUMS:
            crawl[name] += figures[name]
        _add(statuses, figures["statuses"])
        _add(statuses_total, figures["statuses_total"])
        _add(states, figures["states"])
        bound = figures["why"]["bound"]
        bounds[bound] += 1
        whys.setdefault(bound, figures["why"]["text"])
        processes.append(
            {
                **part["process"],
                "age": round(max(0.0, now - part["time"]), 3),
                "pages_per_second": figures["pages_per_second"],
                "hosts": figures["live_hosts"],
                "in_flight": figures["in_flight"],
                "queued": figures["queued"],
                "responses": figures["responses"],
                "bound": bound,
            }
        )
        for host in part["hosts"]:
            rows.setdefault(host["host"], []).append(host)
        for name in ("hosts", "queued", "in_flight"):
            other[name] += part["other"][name]
    waits = [part["crawl"].get("redis") for part in parts]
    crawl["redis"] = max(
        (redis for redis in waits if redis is not None),
        key=lambda redis: (redis["waited"], redis["away"]),
        default=None,
    )
    crawl["pages_per_second"] = round(crawl["pages_per_second"], 3)
    crawl["statuses"] = dict(sorted(statuses.items()))
    crawl["statuses_total"] = dict(sorted(statuses_total.items()))
    crawl["states"] = states
    crawl["paused"] = any(part["crawl"].get("paused", False) for part in parts)
    if bounds:
        bound, count = max(bounds.items(), key=lambda item: (item[1], item[0]))
        crawl["why"] = {"bound": bound, "text": f"{count} of {len(parts)} processes: {whys[bound]}"}
    else:
        crawl["why"] = {"bound": "idle", "text": "No process of the crawl is running."}
    hosts = [_merge_host(held) for held in rows.values()]
    shown = heapq.nlargest(top, hosts, key=lambda host: (host["responses"], host["host"]))
    names = {host["host"] for host in shown}
    for host in hosts:
        if host["host"] not in names:
            other["hosts"] += 1
            other["queued"] += host["queued"]
            other["in_flight"] += host["in_flight"]
    return {
        "version": SCHEMA_VERSION,
        "time": now,
        "uptime": max((part["uptime"] for part in parts), default=0.0),
        "process": None,
        "controls": False,
        "processes": processes,
        "crawl": crawl,
        "hosts": shown,
        "other": other,
    }


def _merge_host(held: list[dict[str, Any]]) -> dict[str, Any]:
    """One host's row from the rows of the processes that hold it."""
    main = max(held, key=lambda row: (row["in_flight"] + row["queued"], row["responses"]))
    row = dict(main)
    for name in _HOST_SUMS:
        row[name] = sum(part[name] for part in held)
    row["pages_per_second"] = round(row["pages_per_second"], 3)
    # A host lent in part to another process has its limit split between
    # the holders: the parts with work add up to its limit.
    working = [part for part in held if part["in_flight"] or part["queued"]]
    if len(working) > 1:
        row["limit"] = sum(part["limit"] for part in working)
        row["cap"] = sum(part["cap"] for part in working)
    statuses: dict[str, int] = {}
    for part in held:
        _add(statuses, part["statuses"])
    row["statuses"] = dict(sorted(statuses.items()))
    row["queued_crawl"] = row["queued"]
    changes = [part["last_change"] for part in held if part["last_change"] is not None]
    row["last_change"] = min(changes, key=lambda change: change["ago"]) if changes else None
    row.pop("events", None)
    row.pop("history", None)
    return row
