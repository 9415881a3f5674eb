"""AIMDMiddleware in real crawls against local hosts.

Politeness is read at the server (in flight, statuses, arrivals, Retry-After windows).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

import pytest
from scrapy import Request, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import DownloadFailedError, DownloadTimeoutError, IgnoreRequest
from scrapy.http import Response
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue import middleware as middleware_module
from scrapy_hostqueue.frontier import FRONTIER_FILE
from scrapy_hostqueue.frontier.sqlite._store import FrontierFile
from scrapy_hostqueue.middleware import CONNECTION_ERRORS, META_START
from scrapy_hostqueue.scheduler import HostBlocked, HostGivenUp
from scrapy_hostqueue.stats import get_recorder, host_stat_key, stat_key
from scrapy_hostqueue.testing import HostSpec, HostStats, LocalHosts
from tests.helpers.crawling import (
    MIDDLEWARE,
    OUR_HANDLER,
    SCHEDULER,
    SCRAPY_HTTP11,
    DirectDownloadSpider,
    HostsFactory,
    PageSpider,
    Received,
    Reply,
    StoppableSpider,
    dropping_connections,
    interleave,
    serving,
    settings,
)

pytestmark = pytest.mark.crawl

# A hard bound on every crawl here; each test stops its crawl much earlier.
CRAWL_TIMEOUT = 30


def aimd_settings(handler: str = SCRAPY_HTTP11, **overrides: Any) -> dict[str, Any]:
    """Scrapy's HTTP/1.1 handler by default.

    The tests parametrized with ``HANDLERS`` also run with this project's handler (what the add-on
    wires), with which the scheduler hands out prefetched requests. *overrides* replace any of
    these.
    """
    defaults: dict[str, Any] = {
        "SCHEDULER": SCHEDULER,
        "DOWNLOADER_MIDDLEWARES": MIDDLEWARE,
        "DOWNLOAD_HANDLERS": {"http": handler, "https": handler},
        "CONCURRENT_REQUESTS": 40,
        "CLOSESPIDER_TIMEOUT": CRAWL_TIMEOUT,
    }
    return settings(**{**defaults, **overrides})


def make_crawler(handler: str = SCRAPY_HTTP11, **overrides: Any) -> Crawler:
    return get_crawler(StoppableSpider, aimd_settings(handler, **overrides))


HANDLERS = pytest.mark.parametrize(
    "handler", [OUR_HANDLER, SCRAPY_HTTP11], ids=["own-handler", "scrapy-http11"]
)


def spider_of(crawler: Crawler) -> StoppableSpider:
    spider = crawler.spider
    assert isinstance(spider, StoppableSpider)
    return spider


def stat(crawler: Crawler, key: str, default: Any = None) -> Any:
    """Return a stat after the crawl."""
    assert crawler.stats is not None
    return crawler.stats.get_value(key, default)


def live(crawler: Crawler, key: str, default: Any = None) -> Any:
    """Return a per-host stat during the crawl.

    A per-host stat during the crawl (the recorder writes them to the stats
    collector only periodically and at the end).
    """
    return get_recorder(crawler).host_stats().get(key, default)


async def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def record_statuses(crawler: Crawler, hostname: str) -> list[tuple[float, int]]:
    """Record ``(monotonic time, status)`` of every response of *hostname*.

    ``(monotonic time, status)`` of every response of *hostname* as it leaves
    the download handler (429s included: RetryMiddleware swallows those later).
    """
    seen: list[tuple[float, int]] = []

    def downloaded(response: Response, request: Request, spider: Any) -> None:
        if f"//{hostname}:" in response.url:
            seen.append((time.monotonic(), response.status))

    crawler.signals.connect(downloaded, signal=signals.response_downloaded, weak=False)
    return seen


async def loop_freezes(frozen: list[tuple[float, float]]) -> None:
    """Append to *frozen* the spans in which the crawl's event loop could not run.

    On a loaded machine it waited up to 0.66 s for the CPU at a time, 24 s in a
    40 s crawl: the hosts saw gaps between arrivals that the crawl did not
    make. Spans shorter than 0.1 s are not counted. Runs until cancelled.
    """
    while True:
        asked = time.monotonic() + 0.02
        await asyncio.sleep(0.02)
        now = time.monotonic()
        if now - asked > 0.1:
            frozen.append((asked, now))


def frozen_within(frozen: list[tuple[float, float]], start: float, end: float) -> float:
    """Return the seconds between *start* and *end* the crawl's loop was frozen."""
    return sum(max(0.0, min(end, until) - max(start, since)) for since, until in frozen)


# -- AIMD against a host that refuses a 4th concurrent request ------------------

#: Pages of the throttling host after its limit is learnt.
STEADY_PAGES = 150


