"""``pages``: start from given URLs and follow every link, on loopback hosts only."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.exceptions import DontCloseSpider
from scrapy.http import Response


def is_loopback(url: str) -> bool:
    """Whether ``url`` points at this machine (the demo never leaves it)."""
    hostname = urlsplit(url).hostname
    if hostname is None:
        return False
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def split_urls(value: str | Iterable[str] | None) -> list[str]:
    """URLs from a ``-a``/setting value: a list, or a string split on commas/spaces."""
    if value is None:
        return []
    if isinstance(value, str):
        return [url for url in re.split(r"[\s,]+", value) if url]
    return [str(url) for url in value]


class PagesSpider(scrapy.Spider):
    """Crawl the local test hosts by following ``<a href>`` links.

    Start URLs, first found wins: ``-a start_urls="URL URL ..."``,
    ``-a start_urls_file=PATH`` (one URL per line), the ``DEMO_START_URLS`` setting.
    Links to anything but a loopback address are dropped. With the
    ``DEMO_KEEP_OPEN`` setting the spider stays open when it runs out of work
    (the demo's ``--monitor``), until the crawl is stopped.
    """

    name = "pages"

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> PagesSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        if crawler.settings.getbool("DEMO_KEEP_OPEN"):
            crawler.signals.connect(spider.keep_open, signal=signals.spider_idle)
        return spider

    def keep_open(self) -> None:
        raise DontCloseSpider

    def __init__(
        self,
        start_urls: str | None = None,
        start_urls_file: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._start_urls = split_urls(start_urls)
        if not self._start_urls and start_urls_file:
            self._start_urls = split_urls(Path(start_urls_file).read_text())

    async def start(self) -> AsyncIterator[Any]:
        urls = self._start_urls or split_urls(self.settings.get("DEMO_START_URLS"))
        if not urls:
            raise ValueError("no start URLs: pass -a start_urls=URL,... or -s DEMO_START_URLS=...")
        foreign = [url for url in urls if not is_loopback(url)]
        if foreign:
            raise ValueError(f"start URLs must be loopback addresses, got {foreign}")
        for url in urls:
            yield scrapy.Request(url)

    def parse(self, response: Response, **kwargs: Any) -> Any:
        links = response.css("a::attr(href)").getall()
        yield {"url": response.url, "status": response.status, "links": len(links)}
        for href in links:
            url = response.urljoin(href)
            if is_loopback(url):
                yield scrapy.Request(url)

    def closed(self, reason: str) -> None:
        path = self.settings.get("DEMO_STATS_FILE")
        if not path:
            return
        assert self.crawler.stats is not None
        stats = self.crawler.stats.get_stats()
        data = {"finish_reason": reason, "stats": stats}
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
