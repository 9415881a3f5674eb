"""Runs the crawls of a scenario against local hosts and summarises them."""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    time_to_budget: float | None = None
    ratio_bound: float | None = None
    ratio_scrapy: float | None = None
    worst_in_flight: int | None = None
    limit: int | None = None
    violations: int | None = None
    status_429: float | None = None
    in_retry_after_window: float | None = None
    cpu: float | None = None
    peak_mb: float | None = None
    fast_rate: float | None = None
    times: list[float] = field(default_factory=list)


def child_environment() -> dict[str, str]:
    """This environment without proxy variables (aiohttp honours them; every
    request here goes to loopback), with the repository on the path."""
    env = {name: value for name, value in os.environ.items() if "proxy" not in name.lower()}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def crawl_timeout(scenario: Scenario, budget: int) -> float:
    """Generous: a configuration may be several times slower than the bound
    (AutoThrottle starts at a 5 s delay), but a stuck crawl must not eat the run."""
    return 60.0 + 10.0 * scenario.bound(budget)


def run_child(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``python -m bench.crawl_once @file``; its JSON result, or ``{"error": ...}``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(config, handle)
        path = handle.name
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bench.crawl_once", f"@{path}"],
            capture_output=True,
            text=True,
            env=child_environment(),
            cwd=ROOT,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        os.unlink(path)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return {"error": f"exit code {done.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def server_side(run: Run, stats: list[HostStats], limits: Sequence[int]) -> None:
    """Fill *run* with what the hosts counted."""
    for host, limit in zip(stats, limits, strict=True):
        run.max_in_flight[host.hostname] = host.max_in_flight
        run.violations += host.max_in_flight > limit
        run.requests += host.requests
        run.status_429 += host.statuses.get(429, 0)
        run.in_retry_after_window += host.in_retry_after_window


def run_scenario(
    scenario: Scenario,
    configs: Sequence[str],
    repeats: int,
    budget: int,
    progress: Callable[[str], None] = print,
) -> tuple[list[Run], dict[str, str]]:
    """Run every available configuration ``repeats`` times, alternating
    (A B C A B C ...), against one set of local hosts reset between crawls.

    Returns the runs and the reason each unavailable configuration was skipped.
    """
    unavailable = {
        name: reason
        for name in configs
        if (reason := unavailable_reason(CONFIGS[name])) is not None
    }
    runnable = [name for name in configs if name not in unavailable]
    limits = scenario.limits()
    fast_hosts = set(scenario.fast_hosts())
    longest_latency = max(spec.latency for spec in scenario.specs)
    runs: list[Run] = []
    timeout = crawl_timeout(scenario, budget)
    with LocalHosts(scenario.hosts, process=True, start_timeout=60.0) as hosts:
        netlocs = [hosts.netloc(index) for index in range(len(hosts))]
        for repeat in range(repeats):
            for name in runnable:
                hosts.reset()
                child = {
                    "settings": {**scenario.settings(), **CONFIGS[name].settings},
                    "hosts": netlocs,
                    "start_per_host": scenario.start_per_host,
                    "budget": budget,
                }
                result = run_child(child, timeout)
                # Requests still in flight when the crawler exited end at the
                # hosts a latency later; count them before reading the stats.
                try:
                    hosts.wait_idle(longest_latency + 10.0)
                except TimeoutError:
                    logger.warning("%s: hosts still busy after %s", scenario.name, name)
                run = Run(scenario.name, name, repeat, ok=False)
                server_side(run, hosts.all_stats(arrivals=False), limits)
                if "error" in result:
                    run.error = str(result["error"])
                else:
                    run.pages = int(result["pages"])
                    run.time_to_budget = result["time_to_budget"]
                    run.wall = result["wall"]
                    run.cpu = result["cpu"]
                    run.cpu_window = result["cpu_window"]
                    run.peak_mb = result["peak_rss_mb"]
                    run.host_pages = result["host_pages"]
                    run.ok = run.time_to_budget is not None
                    if not run.ok:
                        run.error = f"only {run.pages} pages ({result['finish_reason']})"
                    else:
                        fast = sum(n for host, n in run.host_pages.items() if host in fast_hosts)
                        run.fast_rate = fast / run.time_to_budget  # type: ignore[operator]
                runs.append(run)
                progress(describe(run))
    return runs, unavailable


def describe(run: Run) -> str:
    if not run.ok:
        return f"  {run.scenario:<4} {run.config:<20} #{run.repeat + 1}  FAILED: {run.error}"
    worst = max(run.max_in_flight.values(), default=0)
    return (
        f"  {run.scenario:<4} {run.config:<20} #{run.repeat + 1}  "
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
    unavailable: dict[str, str],
    budget: int,
) -> list[Summary]:
    bound = scenario.bound(budget)
    summaries: list[Summary] = []
    for name in configs:
        if name in unavailable:
            summaries.append(Summary(scenario.name, name, "n/a", unavailable[name]))
            continue
        mine = [run for run in runs if run.config == name]
        good = [run for run in mine if run.ok]
        if not good:
            reason = mine[0].error if mine else "not run"
            summaries.append(Summary(scenario.name, name, "failed", reason, runs=len(mine)))
            continue
        times = [run.time_to_budget for run in good if run.time_to_budget is not None]
        median_time = statistics.median(times)
        worst_run = max(good, key=lambda run: max(run.max_in_flight.values(), default=0))
        summaries.append(
            Summary(
                scenario.name,
                name,
                "ok",
                None if len(good) == len(mine) else f"{len(mine) - len(good)} run(s) failed",
                runs=len(good),
                time_to_budget=median_time,
                ratio_bound=median_time / bound,
                worst_in_flight=max(worst_run.max_in_flight.values(), default=0),
                limit=max(scenario.limits()),
                violations=max(run.violations for run in good),
                status_429=_median([run.status_429 for run in good]),
                in_retry_after_window=_median([run.in_retry_after_window for run in good]),
                cpu=_median([run.cpu for run in good]),
                peak_mb=_median([run.peak_mb for run in good]),
                fast_rate=_median([run.fast_rate for run in good]),
                times=times,
            )
        )
    base = next((s for s in summaries if s.config == "scrapy" and s.status == "ok"), None)
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
