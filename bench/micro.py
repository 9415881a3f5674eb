"""S7: the cost of one ``next_request`` as the number of hosts grows.

``python -m bench.micro [--hosts 1,1000,10000,100000] [--rounds 5]`` prints one
JSON line: nanoseconds per pop, the median over rounds, for

* ``frontier``: ``scrapy_hostqueue.frontier.memory.MemoryStore.pop`` (the pure core);
* ``scheduler``: ``HostQueueScheduler.next_request`` built from a crawler made by
  ``scrapy.utils.test.get_crawler`` (no crawl: hosts come from the URLs);
* ``dapq``: Scrapy's ``DownloaderAwarePriorityQueue.pop``, built as
  ``scrapy/core/scheduler.py`` builds it, over a stand-in downloader with no
  active slot (the queue then only scans its slots, its cheapest case);
* ``scrapy-scheduler``: Scrapy's own ``Scheduler.next_request`` over that queue
  (its default), the like-for-like counterpart of ``scheduler``: both pay for
  the ``scheduler/*`` stats.

Every host holds two queued requests. Each round repeats: pop (timed alone), mark
the request finished so its host is ready again, push it back; so the number of
hosts stays constant. The garbage collector is off inside a timed loop. An
implementation holds every number of hosts at once, and its rounds go round
them (1, 1,000, 10,000, 100,000, then again), so that a spell of a slower
machine lands on every number of hosts rather than on all the rounds of one.

Then the memory a queued request costs, in bytes (``bytes_per_queued``), for
``scheduler`` and ``scrapy-scheduler`` (Scrapy's ``Scheduler`` with its default
memory queues: ``DownloaderAwarePriorityQueue`` over ``LifoMemoryQueue``):
100,000 requests spread over each number of hosts are enqueued, and
:mod:`tracemalloc` counts what stays allocated (the queues, the per-host state
and the scheduler's bookkeeping) over the number of requests. The requests are
made before: their parsed URL and their ``meta`` dict, which both schedulers'
host lookups create and a crawl's spider middlewares have created by then
anyway, are not counted.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from scrapy import Request, Spider
from scrapy.core.scheduler import Scheduler
from scrapy.crawler import Crawler
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.test import get_crawler

HOST_COUNTS = (1, 1_000, 10_000, 100_000)
MEMORY_REQUESTS = 100_000
MEMORY_IMPLEMENTATIONS = ("scheduler", "scrapy-scheduler")
IMPLEMENTATIONS = ("frontier", "scheduler", "dapq", "scrapy-scheduler")
QUEUED_PER_HOST = 2
SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 20,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
    "TELNETCONSOLE_ENABLED": False,
    "REMOTE_CONTROL_ENABLED": False,
}


class _Spider(Spider):
    name = "micro"


def _requests(hosts: int, per_host: int = QUEUED_PER_HOST) -> list[Request]:
    return [
        Request(f"http://h{host}.example/{n}", dont_filter=True)
        for n in range(per_host)
        for host in range(hosts)
    ]


def pops_for(implementation: str, hosts: int) -> int:
    """Pops per round: enough for a stable mean, few where a pop is slow."""
    if implementation in ("dapq", "scrapy-scheduler"):
        return max(10, min(5_000, 1_000_000 // hosts))
    return 5_000


class _Timed:
    """One implementation holding one number of hosts, ready to be timed.

    ``pop`` is timed alone, ``recycle`` (untimed) makes the popped request's host ready again and
    queues the request back.
    """

    def __init__(self, pop: Callable[[], Any], recycle: Callable[[Any], None], pops: int) -> None:
        self.pop = pop
        self.recycle = recycle
        self.pops = pops

    def round(self) -> float:
        """Mean ns per ``pop()`` over one round."""
        pop, recycle = self.pop, self.recycle
        gc.collect()
        gc.disable()
        try:
            total = 0
            for _ in range(self.pops):
                start = time.perf_counter_ns()
                item = pop()
                total += time.perf_counter_ns() - start
                recycle(item)
        finally:
            gc.enable()
        return total / self.pops


def prepare_frontier(hosts: int, requests: list[Request]) -> _Timed:
    from scrapy_hostqueue.frontier.memory import HostState, MemoryStore

    frontier: MemoryStore[int] = MemoryStore(lambda key: HostState(4))
    keys = [f"h{host}" for host in range(hosts)]
    for n in range(QUEUED_PER_HOST):
        for key in keys:
            frontier.push(key, 0, n)

    def recycle(popped: tuple[str, int] | None) -> None:
        assert popped is not None
        key, item = popped
        frontier.finish(key)
        frontier.push(key, 0, item)

    return _Timed(frontier.pop, recycle, pops_for("frontier", hosts))


def _new_scheduler() -> Any:
    """Make a HostQueueScheduler for a crawler made by get_crawler (no crawl)."""
    from scrapy_hostqueue.scheduler import HostQueueScheduler

    return HostQueueScheduler.from_crawler(get_crawler(_Spider, SETTINGS))


def prepare_scheduler(hosts: int, requests: list[Request]) -> _Timed:
    scheduler = _new_scheduler()
    for request in requests:
        scheduler.enqueue_request(request)

    def recycle(request: Request | None) -> None:
        assert request is not None
        # Stands in for the downloader's "request left" hook that open() installs.
        scheduler.hosts.on_request_left(request)
        scheduler.enqueue_request(request)

    return _Timed(scheduler.next_request, recycle, pops_for("scheduler", hosts))


class _IdleDownloader:
    """Just what ``DownloaderAwarePriorityQueue`` reads: slots and slot keys."""

    def __init__(self) -> None:
        self.slots: dict[str, Any] = {}

    def get_slot_key(self, request: Request) -> str:
        return urlparse_cached(request).hostname or ""


def _idle_crawler() -> Crawler:
    crawler = get_crawler(_Spider, SETTINGS)
    crawler.engine = SimpleNamespace(downloader=_IdleDownloader())  # type: ignore[assignment]
    return crawler


def prepare_dapq(hosts: int, requests: list[Request]) -> _Timed:
    crawler = _idle_crawler()
    settings = crawler.settings
    queue = build_from_crawler(
        load_object("scrapy.pqueues.DownloaderAwarePriorityQueue"),
        crawler,
        downstream_queue_cls=load_object(settings["SCHEDULER_MEMORY_QUEUE"]),
        key="",
        start_queue_cls=load_object(settings["SCHEDULER_START_MEMORY_QUEUE"]),
    )
    for request in requests:
        queue.push(request)

    def recycle(request: Request | None) -> None:
        assert request is not None
        queue.push(request)

    return _Timed(queue.pop, recycle, pops_for("dapq", hosts))


def _new_scrapy_scheduler() -> Scheduler:
    """Scrapy's Scheduler, opened, over the stand-in downloader."""
    scheduler = Scheduler.from_crawler(_idle_crawler())
    scheduler.open(_Spider())
    return scheduler


