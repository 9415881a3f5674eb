"""Sites among hosts that never answer: how long the sites take.

``--sites`` local hosts answering in 20 ms and ``--dead`` hosts that accept
connections and never answer, each with ``--per-host`` start URLs
(interleaved), Scrapy's default concurrency (16, 8 per domain) and
``DOWNLOAD_TIMEOUT = 3``. A crawl ends at the sites' ``--budget``-th page
(the dead hosts give none). Each configuration (``--configs``, default stock
Scrapy, the scheduler alone and the add-on) runs ``--rounds`` times, in a
fresh process, in rotating order. Prints per crawl the seconds from the first
request to the budget-th page and the most requests a dead host had in flight
at once (counted at the host), then the medians.

    python -m bench.dead_hosts                 # about a minute
    python -m bench.dead_hosts --dead 50 --per-host 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from bench.runner import run_child
from bench.scenarios import CONFIGS
from scrapy_hostqueue.testing import HostSpec, LocalHosts

TIME_LIMIT = 60.0
SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    "DOWNLOAD_TIMEOUT": 3,
}


def crawl(hosts: LocalHosts, config: str, per_host: int, budget: int) -> dict[str, Any]:
    hosts.reset()
    return run_child(
        {
            "settings": {**SETTINGS, **CONFIGS[config].settings},
            "hosts": [hosts.netloc(index) for index in range(len(hosts))],
            "start_per_host": per_host,
            "budget": budget,
            "time_limit": TIME_LIMIT,
            "follow": False,
        },
        TIME_LIMIT + 60,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dead_hosts", description=__doc__)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--dead", type=int, default=4)
    parser.add_argument("--per-host", type=int, default=300, help="start URLs per host")
    parser.add_argument("--budget", type=int, default=1200, help="site pages per crawl")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", default="scrapy,hq-scheduler,hq-full")
    args = parser.parse_args(argv)
    configs = args.configs.split(",")
    unknown = [name for name in configs if name not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}; from {', '.join(CONFIGS)}")
    if min(args.sites, args.per_host, args.budget, args.rounds) < 1 or args.dead < 0:
        parser.error(
            "--sites, --per-host, --budget and --rounds must be at least 1, --dead at least 0"
        )
    if args.budget > args.sites * args.per_host:
        parser.error("--budget is more pages than the sites have")
    specs = [HostSpec(latency=0.02, links=0)] * args.sites + [HostSpec(fault="hang")] * args.dead
    times: dict[str, list[float]] = {name: [] for name in configs}
    with LocalHosts(specs, process=True, start_timeout=60) as hosts:
        for round_ in range(args.rounds):
            shift = round_ % len(configs)
            for config in configs[shift:] + configs[:shift]:
                result = crawl(hosts, config, args.per_host, args.budget)
                hosts.wait_idle(15.0)
                dead = hosts.all_stats(arrivals=False)[args.sites :]
                most = max((host.max_in_flight for host in dead), default=0)
                elapsed = result.get("time_to_budget")
                if elapsed is None:
                    print(f"round {round_ + 1} {config}: no result: {result}", flush=True)
                    continue
                times[config].append(elapsed)
                print(
                    f"round {round_ + 1} {config:>12}: {args.budget} site pages in "
                    f"{elapsed:.2f} s; a dead host had at most {most} in flight",
                    flush=True,
                )
    for config in configs:
        if times[config]:
            print(f"median {config:>12}: {statistics.median(times[config]):.2f} s")
    return 0 if all(times.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