@deferred_f_from_coro_f
async def test_a_throttling_host_is_learnt_while_healthy_hosts_reach_the_ceiling(
    local_hosts: HostsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = local_hosts(
        [HostSpec(latency=0.1)] * 3 + [HostSpec(latency=0.05, throttle_above=3)], process=True
    )
    throttled = hosts.hostnames[3]
    # Link-following keeps every host's queue full (start URLs only trickle in,
    # one per engine loop turn).
    start = [hosts.url(i) for i in range(4)]
    # Bounds for a loaded machine, where this crawl ran at a tenth of its
    # speed or less: the learning phase took 18 s, and 150 pages of the
    # throttling host 30 s.
    crawler = make_crawler(
        HOSTQUEUE_AIMD_CEILING=8, HOSTQUEUE_AIMD_DEBUG=True, CLOSESPIDER_TIMEOUT=90
    )
    pushbacks = host_stat_key(throttled, "backoff_count/backoff")
    responses = host_stat_key(throttled, "response_count")
    learnt = asyncio.Event()
    learning: list[HostStats] = []

    async def control() -> None:
        # The learning phase: until the host pushed back three times (each one
        # makes the next probe of the refused level rarer), at most 25 s.
        await wait_for(lambda: live(crawler, pushbacks, 0) >= 3, 25)
        learning.extend(hosts.all_stats(arrivals=False))
        hosts.reset()
        learnt.set()
        before = live(crawler, responses, 0)
        # Past three push-backs a probe of the refused level comes at its
        # rarest (MAX_PROBE_PENALTY, counted in responses): 150 pages of the
        # host at the learnt limit show the 429s at their steady rate. Counted
        # in pages, not seconds: on a loaded machine 2.5 s gave 19 pages.
        await wait_for(lambda: live(crawler, responses, 0) - before >= STEADY_PAGES, 45)
        spider_of(crawler).stop_at = time.monotonic()

    controller = asyncio.ensure_future(control())
    frozen: list[tuple[float, float]] = []
    freezes = asyncio.ensure_future(loop_freezes(frozen))
    with caplog.at_level(logging.INFO, logger="scrapy_hostqueue.middleware"):
        await crawler.crawl_async(start_urls=start, follow=True)
    await controller
    freezes.cancel()
    assert learnt.is_set()
    assert stat(crawler, "finish_reason") == "test_done"

    # After learning: never more than 4 in flight, 429 at most 2 % of responses.
    after = hosts.stats(3, arrivals=False)
    assert after.served >= STEADY_PAGES, after
    # The learnt limit is used, not collapsed to the floor, and never exceeded.
    assert 3 <= after.max_in_flight <= 4, after
    assert after.statuses.get(429, 0) <= 0.02 * after.served, after
    # The healthy hosts ran at the ceiling, never above it, and never stalled
    # while the throttled host was held back (a back-off blocks it 1 s at
    # least): no gap of 1 s between two arrivals while the crawl could run.
    for index in range(3):
        healthy = hosts.stats(index)
        assert max(healthy.max_in_flight, learning[index].max_in_flight) == 8, healthy
        assert healthy.statuses.keys() == {200}
        running = [a for a in healthy.arrivals if a < spider_of(crawler).stop_at]
        gaps = [(b - a) - frozen_within(frozen, a, b) for a, b in itertools.pairwise(running)]
        assert max(gaps) < 1.0, (healthy, frozen)
        assert stat(crawler, host_stat_key(hosts.hostnames[index], "max_limit")) == 8
    assert stat(crawler, host_stat_key(throttled, "limit")) <= 4
    # Debug lines for every adjustment, one WARNING for the throttled host.
    assert any(
        r.levelno == logging.INFO and f"AIMD {throttled}: limit" in r.getMessage()
        for r in caplog.records
    )
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert throttled in warnings[0].getMessage()


# -- Retry-After -------------------------------------------------------------


@HANDLERS
@deferred_f_from_coro_f
async def test_retry_after_blocks_the_host_and_only_it(
    local_hosts: HostsFactory, handler: str
) -> None:
    throttle_above, window = 2, 1
    hosts = local_hosts(
        [HostSpec(latency=0.05)] * 2
        + [HostSpec(latency=0.05, throttle_above=throttle_above, retry_after=str(window))],
        process=True,
    )
    blocked = hosts.hostnames[2]
    start = [hosts.url(i) for i in range(3)]
    crawler = make_crawler(handler, HOSTQUEUE_AIMD_CEILING=8)
    responses = record_statuses(crawler, blocked)

    async def control() -> None:
        # One window, and a little after it.
        await wait_for(lambda: any(s == 429 for _, s in responses), 15)
        spider_of(crawler).stop_at = time.monotonic() + window + 0.8

    controller = asyncio.ensure_future(control())
    await crawler.crawl_async(start_urls=start, follow=True)
    await controller
    assert stat(crawler, "finish_reason") == "test_done"

    stats = hosts.stats(2)
    windows = [t for t, s in responses if s == 429]
    assert windows
    assert stats.statuses[429] == len(windows)
    # Inside a window the host sees only requests that were already on their
    # way: at most the others in flight when it answered 429.
    assert stats.in_retry_after_window <= throttle_above * len(windows), stats
    assert stat(crawler, host_stat_key(blocked, "block_count/retry-after")) == len(windows)
    others = [hosts.stats(i).arrivals for i in range(2)]
    # Windows that ended before the crawl stopped (the first one at least).
    complete = [t for t in windows if t + window + 0.5 < spider_of(crawler).stop_at]
    assert complete
    for received in complete:
        # The client learns of the window at ``received``; it ends *window* later.
        end = received + window
        # The host resumes at the end of the window, not at a 5 s heartbeat
        # (a generous stall guard: the benchmark measures how close to the end).
        resumed = [a for a in stats.arrivals if a > received + 0.1]
        assert resumed
        assert end - 0.2 <= resumed[0] <= end + 1.0, (received, resumed[0])
        # The other hosts keep going meanwhile.
        for arrivals in others:
            inside = [a for a in arrivals if received < a < end]
            assert len(inside) >= 10
            # No stall (the engine heartbeat would leave 5 s gaps).
            assert max(b - a for a, b in itertools.pairwise(inside)) < 1.5


@pytest.mark.parametrize(
    ("retry_after", "block_reason", "wait_min", "wait_max"),
    [
        # A future HTTP-date (1 s ahead, rounded up to the second by the host).
        ("date:1", "retry-after", 0.9, 2.5),
        # A date in the past: retry at once, no block.
        ("Sun, 06 Nov 1994 08:49:37 GMT", None, 0.0, 0.5),
        # Unusable values: exponential back-off, base 0.6 s -> 0.3..0.6 s.
        ("soon", "backoff", 0.25, 1.1),
        ("-5", "backoff", 0.25, 1.1),
        # Huge: capped by HOSTQUEUE_RETRY_AFTER_MAX (1 s here, 5 s for the others).
        ("86400000", "retry-after", 0.95, 1.6),
    ],
)
@deferred_f_from_coro_f
async def test_retry_after_values(
    local_hosts: HostsFactory,
    retry_after: str,
    block_reason: str | None,
    wait_min: float,
    wait_max: float,
) -> None:
    # Answers 429 to a 2nd concurrent request; the first burst (start limit 2)
    # gets one.
    hosts = local_hosts([HostSpec(latency=0.05, throttle_above=1, retry_after=retry_after)])
    hostname = hosts.hostnames[0]
    crawler = make_crawler(
        HOSTQUEUE_AIMD_CEILING=2,
        HOSTQUEUE_RETRY_AFTER_MAX=1 if retry_after.isdigit() else 5,
        HOSTQUEUE_BACKOFF_BASE=0.6,
    )
    responses = record_statuses(crawler, hostname)

    def resumed_after_429() -> bool:
        received = next((t for t, s in responses if s == 429), None)
        return received is not None and any(a > received for a in hosts.stats(0).arrivals)

    async def control() -> None:
        await wait_for(lambda: any(s == 429 for _, s in responses), 10)
        # Stopped once the host has its next request, or when it is overdue.
        await wait_for(resumed_after_429, wait_max + 0.3)
        spider_of(crawler).stop_at = time.monotonic()

    controller = asyncio.ensure_future(control())
    await crawler.crawl_async(start_urls=[hosts.url(0)], follow=True)
    await controller

    stats = hosts.stats(0)
    received = next(t for t, s in responses if s == 429)
    resumed = next(a for a in stats.arrivals if a > received)
    assert wait_min <= resumed - received <= wait_max, resumed - received
    blocks = {
        reason: stat(crawler, host_stat_key(hostname, f"block_count/{reason}"), 0)
        for reason in ("retry-after", "backoff")
    }
    if block_reason is None:
        assert blocks == {"retry-after": 0, "backoff": 0}
    else:
        assert blocks[block_reason] >= 1
    assert stat(crawler, host_stat_key(hostname, "backoff_count/backoff")) >= 1


# -- Crawl-delay ------------------------------------------------------------------


@HANDLERS
@deferred_f_from_coro_f
async def test_a_host_not_heard_from_has_one_request_at_a_time(
    local_hosts: HostsFactory, handler: str
) -> None:
    """Two hosts that hang and a site, 8 download slots and a limit of 4.

    The hanging hosts took 4 slots each, all 8, and the site waited for their download timeout. A
    host gets more than one request in flight only once it has answered, so they hold one slot each.
    """
    timeout = 0.5
    # The site's 20 pages take a small part of the timeout, even on a busy
    # machine: had it waited for the hanging requests, it would end after it.
    hosts = local_hosts([HostSpec(fault="hang")] * 2 + [HostSpec(latency=0.01, pages=20)])
    hanging = [hosts.page_url(i, page) for page in range(4) for i in range(2)]
    crawler = make_crawler(
        handler,
        CONCURRENT_REQUESTS=8,
        CONCURRENT_REQUESTS_PER_DOMAIN=4,
        HOSTQUEUE_AIMD_START=4,
        DOWNLOAD_TIMEOUT=timeout,
        RETRY_TIMES=0,
    )
    await crawler.crawl_async(start_urls=hanging + hosts.start_urls(2, 20))
    stats = hosts.all_stats()
    for dead in stats[:2]:
        assert dead.requests == 4, dead
        assert dead.max_in_flight == 1, dead
    site = stats[2]
    assert site.served == 20
    # Once it answered, the site had its limit, and had it long before the
    # first hanging request timed out.
    assert site.max_in_flight == 4
    first_hang = min(dead.arrivals[0] for dead in stats[:2])
    assert max(site.arrivals) < first_hang + timeout


class ChainThenBurstSpider(PageSpider):
    """Fetches ``chain`` pages one after the other, then ``burst`` pages together.

    Fetches ``chain`` pages one after the other (each found on the one
    before), then ``burst`` pages found together on the last of them.
    """

    chain = 30
    burst = 8

    def parse(self, response: Response) -> Iterable[Any]:
        self.seen.append(response.url)
        page = int(response.url.rsplit("/", 1)[1])
        base = response.url.rsplit("/", 1)[0]
        if page < self.chain:
            yield Request(f"{base}/{page + 1}")
        elif page == self.chain:
            for extra in range(self.burst):
                yield Request(f"{base}/{self.chain + 1 + extra}")


@HANDLERS
@deferred_f_from_coro_f
async def test_a_host_answering_one_request_at_a_time_meets_a_burst_at_its_start_limit(
    local_hosts: HostsFactory, handler: str
) -> None:
    # 30 fast answers, never more than one request in flight: they used to
    # raise the limit to the ceiling of 8, and the 8 URLs found next all went
    # to the host at once. A limit is raised only by answers given while it
    # was filled, so the burst starts at 2 and climbs from there.
    hosts = local_hosts([HostSpec(latency=0.02)])
    crawler = get_crawler(ChainThenBurstSpider, aimd_settings(handler, HOSTQUEUE_AIMD_CEILING=8))
    await crawler.crawl_async(start_urls=[hosts.page_url(0, 0)])
    hosts.wait_idle()
    server = hosts.stats(0)
    assert server.served == 1 + 30 + 8, server
    assert server.max_in_flight <= 3, server
    assert stat(crawler, host_stat_key(hosts.hostnames[0], "max_limit")) <= 4


@HANDLERS
@deferred_f_from_coro_f
async def test_a_download_slots_concurrency_is_the_hosts_ceiling_above_the_default(
    local_hosts: HostsFactory, handler: str
) -> None:
    # A project's own API host may take more than every other site.
    hosts = local_hosts([HostSpec(latency=0.05), HostSpec(latency=0.05)])
    big, other = hosts.hostnames
    crawler = make_crawler(
        handler, CONCURRENT_REQUESTS_PER_DOMAIN=2, DOWNLOAD_SLOTS={big: {"concurrency": 6}}
    )
    await crawler.crawl_async(start_urls=hosts.start_urls(0, 120) + hosts.start_urls(1, 60))
    hosts.wait_idle()
    assert stat(crawler, host_stat_key(big, "max_limit")) == 6
    assert stat(crawler, host_stat_key(other, "max_limit")) == 2
    assert 2 < hosts.stats(0).max_in_flight <= 6
    assert hosts.stats(1).max_in_flight <= 2


class QueuedAtOpenSpider(PageSpider):
    """Puts every start URL in the scheduler when the spider opens.

    They go in their order, before anything is handed out. Scrapy reads ``start()`` one request per
    engine loop, handing out requests in between, so the URLs that come late in a long list reach
    the scheduler when the ones before them may already be done.
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> QueuedAtOpenSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.queue_all, signal=signals.spider_opened)
        return spider

    def queue_all(self, spider: Any) -> None:
        assert self.crawler.engine is not None
        for url in self.start_urls:
            self.crawler.engine.crawl(Request(url))

    async def start(self) -> AsyncIterator[Any]:
        return
        yield


@deferred_f_from_coro_f
async def test_hosts_that_hang_do_not_take_the_places_of_hosts_that_answer(
    local_hosts: HostsFactory,
) -> None:
    """Four sites that answer and 16 hosts whose pages hang until the download timeout, 8 places.

    The hanging hosts hold at most half of them while the sites have work, so the sites are not sent
    behind them at the end of each turn.
    """
    healthy, hanging = 4, 16
    hosts = local_hosts(
        [HostSpec(latency=0.01, links=0)] * healthy + [HostSpec(fault="hang")] * hanging,
        process=True,
    )
    first = [hosts.url(i) for i in range(healthy)]
    rest = [url for i in range(healthy) for url in hosts.start_urls(i, 40)[1:]]
    dead = [hosts.url(i) for i in range(healthy, healthy + hanging)]
    # All queued before the first hand-out: read from start() one by one, a
    # site's other pages could come after the 0.1 s its place is kept once
    # its first page is done, and the place would go to a hanging host while
    # the site had no work.
    crawler = get_crawler(
        QueuedAtOpenSpider,
        aimd_settings(
            OUR_HANDLER,
            CONCURRENT_REQUESTS=8,
            CONCURRENT_REQUESTS_PER_DOMAIN=2,
            HOSTQUEUE_TURN_REQUESTS=5,
            # Longer than the sites' pages take (about 0.6 s), and each wave
            # of hanging hosts waits it out: 4 waves at most.
            DOWNLOAD_TIMEOUT=1,
            RETRY_TIMES=0,
        ),
    )
    hanging_hosts = set(hosts.hostnames[healthy:])
    timed_out: list[float] = []

    def left(request: Request, spider: Any) -> None:
        if urlparse(request.url).hostname in hanging_hosts:
            timed_out.append(time.monotonic())

    crawler.signals.connect(left, signal=signals.request_left_downloader, weak=False)
    await crawler.crawl_async(start_urls=first + dead + rest)
    hosts.wait_idle(10)
    stats = hosts.all_stats()
    sites, dead_stats = stats[:healthy], stats[healthy:]
    assert sum(s.served for s in sites) == healthy * 40
    assert all(s.requests == 1 for s in dead_stats)
    assert len(timed_out) == hanging
    # While the sites had work, the hanging hosts held no more than the 4
    # places of their share: at each arrival at a hanging host before the
    # sites' last page, the hanging hosts reached so far, less those whose
    # request had timed out (each freed its place then, not before), are at
    # most 4. The sites' pages usually all come before the first timeout
    # (about 0.6 s); on a loaded machine the places freed at the timeouts go
    # to the next hanging hosts, as they should.
    last_page = max(t for s in sites for t in s.arrivals)
    reached = sorted(t for s in dead_stats for t in s.arrivals if t < last_page)
    held = [
        number - sum(1 for gone in timed_out if gone < arrival)
        for number, arrival in enumerate(reached, 1)
    ]
    assert max(held, default=0) <= 4, (held, reached, sorted(timed_out), last_page)


class FailedDownloads:
    """A downloader middleware that notes every download that failed.

    A downloader middleware next to the download handler that notes the
    host and the exception of every download that failed, in ``failed``
    (a subclass gives its own list).
    """

    failed: ClassVar[list[tuple[str, BaseException]]]

    def process_exception(self, request: Request, exception: BaseException) -> None:
        self.failed.append((urlparse(request.url).hostname or "", exception))


@deferred_f_from_coro_f
async def test_hosts_whose_address_drops_connections_fail_at_the_connect_timeout(
    local_hosts: HostsFactory,
) -> None:
    """Hosts whose address drops connection attempts fail at the connect timeout.

    Two sites and six hosts whose addresses drop connection attempts, with a
    20 s download timeout: each attempt at a dropping host ends after
    HOSTQUEUE_CONNECT_TIMEOUT, so the crawl has its pages, and every attempt
    failed and retried, before a single download timeout could run out.
    """

    class Failed(FailedDownloads):
        failed = []

    hosts = local_hosts([HostSpec(latency=0.01, links=0)] * 2)
    with ExitStack() as stack:
        dead = [
            f"http://{address}:{stack.enter_context(dropping_connections(address))}/"
            for address in (f"127.0.3.{i}" for i in range(1, 7))
        ]
        crawler = make_crawler(
            OUR_HANDLER,
            DOWNLOAD_TIMEOUT=20,
            HOSTQUEUE_CONNECT_TIMEOUT=0.3,
            RETRY_TIMES=1,
            CLOSESPIDER_TIMEOUT=15,
            DOWNLOADER_MIDDLEWARES={**MIDDLEWARE, Failed: 950},
        )
        await crawler.crawl_async(
            start_urls=dead + hosts.start_urls(0, 20) + hosts.start_urls(1, 20)
        )
    hosts.wait_idle()
    assert stat(crawler, "finish_reason") == "finished"
    assert sum(s.served for s in hosts.all_stats()) == 40
    dropping = {urlparse(url).hostname for url in dead}
    at_dropping = [(host, error) for host, error in Failed.failed if host in dropping]
    assert all(isinstance(error, DownloadTimeoutError) for _, error in at_dropping), at_dropping
    # 1 + RETRY_TIMES attempts each.
    assert Counter(host for host, _ in at_dropping) == dict.fromkeys(dropping, 2)
    # A connection to a site fails only if the crawl's process did not run
    # for the whole connect timeout while opening it (a loaded machine: a
    # 0.4 s stall of the event loop then does it every time); its retry
    # fetched the page.
    at_sites = [error for host, error in Failed.failed if host not in dropping]
    assert all(isinstance(error, DownloadTimeoutError) for error in at_sites), at_sites
    timeouts = "downloader/exception_type_count/scrapy.exceptions.DownloadTimeoutError"
    assert stat(crawler, timeouts) == 12 + len(at_sites)
    assert stat(crawler, "retry/count") == 6 + len(at_sites)


class GroupingMiddleware:
    """A project's downloader middleware that puts hosts into one downloader slot.

    A project's downloader middleware (at the template's 543) that puts
    hosts into one downloader slot, as for the subdomains of one site.
    """

    SLOT = "site"

    def process_request(self, request: Request) -> None:
        request.meta["download_slot"] = self.SLOT


def most_in_flight_at_once(arrivals: list[float], shorter_than_latency: float) -> int:
    """Count the most requests that arrived within a window shorter than the latency.

    Each of them was still in flight when the last arrived.
    """
    times = sorted(arrivals)
    most = 0
    for i, t in enumerate(times):
        j = i
        while j >= 0 and t - times[j] < shorter_than_latency:
            j -= 1
        most = max(most, i - j)
    return most


@HANDLERS
@deferred_f_from_coro_f
async def test_a_download_slot_set_by_a_downloader_middleware_is_the_host(
    local_hosts: HostsFactory, handler: str, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = local_hosts([HostSpec(latency=0.2)] * 3)
    crawler = make_crawler(
        handler,
        CONCURRENT_REQUESTS_PER_DOMAIN=4,
        DOWNLOAD_SLOTS={GroupingMiddleware.SLOT: {"concurrency": 2}},
        DOWNLOADER_MIDDLEWARES={**MIDDLEWARE, GroupingMiddleware: 543},
    )
    pages = 3 * 4
    start = [url for i in range(3) for url in hosts.start_urls(i, pages // 3)]
    with caplog.at_level(logging.WARNING, logger="scrapy_hostqueue.middleware"):
        await crawler.crawl_async(start_urls=start)
    hosts.wait_idle()
    stats = [hosts.stats(i) for i in range(3)]
    assert sum(s.served for s in stats) == pages
    arrivals = [t for s in stats for t in s.arrivals]
    # Never more than the slot's 2 in flight across its three hosts.
    assert most_in_flight_at_once(arrivals, 0.15) <= 2
    assert stat(crawler, host_stat_key(GroupingMiddleware.SLOT, "max_limit")) == 2
    assert stat(crawler, stat_key("requeued_count")) >= pages  # each went back once
    warnings = [r for r in caplog.records if "download_slot" in r.getMessage()]
    assert len(warnings) == 1


@HANDLERS
@deferred_f_from_coro_f
async def test_robots_crawl_delay_spaces_request_starts(
    local_hosts: HostsFactory, handler: str
) -> None:
    delay = 0.3
    hosts = local_hosts([HostSpec(latency=0.01, crawl_delay=delay), HostSpec(latency=0.01)])
    free_urls = hosts.start_urls(1, 60)
    start = interleave(hosts.start_urls(0, 4), free_urls[:4]) + free_urls[4:]
    crawler = make_crawler(handler, ROBOTSTXT_OBEY=True, HOSTQUEUE_AIMD_START=4)
    await crawler.crawl_async(start_urls=start)
    hosts.wait_idle()  # the hosts' counters are final
    delayed, free = hosts.stats(0), hosts.stats(1)
    assert delayed.served == 4
    assert delayed.robots_served == 1
    assert delayed.min_gap is not None
    assert delayed.min_gap >= delay - 0.025, delayed.arrivals
    # The other host is not held back by it: while it has pages left it is
    # served in each of the delayed host's waits, and its requests are not
    # spaced. (Which host finishes first is the machine's speed: 60 pages
    # take 0.2 s of an idle machine, 3-5 s of a loaded one.)
    assert free.served == 60
    for earlier, later in itertools.pairwise(delayed.arrivals):
        if earlier < free.arrivals[-1]:
            inside = [a for a in free.arrivals if earlier < a < later]
            assert inside, (delayed.arrivals, free.arrivals)
    assert free.min_gap is not None
    assert free.min_gap < delay / 2, free.arrivals
    assert stat(crawler, stat_key("crawl_delay_host_count")) == 1


@deferred_f_from_coro_f
async def test_crawl_delay_can_be_switched_off(local_hosts: HostsFactory) -> None:
    hosts = local_hosts([HostSpec(latency=0.01, crawl_delay=0.5)])
    crawler = make_crawler(ROBOTSTXT_OBEY=True, HOSTQUEUE_CRAWL_DELAY_ENABLED=False)
    await crawler.crawl_async(start_urls=hosts.start_urls(0, 6))
    hosts.wait_idle()
    stats = hosts.stats(0)
    assert stats.served == 6
    assert stats.min_gap is not None
    assert stats.min_gap < 0.4
    assert stat(crawler, stat_key("crawl_delay_host_count")) is None


# -- error budget -------------------------------------------------------------------


class ErrbackSpider(StoppableSpider):
    """Gives every request an errback and records what each failure was."""

    async def start(self) -> AsyncIterator[Any]:
        self.failures: list[tuple[str, type[BaseException]]] = []
        self.last_errors: list[str | None] = []
        for url in self.start_urls:
            yield Request(url, errback=self.failed)

    def failed(self, failure: Failure) -> None:
        assert isinstance(failure.request, Request)  # type: ignore[attr-defined]
        self.failures.append((failure.request.url, failure.type))  # type: ignore[attr-defined]
        if isinstance(failure.value, HostGivenUp):
            self.last_errors.append(failure.value.last_error)


async def crawl_with_errbacks(
    caplog: pytest.LogCaptureFixture, start_urls: list[str], **overrides: Any
) -> tuple[Crawler, ErrbackSpider]:
    """Run a crawl of :class:`ErrbackSpider` that must finish, with INFO lines captured.

    A crawl of :class:`ErrbackSpider` with the middleware's INFO lines
    captured, which must finish.
    """
    crawler = get_crawler(ErrbackSpider, aimd_settings(**overrides))
    with caplog.at_level(logging.INFO, logger="scrapy_hostqueue.middleware"):
        await crawler.crawl_async(start_urls=start_urls)
    assert stat(crawler, "finish_reason") == "finished"
    spider = crawler.spider
    assert isinstance(spider, ErrbackSpider)
    return crawler, spider


@deferred_f_from_coro_f
async def test_a_refusing_host_is_parked_then_given_up(
    local_hosts: HostsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = local_hosts([HostSpec(refuse=True), HostSpec(latency=0.01)])
    refusing = hosts.hostnames[0]
    start = interleave(hosts.start_urls(0, 30), hosts.start_urls(1, 30))
    crawler, spider = await crawl_with_errbacks(
        caplog,
        start,
        HOSTQUEUE_ERROR_BUDGET=3,
        HOSTQUEUE_ERROR_COOLDOWN=0.2,
        HOSTQUEUE_ERROR_MAX_COOLDOWNS=2,
        RETRY_TIMES=5,
    )
    # Every request of the refusing host reached its errback exactly once:
    # a connection error after its retries, or HostGivenUp once the host was
    # given up (queued then, or a retry that came later).
    failed_urls = [url for url, _ in spider.failures]
    assert sorted(failed_urls) == sorted(hosts.start_urls(0, 30))
    given_up = [url for url, kind in spider.failures if issubclass(kind, HostGivenUp)]
    assert given_up
    others = [kind for _, kind in spider.failures if not issubclass(kind, HostGivenUp)]
    assert all(issubclass(kind, CONNECTION_ERRORS) for kind in others), others
    # Each HostGivenUp names the failure that made the host go.
    assert len(spider.last_errors) == len(given_up)
    error_names = {kind.__name__ for kind in CONNECTION_ERRORS}
    for last_error in spider.last_errors:
        assert last_error is not None
        assert last_error.split(":")[0] in error_names, last_error
    hosts.wait_idle()
    assert hosts.stats(1).served == 30
    assert stat(crawler, stat_key("hosts_parked_count")) == 2
    assert stat(crawler, stat_key("hosts_given_up_count")) == 1
    dropped = stat(crawler, host_stat_key(refusing, "dropped_request_count"))
    assert dropped is not None
    assert dropped > 0
    assert stat(crawler, host_stat_key(refusing, "block_count/error-cooldown")) == 2
    assert stat(crawler, host_stat_key(refusing, "exception_count")) >= 9
    given_up = [r for r in caplog.records if "Giving up host" in r.getMessage()]
    assert len(given_up) == 1
    assert given_up[0].levelno == logging.ERROR
    # Nothing of the refusing host reached the spider.
    assert not [url for url in spider_of(crawler).seen if refusing in url]


@deferred_f_from_coro_f
async def test_a_host_that_answers_only_503_is_given_up(
    local_hosts: HostsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Each 503 blocks the host ever longer (up to HOSTQUEUE_BACKOFF_MAX): without
    # an end, a host under maintenance would hold the crawl's end for hours.
    hosts = local_hosts([HostSpec(status=503), HostSpec(latency=0.01)])
    failing = hosts.hostnames[0]
    start = interleave(hosts.start_urls(0, 10), hosts.start_urls(1, 10))
    crawler, spider = await crawl_with_errbacks(
        caplog,
        start,
        HOSTQUEUE_ERROR_BUDGET=2,
        HOSTQUEUE_ERROR_COOLDOWN=0.2,
        HOSTQUEUE_ERROR_MAX_COOLDOWNS=1,
        HOSTQUEUE_BACKOFF_BASE=0.05,
        HOSTQUEUE_BACKOFF_MAX=0.5,
    )
    assert stat(crawler, stat_key("hosts_parked_count")) == 1
    assert stat(crawler, stat_key("hosts_given_up_count")) == 1
    # Every page of the failing host reached its errback exactly once: a 503
    # after its retries, or HostGivenUp naming the 503.
    assert sorted(url for url, _ in spider.failures) == sorted(hosts.start_urls(0, 10))
    given_up = [url for url, kind in spider.failures if issubclass(kind, HostGivenUp)]
    assert given_up
    assert spider.last_errors
    assert all(error == "HTTP 503" for error in spider.last_errors), spider.last_errors
    # The budget ran out after 4 back-off bursts (2 + 2, around one cool-down).
    hosts.wait_idle()
    assert hosts.stats(0).served <= 4 + 2  # and what was in flight with them
    assert hosts.stats(1).served == 10
    given_up_lines = [r for r in caplog.records if "Giving up host" in r.getMessage()]
    assert len(given_up_lines) == 1
    assert failing in given_up_lines[0].getMessage()


@pytest.mark.parametrize("handler", [SCRAPY_HTTP11, OUR_HANDLER])
@deferred_f_from_coro_f
async def test_a_host_answering_malformed_http_is_not_parked(
    local_hosts: HostsFactory, handler: str
) -> None:
    """A host answering malformed HTTP is not parked as a failing one.

    aiohttp refuses a response with a header line without a colon, which
    Scrapy's aiohttp handler reports as DownloadFailedError, as a reset. The
    host did answer: no failure of the error budget, no cool-down, no giving
    up (the HTTP/1.1 handler skips the line and gets the page).
    """
    hosts = local_hosts([HostSpec(latency=0.01, links=0, fault="malformed")])
    crawler = get_crawler(
        ErrbackSpider,
        aimd_settings(
            handler,
            HOSTQUEUE_ERROR_BUDGET=2,
            HOSTQUEUE_ERROR_COOLDOWN=30,
            RETRY_ENABLED=False,
        ),
    )
    await crawler.crawl_async(start_urls=hosts.start_urls(0, 8))
    assert stat(crawler, "finish_reason") == "finished"
    spider = crawler.spider
    assert isinstance(spider, ErrbackSpider)
    hosts.wait_idle()
    assert hosts.stats(0).served == 8
    if handler == OUR_HANDLER:
        assert len(spider.failures) == 8
        assert all(kind is DownloadFailedError for _, kind in spider.failures), spider.failures
    else:
        assert not spider.failures
        assert len(spider.seen) == 8
    assert stat(crawler, stat_key("hosts_parked_count")) is None
    assert stat(crawler, stat_key("hosts_given_up_count")) is None


# -- a host that turns slow, then recovers --------------------------------------------


@deferred_f_from_coro_f
async def test_a_host_turning_slow_drops_to_the_floor_and_climbs_back(
    local_hosts: HostsFactory,
) -> None:
    hosts = local_hosts([HostSpec(latency=0.02)], process=True)
    hostname = hosts.hostnames[0]
    crawler = make_crawler(HOSTQUEUE_AIMD_CEILING=4, HOSTQUEUE_AIMD_SLOW_LATENCY=0.5)
    responses = record_statuses(crawler, hostname)
    limit_key = host_stat_key(hostname, "limit")
    phases: dict[str, int] = {}

    def limit_is(value: int) -> Callable[[], bool]:
        return lambda: live(crawler, limit_key) == value

    async def control() -> None:
        try:
            assert await wait_for(limit_is(4), 10), "never reached the ceiling"
            hosts.set_spec(0, HostSpec(latency=1.0))
            switched = len(responses)
            assert await wait_for(limit_is(1), 10), "never dropped to the floor"
            phases["to_floor"] = len(responses) - switched
            hosts.set_spec(0, HostSpec(latency=0.02))
            recovered = len(responses)
            assert await wait_for(limit_is(4), 10), "never climbed back"
            phases["back_up"] = len(responses) - recovered
        finally:
            spider_of(crawler).stop_at = 0

    controller = asyncio.ensure_future(control())
    await crawler.crawl_async(start_urls=[hosts.url(0)], follow=True)
    await controller
    # 4 -> 2 -> 1: two decreases, each seen once per burst. A 1 s answer
    # is overdue (past the 0.5 s slow latency) before it arrives: the
    # decrease comes then, and the slow answer is the same burst.
    assert phases["to_floor"] <= 10, phases
    assert 0 < phases["back_up"] <= 60, phases
    decreases = [
        stat(crawler, host_stat_key(hostname, f"backoff_count/{reason}")) or 0
        for reason in ("slow", "overdue")
    ]
    assert sum(decreases) == 2, decreases
    assert stat(crawler, host_stat_key(hostname, "min_limit")) == 1


class FailureWatcher:
    """A project's downloader middleware that treats download exceptions as failures.

    A project's downloader middleware above the AIMD middleware that treats
    every download exception but ``IgnoreRequest`` as a failure (as
    ban-detection and proxy-rotation middlewares do).
    """

    def __init__(self) -> None:
        self.failures: list[Exception] = []
        self.ignored: list[Exception] = []

    def process_exception(self, request: Request, exception: Exception) -> None:
        if isinstance(exception, IgnoreRequest):
            self.ignored.append(exception)
        else:
            self.failures.append(exception)


@deferred_f_from_coro_f
async def test_a_request_waiting_at_the_send_gate_goes_back_when_its_host_is_blocked(
    local_hosts: HostsFactory, tmp_path: Path
) -> None:
    """A request waiting at the send gate goes back to the scheduler on a long block.

    With this project's handler the scheduler hands a host one request
    beyond its limit, which waits at the send gate. When the host answers 429
    with a long Retry-After, that request goes back to the scheduler rather
    than wait at the gate for the block's end: the crawl closes on time and
    JOBDIR keeps the request. It crosses the middlewares above the AIMD
    middleware as an IgnoreRequest, not as a failure.
    """
    close_after = 2
    hosts = local_hosts(
        [HostSpec(latency=0.3, links=0, throttle_above=1, throttle_status=429, retry_after="20")]
    )
    jobdir = tmp_path / "job"
    crawler = get_crawler(
        PageSpider,
        aimd_settings(
            OUR_HANDLER,
            JOBDIR=str(jobdir),
            CONCURRENT_REQUESTS_PER_DOMAIN=2,
            HOSTQUEUE_AIMD_START=2,
            CLOSESPIDER_TIMEOUT=close_after,
            DOWNLOADER_MIDDLEWARES={**MIDDLEWARE, FailureWatcher: 600},
        ),
    )
    began = time.monotonic()
    await crawler.crawl_async(start_urls=hosts.start_urls(0, 10))
    elapsed = time.monotonic() - began
    assert stat(crawler, "finish_reason") == "closespider_timeout"
    # On time, not at the end of the 20 s block the request would wait out.
    assert elapsed < 3 * close_after, elapsed
    assert stat(crawler, stat_key("requeued_count")) >= 1
    assert crawler.engine is not None
    (watcher,) = [
        mw
        for mw in crawler.engine.downloader.middleware.middlewares
        if isinstance(mw, FailureWatcher)
    ]
    assert not watcher.failures, watcher.failures
    assert watcher.ignored
    assert [type(e) for e in watcher.ignored] == [HostBlocked] * len(watcher.ignored)
    server = hosts.stats(0)
    assert server.statuses[429] >= 1
    assert server.in_retry_after_window == 0
    # Nothing lost: what was not answered 200 is in JOBDIR for the next run.
    frontier = FrontierFile(str(jobdir / FRONTIER_FILE), readonly=True)
    saved = sum(count for _, count in frontier.queued_per_host())
    frontier.close()
    assert saved + server.statuses[200] == 10


@deferred_f_from_coro_f
async def test_crawl_delay_holds_at_the_server_when_bodies_are_slow(
    local_hosts: HostsFactory,
) -> None:
    """Crawl-delay holds at the server when bodies are slow.

    The send gate keeps the Crawl-delay from the moment a request went on
    the wire, not from its hand-out: the request after a slow body waits.
    """
    delay = 0.3
    hosts = local_hosts(
        [
            HostSpec(
                latency=0.01,
                links=0,
                crawl_delay=delay,
                fault="slow-body",
                fault_rate=0.5,
                trickle=2 * delay,
            )
        ]
    )
    crawler = get_crawler(
        PageSpider,
        aimd_settings(OUR_HANDLER, ROBOTSTXT_OBEY=True, CONCURRENT_REQUESTS_PER_DOMAIN=1),
    )
    # Pages 2 and 4 are slow: 3 and 5 wait, 4 keeps the delay from 3.
    await crawler.crawl_async(start_urls=hosts.start_urls(0, 5))
    stats = hosts.stats(0)
    assert stats.served == 5
    gaps = [later - earlier for earlier, later in itertools.pairwise(stats.arrivals)]
    assert min(gaps) >= delay - 0.025, gaps


# -- requests that did not come from the scheduler -------------------------------


@HANDLERS
@deferred_f_from_coro_f
async def test_direct_downloads_keep_the_download_delay(
    local_hosts: HostsFactory, handler: str
) -> None:
    """Direct downloads keep the download delay.

    engine.download_async requests (media pipelines) are spaced by the
    host's delay, from the scheduled requests and from each other.
    """
    hosts = local_hosts([HostSpec(latency=0.01, links=0)])
    crawler = get_crawler(
        DirectDownloadSpider,
        aimd_settings(
            handler,
            DOWNLOAD_DELAY=0.2,
            DOWNLOAD_DELAY_JITTER=0,
        ),
    )
    # The moment each request's delay counts from: with this project's
    # handler when the send gate let it onto the wire, with Scrapy's its
    # start past the AIMD middleware (as Scrapy's own delay runs between the
    # downloader's starts).
    spaced_at: list[float] = []

    def downloaded(response: Response, request: Request, spider: Any) -> None:
        if handler != OUR_HANDLER:
            spaced_at.append(request.meta[META_START])

    def opened(spider: Any) -> None:
        if handler != OUR_HANDLER:
            return
        gate = internals.current_scheduler(crawler).hosts.gate
        take = gate.take

        def taken(host: str, request: Request) -> None:
            take(host, request)
            spaced_at.append(gate.store.host_state(host).last_sent)

        gate.take = taken

    crawler.signals.connect(downloaded, signal=signals.response_downloaded, weak=False)
    crawler.signals.connect(opened, signal=signals.spider_opened, weak=False)
    pages = 2
    await crawler.crawl_async(start_urls=hosts.start_urls(0, pages))
    spider = crawler.spider
    assert isinstance(spider, DirectDownloadSpider)
    assert len(spider.direct_statuses) == pages * spider.direct_per_page
    hosts.wait_idle()
    server = hosts.stats(0)
    assert server.served == pages + pages * spider.direct_per_page
    spaced_at.sort()
    assert len(spaced_at) == len(server.arrivals)
    assert min(b - a for a, b in itertools.pairwise(spaced_at)) >= 0.2 - 1e-9, spaced_at
    # The handler then takes its time to get each request to the host: the
    # first opens the connection that the next ones reuse. At the server a
    # gap is the delay less what the earlier request took longer to arrive
    # than the later one (up to 35 ms on a loaded machine).
    transit = [arrival - sent for sent, arrival in zip(spaced_at, server.arrivals, strict=True)]
    assert min(transit) > 0, transit
    assert server.min_gap is not None
    assert server.min_gap >= 0.2 - max(transit), (server.arrivals, transit)


@HANDLERS
@deferred_f_from_coro_f
async def test_direct_downloads_count_against_the_host_limit(
    local_hosts: HostsFactory, handler: str
) -> None:
    """engine.download_async requests wait for a place under the host's limit.

    The host never sees more than the limit, with Scrapy's HTTP/1.1 handler too (6 in flight at a
    limit of 2 before).
    """
    hosts = local_hosts([HostSpec(latency=0.05, links=0)])
    crawler = get_crawler(
        DirectDownloadSpider,
        aimd_settings(handler, CONCURRENT_REQUESTS_PER_DOMAIN=2, HOSTQUEUE_AIMD_START=2),
    )
    await crawler.crawl_async(start_urls=hosts.start_urls(0, 8))
    spider = crawler.spider
    assert isinstance(spider, DirectDownloadSpider)
    assert len(spider.seen) == 8
    assert spider.direct_statuses == [200] * 8 * 3
    hosts.wait_idle()
    server = hosts.stats(0)
    assert server.served == 8 + 8 * 3
    assert server.max_in_flight == 2, server


class SameHostFetchMiddleware:
    """Downloads another page of a host before its first request goes on.

    Before the first request of a host goes on, downloads another page of
    that host with engine.download_async and waits for it (as a login or
    token middleware may).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.fetched: list[int] = []

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> SameHostFetchMiddleware:
        return cls(crawler)

    async def process_request(self, request: Request) -> None:
        if self.fetched or "/page/" not in request.url:
            return
        self.fetched.append(0)
        base = request.url.rsplit("/page/", 1)[0]
        assert self.crawler.engine is not None
        answer = await self.crawler.engine.download_async(Request(f"{base}/page/999"))
        self.fetched.append(answer.status)


