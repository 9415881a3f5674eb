"""What a crawl against local hosts did, in a few dozen lines of text.

A test that finds a page missing needs more than ``7 != 8`` to say why: the
crawl's finish reason and counts, what each host served, and how the crawl's log
ended. :func:`crawl_report` puts them together from plain data (Scrapy's stats
as a mapping, the hosts' :class:`HostStats`, log lines), so it serves a test in
this process and a ``scrapy crawl`` in another alike. Scrapy is not imported here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scrapy_hostqueue.testing._spec import HostSpec
from scrapy_hostqueue.testing._state import HostStats

#: Host lines shown at most; hosts that miss pages come first.
MAX_HOST_LINES = 50
#: Hosts whose crawler-side stats are shown, among those that miss pages.
MAX_HOST_DETAILS = 5
#: Missing or repeated page paths named per host.
MAX_PATHS = 8

# Keys left out: timestamps, sizes and rates say nothing about a lost page.
_SKIPPED = ("start_time", "finish_time", "responses_per_minute", "items_per_minute")
_SKIPPED_PREFIXES = (
    "memusage/",
    "downloader/request_bytes",
    "downloader/response_bytes",
    "downloader/request_method_count/",
)
_PER_HOST = "hostqueue/hosts/"
# The headline: what the crawl did with its requests, each key shown even when
# it is 0 (an absent count is the news).
_HEADLINE = (
    ("enqueued", "scheduler/enqueued"),
    ("dequeued", "scheduler/dequeued"),
    ("requeued", "hostqueue/requeued_count"),
    ("duplicates filtered", "dupefilter/filtered"),
    ("responses", "downloader/response_count"),
    ("download errors", "downloader/exception_count"),
    ("retries", "retry/count"),
    ("retries given up", "retry/max_reached"),
    ("hosts parked", "hostqueue/hosts_parked_count"),
    ("hosts given up", "hostqueue/hosts_given_up_count"),
    ("requests dropped", "hostqueue/dropped_request_count"),
    ("overdue", "hostqueue/overdue_count"),
)


def crawl_report(
    stats: Mapping[str, Any] | None,
    *,
    hosts: Sequence[HostStats] = (),
    specs: Sequence[HostSpec] = (),
    log: Iterable[str] = (),
    title: str = "crawl",
) -> str:
    """Say in a few dozen lines what one crawl did, for a failed test's output.

    *stats* are the crawl's Scrapy stats (``crawler.stats.get_stats()``; None
    when the crawl left none, as a killed process); *hosts* the hosts' counts
    (``LocalHosts.all_stats()``) and *specs* their specs (``LocalHosts.specs``),
    which tell how many pages a finite site has, so the report names the pages
    a host never served; *log* the last lines of the crawl's log.

    The report holds the finish reason, the scheduler's and the middleware's
    counts (enqueued, dequeued, requeued, duplicates, blocks, hosts given up,
    download errors, retries), every other global stat that is not 0, the
    per-host stats summed over hosts, one line per host from the hosts' side,
    the crawler's stats of the hosts that miss pages, and the log lines.
    """
    lines = [f"== {title}"]
    if stats is None:
        lines.append("no stats: the crawl did not close")
    else:
        lines += _stats_lines(stats)
    short = _host_lines(hosts, specs, lines)
    if stats is not None:
        for hostname in short[:MAX_HOST_DETAILS]:
            prefix = f"{_PER_HOST}{hostname}/"
            own = {
                key[len(prefix) :]: value for key, value in stats.items() if key.startswith(prefix)
            }
            lines.append(f"crawler's stats of {hostname}: {_pairs(own) or 'none'}")
    tail = list(log)
    if tail:
        lines.append(f"last {len(tail)} log lines:")
        lines += [f"  {line}" for line in tail]
    return "\n".join(lines)


def _stats_lines(stats: Mapping[str, Any]) -> list[str]:
    elapsed = stats.get("elapsed_time_seconds")
    took = f", {elapsed:.2f} s" if isinstance(elapsed, float) else ""
    lines = [f"finish_reason {stats.get('finish_reason')!r}{took}"]
    blocks: dict[str, int] = defaultdict(int)
    summed: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = defaultdict(dict)
    shown = {key for _, key in _HEADLINE} | {"finish_reason", "elapsed_time_seconds"}
    for key, value in sorted(stats.items()):
        if key in shown or key in _SKIPPED or key.startswith(_SKIPPED_PREFIXES):
            continue
        if key.startswith(_PER_HOST):
            _, _, rest = key[len(_PER_HOST) :].partition("/")
            _sum_per_host(summed, rest, value)
            if rest.startswith("block_count/") and isinstance(value, int):
                blocks[rest.split("/", 1)[1]] += value
            continue
        if value in (0, None):
            continue
        group, _, rest = key.partition("/")
        groups[group][rest or group] = value
    headline = [f"{name} {stats.get(key, 0)}" for name, key in _HEADLINE]
    # The blocks are counted per host only: summed here, after the responses.
    headline.insert(5, f"blocks {sum(blocks.values())}" + (f" {dict(blocks)}" if blocks else ""))
    lines.append(", ".join(headline))
    single = {group: values[group] for group, values in groups.items() if list(values) == [group]}
    for group, values in groups.items():
        if group not in single:
            lines.append(f"{group}: {_pairs(values)}")
    if single:
        lines.append(_pairs(single))
    if summed:
        lines.append(f"per host, summed: {_pairs(dict(sorted(summed.items())))}")
    return lines


def _sum_per_host(summed: dict[str, Any], name: str, value: Any) -> None:
    """Add *value* to *summed*: counts add up over hosts, high-water marks keep the highest.

    The rest (limits, latencies) says little summed and is left to the host details.
    """
    if not isinstance(value, int | float):
        return
    if name.endswith("_count") or "_count/" in name:
        summed[name] = summed.get(name, 0) + value
    elif name.startswith("max_"):
        summed[name] = max(summed.get(name, value), value)


def _host_lines(
    hosts: Sequence[HostStats], specs: Sequence[HostSpec], lines: list[str]
) -> list[str]:
    """Append the hosts' counts; return the hostnames that miss pages.

    Append the hosts' counts, one line per run of neighbours that counted
    the same (those that miss pages first past :data:`MAX_HOST_LINES`);
    return the hostnames that miss pages.
    """
    if not hosts:
        return []
    runs: list[tuple[bool, list[str], str]] = []
    short: list[str] = []
    for index, host in enumerate(hosts):
        pages = specs[index].pages if index < len(specs) else None
        missing = [] if pages is None else _missing(host, pages)
        if missing:
            short.append(host.hostname)
        counts = _counts(host, pages, missing)
        if runs and runs[-1][2] == counts:
            runs[-1][1].append(host.hostname)
        else:
            runs.append((bool(missing), [host.hostname], counts))
    lines.append(f"hosts ({len(hosts)}, counted by the hosts):")
    if len(runs) > MAX_HOST_LINES:
        runs.sort(key=lambda run: not run[0])
    for _, names, counts in runs[:MAX_HOST_LINES]:
        named = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)} hosts)"
        lines.append(f"  {named}: {counts}")
    if len(runs) > MAX_HOST_LINES:
        left = sum(len(names) for _, names, _ in runs[MAX_HOST_LINES:])
        lines.append(f"  ... {left} more hosts, {sum(h.served for h in hosts)} pages served in all")
    return short


def _missing(host: HostStats, pages: int) -> list[str]:
    """List the pages of a site of *pages* pages the host never served (``/`` is page 0)."""
    served = set(host.pages)
    if "/" in served:
        served.add("/page/0")
    return [f"/page/{n}" for n in range(pages) if f"/page/{n}" not in served]


def _counts(host: HostStats, pages: int | None, missing: list[str]) -> str:
    parts = [f"served {host.served}" if pages is None else f"served {host.served} of {pages} pages"]
    if missing:
        parts.append(f"missing {_paths(missing)}")
    again = [path for path, count in host.pages.items() if count > 1]
    if again:
        parts.append(f"served more than once {_paths(again)}")
    parts.append(f"requests {host.requests}")
    parts.append(f"max in flight {host.max_in_flight}")
    if host.in_flight:
        parts.append(f"in flight now {host.in_flight}")
    parts.append(f"statuses {dict(sorted(host.statuses.items()))}")
    for name in ("faults", "resets", "in_retry_after_window"):
        if getattr(host, name):
            parts.append(f"{name.replace('_', ' ')} {getattr(host, name)}")
    parts.append(f"connections {host.connections}")
    return ", ".join(parts)


def _paths(paths: list[str]) -> str:
    named = " ".join(paths[:MAX_PATHS])
    return f"{len(paths)} ({named}{' ...' if len(paths) > MAX_PATHS else ''})"


def _pairs(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {_number(value)}" for key, value in values.items())


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
