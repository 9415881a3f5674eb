"""StartRequestsMiddleware: start requests take turns with responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import StartRequestsMiddleware
from scrapy_hostqueue import start as start_module
from scrapy_hostqueue.testing import HostSpec
from tests.helpers.clock import FakeClock
from tests.helpers.crawling import ADDON, SCHEDULER, HostsFactory, PageSpider, settings

NAME = "scrapy_hostqueue.StartRequestsMiddleware"


async def items(values: list[Any]) -> AsyncIterator[Any]:
    for value in values:
        yield value


async def run(
    middleware: StartRequestsMiddleware, values: list[Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Any], list[int]]:
    """Run the middleware; return what it yields, and after how many items it slept."""
    out: list[Any] = []
    sleeps: list[int] = []

    async def sleep(seconds: float) -> None:
        assert seconds == 0
        sleeps.append(len(out))

    monkeypatch.setattr(start_module, "sleep", sleep)
    async for value in middleware.process_start(items(values)):
        out.append(value)
    return out, sleeps


@deferred_f_from_coro_f
async def test_everything_passes_in_order_without_a_turn_inside_the_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values: list[Any] = [scrapy.Request(f"http://a.test/{i}") for i in range(50)]
    values.insert(10, {"an": "item"})
    middleware = StartRequestsMiddleware(clock=FakeClock(0.0, step=start_module.SLICE / 1000))
    out, sleeps = await run(middleware, values, monkeypatch)
    assert out == values
    assert sleeps == []


@deferred_f_from_coro_f
async def test_the_event_loop_gets_a_turn_every_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    # The clock moves by a third of the slice at each read (at the start, after
    # each item and after each turn): every third item ends a slice.
    middleware = StartRequestsMiddleware(clock=FakeClock(0.0, step=start_module.SLICE / 3))
    out, sleeps = await run(middleware, list(range(10)), monkeypatch)
    assert out == list(range(10))
    assert sleeps == [3, 6, 9]


@pytest.mark.parametrize(
    ("user_value", "expected"),
    [(None, 10), (500, 500), ("off", None)],
)
def test_the_addon_enables_it_unless_the_user_placed_it(
    user_value: int | str | None, expected: int | None
) -> None:
    overrides: dict[str, Any] = {}
    if user_value == "off":
        overrides["SPIDER_MIDDLEWARES"] = {NAME: None}
    elif user_value is not None:
        overrides["SPIDER_MIDDLEWARES"] = {NAME: user_value}
    crawler = get_crawler(PageSpider, settings(ADDONS=ADDON, **overrides))
    crawler._apply_settings()
    assert crawler.settings["SPIDER_MIDDLEWARES"][NAME] == expected


class StartWatchingSpider(PageSpider):
    """Records how many responses the spider had parsed when Scrapy read the last start request."""

    parsed_when_start_ended: int | None = None

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            yield scrapy.Request(url)
        self.parsed_when_start_ended = len(self.seen)


@pytest.mark.crawl
@pytest.mark.parametrize(
    "wiring",
    [
        pytest.param({"ADDONS": ADDON}, id="addon"),
        pytest.param({"SPIDER_MIDDLEWARES": {NAME: 10}}, id="scrapy-scheduler"),
        pytest.param({"SPIDER_MIDDLEWARES": {NAME: 10}, "SCHEDULER": SCHEDULER}, id="scheduler"),
    ],
)
@deferred_f_from_coro_f
async def test_responses_are_handled_while_start_requests_are_read(
    local_hosts: HostsFactory, wiring: dict[str, Any]
) -> None:
    """40 pages, then 6,000 start requests the dupefilter drops.

    Scrapy reads them all while its two download slots are busy. Without the middleware the spider
    parses nothing until the last one is read (checked by hand: 0). The host runs in its own
    process: served from a thread of this one, it had to win the GIL from the start loop, and its
    first response could take longer than the whole reading.
    """
    hosts = local_hosts([HostSpec(latency=0.005, pages=100)], process=True)
    pages = [hosts.url(0, f"/page/{i}") for i in range(40)]
    urls = pages + [pages[i % 40] for i in range(6000)]
    crawler = get_crawler(StartWatchingSpider, settings(CONCURRENT_REQUESTS=2, **wiring))
    await crawler.crawl_async(start_urls=urls)
    spider = crawler.spider
    assert isinstance(spider, StartWatchingSpider)
    assert sorted(spider.seen) == sorted(pages)
    assert spider.parsed_when_start_ended is not None
    assert spider.parsed_when_start_ended > 0
    hosts.wait_idle()
    assert hosts.stats(0).served == 40
    assert hosts.stats(0).max_in_flight <= 2


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_a_crawl_closed_while_start_requests_are_read_stops_reading_them(
    local_hosts: HostsFactory,
) -> None:
    """A crawl closed while start requests are read closes cleanly.

    CLOSESPIDER_PAGECOUNT is reached while Scrapy reads start requests (it
    could not be before, since no response was handled meanwhile): the crawl
    closes cleanly and the rest of start() is never read.
    """
    hosts = local_hosts([HostSpec(latency=0.005, pages=100)], process=True)
    pages = [hosts.url(0, f"/page/{i}") for i in range(40)]
    urls = pages + [pages[i % 40] for i in range(200_000)]
    crawler = get_crawler(
        StartWatchingSpider,
        settings(CONCURRENT_REQUESTS=2, CLOSESPIDER_PAGECOUNT=5, ADDONS=ADDON),
    )
    await crawler.crawl_async(start_urls=urls)
    spider = crawler.spider
    assert isinstance(spider, StartWatchingSpider)
    assert spider.parsed_when_start_ended is None
    assert crawler.stats is not None
    assert crawler.stats.get_value("finish_reason") == "closespider_pagecount"
    assert crawler.stats.get_value("log_count/ERROR", 0) == 0
    assert 5 <= len(spider.seen) < 40
