"""The frontier stores compared: memory and time for many queued requests.

``python -m bench.frontier_store [--requests 1000000] [--hosts 10000] [--pops 50000]``
runs each of

* ``memory``: ``HostQueueScheduler`` with the in-memory store
  (``HOSTQUEUE_FRONTIER = "memory"``);
* ``sqlite``: ``HostQueueScheduler`` with the SQLite store in a ``JOBDIR``
  (the default with ``JOBDIR``);
* ``scrapy-jobdir``: Scrapy's own ``Scheduler`` with ``JOBDIR`` (its disk
  queues, a directory per slot, under ``DownloaderAwarePriorityQueue``)

in a child process of its own, on the same requests: ``--requests`` requests
round-robin over ``--hosts`` hosts, made one by one as they are enqueued (a
crawl does not hold them all beforehand), ``dont_filter=True`` (the queues
alone; ``--filter`` puts every request through the dupefilter too). It
reports

* ``rss_growth_mb``: the peak resident memory of the child while it enqueues
  them, less its resident memory before (``VmHWM`` after resetting it, less
  ``VmRSS``; Linux);
* ``enqueue_us``: microseconds per ``enqueue_request``, over all of them;
* ``max_commit_ms``: the longest group commit (the SQLite store), which
  holds the event loop in a crawl;
* ``next_us``: microseconds per ``next_request`` over ``--pops`` pops (each
  popped request is then marked done, as the downloader and the engine would,
  so that its host stays ready, and enqueued again). Scrapy's queue scans
  every slot on each pop (about 1.6 ms with 10,000 hosts), so its pops are
  fewer: ``--pops`` / 10.

One JSON line per store on stdout, then a summary with the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from scrapy_hostqueue.frontier.sqlite._glue import COMMIT_INTERVAL

STORES = ("memory", "sqlite", "scrapy-jobdir")
SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
    "TELNETCONSOLE_ENABLED": False,
    "REMOTE_CONTROL_ENABLED": False,
    "LOG_LEVEL": "WARNING",
}


def _status(field: str) -> int:
    """Read a ``/proc/self/status`` field, in kB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def _build(store: str, jobdir: str) -> tuple[Any, Callable[[Any], None], Callable[[], None]]:
    """Open the scheduler, and return what marks a popped request done and commits.

    The scheduler, opened as far as a crawl-less run allows, what marks a
    popped request done, and the SQLite store's group commit (its timer's
    work; nothing for the others).
    """
    from scrapy import Spider
    from scrapy.core.scheduler import Scheduler
    from scrapy.utils.test import get_crawler

    from bench.micro import _idle_crawler
    from scrapy_hostqueue.scheduler import HostQueueScheduler

    class _Spider(Spider):
        name = "frontier_store"

    if store == "scrapy-jobdir":
        crawler = _idle_crawler()
        crawler.settings.frozen = False
        crawler.settings.set("JOBDIR", jobdir)
        scheduler = Scheduler.from_crawler(crawler)
        scheduler.open(_Spider())
        return scheduler, lambda request: None, lambda: None
    settings = dict(SETTINGS, HOSTQUEUE_TIMELINE_FILE=None)
    if store == "sqlite":
        settings["JOBDIR"] = jobdir
    crawler = get_crawler(_Spider, settings)
    ours = HostQueueScheduler.from_crawler(crawler)
    ours.spider = _Spider()
    codec = ours.frontier.codec  # the SQLite store's; open() sets its spider
    if codec is not None:
        codec.spider = ours.spider
    store = ours.hosts.store

    def done(request: Any) -> None:
        # Stand in for the downloader's "left" hook and the engine's "done".
        ours.hosts.on_request_left(request)
        store.ack(request)

    commit = getattr(store, "commit", lambda: None)
    return ours, done, commit


def child(store: str, requests: int, hosts: int, pops: int, dont_filter: bool) -> dict[str, Any]:
    from scrapy import Request

    with tempfile.TemporaryDirectory() as jobdir:
        scheduler, done, commit = _build(store, jobdir)
        enqueue = scheduler.enqueue_request
        last_commit = time.perf_counter()
        longest = [0.0]

        def tick(now: float) -> float:
            # The group commit every COMMIT_INTERVAL, as in a crawl.
            if now - last_commit >= COMMIT_INTERVAL:
                commit()
                done_at = time.perf_counter()
                longest[0] = max(longest[0], done_at - now)
                return done_at
            return last_commit

        gc.collect()
        _reset_peak()
        rss_before = _status("VmRSS")
        start = time.perf_counter()
        for n in range(requests):
            enqueue(Request(f"http://h{n % hosts}.example/{n}", dont_filter=dont_filter))
            if not n % 1000:
                last_commit = tick(time.perf_counter())
        enqueue_s = time.perf_counter() - start
        peak = _status("VmHWM")
        if store == "scrapy-jobdir":
            pops //= 10
        next_request = scheduler.next_request
        popped = 0
        timed = 0.0
        for _ in range(pops):
            start = time.perf_counter()
            request = next_request()
            timed += time.perf_counter() - start
            if request is None:
                break
            popped += 1
            done(request)
            enqueue(request.replace(dont_filter=True))
            if not popped % 1000:
                start = time.perf_counter()
                last_commit = tick(start)
                timed += time.perf_counter() - start
        if hasattr(scheduler, "close"):
            scheduler.close("finished")
        size = sum(
            os.path.getsize(os.path.join(root, name))
            for root, _dirs, names in os.walk(jobdir)
            for name in names
        )
    return {
        "store": store,
        "requests": requests,
        "hosts": hosts,
        "rss_growth_mb": round((peak - rss_before) / 1024, 1),
        "enqueue_us": round(enqueue_s / requests * 1e6, 2),
        "next_us": round(timed / max(1, popped) * 1e6, 2),
        "pops": popped,
        "max_commit_ms": round(longest[0] * 1000, 1),
        "jobdir_mb": round(size / 2**20, 1),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--pops", type=int, default=50_000)
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--filter", action="store_true", help="through the dupefilter too")
    parser.add_argument("--child", choices=STORES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = child(args.child, args.requests, args.hosts, args.pops, not args.filter)
        print(json.dumps(result), flush=True)
        return 0
    results: dict[str, dict[str, Any]] = {}
    for store in args.stores.split(","):
        command = [
            sys.executable,
            "-m",
            "bench.frontier_store",
            "--child",
            store,
            "--requests",
            str(args.requests),
            "--hosts",
            str(args.hosts),
            "--pops",
            str(args.pops),
        ] + (["--filter"] if args.filter else [])
        out = subprocess.run(command, capture_output=True, text=True, check=False)
        if out.returncode:
            print(out.stderr[-2000:], file=sys.stderr)
            return 1
        results[store] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(results[store]), flush=True)
    memory, sqlite = results.get("memory"), results.get("sqlite")
    scrapy = results.get("scrapy-jobdir")
    if memory and sqlite:
        both = sqlite["enqueue_us"] + sqlite["next_us"]
        summary: dict[str, Any] = {
            "sqlite_rss_vs_memory": round(sqlite["rss_growth_mb"] / memory["rss_growth_mb"], 3),
            "sqlite_time_vs_memory": round(both / (memory["enqueue_us"] + memory["next_us"]), 2),
        }
        if scrapy:
            summary["sqlite_rss_vs_scrapy_jobdir"] = round(
                sqlite["rss_growth_mb"] / scrapy["rss_growth_mb"], 3
            )
            summary["sqlite_time_vs_scrapy_jobdir"] = round(
                both / (scrapy["enqueue_us"] + scrapy["next_us"]), 2
            )
        print(json.dumps({"summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
