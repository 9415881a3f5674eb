"""Runs the crawls of a scenario against local hosts and summarises them."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import scrapy

from bench.scenarios import CONFIGS, Scenario, unavailable_reason
from scrapy_hostqueue.testing import HostStats, LocalHosts

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    """One crawl: what the crawler measured and what the hosts saw."""

    scenario: str
    config: str
    repeat: int
    ok: bool
    error: str | None = None
    #: Stopped by the time limit before the budget (slow, not broken).
    capped: bool = False
    finish_reason: str | None = None
    time_to_budget: float | None = None
    wall: float | None = None
    cpu: float | None = None
    cpu_window: float | None = None
    peak_mb: float | None = None
    pages: int = 0
    host_pages: dict[str, int] = field(default_factory=dict)
    max_in_flight: dict[str, int] = field(default_factory=dict)
    violations: int = 0
    requests: int = 0
    #: TCP connections the hosts accepted during the crawl.
    connections: int = 0
    status_429: int = 0
    in_retry_after_window: int = 0
    fast_rate: float | None = None


@dataclass
class Summary:
    """Medians over the successful runs of one configuration in one scenario."""

    scenario: str
    config: str
    status: str  # "ok", "n/a" or "failed"
    reason: str | None = None
    runs: int = 0
    #: Runs stopped by the time limit count as slower than any other in the
    #: median; when they decide it, ``time_to_budget`` is the time limit and
    #: ``at_least`` is set: the time (and its ratios) are lower bounds.
    capped_runs: int = 0
    at_least: bool = False
    time_to_budget: float | None = None
    ratio_bound: float | None = None
    ratio_scrapy: float | None = None
    worst_in_flight: int | None = None
    limit: int | None = None
    violations: int | None = None
    status_429: float | None = None
    in_retry_after_window: float | None = None
    #: Connections the hosts accepted per 100 requests they received: near 0,
    #: keep-alive connections were reused; 100, every request opened one.
    connections_per_100: float | None = None
    cpu: float | None = None
    #: CPU seconds of the crawl process per second of the measured window:
    #: near 1, the crawl was bound by its own CPU, not by the hosts.
    cpu_busy: float | None = None
    peak_mb: float | None = None
    fast_rate: float | None = None
    #: The fast hosts' pages/s of every run that reached the budget, by round,
    #: to compare two interleaved scenarios round by round.
    fast_rates: dict[int, float] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Describe the machine a benchmark runs on, to be stored with its results."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "scrapy": scrapy.__version__,
        "platform": platform.platform(),
    }


def cpu_probe(rounds: int = 5) -> float:
    """Milliseconds a fixed piece of interpreter work takes (the fastest of *rounds*).

    A yardstick of the machine's speed at this moment, since the speed of a shared machine drifts
    and CPU-bound crawls drift with it.
    """
    best = math.inf
    for _ in range(rounds):
        started = time.perf_counter()
        table: dict[str, int] = {}
        for index in range(100_000):
            key = f"host-{index % 512}"
            table[key] = table.get(key, 0) + index
        best = min(best, time.perf_counter() - started)
    return best * 1000


def child_environment() -> dict[str, str]:
    """Return this environment without proxy variables, with the repository on the path.

    This environment without proxy variables (aiohttp honours them; every
    request here goes to loopback), with the repository on the path.
    """
    env = {name: value for name, value in os.environ.items() if "proxy" not in name.lower()}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


#: Beyond the crawl's own time limit: start-up, and closing, which waits for the
#: requests in flight (a 2 s host).
SHUTDOWN_GRACE = 45.0


def _json_from_child(command: list[str], timeout: float) -> dict[str, Any]:
    """Run a bench child process; its last stdout line as JSON, or ``{"error": ...}``."""
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=child_environment(),
            cwd=ROOT,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return {"error": f"exit code {done.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_child(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``python -m bench.crawl_once @file``; its JSON result, or ``{"error": ...}``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(config, handle)
        path = handle.name
    try:
        return _json_from_child([sys.executable, "-m", "bench.crawl_once", f"@{path}"], timeout)
    finally:
        os.unlink(path)


def server_side(run: Run, stats: list[HostStats], limits: Sequence[int]) -> None:
    """Fill *run* with what the hosts counted."""
    for host, limit in zip(stats, limits, strict=True):
        run.max_in_flight[host.hostname] = host.max_in_flight
        run.violations += host.max_in_flight > limit
        run.requests += host.requests
        run.connections += host.connections
        run.status_429 += host.statuses.get(429, 0)
        run.in_retry_after_window += host.in_retry_after_window


def rounds_of(scenario: Scenario, config: str, repeats: int, extra_repeats: int) -> int:
    """Crawls of *config* in *scenario*.

    ``repeats`` for the configurations the scenario repeats, plus the scenario's ``extra_rounds``
    unless this is a single-round run (``--repeats 1``, ``--quick``); ``extra_repeats`` (at most
    ``repeats``) for the others; none for those it does not run.
    """
    if not scenario.runs(config):
        return 0
    if config in scenario.repeated:
        return repeats + (scenario.extra_rounds if repeats > 1 else 0)
    return min(extra_repeats, repeats)


def crawl_order(
    scenarios: Sequence[Scenario], configs: Sequence[str], *, repeats: int, extra_repeats: int
) -> list[tuple[int, str, int]]:
    """List the crawls of :func:`run_scenarios`, in order.

    ``(round, configuration, index of the scenario)``. Configurations alternate (A B C A B C ...);
    in each, the scenarios run back to back, in reverse order every other round, so that a machine
    speeding up or slowing down through the run favours neither scenario of a pair (S1 and S1b).
    """
    rounds = max(
        (
            rounds_of(scenario, name, repeats, extra_repeats)
            for scenario in scenarios
            for name in configs
        ),
        default=0,
    )
    order = []
    for repeat in range(rounds):
        indexes = range(len(scenarios))
        for name in configs:
            for index in reversed(indexes) if repeat % 2 else indexes:
                if repeat < rounds_of(scenarios[index], name, repeats, extra_repeats):
                    order.append((repeat, name, index))
    return order


def run_scenarios(
    scenarios: Sequence[Scenario],
    configs: Sequence[str],
    *,
    repeats: int,
    extra_repeats: int,
    budget: int,
    time_limits: dict[str, float],
    progress: Callable[[str], None] = print,
) -> tuple[list[Run], dict[str, str]]:
    """Run every available configuration, alternating, in each scenario.

    Run every available configuration, alternating (A B C A B C ...), in
    each scenario against its own set of local hosts, reset between crawls:
    the scenario's repeated configurations ``repeats`` times, the others
    ``extra_repeats`` times (in the first rounds). Several scenarios run
    interleaved: each configuration in each scenario, then the next one (see
    :func:`crawl_order`).

    Returns the runs and the reason each unavailable configuration was skipped.
    """
    unavailable = {
        name: reason
        for name in configs
        if (reason := unavailable_reason(CONFIGS[name])) is not None
    }
    runnable = [name for name in configs if name not in unavailable]
    runs: list[Run] = []
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(LocalHosts(scenario.hosts, process=True, start_timeout=60.0))
            for scenario in scenarios
        ]
        order = crawl_order(scenarios, runnable, repeats=repeats, extra_repeats=extra_repeats)
        for repeat, name, index in order:
            scenario = scenarios[index]
            run = crawl_scenario(
                scenario,
                name,
                repeat,
                servers[index],
                budget=budget,
                time_limit=time_limits[scenario.name],
            )
            runs.append(run)
            progress(describe(run))
    return runs, unavailable


def crawl_scenario(
    scenario: Scenario,
    name: str,
    repeat: int,
    hosts: LocalHosts,
    *,
    budget: int,
    time_limit: float,
    settings: dict[str, Any] | None = None,
) -> Run:
    """One crawl of configuration *name* in *scenario*, measured on both sides.

    *settings* go on top of the configuration's.
    """
    hosts.reset()
    child = {
        "settings": {**scenario.settings(), **CONFIGS[name].settings, **(settings or {})},
        "hosts": [hosts.netloc(index) for index in range(len(hosts))],
        "start_per_host": scenario.start_per_host,
        "budget": budget,
        "time_limit": time_limit,
    }
    result = run_child(child, time_limit + SHUTDOWN_GRACE)
    # Requests still in flight when the crawler exited end at the hosts a
    # latency later; count them before reading the stats.
    longest_latency = max(spec.latency for spec in scenario.specs)
    try:
        hosts.wait_idle(longest_latency + 10.0)
    except TimeoutError:
        logger.warning("%s: hosts still busy after %s", scenario.name, name)
    run = Run(scenario.name, name, repeat, ok=False)
    server_side(run, hosts.all_stats(arrivals=False), scenario.limits())
    if "error" in result:
        run.error = str(result["error"])
    else:
        crawler_side(run, result, set(scenario.fast_hosts()))
    return run


def crawler_side(run: Run, result: dict[str, Any], fast_hosts: set[str]) -> None:
    """Fill *run* with what the crawl process measured."""
    run.pages = int(result["pages"])
    run.time_to_budget = result["time_to_budget"]
    run.wall = result["wall"]
    run.cpu = result["cpu"]
    run.cpu_window = result["cpu_window"]
    run.peak_mb = result["peak_rss_mb"]
    run.host_pages = result["host_pages"]
    run.finish_reason = result["finish_reason"]
    if run.time_to_budget is not None:
        run.ok = True
        fast = sum(n for host, n in run.host_pages.items() if host in fast_hosts)
        run.fast_rate = fast / run.time_to_budget
    elif run.finish_reason in ("time_limit", "closespider_timeout"):
        run.capped = True
        run.error = f"time limit: {run.pages} pages in {run.wall:.0f} s"
    else:
        run.error = f"only {run.pages} pages ({run.finish_reason})"


def describe(run: Run) -> str:
    head = f"  {run.scenario:<4} {run.config:<20} #{run.repeat + 1}  "
    if not run.ok:
        return head + ("CAPPED" if run.capped else "FAILED") + f": {run.error}"
    worst = max(run.max_in_flight.values(), default=0)
    return head + (
        f"{run.time_to_budget:6.2f} s  cpu {run.cpu:5.1f} s  max in flight {worst:>2}  "
        f"429s {run.status_429:>4}  in Retry-After windows {run.in_retry_after_window}"
    )


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def summarise(
    scenario: Scenario,
    configs: Sequence[str],
    runs: Sequence[Run],
    *,
    unavailable: dict[str, str],
    budget: int,
    time_limit: float,
) -> list[Summary]:
    bound = scenario.bound(budget)
    summaries: list[Summary] = []
    for name in configs:
        if not scenario.runs(name):
            continue
        if name in unavailable:
            summaries.append(Summary(scenario.name, name, "n/a", unavailable[name]))
            continue
        mine = [run for run in runs if run.config == name]
        measured = [run for run in mine if run.ok or run.capped]
        if not measured:
            reason = mine[0].error if mine else "not run"
            summaries.append(Summary(scenario.name, name, "failed", reason, runs=len(mine)))
            continue
        good = [run for run in measured if run.ok]
        failed = len(mine) - len(measured)
        times = [run.time_to_budget for run in good if run.time_to_budget is not None]
        median_time = statistics.median([*times, *(math.inf for run in measured if run.capped)])
        worst_in_flight = max(max(run.max_in_flight.values(), default=0) for run in measured)
        summary = Summary(
            scenario.name,
            name,
            "ok",
            f"{failed} run(s) failed: {mine[0].error}" if failed else None,
            runs=len(measured),
            capped_runs=len(measured) - len(good),
            worst_in_flight=worst_in_flight,
            limit=max(scenario.limits()),
            violations=max(run.violations for run in measured),
            status_429=_median([run.status_429 for run in measured]),
            in_retry_after_window=_median([run.in_retry_after_window for run in measured]),
            connections_per_100=_median(
                [100 * run.connections / run.requests for run in measured if run.requests]
            ),
            cpu=_median([run.cpu for run in measured]),
            cpu_busy=_median(
                [
                    run.cpu_window / run.time_to_budget
                    for run in good
                    if run.cpu_window is not None and run.time_to_budget
                ]
            ),
            peak_mb=_median([run.peak_mb for run in measured]),
            fast_rate=_median([run.fast_rate for run in good]),
            fast_rates={run.repeat: run.fast_rate for run in good if run.fast_rate is not None},
            times=times,
        )
        if not math.isfinite(median_time):
            median_time = time_limit
            summary.at_least = True
        summary.time_to_budget = median_time
        summary.ratio_bound = median_time / bound
        summaries.append(summary)
    base = next(
        (s for s in summaries if s.config == "scrapy" and s.status == "ok" and not s.at_least),
        None,
    )
    if base is not None and base.time_to_budget:
        for summary in summaries:
            if summary.time_to_budget is not None:
                summary.ratio_scrapy = summary.time_to_budget / base.time_to_budget
    return summaries


def run_micro(host_counts: Sequence[int], rounds: int, timeout: float = 600.0) -> dict[str, Any]:
    """S7 in its own process (``python -m bench.micro``)."""
    command = [
        sys.executable,
        "-m",
        "bench.micro",
        "--hosts",
        ",".join(map(str, host_counts)),
        "--rounds",
        str(rounds),
    ]
    return _json_from_child(command, timeout)
