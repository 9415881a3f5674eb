"""Healthy hosts among hosts that hang now and then: a host that hangs should slow only itself.

``--healthy`` hosts answering in 20 ms and ``--hanging`` hosts answering in
20 ms but hanging on every 20th page request (``fault=hang,fault-rate=5%``: the
host never answers, the request waits for ``DOWNLOAD_TIMEOUT``), ``--pages``
start URLs on each (interleaved across hosts, the hanging hosts spread among
the healthy ones; no link following), ``CONCURRENT_REQUESTS = 16``,
``CONCURRENT_REQUESTS_PER_DOMAIN = 4``, ``DOWNLOAD_TIMEOUT = --timeout`` and
Scrapy's other defaults. Each configuration (``--configs``) crawls the
healthy hosts alone and then all of them (mixed), back to back, each crawl in a
fresh process, for ``--rounds`` rounds (configurations rotating, alone and
mixed swapping every other round).

Measured per crawl, by the crawl process: the healthy hosts' time, from the
first request to the response to the last of their pages (the crawl stops
there, without waiting for the hanging hosts' rest); by the hosts: the most
requests any host had in flight (the limit is 4), the healthy pages answered
200 (all of them, or the crawl fell short) and the requests the hanging hosts
left hanging. Prints a line per crawl, then per configuration the medians and
the ratio mixed / alone (the median of the rounds' ratios), the target (the
add-on's healthy hosts within 1.3x their time alone) with stock Scrapy's ratio
beside it, and writes ``bench/results/hanging_hosts-<timestamp>.json``.

    python -m bench.hanging_hosts                 # 100 + 10 hosts, 60 pages: about 5 minutes
    python -m bench.hanging_hosts --quick         # 40 + 4 hosts, 30 pages, 5 s timeout
    python -m bench.hanging_hosts --configs scrapy,hq-scheduler,hq-full --rounds 3
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict, dataclass
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
from scrapy_hostqueue.testing import HostSpec, LocalHosts

logger = logging.getLogger(__name__)

TARGET = 1.3
ALONE, MIXED = "alone", "mixed"
MODES = (ALONE, MIXED)


@dataclass(frozen=True)
class Size:
    healthy: int
    hanging: int
    pages: int
    timeout: float

    @property
    def healthy_pages(self) -> int:
        return self.healthy * self.pages


FULL = Size(healthy=100, hanging=10, pages=60, timeout=30.0)
#: 30 pages, not 20: a hanging host's 20th request must come before its last
#: page, or the hang lands where the healthy hosts are finishing anyway.
QUICK = Size(healthy=40, hanging=4, pages=30, timeout=5.0)


def specs(size: Size) -> list[HostSpec]:
    """Return the specs of the healthy hosts first, then the hanging ones."""
    healthy = HostSpec(latency=LATENCY, links=0)
    hanging = HostSpec(latency=LATENCY, links=0, fault="hang", fault_rate=HANG_RATE)
    return [healthy] * size.healthy + [hanging] * size.hanging


@dataclass
class Crawl(ProcessSide):
    """One crawl, as the crawl process and the hosts saw it."""

    round: int
    config: str
    mode: str
    #: Seconds from the first request to the last healthy page's response;
    #: None if the crawl fell short (``error`` says why).
    healthy_time: float | None = None
    #: Counted by the hosts: the healthy pages answered 200, out of ``healthy_pages``.
    healthy_served: int = 0
    healthy_pages: int = 0
    max_in_flight: int = 0
    max_in_flight_healthy: int = 0
    max_in_flight_hanging: int | None = None
    hung: int = 0
    connections: int = 0

    @property
    def all_healthy_fetched(self) -> bool:
        return self.healthy_served >= self.healthy_pages


def crawl(
    hosts: LocalHosts, size: Size, config: str, mode: str, *, round_: int, time_limit: float
) -> Crawl:
    healthy = [hosts.netloc(index) for index in range(size.healthy)]
    hanging = [hosts.netloc(index) for index in range(size.healthy, len(hosts))]
    hosts.reset()
    result = run_child(
        {
            "settings": {
                **SETTINGS,
                "DOWNLOAD_TIMEOUT": size.timeout,
                **CONFIGS[config].settings,
            },
            "hosts": healthy if mode == ALONE else spread(healthy, hanging),
            "start_per_host": size.pages,
            "budget": size.healthy_pages,
            "budget_hosts": hosts.hostnames[: size.healthy],
            "time_limit": time_limit,
            "follow": False,
        },
        time_limit + 60,
    )
    # The crawl process exits at its last healthy page, dropping its hanging
    # requests: the hosts see them go a moment later.
    try:
        hosts.wait_idle(15.0)
    except TimeoutError:
        logger.warning("%s %s: hosts still busy after the crawl", config, mode)
    stats = hosts.all_stats(arrivals=False)
    run = Crawl(round_, config, mode, healthy_pages=size.healthy_pages)
    run.healthy_served = sum(host.statuses.get(200, 0) for host in stats[: size.healthy])
    run.max_in_flight_healthy = max(host.max_in_flight for host in stats[: size.healthy])
    if mode == MIXED and size.hanging:
        run.max_in_flight_hanging = max(host.max_in_flight for host in stats[size.healthy :])
    run.max_in_flight = max(run.max_in_flight_healthy, run.max_in_flight_hanging or 0)
    run.hung = sum(host.faults for host in stats)
    run.connections = sum(host.connections for host in stats)
    if not run.read_process(result):
        return run
    run.healthy_time = result["time_to_budget"]
    if run.healthy_time is None:
        run.error = (
            f"{result['budget_pages']} of {size.healthy_pages} healthy pages ({run.finish_reason})"
        )
    return run


def describe(run: Crawl) -> str:
    head = f"round {run.round + 1} {run.config:>14} {run.mode}: "
    if run.healthy_time is None:
        head += f"FAILED: {run.error}"
    else:
        head += f"healthy hosts {run.healthy_time:6.2f} s"
    hanging = "" if run.max_in_flight_hanging is None else f", hanging {run.max_in_flight_hanging}"
    return head + (
        f"; max in flight {run.max_in_flight}/{PER_HOST_LIMIT} (healthy "
        f"{run.max_in_flight_healthy}{hanging}); healthy pages fetched "
        f"{run.healthy_served}/{run.healthy_pages}; hung {run.hung}, timeouts {run.timeouts}"
    )


def summarise(configs: list[str], runs: list[Crawl]) -> dict[str, dict[str, Any]]:
    """Summarise the rounds of each configuration.

    The medians, the rounds' ratios mixed / alone and their median, the worst in flight, whether
    every healthy page was fetched every time.
    """
    summary: dict[str, dict[str, Any]] = {}
    for config in configs:
        mine = [run for run in runs if run.config == config]
        times = {
            mode: {run.round: run.healthy_time for run in mine if run.mode == mode}
            for mode in MODES
        }
        ratios = [
            mixed / alone
            for round_, mixed in sorted(times[MIXED].items())
            if mixed is not None and (alone := times[ALONE].get(round_))
        ]
        summary[config] = {
            "alone": median(list(times[ALONE].values())),
            "mixed": median(list(times[MIXED].values())),
            "ratios": ratios,
            "ratio": median(ratios),
            "failed": sum(run.healthy_time is None for run in mine),
            "max_in_flight": max((run.max_in_flight for run in mine), default=0),
            "limit": PER_HOST_LIMIT,
            "all_healthy_fetched": all(run.all_healthy_fetched for run in mine),
            "timeouts_mixed": median([run.timeouts for run in mine if run.mode == MIXED]),
        }
    return summary


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def summary_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["Healthy hosts' time (medians), alone and among the hanging hosts:"]
    for config, row in summary.items():
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        rounds = ", ".join(f"{value:.2f}" for value in row["ratios"])
        failed = f"; {row['failed']} crawl(s) fell short" if row["failed"] else ""
        lines.append(
            f"  {config:>14}: mixed / alone {ratio} (rounds: {rounds or '-'}); "
            f"alone {_seconds(row['alone'])}, mixed {_seconds(row['mixed'])}; "
            f"max in flight {row['max_in_flight']}/{row['limit']}; every healthy page "
            f"fetched: {'yes' if row['all_healthy_fetched'] else 'NO'}{failed}"
        )
    return lines


def target_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    stock = summary.get("scrapy", {}).get("ratio")
    beside = "" if stock is None else f" (stock Scrapy: {stock:.2f}x)"
    addon = summary.get(ADDON)
    if addon is None:
        return [f"Target: {ADDON} not run{beside}"]
    ratio = addon["ratio"]
    if ratio is None:
        verdict = "not measured"
    else:
        held = addon["max_in_flight"] <= addon["limit"] and addon["all_healthy_fetched"]
        verdict = f"{ratio:.2f}x " + ("PASS" if ratio <= TARGET and held else "FAIL")
    return [
        f"Target: {ADDON}'s healthy hosts within {TARGET}x their time alone, every healthy "
        f"page fetched, no host above {PER_HOST_LIMIT} in flight: {verdict}{beside}"
    ]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hanging_hosts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--configs", type=configs_argument, default=["scrapy", ADDON])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK.healthy} healthy + {QUICK.hanging} hanging hosts, {QUICK.pages} pages, "
        f"DOWNLOAD_TIMEOUT {QUICK.timeout:g}",
    )
    parser.add_argument("--healthy", type=int, help=f"healthy hosts (default {FULL.healthy})")
    parser.add_argument("--hanging", type=int, help=f"hanging hosts (default {FULL.hanging})")
    parser.add_argument("--pages", type=int, help=f"start URLs per host (default {FULL.pages})")
    parser.add_argument(
        "--timeout", type=float, help=f"DOWNLOAD_TIMEOUT (default {FULL.timeout:g})"
    )
    parser.add_argument(
        "--time-limit", type=float, default=300.0, help="seconds a crawl may take (%(default)g)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    args.size = Size(
        healthy=base.healthy if args.healthy is None else args.healthy,
        hanging=base.hanging if args.hanging is None else args.hanging,
        pages=base.pages if args.pages is None else args.pages,
        timeout=base.timeout if args.timeout is None else args.timeout,
    )
    if min(args.size.healthy, args.size.pages, args.rounds) < 1 or args.size.hanging < 0:
        parser.error("--healthy, --pages and --rounds must be at least 1, --hanging at least 0")
    if args.size.timeout <= 0 or args.time_limit <= 0:
        parser.error("--timeout and --time-limit must be > 0")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    size: Size = args.size
    meta = run_meta("bench.hanging_hosts", argv)
    configs, unavailable = runnable(args.configs)
    for name, reason in unavailable.items():
        print(f"{name}: n/a: {reason}")
    print(
        f"{size.healthy} healthy hosts ({LATENCY * 1000:g} ms) + {size.hanging} hanging on every "
        f"{1 / HANG_RATE:g}th request, {size.pages} pages each, DOWNLOAD_TIMEOUT "
        f"{size.timeout:g}, CONCURRENT_REQUESTS {SETTINGS['CONCURRENT_REQUESTS']}, limit "
        f"{PER_HOST_LIMIT}; {args.rounds} round(s) of {', '.join(configs)}; commit "
        f"{meta['commit']}",
        flush=True,
    )
    runs: list[Crawl] = []
    with LocalHosts(specs(size), process=True, start_timeout=60.0) as hosts:
        for round_, config, mode in crawl_order(configs, MODES, args.rounds):
            run = crawl(hosts, size, config, mode, round_=round_, time_limit=args.time_limit)
            runs.append(run)
            print(describe(run), flush=True)
    summary = summarise(configs, runs)
    lines = ["", *summary_lines(summary), *target_lines(summary)]
    print("\n".join(lines))
    path = write_results(
        args.out,
        "hanging_hosts",
        {
            **meta,
            "size": asdict(size),
            "settings": SETTINGS,
            "hang_rate": HANG_RATE,
            "unavailable": unavailable,
            "runs": [asdict(run) for run in runs],
            "summary": summary,
            "report": lines[1:],
        },
    )
    print(f"Results: {path}")
    return 0 if configs and all(run.healthy_time is not None for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
