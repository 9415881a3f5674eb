"""What the live monitor costs a crawl: polled every second, or off.

Two scenarios: S1 (three 10 ms hosts and a 200 ms one, limit 4, 1,200 pages)
and a broad crawl of 1,000 hosts at 100 ms with 3 start URLs each (2,400
pages). Each runs the add-on with ``HOSTQUEUE_MONITOR = False`` ("off") and
with the monitor on and polled ("polled"): a thread of this process, not of
the crawl's, as a browser would, fetches ``/hosts.json``, a host's detail
(``?host=``) and ``/metrics`` every ``--interval`` seconds. The two run back
to back in every round, the order swapped each round. Prints every crawl's
time to its budget, and per scenario the median over the rounds of the
change from "off" to "polled" (the target: at most 2 %).

    python -m bench.monitor_cost                # 5 rounds, about 4 minutes on 2 cores
    python -m bench.monitor_cost --rounds 9 --scenarios S1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from bench.runner import SHUTDOWN_GRACE, run_child
from bench.scenarios import CONFIGS, DEFAULT_BUDGET, SCENARIOS
from scrapy_hostqueue.testing import LocalHosts, parse_specs

ADDON = "hq-full"
TIME_LIMIT = 60.0
#: name -> (hosts spec, settings, start URLs per host, budget)
SETUPS: dict[str, tuple[str, dict[str, Any], int, int]] = {
    "S1": (
        SCENARIOS["S1"].hosts,
        SCENARIOS["S1"].settings(),
        SCENARIOS["S1"].start_per_host,
        DEFAULT_BUDGET,
    ),
    "broad": ("1000x latency=100ms", SCENARIOS["S6"].settings(), 3, 2 * DEFAULT_BUDGET),
}
VARIANTS = {"off": {"HOSTQUEUE_MONITOR": False}, "polled": {"HOSTQUEUE_MONITOR": True}}


class Poller:
    """A thread that polls the monitor whose URL the crawl writes to *url_file*.

    It fetches the snapshot, the first host's detail and /metrics every
    *interval* seconds, until the server goes away or :meth:`stop`.
    """

    def __init__(self, url_file: Path, interval: float) -> None:
        self.url_file = url_file
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _url(self) -> str | None:
        while not self._stop.is_set():
            if self.url_file.exists():
                text = self.url_file.read_text()
                if text:
                    return text
            time.sleep(0.02)
        return None

    def _run(self) -> None:
        url = self._url()
        if url is None:
            return
        base, token = url.split("?")
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"{base}hosts.json?{token}", timeout=10) as answer:
                    hosts = json.loads(answer.read())["hosts"]
                if hosts:
                    name = urllib.parse.quote(hosts[0]["host"])
                    detail = f"{base}hosts.json?{token}&host={name}"
                    with urllib.request.urlopen(detail, timeout=10) as answer:
                        answer.read()
                with urllib.request.urlopen(f"{base}metrics?{token}", timeout=10) as answer:
                    answer.read()
            except (urllib.error.URLError, OSError):
                return  # the crawl ended
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def crawl(hosts: LocalHosts, setup: str, variant: str, interval: float) -> dict[str, Any]:
    """Run one crawl of *setup* with the monitor *variant*.

    Returns the crawl process's result (with ``monitor_requests`` when polled).
    """
    _spec, settings, per_host, budget = SETUPS[setup]
    hosts.reset()
    config: dict[str, Any] = {
        "settings": {**settings, **CONFIGS[ADDON].settings, **VARIANTS[variant]},
        "hosts": [hosts.netloc(index) for index in range(len(hosts))],
        "start_per_host": per_host,
        "budget": budget,
        "time_limit": TIME_LIMIT,
    }
    if variant != "polled":
        return run_child(config, TIME_LIMIT + SHUTDOWN_GRACE)
    with tempfile.TemporaryDirectory() as work:
        url_file = Path(work) / "monitor-url"
        config["monitor_url_file"] = str(url_file)
        poller = Poller(url_file, interval)
        try:
            return run_child(config, TIME_LIMIT + SHUTDOWN_GRACE)
        finally:
            poller.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.monitor_cost", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scenarios", default="S1,broad")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    args = parser.parse_args(argv)
    worst = 0.0
    for setup in args.scenarios.split(","):
        spec = SETUPS[setup][0]
        changes = []
        times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        with LocalHosts(parse_specs(spec), process=True) as hosts:
            for number in range(args.rounds):
                order = list(VARIANTS) if number % 2 == 0 else list(reversed(VARIANTS))
                result = {}
                polls = 0
                for variant in order:
                    outcome = crawl(hosts, setup, variant, args.interval)
                    polls = outcome.get("monitor_requests", polls if variant == "off" else 0)
                    seconds = outcome.get("time_to_budget")
                    if seconds is None:
                        print(f"{setup} round {number + 1} {variant}: {outcome}", file=sys.stderr)
                        return 1
                    if variant == "polled" and not outcome.get("monitor_requests"):
                        print(f"{setup}: the monitor was never polled", file=sys.stderr)
                        return 1
                    result[variant] = seconds
                    times[variant].append(seconds)
                change = result["polled"] / result["off"] - 1
                changes.append(change)
                print(
                    f"{setup} round {number + 1}: off {result['off']:.3f} s, "
                    f"polled {result['polled']:.3f} s ({change:+.1%}; "
                    f"{polls} monitor requests)",
                    flush=True,
                )
        median = statistics.median(changes)
        worst = max(worst, median)
        print(
            f"{setup}: median off {statistics.median(times['off']):.3f} s, polled "
            f"{statistics.median(times['polled']):.3f} s; median change {median:+.1%} "
            f"over {args.rounds} rounds (target: at most +2%)",
            flush=True,
        )
    return 0 if worst <= 0.02 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
