"""AIMDMiddleware as a component, without a network.

Start-up checks, and each hook driven directly against a stand-in of the
scheduler's hosts built on the real in-memory store.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable
from email.utils import formatdate
from typing import Any

import pytest
import scrapy
from scrapy import Request
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    IgnoreRequest,
    ResponseDataLossError,
)
from scrapy.http import Headers, Response
from scrapy.robotstxt import ProtegoRobotParser
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.test import get_crawler
from twisted.internet.error import (
    ConnectionLost,
    ConnectionRefusedError,
    DNSLookupError,
    TCPTimedOutError,
)
from twisted.internet.error import TimeoutError as TxTimeoutError
from twisted.web._newclient import ResponseNeverReceived

from scrapy_hostqueue import HostGivenUp, HostQueueScheduler, HostQueueSettingsError
from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._direct import DirectDownloads
from scrapy_hostqueue._hosts import Hosts
from scrapy_hostqueue._requests import RequestTable
from scrapy_hostqueue._sendgate import SendGate, gate_opens_at
from scrapy_hostqueue.frontier.memory import HostState, MemoryStore
from scrapy_hostqueue.middleware import (
    CONNECTION_ERRORS,
    CRAWL_DELAY_MARGIN,
    MAX_REQUEUES,
    META_START,
    AIMDMiddleware,
)
from scrapy_hostqueue.stats import get_recorder, host_stat_key
from scrapy_hostqueue.testing import HostSpec, LocalHosts
from tests.helpers.clock import FakeClock
from tests.helpers.crawling import MIDDLEWARE, SCHEDULER, PageSpider, settings

HOST = "example.com"
URL = f"http://{HOST}/page"


class Unwatched:
    """No event loop here: overdue requests are tested with the watch itself and in crawls."""

    def start(self, hook: Any) -> None:
        pass


class Unrecorded:
    """No stats here: the recorder's events are tested with the recorder and in crawls."""

    def limit_event(self, host: str, old: int, new: int, reason: str) -> None:
        pass

    def blocked(self, host: str, seconds: float, reason: str) -> None:
        pass

    def host_given_up(self, host: str, dropped: int, reason: str) -> None:
        pass


class StandInHosts(Hosts):
    """The scheduler's hosts, as the middleware uses them, on the real in-memory store.

    Without an engine: the real one needs a running crawl.
    """

    def __init__(self, configured: int = 8, remember: int = 10_000, *, gated: bool = False) -> None:
        # No super(): no crawler needed.
        self._policy_hook: Any = None
        self._configured = configured
        self._memory = MemoryStore(self._make_state, remember=remember)
        self.blocks: list[tuple[str, float, str]] = []
        self.limits: list[tuple[str, int]] = []
        self.given_up: list[str] = []
        self.records = RequestTable()
        self.recorder = Unrecorded()  # type: ignore[assignment]
        self.prefetch = 0
        self._global_limit = 0  # no share: these tests look at one host's limit
        # Closed (no prefetch) unless *gated*: most of these tests hold no
        # request at a send gate.
        self.gate = SendGate(
            self.store,
            self.records,
            recorder=None,  # type: ignore[arg-type]
            enabled=gated,
            backoff_codes=(),
            may_send_back=lambda request: False,
            room_changed=lambda host: None,
        )
        self.direct = DirectDownloads(self.store, self.records, self.gate, gated=False)
        self._overdue = Unwatched()  # type: ignore[assignment]

    @property
    def store(self) -> MemoryStore[Request]:  # type: ignore[override]
        return self._memory

    def hand_out(self, request: Request) -> Request:
        """Count *request* as handed out by next_request().

        It is in flight for its host until :meth:`leave`.
        """
        host = self.host_of(request)
        self.records.hand_out(request, host, None)
        self.store.adopt(host, self.store.clock())
        return request

    def leave(self, request: Request) -> None:
        """*request* left the downloader."""
        record = self.records.leave(request)
        assert record is not None
        self.store.finish(record.host)

    def _make_state(self, host: str) -> HostState:
        limit = self._configured
        if self._policy_hook is not None:
            limit = self._policy_hook.initial_limit(host, limit)
        state = HostState(limit, jitter=0.5)
        # Heard from: a host not heard from yet has one request at a time
        # (tested with the store and in crawls), which would hide the
        # limits these tests look at.
        state.answering = True
        return state

    def host_of(self, request: Request) -> str:
        return urlparse_cached(request).hostname or ""

    def set_limit(self, host: str, limit: int) -> None:
        self.store.set_limit(host, limit)
        self.limits.append((host, limit))

    def block_until(self, host: str, when: float, reason: str) -> None:
        self.store.block_until(host, when, reason)
        self.blocks.append((host, when, reason))

    def set_interval(self, host: str, interval: float) -> None:
        self.store.set_interval(host, interval, jitter=0.0)

    def give_up(self, host: str) -> int:
        self.given_up.append(host)
        return len(self.store.give_up(host))


