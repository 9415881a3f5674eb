"""A shared crawl on a Redis too small for its frontier.

Two steps, each on a fresh local ``redis-server`` and ``--workers``
``scrapy crawl`` processes of the example project over ``--hosts`` local
hosts of ``--pages`` pages (every page links 3 others of its host, a tree
that reaches each page once):

1. no ``maxmemory``: the peak of Redis's ``used_memory`` (``INFO memory``,
   ``used_memory_peak``) is the frontier's peak;
2. ``maxmemory`` at ``--fraction`` of that peak (of the frontier's part
   of it: the memory an empty server uses, plus the fraction of what the
   crawl added), ``maxmemory-policy noeviction``: every page must still be
   fetched, few twice.

Prints, for step 2, the pages never fetched and fetched more than once, the
time, and per process its finish reason, its log lines about the full Redis,
the seconds Redis was full and the most requests it kept back.

    python -m bench.redis_full                          # 20 hosts x 500 pages
    python -m bench.redis_full --hosts 10 --pages 200   # a quick one
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.runner import child_environment
from example_project.run_demo import PROJECT_DIR
from scrapy_hostqueue.testing import HostSpec, LocalHosts
from scrapy_hostqueue.testing._redis_server import RedisServer

#: What a log line about a full Redis holds.
FULL_LINES = (
    "is full",
    "takes new requests again",
    "of its maxmemory",
    "Redis never took",
    "stays full",
    "Redis refused to",
)


def _memory(server: RedisServer) -> dict[str, int]:
    text = str(server.command("INFO memory"))
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {
        name: int(fields[name].strip()) for name in ("used_memory", "used_memory_peak", "maxmemory")
    }


def crawl(
    server: RedisServer, hosts: LocalHosts, directory: Path, workers: int, timeout: float
) -> tuple[list[int], float]:
    """*workers* crawls of every host on *server*; their exit codes and the seconds they took.

    Logs, stats and spilled files go to *directory*.
    """
    starts = ",".join(hosts.page_url(i, 0) for i in range(len(hosts)))
    settings = {
        "HOSTQUEUE_FRONTIER": server.url,
        "HOSTQUEUE_CRAWL_ID": "full",
        "HOSTQUEUE_REDIS_SPILL_DIR": str(directory),
        "HOSTQUEUE_REDIS_FINISH_GRACE": 2.0,
        "HOSTQUEUE_TIMELINE_FILE": "",
        "CLOSESPIDER_PAGECOUNT": 0,
        "CLOSESPIDER_TIMEOUT": timeout,
        "ROBOTSTXT_OBEY": False,
        "LOG_LEVEL": "INFO",
    }
    processes = []
    began = time.monotonic()
    for n in range(workers):
        command = [sys.executable, "-m", "scrapy", "crawl", "pages", "-a", f"start_urls={starts}"]
        for name, value in {**settings, "DEMO_STATS_FILE": directory / f"stats{n}.json"}.items():
            command += ["-s", f"{name}={value}"]
        with (directory / f"worker{n}.log").open("wb") as log:
            processes.append(
                subprocess.Popen(
                    command,
                    cwd=PROJECT_DIR,
                    env=child_environment(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    codes = []
    try:
        for process in processes:
            codes.append(process.wait(timeout + 60))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return codes, time.monotonic() - began


def run(
    *,
    hosts: int = 20,
    pages: int = 500,
    workers: int = 2,
    fraction: float = 0.5,
    latency: float = 0.01,
    timeout: float = 600.0,
    directory: Path | None = None,
) -> dict[str, Any]:
    """Run the two steps and return their figures (see the module's docstring)."""
    specs = [HostSpec(latency=latency, pages=pages, links=3)] * hosts
    out: dict[str, Any] = {"hosts": hosts, "pages": hosts * pages, "workers": workers}
    with tempfile.TemporaryDirectory() as scratch:
        base = directory or Path(scratch)
        with LocalHosts(specs, process=True) as local, RedisServer() as server:
            (base / "free").mkdir(parents=True, exist_ok=True)
            before = _memory(server)["used_memory"]
            codes, seconds = crawl(server, local, base / "free", workers, timeout)
            peak = _memory(server)["used_memory_peak"]
            out["unlimited"] = {"codes": codes, "seconds": round(seconds, 1)}
        out["used_before"], out["peak"] = before, peak
        maxmemory = before + int((peak - before) * fraction)
        out["maxmemory"] = maxmemory
        with LocalHosts(specs, process=True) as local, RedisServer() as server:
            server.command(f"CONFIG SET maxmemory {maxmemory}")
            (base / "full").mkdir(parents=True, exist_ok=True)
            codes, seconds = crawl(server, local, base / "full", workers, timeout)
            local.wait_idle(10)
            stats = local.all_stats(arrivals=False)
            out["used_at_end"] = _memory(server)["used_memory"]
        missing = sum(
            len(set(range(pages)) - {int(p.rsplit("/", 1)[1]) for p in host.pages})
            for host in stats
        )
        twice = sum(count - 1 for host in stats for count in host.pages.values())
        processes = []
        for n in range(workers):
            log = (base / "full" / f"worker{n}.log").read_text()
            stats_file = base / "full" / f"stats{n}.json"
            result = (
                json.loads(stats_file.read_text())
                if stats_file.exists()
                else {"finish_reason": None, "stats": {}}
            )
            crawl_stats = result["stats"]
            processes.append(
                {
                    "code": codes[n],
                    "finish_reason": result["finish_reason"],
                    "full_lines": [
                        line for line in log.splitlines() if any(s in line for s in FULL_LINES)
                    ],
                    "tracebacks": log.count("Traceback"),
                    "responses": crawl_stats.get("downloader/response_count", 0),
                    "full_seconds": crawl_stats.get("hostqueue/redis/full_seconds", 0),
                    "max_backlog": crawl_stats.get("hostqueue/redis/max_backlog", 0),
                    "spilled": crawl_stats.get("hostqueue/redis/spilled_count", 0),
                }
            )
        out["limited"] = {
            "seconds": round(seconds, 1),
            "missing": missing,
            "twice": twice,
            "processes": processes,
        }
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_full", description=__doc__)
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--pages", type=int, default=500, help="pages per host")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fraction", type=float, default=0.5, help="maxmemory / peak")
    args = parser.parse_args(argv)
    result = run(hosts=args.hosts, pages=args.pages, workers=args.workers, fraction=args.fraction)
    limited = result["limited"]
    print(
        f"{result['pages']:,} pages over {result['hosts']} hosts, {result['workers']} processes; "
        f"used_memory {result['used_before'] / 1e6:.2f} MB empty, peak "
        f"{result['peak'] / 1e6:.2f} MB without maxmemory "
        f"({result['unlimited']['seconds']} s); maxmemory {result['maxmemory'] / 1e6:.2f} MB"
    )
    print(
        f"with maxmemory: {limited['seconds']} s, {limited['missing']} pages never fetched, "
        f"{limited['twice']} fetched twice or more"
    )
    for n, process in enumerate(limited["processes"]):
        print(
            f"  process {n}: exit {process['code']}, {process['finish_reason']}, "
            f"{process['responses']} responses, {len(process['full_lines'])} lines about "
            f"the full Redis, full {process['full_seconds']} s, at most "
            f"{process['max_backlog']} requests kept back ({process['spilled']} spilled), "
            f"{process['tracebacks']} tracebacks"
        )
        for line in process["full_lines"]:
            print(f"    {line[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
