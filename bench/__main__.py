"""``python -m bench``: every scenario side by side with stock Scrapy.

Each crawl runs in a fresh process against local hosts served by another process;
configurations alternate (A B C A B C ...) within a scenario, and S1b, which a target
compares with S1, runs interleaved with S1 (S1 A, S1b A, S1 B, S1b B, ..., then S1b
first in the next round: S1b A, S1 A, ...). Prints the scenarios'
bounds, one line per crawl, the table of medians, S7's next_request costs, the
targets and what the GC tuning extension is worth (the add-on with and without
it); writes ``bench/results/<timestamp>.json`` and ``<timestamp>.png``.

    python -m bench                          # everything, 12-18 minutes on 2 cores
    python -m bench --scenarios S1,S1b --repeats 1
    python -m bench --repeats 3 --extra-repeats 3   # three rounds of all (about 30 minutes)
    python -m bench --quick                  # one round, a smaller budget

Every scenario runs every configuration, but S3r, S3's fast hosts alone, which
runs Scrapy's defaults and the scheduler alone as a yardstick for S3 (it runs
interleaved with S3). Scrapy's defaults, the scheduler alone, the full
add-on and the add-on without its GC tuning extension (and in S2 Scrapy with
its aiohttp handler, which a target compares with there) run ``--repeats``
rounds; the other stock variants (old priority queue, AutoThrottle) run in
the first ``--extra-repeats`` rounds. S1 and S1b run those four
configurations two rounds more (unless ``--repeats 1``): the
S1 -> S1b target is the median, over the rounds, of the change between the
round's two crawls, which run back to back. A crawl stops at 5x its scenario's
bound (at least 10 s, at most ``--time-limit``) and then shows as "> limit".
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.runner import (
    ROOT,
    Run,
    Summary,
    cpu_probe,
    machine,
    run_micro,
    run_scenarios,
    summarise,
)
from bench.scenarios import (
    ALL_SCENARIOS,
    CONFIGS,
    DEFAULT_BUDGET,
    MICRO,
    MIN_TIME_LIMIT,
    SCENARIOS,
    TIME_LIMIT_FACTOR,
    Scenario,
)

DEFAULT_REPEATS = 2
DEFAULT_EXTRA_REPEATS = 1
DEFAULT_TIME_LIMIT = 30.0  # the cap; each scenario's own limit is usually lower
QUICK_BUDGET = 400
MICRO_HOSTS = (1, 1_000, 10_000, 100_000)
QUICK_MICRO_HOSTS = (1, 1_000, 10_000)


def _split(value: str, known: Any, what: str) -> list[str]:
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})"
        )
    return names


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--scenarios",
        type=lambda v: _split(v, ALL_SCENARIOS, "scenario"),
        default=list(ALL_SCENARIOS),
        help=f"comma-separated, from {','.join(ALL_SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--configs",
        type=lambda v: _split(v, CONFIGS, "configuration"),
        help=f"comma-separated, from {','.join(CONFIGS)} (default: each scenario's own)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="rounds of scrapy, hq-scheduler, hq-full, hq-full-no-gc (and scrapy-aiohttp "
        "in S2) "
        f"(default {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--extra-repeats",
        type=int,
        help="rounds of the other configurations: scrapy-pq, scrapy-autothrottle, "
        f"scrapy-aiohttp (default {DEFAULT_EXTRA_REPEATS}, at most --repeats)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT,
        help="most seconds a crawl may take before it stops short of the budget; "
        f"each scenario's limit is {TIME_LIMIT_FACTOR:g}x its bound, at least "
        f"{MIN_TIME_LIMIT:g} s (default cap %(default)g)",
    )
    parser.add_argument(
        "--budget", type=int, help="pages per crawl (default 1200, 400 with --quick)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="one repeat, a smaller budget, S7 up to 10,000 hosts"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results", help="results directory"
    )
    parser.add_argument("--no-chart", action="store_true", help="write no PNG")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else DEFAULT_REPEATS
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.extra_repeats is None:
        args.extra_repeats = min(DEFAULT_EXTRA_REPEATS, args.repeats)
    if args.extra_repeats < 0:
        parser.error("--extra-repeats must be >= 0")
    args.extra_repeats = min(args.extra_repeats, args.repeats)
    if args.time_limit <= 0:
        parser.error("--time-limit must be > 0")
    if args.budget is not None and args.budget < 1:
        parser.error("--budget must be >= 1")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    scenarios = [SCENARIOS[name] for name in args.scenarios if name != MICRO]
    meta: dict[str, Any] = {
        "timestamp": stamp,
        "command": "python -m bench " + " ".join(argv),
        "machine": machine(),
        "repeats": args.repeats,
        "extra_repeats": args.extra_repeats,
        "time_limit_cap": args.time_limit,
        # Other work on the machine skews timings: say how busy it was.
        "load_average_at_start": os.getloadavg(),
    }
    # The machine's speed, before each scenario group and at the end.
    probes: list[tuple[str, float]] = [("start", cpu_probe())]
    meta["cpu_probe_ms"] = probes
    where = meta["machine"]
    print(
        f"scrapy-hostqueue benchmark {stamp}: {where['cores']} x {where['cpu']}, "
        f"Python {where['python']}, Scrapy {where['scrapy']}, "
        f"rounds {args.repeats} (scrapy-pq, scrapy-autothrottle and outside S2 "
        f"scrapy-aiohttp: {args.extra_repeats}), "
        f"load average {os.getloadavg()[0]:.1f}, CPU probe {probes[0][1]:.1f} ms"
    )

    budget = args.budget or (QUICK_BUDGET if args.quick else DEFAULT_BUDGET)
    meta["budget"] = budget
    runs: list[Run] = []
    summaries: list[Summary] = []
    # A scenario paired with another runs interleaved with it (S1b with S1).
    groups: list[list[Scenario]] = []
    for scenario in scenarios:
        partner = next((group for group in groups if group[0].name == scenario.paired_with), None)
        if partner is not None:
            partner.append(scenario)
        else:
            groups.append([scenario])
    time_limits = {s.name: s.time_limit(budget, args.time_limit) for s in scenarios}
    meta["time_limits"] = time_limits
    for index, group in enumerate(groups):
        if index:
            probes.append((group[0].name, cpu_probe()))
        configs = args.configs or list(CONFIGS)
        if not args.extra_repeats:
            configs = [name for name in configs if any(name in s.repeated for s in group)]
        for scenario in group:
            print(
                f"{scenario.name}: {scenario.title}; budget {budget}, "
                f"bound {scenario.bound(budget):.2f} s, "
                f"time limit {time_limits[scenario.name]:.0f} s"
            )
        if len(group) > 1:
            print(f"  ({' and '.join(s.name for s in group)} run interleaved)")
        group_runs, unavailable = run_scenarios(
            group,
            configs,
            repeats=args.repeats,
            extra_repeats=args.extra_repeats,
            budget=budget,
            time_limits=time_limits,
        )
        runs.extend(group_runs)
        for scenario in group:
            for name, reason in unavailable.items():
                print(f"  {scenario.name:<4} {name:<20} n/a: {reason}")
            summaries.extend(
                summarise(
                    scenario,
                    configs,
                    [run for run in group_runs if run.scenario == scenario.name],
                    unavailable=unavailable,
                    budget=budget,
                    time_limit=time_limits[scenario.name],
                )
            )

    micro: dict[str, Any] | None = None
    if MICRO in args.scenarios:
        hosts = QUICK_MICRO_HOSTS if args.quick else MICRO_HOSTS
        print(f"{MICRO}: next_request cost at {', '.join(f'{n:,}' for n in hosts)} hosts")
        micro = run_micro(hosts, rounds=2 if args.quick else 5)

    probes.append(("end", cpu_probe()))
    targets = report.targets(summaries, micro, budget)
    print()
    lines: list[str] = report.scenario_lines(scenarios, budget) if scenarios else []
    if summaries:
        lines += ["", *report.table_lines(summaries)]
    if micro is not None:
        lines += ["", *report.micro_lines(micro)]
    lines += ["", *report.target_lines(targets)]
    reference = report.reference_lines(summaries)
    if reference:
        lines += ["", *reference]
    gc_tuning = report.gc_lines(summaries)
    if gc_tuning:
        lines += ["", *gc_tuning]
    lines += ["", *report.probe_lines(probes)]
    print("\n".join(lines))

    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"{stamp}.json"
    meta["elapsed"] = time.monotonic() - started
    meta["load_average_at_end"] = os.getloadavg()
    report.write_json(
        json_path,
        meta=meta,
        scenarios=scenarios,
        budget=budget,
        runs=runs,
        summaries=summaries,
        micro=micro,
        targets=targets,
    )
    print(f"\nResults: {json_path}")
    if not args.no_chart and (summaries or micro):
        png_path = args.out / f"{stamp}.png"
        if report.write_chart(png_path, summaries, micro, budget):
            print(f"Chart:   {png_path}")
    print(f"Elapsed: {meta['elapsed']:.0f} s, load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
