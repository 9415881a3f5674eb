"""The SQLite store's CPU per request in an S1-like crawl, without the network.

``python -m bench.frontier_cpu [--rounds 7] [--pages 1200]`` drives
``HostQueueScheduler`` as the engine would in scenario S1 (four hosts, three
answering in 10 ms and one in 200 ms, limit 4, 20 requests in flight, 400
start requests per host, three links on every page, committed every 250
pages) on a virtual clock: no downloader, no sockets, so what differs between
the runs is the store alone. Each round runs the in-memory store, then the
SQLite store in a fresh ``JOBDIR``, in this process, with the garbage
collector tuned as the add-on tunes it. It prints, for the best round of
each (least CPU), the CPU time (``time.process_time()``: every thread,
the WAL checkpoints included) and the SQLite store's CPU over the in-memory
store's per request enqueued and per page, as one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import sys
import tempfile
import time
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_hostqueue._config import GC_YOUNG_THRESHOLD
from scrapy_hostqueue.scheduler import HostQueueScheduler

HOSTS = [f"http://127.0.0.{index + 1}:8080" for index in range(4)]
LATENCY = [0.010, 0.010, 0.010, 0.200]
IN_FLIGHT = 20
LINKS = 3
COMMIT_EVERY = 250


class _Spider(Spider):
    name = "frontier_cpu"

    def parse(self, response: Any) -> None:
        pass


def crawl(store: str, pages: int, per_host: int) -> dict[str, Any]:
    """One run; its CPU time and counts."""
    with tempfile.TemporaryDirectory() as jobdir:
        settings: dict[str, Any] = {
            "CONCURRENT_REQUESTS": IN_FLIGHT,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "WARNING",
            "HOSTQUEUE_TIMELINE_FILE": None,
        }
        if store == "sqlite":
            settings["JOBDIR"] = jobdir
        crawler = get_crawler(_Spider, settings)
        scheduler = HostQueueScheduler.from_crawler(crawler)
        spider = _Spider.from_crawler(crawler)
        scheduler.spider = spider
        if scheduler.frontier.codec is not None:
            scheduler.frontier.codec.spider = spider
        scheduler.df.open()
        commit = getattr(scheduler.hosts.store, "commit", lambda: None)
        starts = [
            Request(f"{host}/page/{page}", callback=spider.parse, meta={"is_start_request": True})
            for page in range(per_host)
            for host in HOSTS
        ]
        gc.collect()
        frozen = gc.get_freeze_count()
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *thresholds[1:])
        started = time.process_time()
        for request in starts:
            scheduler.enqueue_request(request)
        enqueued, popped, done = len(starts), 0, 0
        now, order = 0.0, 0
        in_flight: list[tuple[float, int, Request, int]] = []
        while done < pages:
            while len(in_flight) < IN_FLIGHT:
                request = scheduler.next_request()
                if request is None:
                    break
                popped += 1
                index = HOSTS.index(request.url.split("/page/")[0])
                heapq.heappush(in_flight, (now + LATENCY[index], order, request, index))
                order += 1
            if not in_flight:
                break
            now, _, request, index = heapq.heappop(in_flight)
            page = int(request.url.rsplit("/", 1)[1])
            for k in range(1, LINKS + 1):
                child = Request(f"{HOSTS[index]}/page/{page * LINKS + k}", callback=spider.parse)
                scheduler.enqueue_request(child)
                enqueued += 1
            # What the downloader's "left" hook and the engine's "done" do.
            scheduler.hosts.on_request_left(request)
            scheduler.hosts.store.ack(request)
            done += 1
            if not done % COMMIT_EVERY:
                commit()
        commit()
        cpu = time.process_time() - started
        gc.set_threshold(*thresholds)
        if not frozen:
            gc.unfreeze()  # else it was someone else's freeze
        scheduler.close("finished")
    return {"cpu_ms": cpu * 1000, "enqueued": enqueued, "popped": popped, "pages": done}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pages", type=int, default=1200)
    parser.add_argument("--per-host", type=int, default=400, help="start requests per host")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"memory": [], "sqlite": []}
    for _ in range(args.rounds):
        for store, results in runs.items():
            results.append(crawl(store, args.pages, args.per_host))
    memory = min(runs["memory"], key=lambda run: run["cpu_ms"])
    sqlite = min(runs["sqlite"], key=lambda run: run["cpu_ms"])
    extra = sqlite["cpu_ms"] - memory["cpu_ms"]
    result = {
        "memory_cpu_ms": round(memory["cpu_ms"], 1),
        "sqlite_cpu_ms": round(sqlite["cpu_ms"], 1),
        "sqlite_extra_us_per_enqueued": round(extra * 1000 / sqlite["enqueued"], 1),
        "sqlite_extra_us_per_page": round(extra * 1000 / max(1, sqlite["pages"]), 1),
        "enqueued": sqlite["enqueued"],
        "popped": sqlite["popped"],
        "pages": sqlite["pages"],
        "same_crawl": all(memory[key] == sqlite[key] for key in ("enqueued", "popped", "pages")),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