def prepare_scrapy_scheduler(hosts: int, requests: list[Request]) -> _Timed:
    scheduler = _new_scrapy_scheduler()
    for request in requests:
        scheduler.enqueue_request(request)

    def recycle(request: Request | None) -> None:
        assert request is not None
        scheduler.enqueue_request(request)

    return _Timed(scheduler.next_request, recycle, pops_for("scrapy-scheduler", hosts))


PREPARE: dict[str, Callable[[int, list[Request]], _Timed]] = {
    "frontier": prepare_frontier,
    "scheduler": prepare_scheduler,
    "dapq": prepare_dapq,
    "scrapy-scheduler": prepare_scrapy_scheduler,
}


def memory_requests(hosts: int, total: int = MEMORY_REQUESTS) -> list[Request]:
    """Make *total* requests over *hosts* hosts, to be measured by :func:`bytes_per_queued`.

    *total* requests (at least one per host) over *hosts* hosts, ready to be
    measured by :func:`bytes_per_queued`.
    """
    requests = _requests(hosts, max(1, total // hosts))
    for request in requests:
        urlparse_cached(request)
        request.meta  # noqa: B018 - created here, not counted below
    return requests


SCHEDULERS: dict[str, Callable[[], Any]] = {
    "scheduler": _new_scheduler,
    "scrapy-scheduler": _new_scrapy_scheduler,
}


def bytes_per_queued(name: str, requests: list[Request]) -> float:
    """Bytes still allocated after enqueueing *requests*, per request."""
    push = SCHEDULERS[name]().enqueue_request
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for request in requests:
            push(request)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / len(requests)


def run(host_counts: list[int], rounds: int) -> dict[str, Any]:
    """Time every implementation's pop and measure its bytes per queued request.

    ``{"ns_per_pop": {impl: {hosts: median}}, "rounds": {...},
    "bytes_per_queued": {impl: {hosts: bytes}}}``; an implementation that cannot
    run is reported under ``"unavailable"``.
    """
    medians: dict[str, dict[str, float]] = {}
    raw: dict[str, dict[str, list[float]]] = {}
    unavailable: dict[str, str] = {}
    # The same requests serve every implementation, one after the other.
    by_hosts = {hosts: _requests(hosts) for hosts in host_counts}
    for name in IMPLEMENTATIONS:
        try:
            prepared = {hosts: PREPARE[name](hosts, by_hosts[hosts]) for hosts in host_counts}
        except ImportError as error:
            unavailable[name] = f"{type(error).__name__}: {error}"
            continue
        # Rounds go round the host counts (1, 1,000, ..., then again), so
        # that a spell of a slower machine falls on every count, not on all
        # the rounds of one.
        means: dict[int, list[float]] = {hosts: [] for hosts in host_counts}
        for _ in range(rounds):
            for hosts in host_counts:
                means[hosts].append(prepared[hosts].round())
        del prepared
        gc.collect()
        raw[name] = {str(hosts): values for hosts, values in means.items()}
        medians[name] = {str(hosts): statistics.median(values) for hosts, values in means.items()}
    del by_hosts
    memory: dict[str, dict[str, float]] = {}
    for hosts in host_counts:
        requests = memory_requests(hosts)
        for name in MEMORY_IMPLEMENTATIONS:
            memory.setdefault(name, {})[str(hosts)] = bytes_per_queued(name, requests)
        del requests
        gc.collect()
    return {
        "ns_per_pop": medians,
        "rounds": raw,
        "unavailable": unavailable,
        "bytes_per_queued": memory,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hosts",
        default=",".join(map(str, HOST_COUNTS)),
        help="comma-separated host counts (default: %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    host_counts = [int(part) for part in args.hosts.split(",") if part]
    print(json.dumps(run(host_counts, args.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
