"""One crawl in a fresh process: ``python -m bench.crawl_once <config>``.

``<config>`` is a JSON object, or ``@path`` to a file holding one::

    {
      "settings": {...},            # Scrapy settings of this configuration
      "hosts": ["127.0.0.1:PORT", ...],
      "start_per_host": 400,        # start URLs /page/0 .. /page/N-1 on every host
      "budget": 1200,               # CLOSESPIDER_PAGECOUNT
      "time_limit": 30,             # CLOSESPIDER_TIMEOUT (optional)
      "follow": true                # follow the links of every page
    }

Start URLs are interleaved across hosts (host 0 page 0, host 1 page 0, ...), as a
broad crawl's seeds come. The spider follows every link, which costs the CPU a real
link-following crawl costs.

Prints one JSON line on stdout. Times come from ``time.monotonic()`` in this process:

* ``time_to_budget``: from the first request reaching the downloader (signal
  ``request_reached_downloader``) to the ``budget``-th response reaching the engine
  (signal ``response_received``, the count ``CLOSESPIDER_PAGECOUNT`` uses; retried
  429s are not counted, a 429 handed to the spider after the last retry is);
  ``null`` if the crawl ended before the budget (``finish_reason`` says why:
  ``closespider_timeout`` when it hit ``time_limit``).
* ``wall``: from the start of the crawl (before the spider opens) to its close.
* ``cpu``, ``peak_rss_mb``: ``resource.getrusage(RUSAGE_SELF)`` of this process
  at the end (user + system seconds, ``ru_maxrss``), imports included.
* ``cpu_window``: CPU seconds of this process between the two marks above.
* ``host_pages``: responses per hostname up to the ``budget``-th.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy import signals
from scrapy.crawler import AsyncCrawlerProcess
from scrapy.http import Response


class Marks:
    """What the signal handlers record during the crawl."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.first_request: float | None = None
        self.first_request_cpu = 0.0
        self.budget_reached: float | None = None
        self.budget_cpu = 0.0
        self.responses = 0
        self.host_pages: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()

    def request_reached(self, request: scrapy.Request, spider: scrapy.Spider) -> None:
        if self.first_request is None:
            self.first_request = time.monotonic()
            self.first_request_cpu = time.process_time()

    def response_received(
        self, response: Response, request: scrapy.Request, spider: scrapy.Spider
    ) -> None:
        self.responses += 1
        if self.responses > self.budget:
            return
        self.host_pages[urlsplit(response.url).hostname or ""] += 1
        self.statuses[response.status] += 1
        if self.responses == self.budget:
            self.budget_reached = time.monotonic()
            self.budget_cpu = time.process_time()


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
    budget = int(config["budget"])
    settings: dict[str, Any] = {
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "CLOSESPIDER_PAGECOUNT": budget,
        **config["settings"],
    }
    if config.get("time_limit"):
        settings["CLOSESPIDER_TIMEOUT"] = float(config["time_limit"])
    marks = Marks(budget)
    process = AsyncCrawlerProcess(settings)
    crawler = process.create_crawler(BenchSpider)
    crawler.signals.connect(marks.request_reached, signal=signals.request_reached_downloader)
    crawler.signals.connect(marks.response_received, signal=signals.response_received)
    started = time.monotonic()
    process.crawl(
        crawler,
        start_urls=start_urls(config["hosts"], int(config["start_per_host"])),
        follow=bool(config.get("follow", True)),
    )
    process.start()
    closed = time.monotonic()

    usage = resource.getrusage(resource.RUSAGE_SELF)
    assert crawler.stats is not None
    stats = crawler.stats.get_stats()
    reached = marks.budget_reached is not None and marks.first_request is not None
    return {
        "pages": marks.responses,
        "time_to_budget": (
            marks.budget_reached - marks.first_request  # type: ignore[operator]
            if reached
            else None
        ),
        "wall": closed - started,
        "cpu": usage.ru_utime + usage.ru_stime,
        "cpu_window": marks.budget_cpu - marks.first_request_cpu if reached else None,
        # ru_maxrss is in kilobytes on Linux.
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "host_pages": dict(marks.host_pages),
        "statuses": {str(code): n for code, n in sorted(marks.statuses.items())},
        "finish_reason": stats.get("finish_reason"),
        "log_errors": stats.get("log_count/ERROR", 0),
        "retries": stats.get("retry/count", 0),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.crawl_once <json config | @file>", file=sys.stderr)
        return 2
    result = run(load_config(argv[0]))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
