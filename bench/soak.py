"""A long crawl of many hosts, some of them troubled.

Does the crawl keep moving, fetch every page and keep its connections in check?

400 hosts by default, in groups: healthy (360, answering in 20 ms), slow (20,
half at 1 s and half at 2 s), throttling (10, answering 429 with
``Retry-After: 2`` while more than 2 requests are in flight) and hanging (10,
hanging on every 20th page request until ``DOWNLOAD_TIMEOUT``); ``--pages``
(40) start URLs on each, interleaved across hosts (the troubled hosts spread
among the healthy ones), no link following, ``CONCURRENT_REQUESTS = 16``,
``CONCURRENT_REQUESTS_PER_DOMAIN = 4``, ``DOWNLOAD_TIMEOUT = 10``, Scrapy's
other defaults (``RetryMiddleware`` included). Each configuration
(``--configs``) crawls to the end, in a fresh process, ``--rounds`` times
(configurations rotating).

Measured per crawl:

* the longest time without any response while the healthy hosts still had work
  (the crawl process records the time of every response and the time the last
  healthy page was answered; the interval from the first request to the first
  response counts too), and how many such gaps lasted 2 s or more;
* pages never served, counted by the hosts: per host, its pages less the 200
  answers it sent (each page is requested again only after a failure: a timed-
  out request that was retried counts when it is finally served);
* TCP connections the hosts accepted, in total;
* sockets open at once, at the hosts: the peak of their sum, sampled every
  0.25 s during the crawl, and the sum of each host's own peak (an upper bound);
* the most requests in flight on a host of each group (the limit is 4).

Prints a line per crawl, a table of medians, the targets (the add-on: no gap of
2 s or more while the healthy hosts have work, every page fetched, at most
1.5x stock Scrapy's connections, no more sockets open at once than stock
Scrapy) with stock Scrapy's figures beside them, and writes
``bench/results/soak-<timestamp>.json``.

    python -m bench.soak                  # 400 hosts x 40 pages: about 5 minutes
    python -m bench.soak --quick          # 40 hosts x 30 pages, shorter latencies
    python -m bench.soak --smoke          # 14 hosts x 21 pages: does it run?
    python -m bench.soak --configs scrapy,hq-scheduler,hq-full --rounds 2
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.runner import run_child
from bench.scenarios import ADDON, CONFIGS
from bench.standalone import (
    HANG_RATE,
    LATENCY,
    PER_HOST_LIMIT,
    RESULTS,
    SETTINGS,
    ProcessSide,
    configs_argument,
    crawl_order,
    median,
    run_meta,
    runnable,
    spread,
    write_results,
)
from scrapy_hostqueue.testing import ControlError, HostSpec, LocalHosts

logger = logging.getLogger(__name__)

THROTTLE_ABOVE = 2
GROUPS = ("healthy", "slow", "throttling", "hanging")
GAP_TARGET = 2.0
CONNECTIONS_TARGET = 1.5
SAMPLE_EVERY = 0.25
MODE = "soak"


@dataclass(frozen=True)
class Size:
    healthy: int
    slow: int
    throttling: int
    hanging: int
    pages: int
    timeout: float
    #: Half the slow hosts answer in the first, half in the second.
    slow_latencies: tuple[float, float]
    retry_after: int

    def specs(self) -> dict[str, list[HostSpec]]:
        """Every group's hosts."""
        slow = [HostSpec(latency=self.slow_latencies[0], links=0)] * (self.slow // 2)
        slow += [HostSpec(latency=self.slow_latencies[1], links=0)] * (self.slow - len(slow))
        return {
            "healthy": [HostSpec(latency=LATENCY, links=0)] * self.healthy,
            "slow": slow,
            "throttling": [
                HostSpec(
                    latency=LATENCY,
                    links=0,
                    throttle_above=THROTTLE_ABOVE,
                    retry_after=str(self.retry_after),
                )
            ]
            * self.throttling,
            "hanging": [HostSpec(latency=LATENCY, links=0, fault="hang", fault_rate=HANG_RATE)]
            * self.hanging,
        }


FULL = Size(
    healthy=360,
    slow=20,
    throttling=10,
    hanging=10,
    pages=40,
    timeout=10.0,
    slow_latencies=(1.0, 2.0),
    retry_after=2,
)
#: 30 pages: a hanging host's 20th request comes before its last page.
QUICK = Size(
    healthy=30,
    slow=4,
    throttling=3,
    hanging=3,
    pages=30,
    timeout=3.0,
    slow_latencies=(0.2, 0.5),
    retry_after=1,
)
#: The smallest crawl with every group, for the test suite's smoke test: 21
#: pages, so that a hanging host's 20th request comes.
SMOKE = Size(
    healthy=8,
    slow=2,
    throttling=2,
    hanging=2,
    pages=21,
    timeout=1.0,
    slow_latencies=(0.1, 0.2),
    retry_after=1,
)


@dataclass
class Crawl(ProcessSide):
    """One crawl, as the crawl process and the hosts saw it."""

    round: int
    config: str
    #: Seconds from the first request to the last healthy page's response.
    healthy_done: float | None = None
    #: The last response's time: the crawl's length.
    last_response: float | None = None
    #: The longest interval without a response before ``healthy_done``, when
    #: it began, and the intervals of GAP_TARGET or more.
    longest_gap: float | None = None
    longest_gap_at: float | None = None
    long_gaps: int = 0
    pages: int = 0
    never_served: dict[str, int] = field(default_factory=dict)
    connections: int = 0
    connections_by_group: dict[str, int] = field(default_factory=dict)
    open_sockets_peak: int = 0
    open_sockets_host_peaks: int = 0
    max_in_flight: dict[str, int] = field(default_factory=dict)
    status_429: int = 0
    in_retry_after_window: int = 0

    @property
    def never_served_total(self) -> int:
        return sum(self.never_served.values())


def gaps(times: list[float], until: float) -> tuple[float, float, int]:
    """Return the longest gap between 0, the *times* up to *until*, and *until*.

    When it began; how many lasted GAP_TARGET or more.
    """
    moments = [0.0, *sorted(t for t in times if t <= until), until]
    longest, at, long_ones = 0.0, 0.0, 0
    for before, after in itertools.pairwise(moments):
        gap = after - before
        long_ones += gap >= GAP_TARGET
        if gap > longest:
            longest, at = gap, before
    return longest, at, long_ones


class SocketSampler:
    """Sums the hosts' open connections every SAMPLE_EVERY seconds and keeps the peak.

    Sums the hosts' open connections every SAMPLE_EVERY seconds in a thread
    and keeps the peak.
    """

    def __init__(self, hosts: LocalHosts) -> None:
        self._hosts = hosts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sockets", daemon=True)
        self.peak = 0

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            try:
                stats = self._hosts.all_stats(arrivals=False)
            except ControlError as error:
                # A missed sample: the hosts' own peaks still bound the figure.
                logger.warning("open sockets: %s", error)
                continue
            self.peak = max(self.peak, sum(host.open_connections for host in stats))

    def __enter__(self) -> SocketSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def crawl(
    hosts: LocalHosts,
    size: Size,
    groups: dict[str, range],
    config: str,
    *,
    round_: int,
    time_limit: float,
) -> Crawl:
    netlocs = {name: [hosts.netloc(index) for index in indexes] for name, indexes in groups.items()}
    troubled = [
        netloc
        for row in itertools.zip_longest(*(netlocs[name] for name in GROUPS[1:]))
        for netloc in row
        if netloc is not None
    ]
    hosts.reset()
    with SocketSampler(hosts) as sampler:
        result = run_child(
            {
                "settings": {
                    **SETTINGS,
                    "DOWNLOAD_TIMEOUT": size.timeout,
                    **CONFIGS[config].settings,
                },
                "hosts": spread(netlocs["healthy"], troubled),
                "start_per_host": size.pages,
                "budget": size.healthy * size.pages,
                "budget_hosts": [hosts.hostnames[index] for index in groups["healthy"]],
                "stop_at_budget": False,
                "response_times": True,
                "time_limit": time_limit,
                "follow": False,
            },
            time_limit + 60,
        )
        try:
            hosts.wait_idle(size.timeout + 15.0)
        except TimeoutError:
            logger.warning("%s: hosts still busy after the crawl", config)
    stats = hosts.all_stats(arrivals=False)
    run = Crawl(round_, config, pages=len(hosts) * size.pages)
    run.open_sockets_peak = sampler.peak
    run.open_sockets_host_peaks = sum(host.max_open_connections for host in stats)
    run.connections = sum(host.connections for host in stats)
    run.status_429 = sum(host.statuses.get(429, 0) for host in stats)
    run.in_retry_after_window = sum(host.in_retry_after_window for host in stats)
    for name, indexes in groups.items():
        mine = [stats[index] for index in indexes]
        if not mine:
            continue
        run.never_served[name] = sum(
            max(0, size.pages - host.statuses.get(200, 0)) for host in mine
        )
        run.max_in_flight[name] = max(host.max_in_flight for host in mine)
        run.connections_by_group[name] = sum(host.connections for host in mine)
    if not run.read_process(result):
        return run
    times: list[float] = result.get("response_times", [])
    run.last_response = max(times, default=None)
    run.healthy_done = result["time_to_budget"]
    if run.healthy_done is None:
        run.error = (
            f"{result['budget_pages']} of {size.healthy * size.pages} healthy pages "
            f"({run.finish_reason})"
        )
    until = run.healthy_done if run.healthy_done is not None else run.last_response
    if until is not None:
        run.longest_gap, run.longest_gap_at, run.long_gaps = gaps(times, until)
    return run


def _num(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def describe(run: Crawl) -> str:
    head = f"round {run.round + 1} {run.config:>14}: "
    if run.error:
        head += f"({run.error}) "
    never = ", ".join(f"{name} {count}" for name, count in run.never_served.items() if count)
    in_flight = ", ".join(f"{name} {count}" for name, count in run.max_in_flight.items())
    by_group = ", ".join(f"{name} {count}" for name, count in run.connections_by_group.items())
    return head + (
        f"healthy hosts done at {_num(run.healthy_done, suffix=' s')}, longest gap before "
        f"{_num(run.longest_gap, suffix=' s')} (at {_num(run.longest_gap_at, '.1f', ' s')}; "
        f"{run.long_gaps} >= {GAP_TARGET:g} s); crawl {_num(run.last_response, '.1f', ' s')}; "
        f"never served {run.never_served_total}{f' ({never})' if never else ''}; "
        f"connections {run.connections} ({by_group}); open sockets peak {run.open_sockets_peak} "
        f"(host peaks {run.open_sockets_host_peaks}); max in flight {in_flight}; "
        f"429s {run.status_429}, timeouts {run.timeouts}"
    )


def summarise(configs: list[str], runs: list[Crawl]) -> dict[str, dict[str, Any]]:
    """Medians per configuration (never served and gaps: the worst crawl)."""
    summary: dict[str, dict[str, Any]] = {}
    for config in configs:
        mine = [run for run in runs if run.config == config]
        summary[config] = {
            "crawls": len(mine),
            "failed": sum(run.error is not None for run in mine),
            "healthy_done": median([run.healthy_done for run in mine]),
            "crawl_time": median([run.last_response for run in mine]),
            "longest_gap": max((run.longest_gap or 0.0 for run in mine), default=None),
            "long_gaps": max((run.long_gaps for run in mine), default=0),
            "never_served": max((run.never_served_total for run in mine), default=0),
            "pages": mine[0].pages if mine else 0,
            "connections": median([run.connections for run in mine]),
            "open_sockets_peak": median([run.open_sockets_peak for run in mine]),
            "open_sockets_host_peaks": median([run.open_sockets_host_peaks for run in mine]),
            "max_in_flight": max(
                (max(run.max_in_flight.values(), default=0) for run in mine), default=0
            ),
            "status_429": median([run.status_429 for run in mine]),
        }
    stock = summary.get("scrapy", {}).get("connections")
    for row in summary.values():
        row["connections_x_scrapy"] = row["connections"] / stock if stock else None
    return summary


HEADER = (
    "config",
    "healthy done",
    "longest gap",
    f"gaps >={GAP_TARGET:g}s",
    "never served",
    "connections",
    "x scrapy",
    "open sockets",
    "max in flight",
    "crawl",
)


def summary_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    rows: list[tuple[str, ...]] = [HEADER]
    for config, figures in summary.items():
        rows.append(
            (
                config,
                _num(figures["healthy_done"], suffix=" s"),
                _num(figures["longest_gap"], suffix=" s"),
                str(figures["long_gaps"]),
                f"{figures['never_served']}/{figures['pages']}",
                _num(figures["connections"], ".0f"),
                _num(figures["connections_x_scrapy"], suffix="x"),
                f"{_num(figures['open_sockets_peak'], '.0f')} "
                f"({_num(figures['open_sockets_host_peaks'], '.0f')})",
                f"{figures['max_in_flight']}/{PER_HOST_LIMIT}",
                _num(figures["crawl_time"], ".1f", " s"),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(HEADER))]
    lines = [
        "Soak (medians; gaps and pages never served: the worst crawl; open sockets: "
        "sampled peak (sum of host peaks)):"
    ]
    for row in rows:
        lines.append(
            "  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        )
    return lines


def target_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    addon = summary.get(ADDON)
    stock = summary.get("scrapy")
    if addon is None:
        return [f"Targets: {ADDON} not run"]

    def beside(key: str, fmt: str, suffix: str = "") -> str:
        if stock is None or stock[key] is None:
            return ""
        return f" (stock Scrapy: {stock[key]:{fmt}}{suffix})"

    def verdict(passed: bool | None) -> str:
        return "n/a" if passed is None else "PASS" if passed else "FAIL"

    gap = addon["longest_gap"]
    ratio = addon["connections_x_scrapy"]
    sockets = addon["open_sockets_peak"]
    stock_sockets = None if stock is None else stock["open_sockets_peak"]
    return [
        f"Targets for {ADDON}:",
        f"  no gap of {GAP_TARGET:g} s or more while the healthy hosts have work: longest "
        f"{_num(gap, suffix=' s')} {verdict(None if gap is None else gap < GAP_TARGET)}"
        + beside("longest_gap", ".2f", " s"),
        f"  every page fetched: {addon['never_served']} of {addon['pages']} never served "
        f"{verdict(addon['never_served'] == 0 and not addon['failed'])}"
        + beside("never_served", "d"),
        f"  connections at most {CONNECTIONS_TARGET:g}x stock Scrapy's: "
        f"{_num(addon['connections'], '.0f')}, {_num(ratio, suffix='x')} "
        f"{verdict(None if ratio is None else ratio <= CONNECTIONS_TARGET)}"
        + beside("connections", ".0f"),
        f"  open sockets bounded (peak at most stock Scrapy's): {_num(sockets, '.0f')} "
        f"{verdict(None if stock_sockets is None else sockets <= stock_sockets)}"
        + beside("open_sockets_peak", ".0f"),
    ]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--configs", type=configs_argument, default=["scrapy", ADDON])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK.healthy} healthy, {QUICK.slow} slow, {QUICK.throttling} throttling, "
        f"{QUICK.hanging} hanging hosts, {QUICK.pages} pages, shorter latencies and timeout",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE.healthy + SMOKE.slow + SMOKE.throttling + SMOKE.hanging} hosts, "
        f"{SMOKE.pages} pages: checks that the benchmark runs, measures little",
    )
    parser.add_argument("--pages", type=int, help=f"start URLs per host (default {FULL.pages})")
    parser.add_argument(
        "--timeout", type=float, help=f"DOWNLOAD_TIMEOUT (default {FULL.timeout:g})"
    )
    parser.add_argument(
        "--time-limit", type=float, default=600.0, help="seconds a crawl may take (%(default)g)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    base = SMOKE if args.smoke else QUICK if args.quick else FULL
    args.size = Size(
        **{
            **asdict(base),
            "pages": base.pages if args.pages is None else args.pages,
            "timeout": base.timeout if args.timeout is None else args.timeout,
        }
    )
    if min(args.size.pages, args.rounds) < 1:
        parser.error("--pages and --rounds must be at least 1")
    if args.size.timeout <= 0 or args.time_limit <= 0:
        parser.error("--timeout and --time-limit must be > 0")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    size: Size = args.size
    meta = run_meta("bench.soak", argv)
    configs, unavailable = runnable(args.configs)
    for name, reason in unavailable.items():
        print(f"{name}: n/a: {reason}")
    by_group = size.specs()
    groups: dict[str, range] = {}
    for name in GROUPS:
        start = sum(len(indexes) for indexes in groups.values())
        groups[name] = range(start, start + len(by_group[name]))
    specs = [spec for name in GROUPS for spec in by_group[name]]
    print(
        f"{len(specs)} hosts: {size.healthy} healthy ({LATENCY * 1000:g} ms), {size.slow} slow "
        f"({size.slow_latencies[0]:g}/{size.slow_latencies[1]:g} s), {size.throttling} "
        f"throttling (429 + Retry-After {size.retry_after} above {THROTTLE_ABOVE} in flight), "
        f"{size.hanging} hanging on every {1 / HANG_RATE:g}th request; {size.pages} pages each, "
        f"DOWNLOAD_TIMEOUT {size.timeout:g}, CONCURRENT_REQUESTS "
        f"{SETTINGS['CONCURRENT_REQUESTS']}, limit {PER_HOST_LIMIT}; {args.rounds} round(s) of "
        f"{', '.join(configs)}; commit {meta['commit']}",
        flush=True,
    )
    runs: list[Crawl] = []
    with LocalHosts(specs, process=True, start_timeout=60.0) as hosts:
        for round_, config, _ in crawl_order(configs, (MODE,), args.rounds):
            run = crawl(hosts, size, groups, config, round_=round_, time_limit=args.time_limit)
            runs.append(run)
            print(describe(run), flush=True)
    summary = summarise(configs, runs)
    lines = ["", *summary_lines(summary), *target_lines(summary)]
    print("\n".join(lines))
    path = write_results(
        args.out,
        "soak",
        {
            **meta,
            "size": asdict(size),
            "groups": {name: [indexes.start, indexes.stop] for name, indexes in groups.items()},
            "settings": SETTINGS,
            "unavailable": unavailable,
            "runs": [asdict(run) for run in runs],
            "summary": summary,
            "report": lines[1:],
        },
    )
    print(f"Results: {path}")
    return 0 if configs and all(run.error is None for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