async def crawl_fetching_the_same_host(
    caplog: pytest.LogCaptureFixture, hosts: LocalHosts, handler: str, limit: int, pages: int
) -> tuple[Crawler, list[str]]:
    """Crawl *pages* pages of host 0, the first waiting for a download of the same host.

    Crawls *pages* pages of host 0 at *limit* per host, the first of them
    waiting for a download of the same host (SameHostFetchMiddleware).
    Returns the crawler and the WARNING messages of the AIMD middleware.
    """
    crawler = get_crawler(
        PageSpider,
        aimd_settings(
            handler,
            CONCURRENT_REQUESTS_PER_DOMAIN=limit,
            DOWNLOADER_MIDDLEWARES={**MIDDLEWARE, SameHostFetchMiddleware: 100},
        ),
    )
    with caplog.at_level(logging.WARNING, logger="scrapy_hostqueue.middleware"):
        await crawler.crawl_async(start_urls=hosts.start_urls(0, pages))
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "scrapy_hostqueue.middleware" and r.levelno == logging.WARNING
    ]
    return crawler, warnings


@deferred_f_from_coro_f
async def test_a_direct_download_awaited_by_a_request_of_its_host_goes_after_a_while(
    local_hosts: HostsFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At a limit of 1 the waiting request holds the host's only place.

    The download it waits for goes beyond the limit once no request of the host has finished for a
    while, with a WARNING, instead of hanging the crawl.
    """
    patience = 0.5
    monkeypatch.setattr(middleware_module, "_DIRECT_PATIENCE", patience)
    hosts = local_hosts([HostSpec(latency=0.01, links=0)])
    began = time.monotonic()
    crawler, warnings = await crawl_fetching_the_same_host(caplog, hosts, SCRAPY_HTTP11, 1, 3)
    # A stall guard: the download goes after the patience, not at CRAWL_TIMEOUT.
    assert time.monotonic() - began < 20 * patience
    assert stat(crawler, "finish_reason") == "finished"
    spider = crawler.spider
    assert isinstance(spider, PageSpider)
    assert len(spider.seen) == 3
    assert len([w for w in warnings if "beyond the limit" in w]) == 1


@HANDLERS
@deferred_f_from_coro_f
async def test_a_direct_download_awaited_by_the_first_request_of_a_new_host_goes_at_once(
    local_hosts: HostsFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    handler: str,
) -> None:
    """A direct download awaited by a new host's first request goes at once.

    A host not heard from yet is handed one request at a time, but a
    download that request waits for in a downloader middleware is held to
    the host's limit, not to that one request: it goes at once. Before, with
    Scrapy's HTTP/1.1 handler, it waited out the patience (10 s) on every new
    host, then went with a WARNING.
    """
    monkeypatch.setattr(middleware_module, "_DIRECT_PATIENCE", 3.0)
    hosts = local_hosts([HostSpec(latency=0.01, links=0)])
    crawler, warnings = await crawl_fetching_the_same_host(caplog, hosts, handler, 4, 6)
    assert stat(crawler, "finish_reason") == "finished"
    spider = crawler.spider
    assert isinstance(spider, PageSpider)
    assert len(spider.seen) == 6
    assert not [w for w in warnings if "beyond the limit" in w]
    hosts.wait_idle()
    server = hosts.stats(0)
    assert server.served == 6 + 1
    assert server.max_in_flight <= 4, server


@HANDLERS
@deferred_f_from_coro_f
async def test_a_new_host_gets_its_limit_once_its_first_headers_are_in(
    local_hosts: HostsFactory, handler: str
) -> None:
    """A host not heard from yet is handed one request at a time.

    Its first response headers, not the end of a large first body, give it its limit. Before, the
    host's second request reached it only after the whole first body.
    """
    first_body = 0.6
    hosts = local_hosts([HostSpec(latency=0.01, links=0, fault="slow-body", trickle=first_body)])
    crawler = get_crawler(PageSpider, aimd_settings(handler))
    await crawler.crawl_async(start_urls=hosts.start_urls(0, 4))
    spider = crawler.spider
    assert isinstance(spider, PageSpider)
    assert len(spider.seen) == 4
    hosts.wait_idle()
    server = hosts.stats(0)
    assert server.served == 4
    arrivals = sorted(server.arrivals)
    # The second arrived while the first body was still coming.
    assert arrivals[1] - arrivals[0] < 0.6 * first_body, arrivals
    assert server.max_in_flight == 2, server


async def arrivals_after_the_first(
    hosts: LocalHosts, settings: dict[str, Any]
) -> tuple[list[float], HostStats]:
    """Crawls 4 pages of host 0.

    Returns how long after the first each later request reached the host, and the host's counts.
    """
    crawler = get_crawler(PageSpider, settings)
    await crawler.crawl_async(start_urls=hosts.start_urls(0, 4))
    hosts.wait_idle()
    server = hosts.stats(0)
    arrivals = sorted(server.arrivals)
    assert arrivals, server
    return [t - arrivals[0] for t in arrivals[1:]], server


@HANDLERS
@deferred_f_from_coro_f
async def test_a_new_hosts_first_429_with_a_slow_body_sends_nothing_more_before_its_block(
    local_hosts: HostsFactory, handler: str
) -> None:
    """A new host's first 429 with a slow body sends nothing more until its window ends.

    A new host whose first answer is a 429 with a Retry-After does not get
    its limit at those headers: nothing more goes to it while the body comes
    (0.5 s), nor during the Retry-After (1 s) after it. Before, the headers gave
    the host its limit and its next requests went at once.
    """
    body, retry_after = 0.5, 1
    hosts = local_hosts(
        [
            HostSpec(
                latency=0.01,
                links=0,
                status=429,
                retry_after=str(retry_after),
                fault="slow-body",
                trickle=body,
            )
        ]
    )
    # The crawl closes before the block ends: nothing more may reach the host.
    held = body + retry_after * 0.8
    later, server = await arrivals_after_the_first(
        hosts, aimd_settings(handler, CLOSESPIDER_TIMEOUT=held, RETRY_ENABLED=False)
    )
    # The body ends *body* after the first arrival, the block *retry_after* after that.
    assert [t for t in later if t < held] == [], later
    assert server.max_in_flight == 1, server


@pytest.mark.parametrize("prefetch", [1, 0], ids=["send-gate", "no-send-gate"])
@deferred_f_from_coro_f
async def test_with_the_own_handler_a_first_429_without_retry_after_also_holds_the_host(
    local_hosts: HostsFactory, prefetch: int
) -> None:
    """This project's handler tells the scheduler the status before the headers go out.

    A 429 with no Retry-After holds the new host too, for the whole slow body (0.5 s) and the
    back-off after it (HOSTQUEUE_BACKOFF_BASE 1 s: at least 0.5 s), with the send gate or without.
    """
    body, backoff_base = 0.5, 1.0
    hosts = local_hosts(
        [HostSpec(latency=0.01, links=0, status=429, fault="slow-body", trickle=body)]
    )
    later, server = await arrivals_after_the_first(
        hosts,
        aimd_settings(
            OUR_HANDLER,
            CLOSESPIDER_TIMEOUT=body + backoff_base * 0.75,
            RETRY_ENABLED=False,
            HOSTQUEUE_BACKOFF_BASE=backoff_base,
            HOSTQUEUE_PREFETCH=prefetch,
        ),
    )
    assert [t for t in later if t < body + backoff_base / 4] == [], later
    assert server.max_in_flight == 1, server


@deferred_f_from_coro_f
async def test_with_the_own_handler_a_200_with_retry_after_gives_a_new_host_its_limit(
    local_hosts: HostsFactory,
) -> None:
    """Retry-After on a 200 (some CDNs send it) asks for nothing.

    With this project's handler, which reads the status first, the new host gets its limit at those
    headers as usual, and its next request goes while the first body (0.6 s) is still coming.
    """
    arrivals: list[float] = []
    chunks, chunk_delay = 3, 0.2

    def slow_ok(received: Received) -> Reply:
        arrivals.append(time.monotonic())
        return Reply(
            200,
            {"Retry-After": "5"},
            b"",
            chunks=[b"x" * 100] * chunks,
            chunk_delay=chunk_delay,
        )

    async with serving(["127.0.0.3"], slow_ok) as site:
        crawler = make_crawler(OUR_HANDLER, HOSTQUEUE_AIMD_START=2)
        await crawler.crawl_async(start_urls=[site.url("127.0.0.3", f"/p/{n}") for n in range(4)])
    assert len(spider_of(crawler).seen) == 4
    assert site.max_in_flight["127.0.0.3"] == 2
    # The second arrived while the first body was still coming.
    assert arrivals[1] - arrivals[0] < 0.7 * chunks * chunk_delay, arrivals


class StandInMiddleware:
    """Answers every request for a page numbered 1000 or above itself, with *status*.

    Answers every request for a page numbered 1000 or above itself, at
    once, with *status*, as a stand-in or offline middleware may.
    """

    status = 200

    def process_request(self, request: Request) -> Response | None:
        if int(request.url.rsplit("/page/", 1)[1]) < 1000:
            return None
        return Response(request.url, status=self.status, request=request)


class StandIn503Middleware(StandInMiddleware):
    status = 503


class MadeUpThenRealSpider(PageSpider):
    """Queues 60 pages the stand-in middleware answers, then 4 the host does.

    From its first page, queues 60 pages the stand-in middleware answers,
    then 4 the host does.
    """

    def parse(self, response: Response) -> Iterable[Any]:
        yield from super().parse(response)
        if response.url.endswith("/page/0"):
            base = response.url.rsplit("/page/", 1)[0]
            for page in [*range(1000, 1060), *range(1, 5)]:
                yield Request(f"{base}/page/{page}")


@pytest.mark.parametrize("stand_in", [StandInMiddleware, StandIn503Middleware])
@deferred_f_from_coro_f
async def test_responses_a_later_middleware_makes_up_do_not_move_the_limit(
    local_hosts: HostsFactory, stand_in: type[StandInMiddleware]
) -> None:
    """A response a downloader middleware after the AIMD one makes up was not downloaded.

    It says nothing of the host. 60 made-up 200s, answered at once while the host's limit was
    filled, read as fast answers and raised its limit from 2 to the ceiling, 8; made-up 503s blocked
    the host and lowered it. The host's real pages then went under a limit it never earned.
    """
    hosts = local_hosts([HostSpec(latency=0.02, links=0)])
    crawler = get_crawler(
        MadeUpThenRealSpider,
        aimd_settings(
            HOSTQUEUE_AIMD_START=2,
            HOSTQUEUE_AIMD_CEILING=8,
            RETRY_ENABLED=False,
            HTTPERROR_ALLOW_ALL=True,
            DOWNLOADER_MIDDLEWARES={**MIDDLEWARE, stand_in: 700},
        ),
    )
    await crawler.crawl_async(start_urls=[hosts.page_url(0, 0)])
    spider = crawler.spider
    assert isinstance(spider, PageSpider)
    assert len(spider.seen) == 1 + 60 + 4
    host = hosts.hostnames[0]
    # 3 at most: the 4 real pages, answered fast while the limit of 2 was
    # filled, may raise it by one.
    assert stat(crawler, host_stat_key(host, "max_limit")) <= 3
    assert stat(crawler, host_stat_key(host, "min_limit")) == 2
    assert not stat(crawler, host_stat_key(host, "backoff_count/http-503"))
    hosts.wait_idle()
    assert hosts.stats(0).served == 1 + 4


@HANDLERS
@deferred_f_from_coro_f
async def test_a_made_up_response_does_not_give_a_new_host_its_limit(
    local_hosts: HostsFactory, handler: str
) -> None:
    """A response a later downloader middleware makes up is no sign that the host answers.

    After two of them, the host's first real request still goes alone. Before, the made-up one gave
    the host its limit (2) and its first two real pages reached it together.
    """
    hosts = local_hosts([HostSpec(latency=0.3, links=0)])
    made_up = [hosts.page_url(0, page) for page in (1000, 1001)]
    crawler = make_crawler(
        handler,
        HOSTQUEUE_AIMD_START=2,
        DOWNLOADER_MIDDLEWARES={**MIDDLEWARE, StandInMiddleware: 700},
    )
    await crawler.crawl_async(start_urls=[*made_up, *hosts.start_urls(0, 4)])
    assert len(spider_of(crawler).seen) == 2 + 4
    hosts.wait_idle()
    server = hosts.stats(0)
    assert server.served == 4
    arrivals = sorted(server.arrivals)
    # The second real page waits for the first one's answer (0.3 s).
    assert arrivals[1] - arrivals[0] >= 0.25, arrivals


@HANDLERS
@deferred_f_from_coro_f
async def test_redirects_move_the_limit_of_the_host_that_answers_them(
    local_hosts: HostsFactory, handler: str
) -> None:
    """A host that answers with redirects, slowly.

    RedirectMiddleware (600) turns each 302 into a new request before process_response at 560 sees
    it, so the host kept its start limit (4) whatever its pace. Its slow answers now lower it; the
    pages they lead to count for their own host.
    """
    pages = local_hosts([HostSpec(latency=0.01, links=0)])

    def redirect(received: Received) -> Reply:
        page = int(received.target.rsplit("/", 1)[1])
        return Reply(302, {"Location": pages.page_url(0, page)}, b"", head_delay=0.3)

    async with serving(["127.0.0.3"], redirect) as redirecting:
        crawler = make_crawler(
            handler,
            HOSTQUEUE_AIMD_START=4,
            HOSTQUEUE_AIMD_FAST_LATENCY=0.1,
            HOSTQUEUE_AIMD_SLOW_LATENCY=0.2,
        )
        await crawler.crawl_async(
            start_urls=[redirecting.url("127.0.0.3", f"/r/{page}") for page in range(8)]
        )
    assert sorted(spider_of(crawler).seen) == sorted(pages.start_urls(0, 8))
    assert stat(crawler, host_stat_key("127.0.0.3", "min_limit")) < 4
    assert redirecting.max_in_flight["127.0.0.3"] <= 4
    assert stat(crawler, host_stat_key(pages.hostnames[0], "min_limit")) >= 2


class BanRetryMiddleware:
    """Sends a 429 back as a new request itself, as a ban middleware may.

    Sends a 429 back as a new request itself, as a ban or proxy-rotation
    middleware ordered above the AIMD one may (up to 10 times a page).
    """

    def process_response(self, request: Request, response: Response) -> Request | Response:
        tries = request.meta.get("ban_retries", 0)
        if response.status != 429 or tries >= 10:
            return response
        retry = request.replace(dont_filter=True)
        retry.meta["ban_retries"] = tries + 1
        return retry


@HANDLERS
@deferred_f_from_coro_f
async def test_a_429_a_middleware_above_turns_into_a_request_still_blocks_the_host(
    local_hosts: HostsFactory, handler: str
) -> None:
    """A 429 a middleware above turns into a request is never honoured.

    A 429 that a downloader middleware above the AIMD one turns into a new
    request never reaches process_response at 560, and its Retry-After was
    never honoured: the host kept its limit and got requests inside its
    windows. It is learnt from as it is downloaded now.
    """
    hosts = local_hosts([HostSpec(latency=0.05, links=0, throttle_above=1, retry_after="1")])
    crawler = make_crawler(
        handler,
        HOSTQUEUE_AIMD_START=4,
        DOWNLOADER_MIDDLEWARES={**MIDDLEWARE, BanRetryMiddleware: 700},
    )
    await crawler.crawl_async(start_urls=hosts.start_urls(0, 8))
    assert len(spider_of(crawler).seen) == 8
    host = hosts.hostnames[0]
    assert stat(crawler, host_stat_key(host, "block_count/retry-after"), 0) >= 1
    assert stat(crawler, host_stat_key(host, "min_limit")) < 4
    hosts.wait_idle()
    server = hosts.stats(0)
    # The host slowed down at its first 429s and waited out each Retry-After
    # but for requests already on their way. Before: 62 429s, 60 of them to
    # requests sent inside a window.
    assert 1 <= server.statuses.get(429, 0) <= 10, server
    assert server.in_retry_after_window <= 6, server


class OtherHostDownloadSpider(PageSpider):
    """Downloads a page of ``to_host`` on each response from ``from_host``.

    On each response from ``from_host``, downloads a page of ``to_host``
    with ``engine.download_async``.
    """

    from_host = ""
    to_host = ""

    async def parse(self, response: Response) -> AsyncIterator[Any]:  # type: ignore[override]
        self.seen.append(response.url)
        if response.url.startswith(self.from_host):
            assert self.crawler.engine is not None
            answer = await self.crawler.engine.download_async(
                Request(f"{self.to_host}/page/999", dont_filter=True)
            )
            self.statuses.append(answer.status)
        return
        yield


@HANDLERS
@deferred_f_from_coro_f
async def test_a_direct_download_behind_a_silent_hosts_one_request_says_so(
    local_hosts: HostsFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    handler: str,
) -> None:
    """A direct download behind a silent host's one request waits, then goes.

    A silent host has one request on the wire at a time, direct downloads
    (media pipelines) too. One that waited out the patience behind a request
    that does not finish goes as a second, within the limit, and the WARNING
    says why it waited (it used to ask for a limit of 2 or more, which the host
    had). Without the send gate (Scrapy's HTTP/1.1 handler) such a download
    used to go at once, up to the host's limit: a dead host held that many
    download slots.
    """
    monkeypatch.setattr(middleware_module, "_DIRECT_PATIENCE", 0.4)
    hosts = local_hosts([HostSpec(latency=0.01, links=0), HostSpec(latency=1.2, links=0)])
    fast, slow = hosts.start_urls(0, 1)[0], hosts.start_urls(1, 1)[0]
    crawler = get_crawler(OtherHostDownloadSpider, aimd_settings(handler))
    with caplog.at_level(logging.WARNING, logger="scrapy_hostqueue.middleware"):
        await crawler.crawl_async(
            start_urls=[slow, fast],
            from_host=fast.rsplit("/page/", 1)[0],
            to_host=slow.rsplit("/page/", 1)[0],
        )
    spider = crawler.spider
    assert isinstance(spider, OtherHostDownloadSpider)
    assert sorted(spider.seen) == sorted([slow, fast])
    assert spider.statuses == [200]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "silent (not heard from yet" in warnings[0]
    assert "waited 0.4s" in warnings[0]
    assert "within the limit of 2" in warnings[0]
    assert "needs a limit of 2" not in warnings[0]
    hosts.wait_idle()
    assert hosts.stats(1).served == 2
    assert hosts.stats(1).max_in_flight == 2


class BatchDownloadSpider(PageSpider):
    """Downloads three pages of ``to_host`` at once, as a media pipeline does.

    On its one response from ``from_host``, downloads three pages of
    ``to_host`` at once with ``engine.download_async``, as a media pipeline
    does with an item's files.
    """

    from_host = ""
    to_host = ""

    async def parse(self, response: Response) -> AsyncIterator[Any]:  # type: ignore[override]
        self.seen.append(response.url)
        if response.url.startswith(self.from_host):
            engine = self.crawler.engine
            assert engine is not None
            answers = await asyncio.gather(
                *(
                    engine.download_async(Request(f"{self.to_host}/page/{900 + n}"))
                    for n in range(3)
                )
            )
            self.statuses.extend(answer.status for answer in answers)
        return
        yield


class SlowAsyncMiddleware:
    """An async downloader middleware that takes 0.3 s over each request.

    An async downloader middleware after the AIMD one that takes 0.3 s
    over each request before it goes on to the downloader.
    """

    async def process_request(self, request: Request) -> None:
        await asyncio.sleep(0.3)


@deferred_f_from_coro_f
async def test_direct_downloads_behind_an_async_middleware_keep_a_silent_host_at_one(
    local_hosts: HostsFactory,
) -> None:
    """Direct downloads behind an async middleware keep a silent host to one request.

    Without the send gate, a download that skips the scheduler counts
    against a silent host's one request at a time from the moment the AIMD
    middleware lets it go, not from when it reaches the download handler: an
    async middleware after the AIMD one let all three go at once.
    """
    slow = 0.5
    hosts = local_hosts([HostSpec(latency=0.01, links=0), HostSpec(latency=slow, links=0)])
    crawler = get_crawler(
        BatchDownloadSpider,
        aimd_settings(
            SCRAPY_HTTP11,
            HOSTQUEUE_AIMD_START=4,
            DOWNLOADER_MIDDLEWARES={**MIDDLEWARE, SlowAsyncMiddleware: 600},
        ),
    )
    await crawler.crawl_async(
        start_urls=hosts.start_urls(0, 1),
        from_host=hosts.url(0, "/").rstrip("/"),
        to_host=hosts.url(1, "/").rstrip("/"),
    )
    spider = crawler.spider
    assert isinstance(spider, BatchDownloadSpider)
    assert spider.statuses == [200, 200, 200]
    hosts.wait_idle()
    arrivals = sorted(hosts.stats(1).arrivals)
    assert len(arrivals) == 3
    # The second waited for the first one's answer.
    assert arrivals[1] - arrivals[0] >= 0.8 * slow, arrivals


class _TimedSpider(PageSpider):
    """Records when each response arrived (monotonic seconds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrived: dict[str, float] = {}

    def parse(self, response: Response) -> Iterable[Any]:
        self.arrived[response.url] = time.monotonic()
        return super().parse(response)


@HANDLERS
@deferred_f_from_coro_f
async def test_hung_requests_do_not_hold_the_budget_of_hosts_that_answer(
    local_hosts: HostsFactory, handler: str
) -> None:
    """Two hosts hang on their second request, with CONCURRENT_REQUESTS = 2.

    Counted against the budget until their timeout, their hung requests would hold both places and
    the healthy host would wait for the timeout. Overdue after half a second, they no longer count:
    the healthy host's pages start coming before any hung one times out (about 1 s: twice that is
    the timeout).

    A request is overdue after four times its host's usual latency, at least the fast latency and at
    most the slow one: both are half a second here. Left to the defaults, the hanging hosts' first
    answers, which take 0.1-0.2 s on a loaded machine instead of 20 ms, put the overdue time at or
    past the timeout, and there is nothing left to show.
    """
    timeout = 2
    hanging = HostSpec(latency=0.02, links=0, fault="hang", fault_rate=0.5)
    hosts = local_hosts([hanging, hanging, HostSpec(latency=0.02, links=0)])
    crawler = get_crawler(
        _TimedSpider,
        aimd_settings(
            handler,
            CONCURRENT_REQUESTS=2,
            CONCURRENT_REQUESTS_PER_DOMAIN=2,
            DOWNLOAD_TIMEOUT=timeout,
            RETRY_ENABLED=False,
            HOSTQUEUE_AIMD_FAST_LATENCY=0.5,
            HOSTQUEUE_AIMD_SLOW_LATENCY=0.5,
        ),
    )
    healthy = hosts.start_urls(2, 30)
    await crawler.crawl_async(
        start_urls=interleave(hosts.start_urls(0, 3), hosts.start_urls(1, 3)) + healthy
    )
    hosts.wait_idle()
    spider = crawler.spider
    assert isinstance(spider, _TimedSpider)
    assert set(healthy) <= set(spider.arrived)
    # Each hanging host's second request hangs; the first of them to go
    # times out *timeout* later. The healthy host's pages start before that
    # (all 30 of them do too, unless the machine is loaded: they take
    # 2-3 s of a loaded machine, about 0.3 s of an idle one).
    hung_sent = min(hosts.stats(index).arrivals[1] for index in range(2))
    first_page = min(hosts.stats(2).arrivals)
    assert first_page < hung_sent + timeout, (first_page - hung_sent, hosts.all_stats())
    assert crawler.stats is not None
    assert crawler.stats.get_value(stat_key("overdue_count"), 0) >= 2
    for index in range(3):
        assert hosts.stats(index, arrivals=False).max_in_flight <= 2
