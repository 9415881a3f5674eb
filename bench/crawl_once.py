"""One crawl in a fresh process: ``python -m bench.crawl_once <config>``.

``<config>`` is a JSON object, or ``@path`` to a file holding one::

    {
      "settings": {...},            # Scrapy settings of this configuration
      "hosts": ["127.0.0.1:PORT", ...],
      "start_per_host": 400,        # start URLs /page/0 .. /page/N-1 on every host
      "budget": 1200,               # CLOSESPIDER_PAGECOUNT
      "time_limit": 30,             # seconds from spider_opened (optional)
      "follow": true,               # follow the links of every page
      "budget_hosts": [...],        # optional: only these hostnames' responses
                                    # count toward the budget
      "stop_at_budget": true,       # false: mark the budget's time, crawl on
      "response_times": false,      # true: list the time of every response
      "monitor_url_file": "PATH"    # optional: the live monitor's URL is written
                                    # there once it listens (bench/monitor_cost.py)
    }

Start URLs are interleaved across hosts (host 0 page 0, host 1 page 0, ...), as a
broad crawl's seeds come. The spider follows every link, which costs the CPU a real
link-following crawl costs.

Prints one JSON line on stdout and exits at once when the ``budget``-th response
arrives (``finish_reason``: ``budget``): nothing after it is measured, and
waiting for the requests still in flight (a 2 s host) would only make the suite
longer. Times come from ``time.monotonic()`` in this process:

* ``time_to_budget``: from the first request reaching the downloader (signal
  ``request_reached_downloader``) to the ``budget``-th response reaching the engine
  (signal ``response_received``, the count ``CLOSESPIDER_PAGECOUNT`` uses; retried
  429s are not counted, a 429 handed to the spider after the last retry is);
  ``null`` if the crawl ended before the budget (``finish_reason`` says why:
  ``time_limit`` when it ran out of time; it then exits at once too).
* ``first_response``: from the same first request to the first response reaching
  the engine (``null`` without a response).
* ``wall``: from the start of the crawl (before the spider opens) to the exit.
* ``cpu``, ``peak_rss_mb``: ``resource.getrusage(RUSAGE_SELF)`` of this process
  at the same moment (user + system seconds, ``ru_maxrss``), imports included.
* ``cpu_window``: CPU seconds of this process between the two marks above.
* ``host_pages``: responses per hostname up to the ``budget``-th (every
  response when the crawl goes on past the budget).

With ``budget_hosts``, only responses from those hostnames count toward the
budget (``budget_pages``): ``time_to_budget`` is then the time the last of
their pages was answered, whatever the other hosts are doing, and
``CLOSESPIDER_PAGECOUNT``, which counts every response, is not set. With
``stop_at_budget`` false the crawl goes on after the budget until the spider
closes or the time limit. ``response_times`` (when asked for) holds the time of
every response from the first request, in order, as ``time_to_budget`` counts.

A ``"JOBDIR": "@fresh"`` setting gets an empty temporary directory, removed
when the crawl exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy import signals
from scrapy.crawler import AsyncCrawlerProcess
from scrapy.http import Response


class Marks:
    """What the signal handlers record during the crawl."""

    def __init__(
        self,
        budget: int,
        on_budget: Callable[[], None],
        *,
        budget_hosts: Iterable[str] | None = None,
        stop_at_budget: bool = True,
        response_times: bool = False,
    ) -> None:
        self.budget = budget
        self.on_budget = on_budget
        self.budget_hosts = None if budget_hosts is None else frozenset(budget_hosts)
        self.stop_at_budget = stop_at_budget
        self.first_request: float | None = None
        self.first_request_cpu = 0.0
        self.first_response: float | None = None
        self.budget_reached: float | None = None
        self.budget_cpu = 0.0
        self.responses = 0
        #: Responses that count toward the budget.
        self.budget_pages = 0
        self.host_pages: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.response_times: list[float] | None = [] if response_times else None

    def request_reached(self, request: scrapy.Request, spider: scrapy.Spider) -> None:
        if self.first_request is None:
            self.first_request = time.monotonic()
            self.first_request_cpu = time.process_time()

    def response_received(
        self, response: Response, request: scrapy.Request, spider: scrapy.Spider
    ) -> None:
        now = time.monotonic()
        self.responses += 1
        if self.first_response is None:
            self.first_response = now
        if self.budget_reached is not None and self.stop_at_budget:
            return
        hostname = urlsplit(response.url).hostname or ""
        self.host_pages[hostname] += 1
        self.statuses[response.status] += 1
        if self.response_times is not None:
            self.response_times.append(now)
        if self.budget_hosts is not None and hostname not in self.budget_hosts:
            return
        self.budget_pages += 1
        if self.budget_pages == self.budget:
            self.budget_reached = now
            self.budget_cpu = time.process_time()
            self.on_budget()


class BenchSpider(scrapy.Spider):
    """Starts from the given URLs and follows every link when ``follow`` is set."""

    name = "bench"
    start_urls: list[str]
    follow: bool = True

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            yield scrapy.Request(url)

    def parse(self, response: Response) -> Iterable[Any]:
        if self.follow and hasattr(response, "css"):
            for href in response.css("a::attr(href)").getall():
                yield response.follow(href)


def start_urls(hosts: list[str], per_host: int) -> list[str]:
    """``per_host`` pages of every host, interleaved across hosts."""
    return [f"http://{netloc}/page/{page}" for page in range(per_host) for netloc in hosts]


def load_config(argument: str) -> dict[str, Any]:
    if argument.startswith("@"):
        argument = Path(argument[1:]).read_text()
    config: dict[str, Any] = json.loads(argument)
    return config


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Run the crawl.

    Returns its result if it ends short of the budget (at the budget, the result is printed and the
    process exits).
    """
    budget = int(config["budget"])
    budget_hosts = config.get("budget_hosts")
    stop_at_budget = bool(config.get("stop_at_budget", True))
    settings: dict[str, Any] = {
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
    }
    if budget_hosts is None and stop_at_budget:
        # A backstop: the crawl normally ends at the budget by exiting.
        settings["CLOSESPIDER_PAGECOUNT"] = budget
    settings.update(config["settings"])
    jobdir = None
    if settings.get("JOBDIR") == "@fresh":
        jobdir = settings["JOBDIR"] = tempfile.mkdtemp(prefix="hostqueue-bench-")
    time_limit = float(config.get("time_limit") or 0)
    if time_limit:
        # A backstop: the crawl normally ends at the time limit by exiting.
        settings["CLOSESPIDER_TIMEOUT"] = time_limit + 10
    process = AsyncCrawlerProcess(settings)
    crawler = process.create_crawler(BenchSpider)
    started = time.monotonic()

    def result(finish_reason: Any) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        assert crawler.stats is not None
        stats = crawler.stats.get_stats()
        reached = marks.budget_reached is not None and marks.first_request is not None
        data: dict[str, Any] = {
            "pages": marks.responses,
            "time_to_budget": (
                marks.budget_reached - marks.first_request  # type: ignore[operator]
                if reached
                else None
            ),
            "first_response": (
                marks.first_response - marks.first_request
                if marks.first_response is not None and marks.first_request is not None
                else None
            ),
            "wall": time.monotonic() - started,
            "cpu": usage.ru_utime + usage.ru_stime,
            "cpu_window": marks.budget_cpu - marks.first_request_cpu if reached else None,
            # ru_maxrss is in kilobytes on Linux.
            "peak_rss_mb": usage.ru_maxrss / 1024,
            "budget_pages": marks.budget_pages,
            "host_pages": dict(marks.host_pages),
            "statuses": {str(code): n for code, n in sorted(marks.statuses.items())},
            "finish_reason": finish_reason,
            "log_errors": stats.get("log_count/ERROR", 0),
            "retries": stats.get("retry/count", 0),
            # Download timeouts, whatever the handler's exception class.
            "timeouts": sum(
                count
                for key, count in stats.items()
                if key.startswith("downloader/exception_type_count/") and "Timeout" in key
            ),
        }
        if monitors:
            data["monitor_requests"] = monitors[0].server.answered
        if marks.response_times is not None and marks.first_request is not None:
            data["response_times"] = [
                round(moment - marks.first_request, 4) for moment in marks.response_times
            ]
        return data

    def exit_with(finish_reason: str) -> None:
        print(json.dumps(result(finish_reason)), flush=True)
        sys.stderr.flush()
        if jobdir is not None:
            shutil.rmtree(jobdir, ignore_errors=True)
        os._exit(0)

    monitors: list[Any] = []  # the live monitor, once its URL is written

    def start_the_clock(spider: scrapy.Spider) -> None:
        if time_limit:
            asyncio.get_running_loop().call_later(time_limit, exit_with, "time_limit")
        url_file = config.get("monitor_url_file")
        if url_file:
            # The monitor starts in its own spider_opened handler: look for it
            # once the loop runs again.
            asyncio.get_running_loop().call_soon(write_monitor_url, url_file)

    def write_monitor_url(path: str) -> None:
        from scrapy_hostqueue.monitor.extension import HostQueueMonitor

        assert crawler.extensions is not None
        monitor = next(
            (m for m in crawler.extensions.middlewares if isinstance(m, HostQueueMonitor)), None
        )
        if monitor is None:
            return  # the monitor is off
        if monitor.url is None:
            # Its server is still starting.
            asyncio.get_running_loop().call_later(0.05, write_monitor_url, path)
            return
        monitors.append(monitor)
        Path(path).write_text(monitor.url)

    marks = Marks(
        budget,
        (lambda: exit_with("budget")) if stop_at_budget else (lambda: None),
        budget_hosts=budget_hosts,
        stop_at_budget=stop_at_budget,
        response_times=bool(config.get("response_times", False)),
    )
    crawler.signals.connect(start_the_clock, signal=signals.spider_opened)
    crawler.signals.connect(marks.request_reached, signal=signals.request_reached_downloader)
    crawler.signals.connect(marks.response_received, signal=signals.response_received)
    process.crawl(
        crawler,
        start_urls=start_urls(config["hosts"], int(config["start_per_host"])),
        follow=bool(config.get("follow", True)),
    )
    process.start()
    if jobdir is not None:
        shutil.rmtree(jobdir, ignore_errors=True)
    assert crawler.stats is not None
    return result(crawler.stats.get_value("finish_reason"))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.crawl_once <json config | @file>", file=sys.stderr)
        return 2
    result = run(load_config(argv[0]))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