class StandInScheduler(HostQueueScheduler):
    """A scheduler that is only its hosts."""

    def __init__(self, hosts: StandInHosts) -> None:
        # No super(): no crawler needed.
        self.hosts = hosts


def middleware(
    monkeypatch: pytest.MonkeyPatch, hosts: StandInHosts | None = None, **overrides: Any
) -> tuple[AIMDMiddleware, StandInHosts, FakeClock]:
    crawler = get_crawler(
        PageSpider, settings(SCHEDULER=SCHEDULER, DOWNLOADER_MIDDLEWARES=MIDDLEWARE, **overrides)
    )
    mw = AIMDMiddleware.from_crawler(crawler)
    clock = FakeClock(5000.0)
    mw.clock = mw.table.clock = clock
    if hosts is None:
        hosts = StandInHosts()
    hosts.store.clock = clock
    # The scheduler's own crawler: attach_policy connects it to a signal; its
    # recorder keeps what the hosts apply, as the real scheduler's does.
    hosts.crawler = crawler
    hosts.recorder = get_recorder(crawler)
    scheduler = StandInScheduler(hosts)
    monkeypatch.setattr(internals, "current_scheduler", lambda crawler: scheduler)
    mw.spider_opened(PageSpider())
    return mw, hosts, clock


def sent(mw: AIMDMiddleware, url: str = URL, *, scheduled: bool = True) -> Request:
    """Send a request through process_request and return it."""
    request = Request(url)
    if scheduled:
        mw._hosts().hand_out(request)  # type: ignore[attr-defined]
    assert mw.process_request(request) is None
    return request


def response(
    request: Request, status: int = 200, latency: float = 0.01, **headers: str
) -> Response:
    request.meta["download_latency"] = latency
    return Response(request.url, status=status, headers=headers, request=request)


def deliver(mw: AIMDMiddleware, request: Request, answer: Response) -> Response:
    """*answer* comes from the download handler.

    The scheduler hands it to the middleware on response_downloaded, then it crosses
    process_response (crawl tests cover those a middleware makes up).
    """
    mw.learn(request, answer)
    return mw.process_response(request, answer)


def answer(mw: AIMDMiddleware, request: Request, status: int = 200, latency: float = 0.01) -> None:
    """*request* is answered and leaves the downloader."""
    deliver(mw, request, response(request, status, latency))
    mw._hosts().leave(request)  # type: ignore[attr-defined]


def limit(hosts: StandInHosts, host: str = HOST) -> int:
    return hosts.host_state(host).limit


# -- start-up ------------------------------------------------------------------


def test_refuses_to_run_beside_autothrottle() -> None:
    crawler = get_crawler(
        PageSpider,
        settings(SCHEDULER=SCHEDULER, DOWNLOADER_MIDDLEWARES=MIDDLEWARE, AUTOTHROTTLE_ENABLED=True),
    )
    with pytest.raises(HostQueueSettingsError, match="AUTOTHROTTLE_ENABLED") as info:
        AIMDMiddleware.from_crawler(crawler)
    assert "slot delay" in str(info.value)


@deferred_f_from_coro_f
async def test_a_crawl_with_autothrottle_fails_at_start() -> None:
    crawler = get_crawler(
        PageSpider,
        settings(SCHEDULER=SCHEDULER, DOWNLOADER_MIDDLEWARES=MIDDLEWARE, AUTOTHROTTLE_ENABLED=True),
    )
    with pytest.raises(HostQueueSettingsError, match="AutoThrottle"):
        await crawler.crawl_async(start_urls=[])


@deferred_f_from_coro_f
async def test_refuses_to_run_without_hostqueue_scheduler() -> None:
    crawler = get_crawler(PageSpider, settings(DOWNLOADER_MIDDLEWARES=MIDDLEWARE))
    with pytest.raises(HostQueueSettingsError, match="SCHEDULER") as info:
        await crawler.crawl_async(start_urls=[])
    assert "scrapy.core.scheduler.Scheduler" in str(info.value)


class MyScheduler(HostQueueScheduler):
    pass


