"""The printed tables, the targets, the JSON file and the chart."""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.runner import Run, Summary
from bench.scenarios import ADDON, ADDON_WITHOUT_GC, CONFIGS, SCENARIOS, Scenario

logger = logging.getLogger(__name__)

MICRO_HOSTS_FLAT = (1, 100_000)
MICRO_DAPQ_AT = 10_000


def _num(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def scenario_lines(scenarios: Sequence[Scenario], budget: int) -> list[str]:
    lines = ["Scenarios (bound = least time to the budget the per-host limits allow):"]
    for scenario in scenarios:
        bound, per_host = scenario.bound(budget), scenario.per_host_bound(budget)
        extra = (
            ""
            if abs(bound - per_host) < 1e-9
            else f" (per-host limits alone: {per_host:.2f} s; "
            f"CONCURRENT_REQUESTS={scenario.concurrent_requests} binds)"
        )
        lines.append(f"  {scenario.name:<4} {scenario.title}: bound {bound:.2f} s{extra}")
    return lines


HEADER = (
    "scenario",
    "config",
    "time s",
    "x bound",
    "x scrapy",
    "max in flight/limit (hosts over)",
    "429s",
    "in R-A window",
    "conns/100",
    "CPU s",
    "CPU busy",
    "peak MB",
)


def table_lines(summaries: Sequence[Summary]) -> list[str]:
    rows: list[tuple[str, ...]] = [HEADER]
    notes: list[str] = []
    for s in summaries:
        if s.status != "ok":
            rows.append((s.scenario, s.config, s.status, *("",) * (len(HEADER) - 3)))
            notes.append(f"  {s.scenario} {s.config}: {s.status}: {s.reason}")
            continue
        if s.reason:
            notes.append(f"  {s.scenario} {s.config}: {s.reason}")
        if s.capped_runs:
            notes.append(
                f"  {s.scenario} {s.config}: {s.capped_runs} of {s.runs} run(s) stopped "
                "by the time limit before the budget"
            )
        more = ">" if s.at_least else ""
        rows.append(
            (
                s.scenario,
                s.config,
                more + _num(s.time_to_budget),
                more + _num(s.ratio_bound, suffix="x"),
                (more if s.ratio_scrapy is not None else "") + _num(s.ratio_scrapy, suffix="x"),
                f"{s.worst_in_flight}/{s.limit} ({s.violations})",
                _num(s.status_429, ".0f"),
                _num(s.in_retry_after_window, ".0f"),
                _num(s.connections_per_100, ".0f"),
                _num(s.cpu, ".1f"),
                _num(None if s.cpu_busy is None else 100 * s.cpu_busy, ".0f", "%"),
                _num(s.peak_mb, ".0f"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = []
    for index, row in enumerate(rows):
        cells = [
            cell.ljust(width) if column < 2 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines.extend(LEGEND)
    if notes:
        lines.append("Notes:")
        lines.extend(notes)
    return lines


LEGEND = (
    "Medians over the runs. time: from the first request reaching the downloader to the",
    "budget-th response reaching the engine (crawler clock); x bound: over the scenario's",
    "bound; x scrapy: over Scrapy defaults in the same run; '>': stopped at the time limit.",
    "max in flight/limit: the worst host at the server (hosts over their limit in the worst",
    "run); 429s, in R-A window (requests arriving inside a Retry-After the host had sent):",
    "counted at the hosts; conns/100: connections the hosts accepted per 100 requests",
    "(near 0: keep-alive connections reused; 100: one per request); CPU s, peak MB: the",
    "crawl process, start-up included; CPU busy: its CPU time over the measured time (near",
    "100 %: bound by its own CPU, not the hosts).",
)


def micro_lines(micro: dict[str, Any]) -> list[str]:
    if "error" in micro:
        return [f"S7 next_request cost: failed: {micro['error']}"]
    costs: dict[str, dict[str, float]] = micro["ns_per_pop"]
    counts = sorted({int(hosts) for series in costs.values() for hosts in series})
    width = max(len("hosts"), *(len(name) for name in costs)) + 2
    lines = ["S7 next_request cost, µs per pop (median of rounds):"]
    lines.append("  " + "hosts".ljust(width) + "".join(f"{n:>12,}" for n in counts))
    for name, series in costs.items():
        cells = "".join(
            f"{series[str(n)] / 1000:>12.2f}" if str(n) in series else f"{'-':>12}" for n in counts
        )
        lines.append(f"  {name:<{width}}{cells}")
    for name, reason in micro.get("unavailable", {}).items():
        lines.append(f"  {name}: n/a: {reason}")
    memory: dict[str, dict[str, float]] = micro.get("bytes_per_queued", {})
    if memory:
        counts = sorted({int(hosts) for series in memory.values() for hosts in series})
        lines.append("Memory per queued request, bytes (100,000 requests over the hosts):")
        lines.append("  " + "hosts".ljust(width) + "".join(f"{n:>12,}" for n in counts))
        for name, series in memory.items():
            cells = "".join(
                f"{series[str(n)]:>12.1f}" if str(n) in series else f"{'-':>12}" for n in counts
            )
            lines.append(f"  {name:<{width}}{cells}")
    return lines


@dataclass
class Target:
    """One of the suite's targets (speed, politeness, cost), as measured in this run."""

    target: str
    measured: str
    passed: bool | None  # None: not measured in this run


def _find(summaries: Sequence[Summary], scenario: str, config: str) -> Summary | None:
    for s in summaries:
        if s.scenario == scenario and s.config == config and s.status == "ok":
            return s
    return None


def _busy(*summaries: Summary) -> str:
    """Return the ", CPU-bound" remark for a target whose crawls kept their CPU busy.

    The ", CPU-bound" remark for a target whose crawls kept their CPU busy for at least
    90 % of the measured time (their speed is then their CPU cost per page), else "".
    """
    busy = [s.cpu_busy for s in summaries if s.cpu_busy is not None]
    return f", CPU-bound ({100 * min(busy):.0f}% busy)" if busy and min(busy) >= 0.9 else ""


def paired_changes(a: Summary, b: Summary) -> list[float]:
    """Return ``b``'s fast-host rate over ``a``'s, minus 1, for every round.

    ``b``'s fast-host rate over ``a``'s, minus 1, for every round in which
    both reached the budget. The two scenarios run back to back in each round
    (see :func:`bench.runner.crawl_order`), so a round's ratio leaves out the
    machine's drift between rounds, which a ratio of medians takes in.
    """
    return [
        b.fast_rates[round_] / a.fast_rates[round_] - 1
        for round_ in sorted(a.fast_rates.keys() & b.fast_rates.keys())
        if a.fast_rates[round_] > 0
    ]


def _slow_host_target(a: Summary | None, b: Summary | None, config: str) -> Target:
    """Measure the change in the fast hosts' pages/s from S1 to S1b.

    The median over rounds of the change in the fast hosts' pages/s when the 200 ms host becomes a 2
    s host.
    """
    name = f"S1 -> S1b {config}: fast hosts' pages/s change < 10 %"
    changes = [] if a is None or b is None else paired_changes(a, b)
    if a is None or b is None or not changes or not a.fast_rate or b.fast_rate is None:
        return Target(name, "not run", None)
    change = statistics.median(changes)
    rounds = ", ".join(f"{value:+.0%}" for value in changes)
    return Target(
        name,
        f"median of {len(changes)} paired rounds {change:+.1%} (rounds {rounds}; "
        f"medians {a.fast_rate:.0f} -> {b.fast_rate:.0f} pages/s)" + _busy(a, b),
        abs(change) < 0.10,
    )


def targets(
    summaries: Sequence[Summary], micro: dict[str, Any] | None, budget: int
) -> list[Target]:
    """Every target as measured in this run.

    Politeness at the hosts, the fast hosts' pages/s from S1 to S1b, speed against Scrapy and the
    bound, S7's cost per pop and the memory per queued request.
    """
    found: list[Target] = []
    hq_configs = ("hq-scheduler", "hq-full")

    for config in hq_configs:
        s = _find(summaries, "S1", config)
        handler = "HTTP11 handler" if config == "hq-scheduler" else "its aiohttp handler"
        name = f"S1 {config}: no host above its limit at the server ({handler})"
        found.append(
            Target(name, "not run", None)
            if s is None
            else Target(
                name,
                f"max {s.worst_in_flight}/{s.limit}, {s.violations} host(s) over",
                s.violations == 0,
            )
        )

    for config in hq_configs:
        found.append(
            _slow_host_target(
                _find(summaries, "S1", config), _find(summaries, "S1b", config), config
            )
        )

    base = _find(summaries, "S3", "scrapy")
    for config in hq_configs:
        s = _find(summaries, "S3", config)
        name = f"S3 {config}: >= 3x faster than Scrapy defaults"
        if s is None or base is None or not s.time_to_budget or not base.time_to_budget:
            found.append(Target(name, "not run", None))
        elif s.at_least:
            found.append(Target(name, f"{config} hit the time limit", False))
        else:
            speedup = base.time_to_budget / s.time_to_budget
            # A capped Scrapy run makes the speed-up a lower bound.
            more = ">" if base.at_least else ""
            found.append(
                Target(
                    name,
                    f"{more}{base.time_to_budget:.2f} s / {s.time_to_budget:.2f} s "
                    f"= {more}{speedup:.2f}x" + _busy(s),
                    True if speedup >= 3 else None if base.at_least else False,
                )
            )

    bound = SCENARIOS["S2"].per_host_bound(budget)
    aiohttp = _find(summaries, "S2", "scrapy-aiohttp")
    for config in hq_configs:
        s = _find(summaries, "S2", config)
        name = f"S2 {config}: within 1.15x of the bound {bound:.2f} s"
        if s is None or s.time_to_budget is None:
            found.append(Target(name, "not run", None))
            found.append(Target(f"S2 {config}: no slower than scrapy-aiohttp", "not run", None))
            continue
        ratio = s.time_to_budget / bound
        more = ">" if s.at_least else ""
        found.append(
            Target(
                name,
                f"{more}{s.time_to_budget:.2f} s = {more}{ratio:.2f}x",
                ratio <= 1.15 and not s.at_least,
            )
        )
        name = f"S2 {config}: no slower than scrapy-aiohttp"
        if aiohttp is None or aiohttp.time_to_budget is None:
            found.append(Target(name, "scrapy-aiohttp not run", None))
        else:
            found.append(
                Target(
                    name,
                    f"{more}{s.time_to_budget:.2f} s vs "
                    f"{'>' if aiohttp.at_least else ''}{aiohttp.time_to_budget:.2f} s",
                    not s.at_least and s.time_to_budget <= aiohttp.time_to_budget,
                )
            )

    costs: dict[str, dict[str, float]] = (micro or {}).get("ns_per_pop", {})
    scheduler = costs.get("scheduler", {})
    low, high = (str(n) for n in MICRO_HOSTS_FLAT)
    # The pure frontier's row says whether any growth is the ring's or the
    # scheduler's bookkeeping around it.
    for label, series in (
        ("scheduler next_request", scheduler),
        ("frontier pop", costs.get("frontier", {})),
    ):
        name = f"S7 {label}: flat within 2x from 1 to 100,000 hosts"
        if low in series and high in series:
            values = list(series.values())
            spread = max(values) / min(values)
            found.append(
                Target(
                    name,
                    f"{min(values) / 1000:.1f}-{max(values) / 1000:.1f} µs, max/min {spread:.2f}x",
                    spread <= 2,
                )
            )
        else:
            found.append(Target(name, "not run", None))
    at = str(MICRO_DAPQ_AT)
    dapq = costs.get("dapq", {})
    name = f"S7 scheduler next_request: >= 50x cheaper than DAPQ at {MICRO_DAPQ_AT:,} hosts"
    if at in scheduler and at in dapq:
        factor = dapq[at] / scheduler[at]
        found.append(
            Target(
                name,
                f"{dapq[at] / 1000:.1f} µs / {scheduler[at] / 1000:.1f} µs = {factor:.0f}x",
                factor >= 50,
            )
        )
    else:
        found.append(Target(name, "not run", None))

    memory: dict[str, dict[str, float]] = (micro or {}).get("bytes_per_queued", {})
    ours, stock = memory.get("scheduler", {}), memory.get("scrapy-scheduler", {})
    name = "Memory per queued request <= Scrapy's memory queue, 1 to 100,000 hosts"
    shared = [hosts for hosts in ours if hosts in stock]
    if shared:
        ratios = [ours[hosts] / stock[hosts] for hosts in shared]
        found.append(
            Target(
                name,
                f"{min(ratios):.2f}-{max(ratios):.2f}x Scrapy's",
                max(ratios) <= 1,
            )
        )
    else:
        found.append(Target(name, "not run", None))
    return found


def reference_lines(summaries: Sequence[Summary]) -> list[str]:
    """Say what S3r, S3 without its delayed hosts, says about S3's figures.

    The speed-up over Scrapy's defaults that the delayed hosts' whole cost is worth on the same
    download handler, and what they cost the scheduler alone. Empty unless S3 and S3r ran with
    Scrapy's defaults.
    """
    base, plain = _find(summaries, "S3", "scrapy"), _find(summaries, "S3r", "scrapy")
    if base is None or plain is None or not base.time_to_budget or not plain.time_to_budget:
        return []
    more = ">" if base.at_least else ""
    lines = [
        "S3r (S3's four 50 ms hosts alone) against S3:",
        f"  Scrapy defaults took {plain.time_to_budget:.2f} s without the delayed hosts and "
        f"{more}{base.time_to_budget:.2f} s with them: taking away the whole cost of the "
        f"delayed hosts makes Scrapy {more}{base.time_to_budget / plain.time_to_budget:.2f}x "
        "faster on its HTTP11 handler",
    ]
    ours = _find(summaries, "S3", "hq-scheduler")
    ours_plain = _find(summaries, "S3r", "hq-scheduler")
    if ours and ours_plain and ours.time_to_budget and ours_plain.time_to_budget:
        lines.append(
            f"  hq-scheduler took {ours_plain.time_to_budget:.2f} s without them and "
            f"{ours.time_to_budget:.2f} s with them "
            f"({ours.time_to_budget / ours_plain.time_to_budget - 1:+.1%})"
        )
    return lines


def gc_lines(summaries: Sequence[Summary]) -> list[str]:
    """Say what the GcTuning extension is worth.

    The add-on with it against the add-on without it, in every scenario that ran both. Empty if none
    did.
    """
    lines = []
    for with_gc in summaries:
        if with_gc.config != ADDON or with_gc.status != "ok" or not with_gc.time_to_budget:
            continue
        without = _find(summaries, with_gc.scenario, ADDON_WITHOUT_GC)
        if without is None or not without.time_to_budget:
            continue
        more, more_without = (">" if s.at_least else "" for s in (with_gc, without))
        cpu = (
            f"; CPU {with_gc.cpu:.1f} s with, {without.cpu:.1f} s without"
            if with_gc.cpu is not None and without.cpu is not None
            else ""
        )
        lines.append(
            f"  {with_gc.scenario:<4} {more}{with_gc.time_to_budget:.2f} s with, "
            f"{more_without}{without.time_to_budget:.2f} s without "
            f"({with_gc.time_to_budget / without.time_to_budget - 1:+.1%}){cpu}"
        )
    if not lines:
        return []
    return [f"GC tuning: {ADDON} (with GcTuning) against {ADDON_WITHOUT_GC} (without):", *lines]


def target_lines(targets: Sequence[Target]) -> list[str]:
    width = max(len(t.target) for t in targets)
    mwidth = max(len(t.measured) for t in targets)
    lines = ["Targets:"]
    for t in targets:
        verdict = "n/a" if t.passed is None else "PASS" if t.passed else "FAIL"
        lines.append(f"  {t.target:<{width}}  {t.measured:<{mwidth}}  {verdict}")
    return lines


def probe_lines(probes: Sequence[tuple[str, float]]) -> list[str]:
    """Report the machine's speed through the run, and warn when it drifted."""
    times = [ms for _, ms in probes]
    lines = [
        "CPU probe (ms for a fixed piece of interpreter work; before each scenario): "
        + ", ".join(f"{label} {ms:.1f}" for label, ms in probes)
    ]
    if times and max(times) > 1.2 * min(times):
        lines.append(
            f"  The machine's speed changed by up to {max(times) / min(times):.2f}x during the "
            "run: CPU-bound crawls (CPU busy near 100 %) slowed or sped up with it, waiting "
            "ones did not, and ratios between the two moved."
        )
    return lines


def write_json(
    path: Path,
    *,
    meta: dict[str, Any],
    scenarios: Sequence[Scenario],
    budget: int,
    runs: Sequence[Run],
    summaries: Sequence[Summary],
    micro: dict[str, Any] | None,
    targets: Sequence[Target],
) -> None:
    data = {
        **meta,
        "scenarios": {
            s.name: {
                "title": s.title,
                "hosts": s.hosts,
                "budget": budget,
                "start_per_host": s.start_per_host,
                "settings": s.settings(),
                "bound": s.bound(budget),
                "per_host_bound": s.per_host_bound(budget),
            }
            for s in scenarios
        },
        "runs": [asdict(run) for run in runs],
        "summary": [asdict(summary) for summary in summaries],
        "micro": micro,
        "targets": [asdict(target) for target in targets],
    }
    path.write_text(json.dumps(data, indent=1))


def write_chart(
    path: Path, summaries: Sequence[Summary], micro: dict[str, Any] | None, budget: int
) -> bool:
    """Draw the time over the bound, and S7's cost per pop against the number of hosts.

    Time over the bound per scenario and configuration, and S7's cost per
    pop against the number of hosts. Returns False without matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no chart")
        return False

    ok = [s for s in summaries if s.status == "ok" and s.ratio_bound is not None]
    scenario_names = list(dict.fromkeys(s.scenario for s in ok))
    # One colour per configuration, in the suite's order, whatever runs.
    colours = {name: f"C{index}" for index, name in enumerate(CONFIGS)}
    costs: dict[str, dict[str, float]] = (micro or {}).get("ns_per_pop", {})
    panels = 1 + bool(costs)
    figure, axes = plt.subplots(
        1, panels, figsize=(7 + 4 * (panels - 1), 4.5), squeeze=False, width_ratios=[7, 4][:panels]
    )
    bars = axes[0][0]
    labelled: set[str] = set()
    for position, scenario in enumerate(scenario_names):
        present = sorted(
            (s for s in ok if s.scenario == scenario), key=lambda s: list(CONFIGS).index(s.config)
        )
        width = 0.8 / len(present)
        for index, s in enumerate(present):
            x = position + (index - (len(present) - 1) / 2) * width
            bars.bar(
                x,
                s.ratio_bound,
                width,
                color=colours[s.config],
                # A hatched bar stopped at the time limit: the real ratio is higher.
                hatch="//" if s.at_least else None,
                label=None if s.config in labelled else s.config,
            )
            labelled.add(s.config)
    bars.axhline(1.0, color="black", linewidth=0.8)
    bars.set_xticks(range(len(scenario_names)), scenario_names)
    bars.set_yscale("log")
    bars.set_ylabel("time to budget / politeness bound (log)")
    bars.set_title(f"Time to {budget:,} pages over the bound (lower is better)")
    handles, labels = bars.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: list(CONFIGS).index(labels[i]))
    # Head room above the tallest bar for the legend (log scale).
    bars.set_ylim(top=max((s.ratio_bound or 1.0) for s in ok) * 4 if ok else 10.0)
    bars.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        loc="upper center",
        ncol=3,
        fontsize=8,
        title="hatched: stopped at the time limit" if any(s.at_least for s in ok) else None,
        title_fontsize=7,
    )
    if costs:
        lines = axes[0][1]
        for name, series in costs.items():
            hosts = sorted(series, key=int)
            lines.plot(
                [int(n) for n in hosts], [series[n] / 1000 for n in hosts], marker="o", label=name
            )
        lines.set_xscale("log")
        lines.set_yscale("log")
        lines.set_xlabel("hosts")
        lines.set_ylabel("µs per pop (log)")
        lines.set_title("S7 next_request cost")
        lines.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
