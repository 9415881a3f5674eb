"""Running real crawls in tests: settings shared by every crawl test and a spider
that starts from given URLs and (optionally) follows links."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import scrapy
from scrapy.crawler import Crawler
from scrapy.http import Response
from scrapy.utils.test import get_crawler

SCRAPY_HTTP11 = "scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler"
SCRAPY_AIOHTTP = "scrapy.core.downloader.handlers._aiohttp.AiohttpDownloadHandler"
OUR_HANDLER = "scrapy_hostqueue.AiohttpDownloadHandler"
SCHEDULER = "scrapy_hostqueue.HostQueueScheduler"

BASE_SETTINGS: dict[str, Any] = {
    "TELNETCONSOLE_ENABLED": False,
    "EXTENSIONS": {"scrapy.extensions.remote_control.RemoteControl": None},
    "ROBOTSTXT_OBEY": False,
    "LOG_LEVEL": "INFO",
    "RETRY_ENABLED": True,
    "DOWNLOAD_TIMEOUT": 20,
    # A backstop: a crawl that stalls ends (and fails its test's assertions)
    # instead of hanging the suite.
    "CLOSESPIDER_TIMEOUT": 60,
    # The stock handler is explicit so that tests do not depend on what an
    # add-on may wire.
    "DOWNLOAD_HANDLERS": {"http": SCRAPY_HTTP11, "https": SCRAPY_HTTP11},
}


def settings(**overrides: Any) -> dict[str, Any]:
    merged = dict(BASE_SETTINGS)
    merged.update(overrides)
    return merged


class PageSpider(scrapy.Spider):
    """Starts from ``start_urls`` and follows every link when ``follow`` is set;
    records the URL of every response in ``seen``."""

    name = "pages"
    start_urls: list[str]
    follow: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []
        self.statuses: list[int] = []

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            yield scrapy.Request(url, dont_filter=False)

    def parse(self, response: Response) -> Iterable[Any]:
        self.seen.append(response.url)
        self.statuses.append(response.status)
        if self.follow and hasattr(response, "css"):
            for href in response.css("a::attr(href)").getall():
                yield response.follow(href)


async def crawl(
    start_urls: list[str],
    *,
    follow: bool = False,
    spider_cls: type[PageSpider] = PageSpider,
    **overrides: Any,
) -> Crawler:
    """Run one crawl to the end and return its crawler (``crawler.spider.seen``,
    ``crawler.stats``)."""
    crawler = get_crawler(spider_cls, settings(**overrides))
    await crawler.crawl_async(start_urls=start_urls, follow=follow)
    return crawler


def interleave(*lists: list[str]) -> list[str]:
    """Round-robin over several URL lists (as a broad crawl's start URLs come)."""
    out: list[str] = []
    for group in zip(*lists, strict=False):
        out.extend(group)
    return out


@contextmanager
def dropping_connections(address: str) -> Iterator[int]:
    """A port on *address* that drops connection attempts, as an address behind
    a firewall that drops packets does: it listens with a backlog of 0 and
    never accepts, and its accept queue is filled at once, so that Linux drops
    the SYN of every later attempt, which stays unanswered until the client
    gives up. Yields the port."""
    with ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind((address, 0))
        listener.listen(0)
        port: int = listener.getsockname()[1]
        for _ in range(3):
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            filler.connect_ex((address, port))
        yield port