def test_accepts_a_subclass_of_the_scheduler() -> None:
    crawler = get_crawler(
        PageSpider,
        settings(SCHEDULER=MyScheduler, DOWNLOADER_MIDDLEWARES=MIDDLEWARE),
    )
    assert isinstance(AIMDMiddleware.from_crawler(crawler), AIMDMiddleware)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"HOSTQUEUE_AIMD_START": 9, "HOSTQUEUE_AIMD_CEILING": 8}, "HOSTQUEUE_AIMD_START"),
        ({"HOSTQUEUE_AIMD_FLOOR": 0}, "HOSTQUEUE_AIMD_FLOOR"),
        ({"HOSTQUEUE_AIMD_FAST_LATENCY": -1}, "HOSTQUEUE_AIMD_FAST_LATENCY"),
        ({"HOSTQUEUE_RETRY_AFTER_MAX": "soon"}, "HOSTQUEUE_RETRY_AFTER_MAX"),
        ({"HOSTQUEUE_ERROR_BUDGET": 0}, "HOSTQUEUE_ERROR_BUDGET"),
        ({"HOSTQUEUE_AIMD_BACKOFF_HTTP_CODES": [429, 999]}, "HOSTQUEUE_AIMD_BACKOFF_HTTP_CODES"),
    ],
)
def test_bad_settings_are_refused_naming_them(overrides: dict[str, Any], named: str) -> None:
    crawler = get_crawler(
        PageSpider, settings(SCHEDULER=SCHEDULER, DOWNLOADER_MIDDLEWARES=MIDDLEWARE, **overrides)
    )
    with pytest.raises(HostQueueSettingsError, match=named):
        AIMDMiddleware.from_crawler(crawler)


def test_hosts_known_before_spider_opened_get_the_aimd_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With JOBDIR the scheduler resumes requests (and meets hosts) in open(),
    # before spider_opened attaches the middleware.
    hosts = StandInHosts(configured=8)
    hosts.store.push(HOST, 0, "resumed request")
    assert limit(hosts) == 8
    mw, hosts, _ = middleware(monkeypatch, hosts)
    assert limit(hosts) == 2
    # And hosts met afterwards get it through the hook.
    assert limit(hosts, "other.example") == 2
    assert mw.table.host(HOST).limit == 2


