"""Many start URLs: the add-on with and without ``StartRequestsMiddleware``.

S6's hosts (500 local hosts answering in 100 ms, limit 4) with ``--per-host``
start URLs each (40 by default: 20,000) and a budget of ``--budget`` pages
(1,200). The add-on's configuration runs with its start middleware and with
it disabled (``SPIDER_MIDDLEWARES = {...: None}``), in alternating order,
``--rounds`` times, each crawl in a fresh process. Prints per crawl the
seconds from the first request to the first response and to the budget-th
response, then the medians and the median of the per-round ratios
(without / with).

    python -m bench.start_stall             # about a minute
    python -m bench.start_stall --rounds 5 --per-host 100
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from bench.runner import run_child
from bench.scenarios import CONFIGS, SCENARIOS
from scrapy_hostqueue.testing import LocalHosts

START_MIDDLEWARE = "scrapy_hostqueue.StartRequestsMiddleware"
VARIANTS: dict[str, dict[str, Any]] = {
    "with": {},
    "without": {"SPIDER_MIDDLEWARES": {START_MIDDLEWARE: None}},
}
TIME_LIMIT = 120.0


def crawl(hosts: LocalHosts, per_host: int, budget: int, extra: dict[str, Any]) -> dict[str, Any]:
    scenario = SCENARIOS["S6"]
    hosts.reset()
    result = run_child(
        {
            "settings": {**scenario.settings(), **CONFIGS["hq-full"].settings, **extra},
            "hosts": [hosts.netloc(index) for index in range(len(hosts))],
            "start_per_host": per_host,
            "budget": budget,
            "time_limit": TIME_LIMIT,
        },
        TIME_LIMIT + 60,
    )
    hosts.wait_idle(15.0)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.start_stall", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-host", type=int, default=40, help="start URLs per host")
    parser.add_argument("--budget", type=int, default=1200, help="pages per crawl")
    args = parser.parse_args(argv)
    if min(args.rounds, args.per_host, args.budget) < 1:
        parser.error("--rounds, --per-host and --budget must be at least 1")
    budget = args.budget
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    firsts: dict[str, list[float]] = {name: [] for name in VARIANTS}
    ratios: list[float] = []
    with LocalHosts(SCENARIOS["S6"].hosts, process=True, start_timeout=60) as hosts:
        for round_ in range(args.rounds):
            names = list(VARIANTS)
            if round_ % 2:
                names.reverse()
            this_round: dict[str, float] = {}
            for name in names:
                result = crawl(hosts, args.per_host, budget, VARIANTS[name])
                if "error" in result or result.get("time_to_budget") is None:
                    print(f"round {round_ + 1} {name}: no result: {result}", flush=True)
                    continue
                this_round[name] = result["time_to_budget"]
                times[name].append(result["time_to_budget"])
                firsts[name].append(result["first_response"])
                print(
                    f"round {round_ + 1} {name:>7}: first response "
                    f"{result['first_response']:.3f} s, {budget} pages "
                    f"{result['time_to_budget']:.2f} s",
                    flush=True,
                )
            if len(this_round) == len(VARIANTS):
                ratios.append(this_round["without"] / this_round["with"])
    if not ratios:
        print("no complete round", flush=True)
        return 1
    for name in VARIANTS:
        print(
            f"median {name:>7}: first response {statistics.median(firsts[name]):.3f} s, "
            f"{budget} pages {statistics.median(times[name]):.2f} s"
        )
    print(
        f"time to {budget} pages, without / with: median {statistics.median(ratios):.2f}x "
        f"({', '.join(f'{ratio:.2f}' for ratio in ratios)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
