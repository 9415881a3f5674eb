"""What the standalone scenarios (``bench.hanging_hosts``, ``bench.soak``) share.

The choice of configurations, the crawl order, the run's description and its JSON file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.runner import ROOT, cpu_probe, machine
from bench.scenarios import CONFIGS, unavailable_reason

RESULTS = ROOT / "bench" / "results"


#: The crawl both scenarios run: healthy hosts answer in LATENCY seconds,
#: hanging ones never answer one page request in 1 / HANG_RATE.
LATENCY = 0.02
HANG_RATE = 0.05
PER_HOST_LIMIT = 4
SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST_LIMIT,
}


@dataclass(kw_only=True)
class ProcessSide:
    """What a standalone scenario's crawl process reports of one crawl.

    A base of the scenarios' records of a crawl, which add what the hosts saw.
    """

    error: str | None = None
    finish_reason: str | None = None
    wall: float | None = None
    cpu: float | None = None
    responses: int = 0
    timeouts: int = 0
    retries: int = 0

    def read_process(self, result: dict[str, Any]) -> bool:
        """Fill in what the crawl process reported in *result*.

        False when it reported an error instead (kept in ``error``).
        """
        if "error" in result:
            self.error = str(result["error"])
            return False
        self.finish_reason = result["finish_reason"]
        self.wall = result["wall"]
        self.cpu = result["cpu"]
        self.responses = result["pages"]
        self.timeouts = result["timeouts"]
        self.retries = result["retries"]
        return True


def configs_argument(value: str) -> list[str]:
    """``--configs``: comma-separated configuration names, each known."""
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in names if name not in CONFIGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown configuration(s) {', '.join(unknown) or '(none given)'}; "
            f"from {', '.join(CONFIGS)}"
        )
    return names


def runnable(configs: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Return the configurations that can run here, and why each other one cannot."""
    unavailable = {
        name: reason
        for name in configs
        if (reason := unavailable_reason(CONFIGS[name])) is not None
    }
    return [name for name in configs if name not in unavailable], unavailable


def crawl_order(
    configs: Sequence[str], modes: Sequence[str], rounds: int
) -> list[tuple[int, str, str]]:
    """``(round, configuration, mode)`` in crawl order.

    The configurations rotate from round to round (A B, B A, ...), and each one's modes run back to
    back, in reverse order every other round, so that the machine's drift favours neither a
    configuration nor a mode.
    """
    order = []
    for round_ in range(rounds):
        shift = round_ % len(configs)
        for config in [*configs[shift:], *configs[:shift]]:
            for mode in reversed(modes) if round_ % 2 else modes:
                order.append((round_, config, mode))
    return order


def spread(hosts: Sequence[str], others: Sequence[str]) -> list[str]:
    """*hosts* with *others* spread evenly among them.

    The order of the hosts in each round of start URLs.
    """
    order: list[str] = []
    step = len(hosts) / len(others) if others else 0.0
    left = list(others)
    for index, host in enumerate(hosts):
        order.append(host)
        if left and index + 1 >= step * (len(others) - len(left) + 1):
            order.append(left.pop(0))
    return order + left


def median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except OSError:
        return None
    return done.stdout.strip() or None


def run_meta(prog: str, argv: Sequence[str]) -> dict[str, Any]:
    """Describe the run and where it ran, to be stored with its results."""
    return {
        "timestamp": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "command": " ".join([f"python -m {prog}", *argv]),
        "commit": _commit(),
        "machine": machine(),
        # Other work on the machine skews timings: say how busy it was.
        "load_average_at_start": os.getloadavg(),
        "cpu_probe_ms_at_start": cpu_probe(),
    }


def write_results(out: Path, name: str, data: dict[str, Any]) -> Path:
    """``<out>/<name>-<timestamp>.json``, with the load at the end added."""
    data["load_average_at_end"] = os.getloadavg()
    data["cpu_probe_ms_at_end"] = cpu_probe()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{data['timestamp']}.json"
    path.write_text(json.dumps(data, indent=1))
    return path