def test_download_slots_concurrency_caps_a_host(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, hosts, _ = middleware(
        monkeypatch,
        StandInHosts(configured=3),
        DOWNLOAD_SLOTS={HOST: {"concurrency": 3}},
        HOSTQUEUE_AIMD_START=4,
    )
    assert limit(hosts) == 3  # AIMD start, but never above the slot's concurrency
    for _ in range(50):
        deliver(mw, request := sent(mw), response(request))
    assert limit(hosts) == 3
    assert limit(hosts, "free.example") == 4


# -- process_request: the hand-out-to-wire race ----------------------------------


def test_process_request_stamps_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, _, clock = middleware(monkeypatch)
    request = sent(mw)
    assert request.meta[META_START] == clock.now


def test_a_request_of_a_host_blocked_meanwhile_goes_back_to_the_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mw, hosts, clock = middleware(monkeypatch)
    hosts.block_until(HOST, clock.now + 2, "retry-after")
    request = hosts.hand_out(Request(URL))
    back = mw.process_request(request)
    assert isinstance(back, Request)
    assert back.url == URL
    assert back.dont_filter
    assert hosts.requeues(back) == 1
    assert META_START not in back.meta
    # Not forever: after MAX_REQUEUES it goes through.
    # A requeued request comes back through the scheduler.
    for _ in range(MAX_REQUEUES - 1):
        back = mw.process_request(hosts.hand_out(back))
        assert isinstance(back, Request)
    assert mw.process_request(hosts.hand_out(back)) is None


def held(outcome: Any) -> Awaitable[Any]:
    """Return what process_request returns for a request it holds: an awaitable."""
    assert outcome is not None
    assert not isinstance(outcome, Request)
    assert inspect.isawaitable(outcome)
    return outcome  # type: ignore[no-any-return]


def direct_middleware(
    monkeypatch: pytest.MonkeyPatch, *, closing: bool = False
) -> tuple[AIMDMiddleware, StandInHosts, FakeClock]:
    """Make the middleware for requests that skip the scheduler."""
    monkeypatch.setattr(internals, "engine_closing", lambda crawler: closing)
    return middleware(monkeypatch)


@deferred_f_from_coro_f
async def test_a_request_not_from_the_scheduler_waits_out_the_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """engine.download_async requests (media pipelines) would loop if sent back to the scheduler.

    They wait in the middleware instead.
    """
    mw, hosts, clock = direct_middleware(monkeypatch)
    hosts.block_until(HOST, clock.now + 2, "retry-after")
    direct = Request(URL)
    waiting = held(mw.process_request(direct))
    clock.now += 2
    assert await waiting is None
    assert direct.meta[META_START] == clock.now
    # robots.txt waits for a block too.
    hosts.block_until(HOST, clock.now + 1, "retry-after")
    robots = held(mw.process_request(Request(f"http://{HOST}/robots.txt")))
    clock.now += 1
    assert await robots is None
    # Not blocked: it goes at once.
    assert mw.process_request(Request(URL)) is None


@deferred_f_from_coro_f
async def test_a_request_not_from_the_scheduler_is_spaced_by_the_host_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mw, hosts, clock = direct_middleware(monkeypatch)
    hosts.set_interval(HOST, 1.0)
    assert mw.process_request(Request(URL)) is None
    # The next start waits the interval after it, scheduled or not.
    assert hosts.store.host_state(HOST).ready_at() == clock.now + 1.0
    waiting = held(mw.process_request(Request(URL)))
    clock.now += 1.0
    assert await waiting is None
    assert hosts.store.host_state(HOST).ready_at() == clock.now + 1.0
    # robots.txt is not spaced (the host's first request waits for it).
    assert mw.process_request(Request(f"http://{HOST}/robots.txt")) is None


def test_the_send_gate_counts_the_interval_from_when_the_headers_go_out() -> None:
    """The send gate counts a host's interval from when a request's headers go out.

    Not from letting it through: opening a connection (a round trip, more with
    TLS) or a busy event loop comes in between, and the next request would
    reach the host that much less than the interval after it. Under load the
    host saw 0.366 s then 0.152 s between pages 0.25 s apart.
    """
    hosts = StandInHosts(gated=True)
    hosts.set_interval(HOST, 1.0)
    gate = hosts.gate
    request = hosts.hand_out(Request(URL))
    gate.take(HOST, request)
    state = hosts.store.host_state(HOST)
    state.last_sent -= 0.5  # let through half a second before its headers go out
    sent = time.monotonic()
    gate.headers_sent(request)
    gap = state.interval * (1 - state.jitter)
    assert gate_opens_at(state) >= sent + gap
    assert not gate.may_send(HOST)
    # A request the gate did not let through (not handed out) changes nothing.
    gate.headers_sent(Request(f"http://{HOST}/other"))
    assert gate_opens_at(state) >= sent + gap


@deferred_f_from_coro_f
async def test_a_request_not_from_the_scheduler_to_a_given_up_host_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mw, hosts, clock = direct_middleware(monkeypatch)
    hosts.block_until(HOST, clock.now + 5, "error-cooldown")
    waiting = held(mw.process_request(Request(URL)))
    hosts.give_up(HOST)
    with pytest.raises(HostGivenUp):
        mw.process_request(Request(URL))
    # One held during the cool-down that ended in the give-up.
    clock.now += 5
    with pytest.raises(HostGivenUp):
        await waiting


@deferred_f_from_coro_f
async def test_a_held_request_not_from_the_scheduler_is_dropped_when_the_crawl_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mw, hosts, clock = direct_middleware(monkeypatch, closing=True)
    hosts.block_until(HOST, clock.now + 300, "retry-after")
    waiting = held(mw.process_request(Request(URL)))
    with pytest.raises(IgnoreRequest, match="closed"):
        await waiting


# -- responses ---------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
def test_a_back_off_status_halves_and_blocks_for_retry_after(
    monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    mw, hosts, clock = middleware(monkeypatch, HOSTQUEUE_AIMD_START=6)
    request = sent(mw)
    clock.now += 0.1
    assert deliver(mw, request, response(request, status, **{"Retry-After": "2"}))
    assert limit(hosts) == 3
    assert hosts.blocks == [(HOST, clock.now + 2, "retry-after")]


def test_other_statuses_are_not_back_offs(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, hosts, _ = middleware(monkeypatch, HOSTQUEUE_AIMD_START=6)
    for status in (500, 404, 302):
        request = sent(mw)
        deliver(mw, request, response(request, status))
    assert limit(hosts) == 6
    assert not hosts.blocks


def test_back_off_codes_are_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, hosts, clock = middleware(
        monkeypatch, HOSTQUEUE_AIMD_START=6, HOSTQUEUE_AIMD_BACKOFF_HTTP_CODES=[500]
    )
    request = sent(mw)
    deliver(mw, request, response(request, 500))
    assert limit(hosts) == 3
    clock.now += 5  # past the back-off block
    request = sent(mw)
    deliver(mw, request, response(request, 429))
    assert limit(hosts) == 3


@pytest.mark.parametrize(
    ("header", "reason", "low", "high"),
    [
        (30, "retry-after", 28.5, 30.5),  # an HTTP-date 30 s ahead
        (-30, None, 0, 0),  # an HTTP-date in the past: retry now
        ("garbage", "backoff", 0.5, 1.0),
        ("-3", "backoff", 0.5, 1.0),
        ("100000", "retry-after", 60, 60),
    ],
)
def test_retry_after_forms(
    monkeypatch: pytest.MonkeyPatch,
    header: str | int,
    reason: str | None,
    low: float,
    high: float,
) -> None:
    if isinstance(header, int):
        header = formatdate(time.time() + header, usegmt=True)
    mw, hosts, clock = middleware(monkeypatch, HOSTQUEUE_RETRY_AFTER_MAX=60)
    request = sent(mw)
    deliver(mw, request, response(request, 429, **{"Retry-After": header}))
    if reason is None:
        assert hosts.blocks == []
        return
    [(host, when, got)] = hosts.blocks
    assert (host, got) == (HOST, reason)
    assert low <= when - clock.now <= high


@pytest.mark.parametrize(
    ("values", "wait"),
    [(["3", "1"], 3.0), (["1", "garbage", "2.5"], 2.5), (["garbage", "4"], 4.0)],
)
def test_of_several_retry_after_headers_the_longest_wait_counts(
    monkeypatch: pytest.MonkeyPatch, values: list[str], wait: float
) -> None:
    mw, hosts, clock = middleware(monkeypatch)
    request = sent(mw)
    request.meta["download_latency"] = 0.01
    answer = Response(
        request.url, status=429, headers=Headers({"Retry-After": values}), request=request
    )
    deliver(mw, request, answer)
    [(_, when, reason)] = hosts.blocks
    assert reason == "retry-after"
    assert when - clock.now == pytest.approx(wait)


@pytest.mark.parametrize(
    ("header", "logged"),
    [
        ("15", "Retry-After 15s"),
        ("900", "Retry-After 900s over HOSTQUEUE_RETRY_AFTER_MAX=60s"),
        ("9" * 26, "Retry-After over HOSTQUEUE_RETRY_AFTER_MAX=60s"),
        ("12345678901.5", "Retry-After over HOSTQUEUE_RETRY_AFTER_MAX=60s"),
        ("soon", "HTTP 429, Retry-After 'soon' unreadable"),
        ("1e3", "HTTP 429, Retry-After '1e3' unreadable"),
    ],
)
def test_the_back_off_warning_says_what_became_of_retry_after(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, header: str, logged: str
) -> None:
    mw, _, _ = middleware(monkeypatch, HOSTQUEUE_RETRY_AFTER_MAX=60)
    request = sent(mw)
    with caplog.at_level(logging.WARNING, logger="scrapy_hostqueue.middleware"):
        deliver(mw, request, response(request, 429, **{"Retry-After": header}))
    (record,) = [r for r in caplog.records if "asked to back off" in r.getMessage()]
    assert logged in record.getMessage()
    assert "inf" not in record.getMessage()
    assert "e+" not in record.getMessage()


def test_a_capped_crawl_delay_is_logged_with_what_robots_txt_asked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mw, hosts, _ = middleware(monkeypatch, ROBOTSTXT_OBEY=True)
    with caplog.at_level(logging.INFO, logger="scrapy_hostqueue.middleware"):
        robots(mw, "User-agent: *\nCrawl-delay: 99999\n")
    assert hosts.host_state(HOST).interval == pytest.approx(30 + CRAWL_DELAY_MARGIN)
    (record,) = [r for r in caplog.records if "Crawl-delay" in r.getMessage()]
    assert "Crawl-delay 30s is obeyed (it asks 99999s; HOSTQUEUE_CRAWL_DELAY_MAX)" in (
        record.getMessage()
    )


def test_one_decrease_per_burst_through_the_middleware(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, hosts, clock = middleware(monkeypatch, HOSTQUEUE_AIMD_START=8)
    burst = [sent(mw, f"{URL}/{i}") for i in range(4)]
    clock.now += 0.05
    for request in burst:
        deliver(mw, request, response(request, 429, **{"Retry-After": "1"}))
    assert limit(hosts) == 4
    assert hosts.limits == [(HOST, 4)]
    stats = get_recorder(mw.crawler).host_stats()
    assert stats[host_stat_key(HOST, "backoff_count/backoff")] == 1
    assert stats[host_stat_key(HOST, "block_count/retry-after")] == 4


def test_fast_and_slow_responses(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, hosts, clock = middleware(
        monkeypatch, HOSTQUEUE_AIMD_SLOW_LATENCY=1.0, HOSTQUEUE_AIMD_FAST_LATENCY=0.2
    )
    # Two in flight at once: the host used its whole limit of 2.
    burst = [sent(mw), sent(mw)]
    for request in burst:
        answer(mw, request, latency=0.05)
    assert limit(hosts) == 3
    clock.now += 1
    request = sent(mw)
    clock.now += 2
    deliver(mw, request, response(request, latency=2.0))
    assert limit(hosts) == 1


def test_only_answers_while_the_host_filled_its_limit_raise_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mw, hosts, clock = middleware(monkeypatch)
    # One request at a time (a host held back by its delay, or short of
    # URLs): it never had its limit of 2 in flight.
    for _ in range(40):
        clock.now += 0.1
        answer(mw, sent(mw))
    assert limit(hosts) == 2
    assert hosts.limits == []
    # Answered while its host has its limit in flight, a request vouches for
    # the limit; so does one that was alone when it started, if a later
    # hand-out filled the limit while it was in flight.
    first = sent(mw)
    clock.now += 0.01
    second = sent(mw)
    clock.now += 0.01
    answer(mw, second)
    assert limit(hosts) == 2
    answer(mw, first)
    assert limit(hosts) == 3


def test_each_request_of_a_burst_that_fills_the_limit_vouches_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The engine hands out a burst in one go; each request passes this
    # middleware a moment later, after the store noted the limit filled.
    mw, hosts, clock = middleware(monkeypatch)
    burst = [hosts.hand_out(Request(f"{URL}/{i}")) for i in range(2)]
    for request in burst:
        clock.now += 0.01
        assert mw.process_request(request) is None
    clock.now += 0.01
    answer(mw, burst[0])  # two in flight: the limit is filled now
    assert limit(hosts) == 2
    answer(mw, burst[1])  # alone now, but sent while two were out
    assert limit(hosts) == 3


def test_a_cached_answer_counts_as_heard_from(monkeypatch: pytest.MonkeyPatch) -> None:
    # A crawl replayed from the HTTP cache is not held to one request per host.
    mw, hosts, _ = middleware(monkeypatch)
    request = sent(mw)
    hosts.store.set_answering(HOST, False)
    mw.process_response(request, Response(URL, status=200, flags=["cached"], request=request))
    state = hosts.host_state(HOST)
    assert state.answering
    assert hosts.store.in_flight_cap(state) == state.limit == 2


def test_cached_and_foreign_responses_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, hosts, _ = middleware(monkeypatch, HOSTQUEUE_AIMD_START=6)
    request = sent(mw)
    cached = Response(URL, status=429, flags=["cached"], request=request)
    mw.process_response(request, cached)
    # Never went through process_request (a middleware above answered it).
    foreign = Request(URL)
    deliver(mw, foreign, Response(URL, status=429, request=foreign))
    assert limit(hosts) == 6
    assert not hosts.blocks


# -- process_exception --------------------------------------------------------------


@pytest.mark.parametrize(
    "exception",
    [
        DownloadConnectionRefusedError("refused"),
        CannotResolveHostError("nxdomain"),
        DownloadTimeoutError("timeout"),
        DownloadFailedError("failed"),
        ResponseDataLossError("truncated"),
        ConnectionRefusedError(),
        DNSLookupError(),
        TCPTimedOutError(),
        TxTimeoutError(),
        ConnectionLost(),
        ResponseNeverReceived([]),
        TimeoutError(),
        ConnectionResetError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_connection_errors_decrease(monkeypatch: pytest.MonkeyPatch, exception: Exception) -> None:
    assert isinstance(exception, CONNECTION_ERRORS)
    mw, hosts, _ = middleware(monkeypatch, HOSTQUEUE_AIMD_START=6)
    request = sent(mw)
    assert mw.process_exception(request, exception) is None
    assert limit(hosts) == 3
    stats = get_recorder(mw.crawler).host_stats()
    assert stats[host_stat_key(HOST, f"exception_type_count/{type(exception).__name__}")] == 1


@pytest.mark.parametrize(
    "exception", [IgnoreRequest(), OSError("empty gzip body"), ValueError("bug")]
)
def test_other_exceptions_are_only_counted(
    monkeypatch: pytest.MonkeyPatch, exception: Exception
) -> None:
    assert not isinstance(exception, CONNECTION_ERRORS)
    mw, hosts, _ = middleware(monkeypatch, HOSTQUEUE_AIMD_START=6)
    mw.process_exception(sent(mw), exception)
    assert limit(hosts) == 6
    assert get_recorder(mw.crawler).host_stats()[host_stat_key(HOST, "exception_count")] == 1


def test_error_budget_parks_then_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, hosts, clock = middleware(
        monkeypatch,
        HOSTQUEUE_ERROR_BUDGET=2,
        HOSTQUEUE_ERROR_COOLDOWN=5,
        HOSTQUEUE_ERROR_MAX_COOLDOWNS=1,
    )
    hosts.store.push(HOST, 0, "queued")
    error = DownloadConnectionRefusedError("refused")
    for _ in range(2):
        clock.now += 1
        mw.process_exception(sent(mw), error)
    assert hosts.blocks == [(HOST, clock.now + 5, "error-cooldown")]
    assert not hosts.given_up
    for _ in range(2):
        clock.now += 10
        mw.process_exception(sent(mw), error)
    assert hosts.given_up == [HOST]
    assert hosts.host_state(HOST).given_up
    stats = mw.crawler.stats
    assert stats is not None
    assert stats.get_value("hostqueue/hosts_parked_count") == 1
    assert stats.get_value("hostqueue/hosts_given_up_count") == 1
    assert stats.get_value("hostqueue/dropped_request_count") == 1
    # Given up once: later failures change nothing.
    mw.process_exception(sent(mw), error)
    assert hosts.given_up == [HOST]


def test_a_failing_host_with_work_queued_keeps_its_error_budget_among_more_hosts_than_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # HOSTQUEUE_REMEMBER_HOSTS bounds the memory of idle hosts; a host with
    # work queued is not idle and must keep what the middleware learned
    # (failures, cool-downs) however many other hosts answer meanwhile.
    mw, hosts, clock = middleware(
        monkeypatch,
        StandInHosts(remember=2),
        HOSTQUEUE_REMEMBER_HOSTS=2,
        HOSTQUEUE_ERROR_BUDGET=2,
        HOSTQUEUE_ERROR_COOLDOWN=5,
        HOSTQUEUE_ERROR_MAX_COOLDOWNS=1,
    )
    hosts.store.push(HOST, 0, "queued")
    error = DownloadConnectionRefusedError("refused")

    def others_answer(first: int) -> None:
        for i in range(first, first + 10):
            answer(mw, sent(mw, f"http://other{i}.test/"))

    for _ in range(2):
        clock.now += 1
        mw.process_exception(sent(mw), error)
    assert hosts.blocks == [(HOST, clock.now + 5, "error-cooldown")]
    others_answer(0)  # during the cool-down
    for _ in range(2):
        clock.now += 10
        mw.process_exception(sent(mw), error)
        others_answer(100)
    assert hosts.given_up == [HOST]
    assert len(mw.table) <= 2 + 2 + 1  # both memories of idle hosts, and HOST


def test_robots_txt_answers_leave_nothing_behind_when_no_idle_host_is_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With HOSTQUEUE_REMEMBER_HOSTS = 0 the scheduler forgets an idle host at
    # once; what the middleware learns from a robots.txt answer (which no
    # scheduler hand-out covers) was kept for good, an entry per host of a
    # broad crawl.
    mw, _, _ = middleware(monkeypatch, StandInHosts(remember=0), HOSTQUEUE_REMEMBER_HOSTS=0)
    for i in range(20):
        request = sent(mw, f"http://other{i}.test/robots.txt", scheduled=False)
        deliver(mw, request, response(request, 503 if i % 2 else 200))
        failing = sent(mw, f"http://failing{i}.test/robots.txt", scheduled=False)
        mw.process_exception(failing, DownloadConnectionRefusedError("refused"))
    assert len(mw.table) == 0


def test_what_was_learned_about_a_host_is_forgotten_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mw, hosts, clock = middleware(monkeypatch, StandInHosts(remember=3), HOSTQUEUE_AIMD_START=4)
    request = sent(mw)
    clock.now += 1
    answer(mw, request, latency=60)  # slow: halved, no block
    assert limit(hosts) == 2
    assert HOST in mw.table
    for i in range(2):
        answer(mw, sent(mw, f"http://other{i}.test/"))
    assert limit(hosts) == 2  # still remembered
    for i in range(2, 6):
        answer(mw, sent(mw, f"http://other{i}.test/"))
    assert HOST not in mw.table
    assert hosts.store.known_state(HOST) is None
    assert limit(hosts) == 4  # met again: from the start
    assert len(mw.table) <= 3 + 1


# -- Crawl-delay ----------------------------------------------------------------


def robots(mw: AIMDMiddleware, body: str, url: str = URL) -> None:
    parser = ProtegoRobotParser(body.encode(), None)
    mw._robots_parsed(parser, Request(url))


@pytest.mark.parametrize(
    ("body", "overrides", "interval"),
    [
        ("User-agent: *\nCrawl-delay: 0.5\n", {}, 0.5 + CRAWL_DELAY_MARGIN),
        ("User-agent: *\nCrawl-delay: 100\n", {}, 30 + CRAWL_DELAY_MARGIN),
        ("User-agent: *\nCrawl-delay: 100\n", {"HOSTQUEUE_CRAWL_DELAY_MAX": 4}, 4.05),
        ("User-agent: *\nDisallow: /x\n", {}, 0.0),
        (
            "User-agent: mybot\nCrawl-delay: 2\n\nUser-agent: *\nCrawl-delay: 7\n",
            {"ROBOTSTXT_USER_AGENT": "mybot"},
            2 + CRAWL_DELAY_MARGIN,
        ),
        (
            "User-agent: mybot\nCrawl-delay: 2\n\nUser-agent: *\nCrawl-delay: 7\n",
            {"USER_AGENT": "mybot/1.0"},
            2 + CRAWL_DELAY_MARGIN,
        ),
    ],
)
def test_crawl_delay_becomes_the_interval_without_jitter(
    monkeypatch: pytest.MonkeyPatch, body: str, overrides: dict[str, Any], interval: float
) -> None:
    mw, hosts, _ = middleware(monkeypatch, ROBOTSTXT_OBEY=True, **overrides)
    robots(mw, body)
    state = hosts.host_state(HOST)
    assert state.interval == pytest.approx(interval)
    if interval:
        assert state.jitter == 0


def test_the_strictest_crawl_delay_of_a_hosts_ports_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, hosts, _ = middleware(monkeypatch, ROBOTSTXT_OBEY=True)
    robots(mw, "User-agent: *\nCrawl-delay: 3\n", f"http://{HOST}:8001/")
    robots(mw, "User-agent: *\nCrawl-delay: 1\n", f"http://{HOST}:8002/")
    assert hosts.host_state(HOST).interval == pytest.approx(3 + CRAWL_DELAY_MARGIN)


def test_a_larger_download_delay_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    mw, hosts, _ = middleware(monkeypatch, ROBOTSTXT_OBEY=True)
    hosts.store.set_interval(HOST, 5.0, jitter=0.0)
    robots(mw, "User-agent: *\nCrawl-delay: 1\n")
    assert hosts.host_state(HOST).interval == 5.0


def test_robots_crawl_delay_holds_requests_already_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests handed out before robots.txt was parsed wait for it past the scheduler.

    They must not all start at once when it arrives.
    """
    mw, hosts, clock = middleware(monkeypatch, ROBOTSTXT_OBEY=True)
    robots(mw, "User-agent: *\nCrawl-delay: 1\n")
    # The robots.txt fetch counts as the previous request: the host is blocked
    # for one delay, and the waiting requests go back to the scheduler.
    assert hosts.blocks == [(HOST, clock.now + 1 + CRAWL_DELAY_MARGIN, "crawl-delay")]
    waiting = [hosts.hand_out(Request(f"{URL}/{i}")) for i in range(3)]
    assert all(isinstance(mw.process_request(request), Request) for request in waiting)
    clock.now += 1 + CRAWL_DELAY_MARGIN
    first = sent(mw)
    assert META_START in first.meta
    # One that comes too soon after goes back too, without blocking the host
    # (which would also hold ``first`` if it is not on the wire yet).
    clock.now += 0.2
    back = mw.process_request(hosts.hand_out(Request(URL + "/2")))
    assert isinstance(back, Request)
    assert hosts.requeues(back) == 1
    assert len(hosts.blocks) == 1
    clock.now += 1
    assert mw.process_request(hosts.hand_out(back)) is None


def test_the_crawl_delay_is_reapplied_when_the_scheduler_forgot_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mw, hosts, clock = middleware(monkeypatch, ROBOTSTXT_OBEY=True)
    robots(mw, "User-agent: *\nCrawl-delay: 1\n")
    hosts._memory = MemoryStore(hosts._make_state)  # forgot every host
    clock.now += 2  # past the block that follows robots.txt
    sent(mw)
    assert hosts.host_state(HOST).interval == pytest.approx(1 + CRAWL_DELAY_MARGIN)


# -- the add-on wiring, end to end --------------------------------------------------


@pytest.mark.parametrize(("user_value", "expected"), [(None, 16), (100, 100), (4, 4)])
def test_the_addon_lowers_concurrent_items_unless_the_user_set_it(
    user_value: int | None, expected: int
) -> None:
    values = {} if user_value is None else {"CONCURRENT_ITEMS": user_value}
    crawler = get_crawler(PageSpider, settings(ADDONS={"scrapy_hostqueue.Addon": 0}, **values))
    crawler._apply_settings()
    assert crawler.settings.getint("CONCURRENT_ITEMS") == expected


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_the_addon_wires_the_middleware_above_retry(local_hosts: Any) -> None:
    hosts: LocalHosts = local_hosts([HostSpec(latency=0.01, pages=20)])
    crawler = get_crawler(PageSpider, settings(ADDONS={"scrapy_hostqueue.Addon": 0}))
    orders: list[str] = []

    def opened(spider: scrapy.Spider) -> None:
        assert crawler.engine is not None
        for mw in crawler.engine.downloader.middleware.middlewares:
            orders.append(type(mw).__name__)

    crawler.signals.connect(opened, signal=scrapy.signals.spider_opened, weak=False)
    await crawler.crawl_async(start_urls=[hosts.url(0)], follow=True)
    assert orders.index("AIMDMiddleware") == orders.index("RetryMiddleware") + 1
    hosts.wait_idle()
    assert hosts.stats(0).served == 20
    stats = get_recorder(crawler).host_stats()
    assert stats[host_stat_key(hosts.hostnames[0], "max_limit")] > 2


def test_a_child_of_a_request_sent_back_often_is_held_by_a_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """How often a request went back is the request's own.

    A request built from its response's meta (``meta=response.meta``) starts from zero and is held
    by its host's block like any other.
    """
    mw, hosts, clock = middleware(monkeypatch)
    hosts.block_until(HOST, clock.now + 2, "retry-after")
    back = mw.process_request(hosts.hand_out(Request(URL)))
    for _ in range(MAX_REQUEUES - 1):
        assert isinstance(back, Request)
        back = mw.process_request(hosts.hand_out(back))
    assert isinstance(back, Request)
    assert hosts.requeues(back) == MAX_REQUEUES
    assert mw.process_request(hosts.hand_out(back)) is None  # goes at last
    child = Request(URL + "/child", meta=back.meta)
    assert hosts.requeues(child) == 0
    assert isinstance(mw.process_request(hosts.hand_out(child)), Request)
