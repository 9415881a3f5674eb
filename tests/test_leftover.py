"""The check at a finished crawl's close.

Nothing may be left in any part of the scheduler (``scrapy_hostqueue._leftover``).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import HostQueueScheduler
from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._leftover import LeftOver
from tests.helpers.crawling import OUR_HANDLER, SCHEDULER, HostsFactory, PageSpider, crawl, settings

LOST = "hostqueue/lost_at_close_count"


def _scheduler(monkeypatch: pytest.MonkeyPatch, **overrides: object) -> HostQueueScheduler:
    """Open a scheduler without an engine.

    The test hands requests out and lets them go as the engine and the downloader would.
    """
    crawler = get_crawler(PageSpider, settings(SCHEDULER=SCHEDULER, **overrides))
    monkeypatch.setattr(internals, "on_request_leaving_downloader", lambda *_: lambda: None)
    scheduler = HostQueueScheduler.from_crawler(crawler)
    scheduler.open(PageSpider())
    return scheduler


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.ERROR and record.name == "scrapy_hostqueue.scheduler"
    ]


def test_a_finished_crawl_with_requests_left_says_so_per_part(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = _scheduler(monkeypatch)
    for url in ("http://a.example/1", "http://a.example/2", "http://b.example/1"):
        assert scheduler.enqueue_request(Request(url))
    handed_out = scheduler.next_request()
    assert handed_out is not None
    # A request of a given-up host, on its way to its errback.
    scheduler.hosts.give_up_request("c.example", Request("http://c.example/1"))
    with caplog.at_level(logging.ERROR):
        scheduler.close("finished")
    [error] = _errors(caplog)
    assert "finished with 4 request(s) left in the scheduler" in error
    assert "2 queued, 1 in flight, 1 handed out, 1 given up, not yet failed" in error
    assert "hosts: a.example, b.example, c.example" in error
    assert scheduler.stats.get_value(LOST) == 4


@deferred_f_from_coro_f
async def test_requests_held_at_the_send_gate_at_close_are_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = _scheduler(
        monkeypatch,
        DOWNLOAD_HANDLERS={"http": OUR_HANDLER, "https": OUR_HANDLER},
        CONCURRENT_REQUESTS_PER_DOMAIN=1,
    )
    assert scheduler.hosts.prefetch == 1
    for page in range(2):
        assert scheduler.enqueue_request(Request(f"http://a.example/{page}"))
    first, second = scheduler.next_request(), scheduler.next_request()
    assert first is not None and second is not None
    gate = scheduler.hosts.gate
    await gate.acquire(first)
    waiting = asyncio.ensure_future(gate.acquire(second))
    await asyncio.sleep(0)
    assert not waiting.done()
    with caplog.at_level(logging.ERROR):
        scheduler.close("finished")
    waiting.cancel()
    [error] = _errors(caplog)
    assert "2 in flight, 2 handed out, 1 at the send gate, 1 on the wire" in error
    assert scheduler.stats.get_value(LOST) == 2


def test_a_crawl_closed_for_another_reason_may_leave_requests(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A stopped crawl (Ctrl-C, CLOSESPIDER_*) leaves its queue by design.
    scheduler = _scheduler(monkeypatch)
    assert scheduler.enqueue_request(Request("http://a.example/1"))
    with caplog.at_level(logging.ERROR):
        scheduler.close("shutdown")
    assert _errors(caplog) == []
    assert scheduler.stats.get_value(LOST) is None


def test_the_log_line_names_a_bounded_number_of_hosts() -> None:
    left = LeftOver()
    for n in range(25):
        left.add("queued", 2, f"h{n}.example")
    left.add("queued", 3, None)  # queued where no live host shows it
    assert left.lost == 53
    text = left.describe(limit=3)
    assert text == "53 queued; hosts: h0.example, h1.example, h2.example (and 22 more)"


def test_the_requests_a_handed_out_request_is_counted_in_count_once() -> None:
    left = LeftOver()
    left.add("in flight", 2, "a")
    left.add("handed out", 2, "a")
    left.add("on the wire", 1, "a")
    left.add("at the send gate", 1, "a")
    left.add("overdue", 1, "a")
    assert left.lost == 2
    left.add("handed out", 1, "b")  # adopted: recorded, not counted by the store
    assert left.lost == 3


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_a_finished_crawl_leaves_nothing(
    local_hosts: HostsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = local_hosts("3x latency=5ms,pages=12,links=3,fault=reset,fault-rate=25%")
    with caplog.at_level(logging.INFO):
        crawler = await crawl(
            [hosts.page_url(i, 0) for i in range(3)],
            follow=True,
            ADDONS={"scrapy_hostqueue.Addon": 0},
            DOWNLOAD_HANDLERS={},
            CONCURRENT_REQUESTS=2,
            HOSTQUEUE_MAX_ACTIVE_HOSTS=1,
            HOSTQUEUE_TURN_REQUESTS=2,
            HOSTQUEUE_TIMELINE_FILE=None,
        )
    assert crawler.stats is not None
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert crawler.stats.get_value(LOST) is None
    assert not [message for message in _errors(caplog) if "left in the scheduler" in message]
