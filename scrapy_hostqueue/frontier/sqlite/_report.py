"""``python -m scrapy_hostqueue frontier PATH``: what a frontier file holds.

Reads the file without locking it or writing to it, so it also works while a
crawl runs on the file (SQLite's WAL mode lets a reader look).
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

from scrapy_hostqueue.frontier import FRONTIER_FILE
from scrapy_hostqueue.frontier.sqlite._file import FrontierFile
from scrapy_hostqueue.frontier.sqlite._store import parse_learned


def frontier_file(path: str) -> str:
    """*path*, or the frontier file in it if it is a directory (a JOBDIR)."""
    if path.startswith("sqlite://"):
        path = path[len("sqlite://") :]
    if os.path.isdir(path):
        return os.path.join(path, FRONTIER_FILE)
    return path


def _when(wall: float, now: float) -> str:
    moment = datetime.fromtimestamp(wall, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{moment} (in {wall - now:,.0f} s)"


def report(path: str, *, top: int = 10) -> str:
    """Report on the frontier file at *path*, as text."""
    frontier = FrontierFile(frontier_file(path), readonly=True)
    try:
        queued = dict(frontier.queued_per_host())
        leased = dict(frontier.leased_per_host())
        hosts = list(frontier.host_rows())
        fingerprints = frontier.fingerprint_count()
    finally:
        frontier.close()
    now = time.time()
    lines = [
        f"frontier file {frontier.path}",
        f"  {sum(queued.values()):,} requests queued and {sum(leased.values()):,} leased "
        f"(handed out, not acknowledged) over {len(queued.keys() | leased.keys()):,} hosts; "
        f"{fingerprints:,} fingerprints seen",
    ]
    busiest = sorted(queued.keys() | leased.keys(), key=lambda h: (-queued.get(h, 0), h))
    if busiest:
        lines.append(f"queued and leased per host (top {min(top, len(busiest))}):")
        width = max(len(host) for host in busiest[:top])
        for host in busiest[:top]:
            lines.append(
                f"  {host:<{width}}  {queued.get(host, 0):>9,} queued  "
                f"{leased.get(host, 0):>6,} leased"
            )
    blocked = sorted(
        (row for row in hosts if row[3] is not None and row[3] > now), key=lambda r: r[3] or 0
    )
    if blocked:
        lines.append("blocked hosts:")
        for host, _limit, _interval, until, reason, _spaced, _given_up, _learned in blocked:
            assert until is not None
            lines.append(f"  {host}  until {_when(until, now)}, {reason or 'blocked'}")
    given_up = sorted(row[0] for row in hosts if row[6])
    if given_up:
        lines.append(f"given-up hosts ({len(given_up):,}): " + ", ".join(given_up[:top]))
    learned = sorted((row for row in hosts if row[1] or row[2] or row[7]), key=lambda r: r[0])
    if learned:
        lines.append(f"learned limits and intervals ({len(learned):,} hosts):")
        for host, limit, interval, *_, text in learned[:top]:
            lines.append(
                f"  {host}  limit {limit}"
                + (f", interval {interval:g} s" if interval else "")
                + _aimd_text(parse_learned(text))
            )
    return "\n".join(lines)


def _aimd_text(data: dict[str, float] | None) -> str:
    """Say what the AIMD middleware learned about a host, in words."""
    if not data:
        return ""
    parts = []
    if "srtt" in data:
        parts.append(f"latency {data['srtt']:.3g} s ± {data.get('rttvar', 0.0):.2g}")
    if data.get("failures"):
        parts.append(f"{data['failures']:g} failure(s) in a row")
    if data.get("cooldowns"):
        parts.append(f"{data['cooldowns']:g} cool-down(s)")
    if data.get("probe_level"):
        parts.append(f"pushed back at {data['probe_level']:g}")
    head = f"; AIMD limit {data['limit']:g}" if "limit" in data else "; AIMD"
    return head + "".join(f", {part}" for part in parts)
