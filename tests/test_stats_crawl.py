"""Per-host stats, the host log line and the timeline in real crawls.

They are checked against the local test hosts' own counts.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from pydispatch import dispatcher
from scrapy import signals
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import HostQueueSettingsError
from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue._timeline import OTHER_HOSTS, read_timeline
from scrapy_hostqueue.monitor._snapshot import BLOCKED_STATES
from scrapy_hostqueue.stats import HostQueueStats, get_recorder, host_stat_key, stat_key
from scrapy_hostqueue.testing import HostSpec, LocalHosts
from tests.helpers.crawling import (
    BASE_SETTINGS,
    OUR_HANDLER,
    SCHEDULER,
    HostsFactory,
    PageSpider,
    crawl,
    interleave,
)

EXTENSION = "scrapy_hostqueue.stats.HostQueueStats"
LIMIT = 4


def stats_settings(**overrides: Any) -> dict[str, Any]:
    extensions = dict(BASE_SETTINGS["EXTENSIONS"])
    extensions[EXTENSION] = 0
    values: dict[str, Any] = {
        "SCHEDULER": SCHEDULER,
        "EXTENSIONS": extensions,
        "CONCURRENT_REQUESTS": 32,
        "CONCURRENT_REQUESTS_PER_DOMAIN": LIMIT,
        "HOSTQUEUE_LOG_INTERVAL": 0,
    }
    values.update(overrides)
    return values


def three_hosts(local_hosts: HostsFactory) -> LocalHosts:
    return local_hosts(
        [
            # Fast: many responses.
            HostSpec(latency=0.01, links=3, pages=60),
            # Slow enough that LIMIT requests are at the server together.
            HostSpec(latency=0.25, links=3, pages=24),
            # Answers 429 at once above 2 in flight.
            HostSpec(latency=0.15, links=3, pages=30, throttle_above=2, throttle_status=429),
        ]
    )


def check_against_server(stats: dict[str, Any], hosts: LocalHosts) -> None:
    for i, hostname in enumerate(hosts.hostnames):
        server = hosts.stats(i, arrivals=False)
        assert server.served > 0

        def value(name: str, hostname: str = hostname) -> Any:
            return stats.get(host_stat_key(hostname, name), 0)

        assert value("response_count") == server.served, hostname
        assert value("request_count") == server.requests, hostname
        # The scheduler counts a request from hand-out until it leaves the
        # downloader, the server from arrival until the response is written:
        # the scheduler's view holds the server's.
        assert value("max_inflight") >= server.max_in_flight, hostname
        for status, count in server.statuses.items():
            assert value(f"status_count/{status}") == count, (hostname, status)
    assert stats[stat_key("hosts_seen_count")] == len(hosts)
    assert stats[stat_key("max_active_hosts")] == len(hosts)


def start_urls(hosts: LocalHosts) -> list[str]:
    return interleave(*(hosts.start_urls(i, 1) for i in range(len(hosts))))


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_stats_match_the_servers_counts(local_hosts: HostsFactory) -> None:
    hosts = three_hosts(local_hosts)
    # RetryMiddleware turns most 429s into retries, so they never reach the
    # engine (no response_received): they are counted all the same.
    crawler = await crawl(start_urls(hosts), follow=True, **stats_settings(RETRY_ENABLED=True))
    assert crawler.stats is not None
    stats = crawler.stats.get_stats()
    check_against_server(stats, hosts)
    # On a host slow enough to hold every request at the server together, the
    # two views meet: the limit is reached on both sides.
    slow = hosts.stats(1, arrivals=False)
    assert slow.max_in_flight == LIMIT
    assert stats[host_stat_key(hosts.hostnames[1], "max_inflight")] == LIMIT
    assert hosts.stats(2, arrivals=False).statuses.get(429, 0) > 0
    assert stats[host_stat_key(hosts.hostnames[1], "latency_mean")] >= 0.25
    assert stats[host_stat_key(hosts.hostnames[1], "latency_p95")] >= 0.25
    assert not any(OTHER_HOSTS in key for key in stats)


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_hosts_beyond_the_cap_share_one_key(local_hosts: HostsFactory) -> None:
    hosts = local_hosts([HostSpec(latency=0.005, links=2, pages=6 + 4 * i) for i in range(5)])
    crawler = await crawl(
        start_urls(hosts), follow=True, **stats_settings(HOSTQUEUE_STATS_MAX_HOSTS=2)
    )
    assert crawler.stats is not None
    stats = crawler.stats.get_stats()
    per_host = {key.split("/")[2] for key in stats if key.startswith("hostqueue/hosts/")}
    assert len(per_host) == 3
    assert OTHER_HOSTS in per_host
    served = sum(hosts.stats(i, arrivals=False).served for i in range(len(hosts)))
    # A host that got its entry late has its earlier responses under the
    # aggregate key (and may have none of its own): the sum is exact.
    responses = sum(stats.get(host_stat_key(host, "response_count"), 0) for host in per_host)
    assert responses == served


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_with_prefetch_the_log_line_stats_and_timeline_count_requests_on_the_wire(
    local_hosts: HostsFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # With this project's handler the scheduler hands a host one request
    # beyond its limit, which waits at the send gate: the in-flight figures
    # users read count what was sent, as the host does.
    hosts = local_hosts([HostSpec(latency=0.05)])
    timeline = tmp_path / "timeline.jsonl"
    caplog.set_level(logging.INFO, logger="scrapy_hostqueue.stats")
    crawler = await crawl(
        hosts.start_urls(0, 60),
        **stats_settings(
            DOWNLOAD_HANDLERS={"http": OUR_HANDLER, "https": OUR_HANDLER},
            HOSTQUEUE_LOG_INTERVAL=0.05,
            HOSTQUEUE_TIMELINE_FILE=str(timeline),
            HOSTQUEUE_TIMELINE_INTERVAL=0.05,
        ),
    )
    assert crawler.stats is not None
    host = hosts.hostnames[0]
    assert hosts.stats(0, arrivals=False).max_in_flight == LIMIT
    assert crawler.stats.get_value(host_stat_key(host, "max_inflight")) == LIMIT
    assert crawler.stats.get_value(host_stat_key(host, "max_handed_out")) == LIMIT + 1
    shown = [
        int(match.group(1))
        for r in caplog.records
        if r.getMessage().startswith("Hosts: ")
        for match in re.finditer(rf"{re.escape(host)} (\d+)/{LIMIT}", r.getMessage())
    ]
    assert shown
    assert max(shown) <= LIMIT
    sampled = [row["in_flight"] for row in read_timeline(str(timeline)) if row["host"] == host]
    assert sampled
    assert max(sampled) <= LIMIT


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_log_line_and_timeline(
    local_hosts: HostsFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = three_hosts(local_hosts)
    timeline = tmp_path / "timeline.jsonl"
    caplog.set_level(logging.INFO, logger="scrapy_hostqueue.stats")
    crawler = await crawl(
        start_urls(hosts),
        follow=True,
        **stats_settings(
            HOSTQUEUE_LOG_INTERVAL=0.2,
            HOSTQUEUE_TIMELINE_FILE=str(timeline),
            HOSTQUEUE_TIMELINE_INTERVAL=0.1,
        ),
    )
    assert crawler.stats is not None

    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Hosts: ")]
    assert lines
    assert any(f"{hosts.hostnames[1]} " in line for line in lines)

    hosts.wait_idle()  # the last answers counted at the hosts
    rows = read_timeline(str(timeline))
    times = sorted({row["t"] for row in rows})
    assert len(times) >= 3
    # One aggregate row per interval, at most one row per host per interval.
    assert sum(1 for row in rows if row["host"] == OTHER_HOSTS) == len(times)
    assert len({(row["t"], row["host"]) for row in rows}) == len(rows)
    for i, hostname in enumerate(hosts.hostnames):
        host_rows = [row for row in rows if row["host"] == hostname]
        server = hosts.stats(i, arrivals=False)
        assert sum(row["fetched"] for row in host_rows) == server.served
        assert max(row["in_flight"] for row in host_rows) <= LIMIT
        assert {row["limit"] for row in host_rows} <= {LIMIT, None}
    assert max(row["in_flight"] for row in rows if row["host"] == hosts.hostnames[1]) >= 2

    png, page = tmp_path / "chart.png", tmp_path / "chart.html"
    assert cli(["plot", str(timeline), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli(["plot", str(timeline), "-o", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert text.count("<polyline") >= 2 * len(hosts)
    assert hosts.hostnames[0] in text
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_a_dead_host_shows_its_failed_downloads_in_the_timeline(
    local_hosts: HostsFactory, tmp_path: Path
) -> None:
    # A host that refuses connections answers nothing: without failures in
    # the timeline it was a flat 0, like an idle host.
    hosts = local_hosts([HostSpec(latency=0.01, pages=20), HostSpec(refuse=True)])
    up, down = hosts.hostnames
    timeline = tmp_path / "timeline.jsonl"
    crawler = await crawl(
        hosts.start_urls(0, 20) + [hosts.page_url(1, page) for page in range(5)],
        **stats_settings(HOSTQUEUE_TIMELINE_FILE=str(timeline), HOSTQUEUE_TIMELINE_INTERVAL=0.1),
    )
    assert crawler.stats is not None
    attempts = crawler.stats.get_value("downloader/exception_count")
    assert attempts == 5 * 3  # each URL and its 2 retries
    rows = read_timeline(str(timeline))
    assert sum(row["failed"] for row in rows if row["host"] == down) == attempts
    assert sum(row["fetched"] for row in rows if row["host"] == down) == 0
    assert sum(row["failed"] for row in rows if row["host"] == up) == 0
    assert sum(row["fetched"] for row in rows if row["host"] == up) == hosts.stats(0).served
    page = tmp_path / "chart.html"
    assert cli(["plot", str(timeline), "-o", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.count("<svg") == 3
    assert down in text


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_requests_the_send_gate_sends_back_are_not_failed_downloads(
    local_hosts: HostsFactory, tmp_path: Path
) -> None:
    # With the add-on a request waits at the send gate; when its host answers
    # 429 with Retry-After it goes back to the scheduler: no download failed.
    hosts = local_hosts(
        [HostSpec(latency=0.05, pages=30, throttle_above=2, retry_after="0.5", links=0)]
    )
    timeline = tmp_path / "timeline.jsonl"
    crawler = await crawl(
        hosts.start_urls(0, 30),
        **stats_settings(
            ADDONS={"scrapy_hostqueue.Addon": 0},
            DOWNLOAD_HANDLERS={"http": OUR_HANDLER, "https": OUR_HANDLER},
            HOSTQUEUE_AIMD_START=4,
            HOSTQUEUE_TIMELINE_FILE=str(timeline),
            HOSTQUEUE_TIMELINE_INTERVAL=0.1,
        ),
    )
    assert crawler.stats is not None
    sent_back = "downloader/exception_type_count/scrapy_hostqueue.exceptions.HostBlocked"
    assert crawler.stats.get_value(sent_back, 0) >= 1
    rows = read_timeline(str(timeline))
    assert sum(row["failed"] for row in rows) == 0
    assert hosts.stats(0).served >= 30


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_the_log_line_shows_a_hosts_download_delay(
    local_hosts: HostsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A host held back by its delay has room and work.

    Without the delay shown, the line made it look idle.
    """
    # The second host, without a delay, is busy for about 0.5 s.
    hosts = local_hosts([HostSpec(latency=0.005), HostSpec(latency=0.05)])
    caplog.set_level(logging.INFO, logger="scrapy_hostqueue.stats")
    await crawl(
        [*hosts.start_urls(0, 4), *hosts.start_urls(1, 40)],
        **stats_settings(
            HOSTQUEUE_LOG_INTERVAL=0.1,
            DOWNLOAD_SLOTS={hosts.hostnames[0]: {"delay": 0.3}},
        ),
    )
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Hosts: ")]
    delayed = re.compile(rf"{re.escape(hosts.hostnames[0])} \d+/\d+ \(delay 0.3s\)")
    assert any(delayed.search(line) for line in lines)
    undelayed = re.compile(rf"{re.escape(hosts.hostnames[1])} \d+/\d+ \(delay")
    assert any(f"{hosts.hostnames[1]} " in line for line in lines)
    assert not any(undelayed.search(line) for line in lines)


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_the_log_line_and_timeline_show_a_silent_hosts_one_request(
    local_hosts: HostsFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With the add-on a host that has not answered has one request at a time whatever its limit.

    The log line and the timeline show that one, and the line says why. They showed the limit, 4,
    next to the 1 in flight.
    """
    hosts = local_hosts([HostSpec(latency=0.02, links=0), HostSpec(fault="hang", links=0)])
    timeline = tmp_path / "timeline.jsonl"
    caplog.set_level(logging.INFO, logger="scrapy_hostqueue.stats")
    await crawl(
        [*hosts.start_urls(0, 30), *hosts.start_urls(1, 2)],
        **stats_settings(
            ADDONS={"scrapy_hostqueue.Addon": 0},
            DOWNLOAD_HANDLERS={"http": OUR_HANDLER, "https": OUR_HANDLER},
            HOSTQUEUE_AIMD_START=4,
            HOSTQUEUE_LOG_INTERVAL=0.1,
            HOSTQUEUE_TIMELINE_FILE=str(timeline),
            HOSTQUEUE_TIMELINE_INTERVAL=0.1,
            DOWNLOAD_TIMEOUT=0.6,
            RETRY_ENABLED=False,
        ),
    )
    hanging = hosts.hostnames[1]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Hosts: ")]
    silent = f"{hanging} 1/1 (silent, 1 at a time until it answers; limit 4)"
    assert any(silent in line for line in lines), lines
    assert not any(f"{hanging} 1/4" in line for line in lines), lines
    limits = {row["limit"] for row in read_timeline(str(timeline)) if row["host"] == hanging}
    assert limits == {1}, limits
    hosts.wait_idle()
    assert hosts.stats(1).max_in_flight == 1


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_timeline_under_the_stock_scheduler(
    local_hosts: HostsFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The comparison run, on Scrapy's own scheduler.

    With Scrapy's own scheduler the timeline still shows requests in the downloader and responses
    per host.
    """
    hosts = local_hosts(
        [HostSpec(latency=0.005, links=3, pages=40), HostSpec(latency=0.3, links=3, pages=12)]
    )
    timeline = tmp_path / "timeline.jsonl"
    settings = stats_settings(
        HOSTQUEUE_TIMELINE_FILE=str(timeline),
        HOSTQUEUE_TIMELINE_INTERVAL=0.1,
        HOSTQUEUE_LOG_INTERVAL=0.2,
    )
    del settings["SCHEDULER"]
    caplog.set_level(logging.INFO, logger="scrapy_hostqueue.stats")
    crawler = await crawl(start_urls(hosts), follow=True, **settings)
    assert crawler.stats is not None
    assert "not HostQueueScheduler" in caplog.text
    assert any(
        r.getMessage().startswith("Hosts: ") and "in the downloader" in r.getMessage()
        for r in caplog.records
    )
    rows = read_timeline(str(timeline))
    for i, hostname in enumerate(hosts.hostnames):
        host_rows = [row for row in rows if row["host"] == hostname]
        assert sum(row["fetched"] for row in host_rows) == hosts.stats(i, arrivals=False).served
        assert all(row["queued"] is None and row["limit"] is None for row in host_rows)
    # Sampled every 0.1 s: the slow host (0.3 s a page, 12 pages) is always
    # caught with requests in flight; the fast one may finish between samples.
    slow_rows = [row for row in rows if row["host"] == hosts.hostnames[1]]
    assert max(row["in_flight"] for row in slow_rows) >= 1
    assert all(row["queued"] is None for row in rows if row["host"] == OTHER_HOSTS)


class ClosingSpider(PageSpider):
    """Reads the stats in ``closed()``, as spiders and extensions that report do.

    Reads the stats in ``closed()``, as spiders and extensions that save or
    send stats at the end do.
    """

    at_close: dict[str, Any]

    def closed(self, reason: str) -> None:
        assert self.crawler.stats is not None
        self.at_close = dict(self.crawler.stats.get_stats())


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_per_host_stats_are_in_place_when_the_spider_closes(
    local_hosts: HostsFactory,
) -> None:
    hosts = local_hosts([HostSpec(latency=0.005, links=0)])
    crawler = await crawl(hosts.start_urls(0, 3), spider_cls=ClosingSpider, **stats_settings())
    assert isinstance(crawler.spider, ClosingSpider)
    assert crawler.spider.at_close.get(host_stat_key(hosts.hostnames[0], "response_count")) == 3


class ReceiverSpider(PageSpider):
    """Notes, when it closes, which per-request signals reach the extension."""

    receivers: set[str]

    def closed(self, reason: str) -> None:
        extension = {
            method: getattr(HostQueueStats, method)
            for method in (
                "request_reached_downloader",
                "request_left_downloader",
                "response_downloaded",
            )
        }
        self.receivers = set()
        for signal in (
            signals.request_reached_downloader,
            signals.request_left_downloader,
            signals.response_downloaded,
        ):
            live = dispatcher.liveReceivers(
                dispatcher.getAllReceivers(self.crawler.signals.sender, signal)
            )
            for receiver in live:
                # Only this crawl's: every crawler's signals share one sender,
                # and a crawler kept alive elsewhere (log records of another
                # test hold requests) still has its receivers connected.
                if getattr(getattr(receiver, "__self__", None), "crawler", None) is not (
                    self.crawler
                ):
                    continue
                for name, function in extension.items():
                    if getattr(receiver, "__func__", None) is function:
                        self.receivers.add(name)


@pytest.mark.crawl
@pytest.mark.parametrize(
    ("scheduler", "timeline", "expected"),
    [
        # The scheduler's frontier knows every host's requests: no count needed.
        (SCHEDULER, False, set()),
        (
            SCHEDULER,
            True,
            {"request_reached_downloader", "request_left_downloader", "response_downloaded"},
        ),
        # The stock scheduler's log line counts requests in the downloader.
        (None, False, {"request_reached_downloader", "request_left_downloader"}),
    ],
)
@deferred_f_from_coro_f
async def test_per_request_receivers_only_where_their_counts_are_read(
    local_hosts: HostsFactory,
    tmp_path: Path,
    scheduler: str | None,
    timeline: bool,
    expected: set[str],
) -> None:
    hosts = local_hosts([HostSpec(latency=0.005, links=0)])
    settings = stats_settings(HOSTQUEUE_LOG_INTERVAL=60)
    if timeline:
        settings["HOSTQUEUE_TIMELINE_FILE"] = str(tmp_path / "timeline.jsonl")
    if scheduler is None:
        del settings["SCHEDULER"]
    crawler = await crawl(hosts.start_urls(0, 3), spider_cls=ReceiverSpider, **settings)
    assert isinstance(crawler.spider, ReceiverSpider)
    assert crawler.spider.receivers == expected
    assert hosts.stats(0, arrivals=False).served == 3


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_an_empty_crawl_timeline_says_nothing_is_queued(tmp_path: Path) -> None:
    """``null`` means a scheduler that does not tell its queues.

    This one does, and had nothing queued.
    """
    timeline = tmp_path / "timeline.jsonl"
    await crawl([], **stats_settings(HOSTQUEUE_TIMELINE_FILE=str(timeline)))
    rows = read_timeline(str(timeline))
    assert rows
    assert all(row["host"] == OTHER_HOSTS and row["queued"] == 0 for row in rows), rows


class OtherSpider(PageSpider):
    name = "other"


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_two_crawls_of_one_process_do_not_write_one_timeline(
    local_hosts: HostsFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Both crawls opened the file for writing and cut each other's rows.

    The second now writes none and says so, and %(name)s gives each its own.
    """
    hosts = local_hosts([HostSpec(latency=0.01), HostSpec(latency=0.01)])

    async def both(path: str) -> None:
        settings = stats_settings(HOSTQUEUE_TIMELINE_FILE=path, HOSTQUEUE_TIMELINE_INTERVAL=0.05)
        crawlers = [
            get_crawler(spider, {**BASE_SETTINGS, **settings})
            for spider in (PageSpider, OtherSpider)
        ]
        await asyncio.gather(
            *(
                crawler.crawl_async(start_urls=hosts.start_urls(i, 30))
                for i, crawler in enumerate(crawlers)
            )
        )

    caplog.set_level(logging.INFO, logger="scrapy_hostqueue.stats")
    shared = tmp_path / "timeline.jsonl"
    await both(str(shared))
    hosts.wait_idle()  # the last answers counted at the hosts
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "another crawl of this process" in errors[0], errors
    # The file reads, and holds one crawl's rows, all of them.
    rows = read_timeline(str(shared))
    (host,) = {row["host"] for row in rows} - {OTHER_HOSTS}
    served = hosts.stats(hosts.hostnames.index(host), arrivals=False).served
    assert sum(row["fetched"] for row in rows if row["host"] == host) == served == 30

    caplog.clear()
    hosts.reset()
    await both(str(tmp_path / "%(name)s.jsonl"))
    hosts.wait_idle()  # the last answers counted at the hosts
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]
    for name, i in (("pages", 0), ("other", 1)):
        rows = read_timeline(str(tmp_path / f"{name}.jsonl"))
        fetched = sum(row["fetched"] for row in rows if row["host"] == hosts.hostnames[i])
        assert fetched == hosts.stats(i, arrivals=False).served == 30


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_the_closing_line_gives_a_plot_command_that_runs(
    local_hosts: HostsFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = local_hosts([HostSpec(latency=0.01)])
    timeline = tmp_path / "host timeline.jsonl"
    caplog.set_level(logging.INFO, logger="scrapy_hostqueue.stats")
    await crawl(hosts.start_urls(0, 5), **stats_settings(HOSTQUEUE_TIMELINE_FILE=str(timeline)))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Host timeline")]
    command = line.split("draw it: ", 1)[1].rstrip(")")
    # The path has a space: quoted, it stays one argument; HTML needs no extra.
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "scrapy_hostqueue", "plot"], words
    assert cli(words[3:]) == 0
    assert (tmp_path / "host timeline.html").read_text(encoding="utf-8").startswith("<!DOCTYPE")


def test_timeline_file_placeholders_are_checked_at_start() -> None:
    settings = stats_settings(HOSTQUEUE_TIMELINE_FILE="/tmp/%(spider)s.jsonl")
    with pytest.raises(HostQueueSettingsError, match=r"HOSTQUEUE_TIMELINE_FILE.*%\(name\)s"):
        HostQueueStats.from_crawler(get_crawler(PageSpider, settings))


#: The host log line, with the monitor's answer to "why not faster?".
LINE = re.compile(
    r"Hosts: (\d+) active, (\d+) blocked, (\d+) with work; (\d+) requests queued; "
    r"busiest \(in flight/limit\): (.*); why not faster\? (Bound by .*|Nothing .*|Requests .*)"
)


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_with_the_monitor_the_log_line_reads_its_snapshot(
    local_hosts: HostsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The log line's figures are those of the snapshot the page and /metrics read."""
    fine = HostSpec(latency=0.02, links=3, pages=40)
    # Answers 429 with a Retry-After of 1 s above one request in flight.
    throttling = HostSpec(latency=0.02, links=3, pages=20, throttle_above=1, retry_after="1")
    hosts = local_hosts([fine, throttling])
    caplog.set_level(logging.INFO, logger="scrapy_hostqueue.stats")
    crawler = get_crawler(
        PageSpider,
        {
            **BASE_SETTINGS,
            "ADDONS": {"scrapy_hostqueue.Addon": 0},
            "HOSTQUEUE_LOG_INTERVAL": 0.1,
            "HOSTQUEUE_MONITOR_INTERVAL": 0.05,
            "RETRY_ENABLED": False,
        },
    )
    read: list[dict[str, Any]] = []

    def spider_opened() -> None:
        # What the log line reads, as it reads it.
        snapshot = get_recorder(crawler).snapshot
        assert snapshot is not None

        def recorded() -> dict[str, Any]:
            read.append(snapshot())
            return read[-1]

        get_recorder(crawler).snapshot = recorded

    crawler.signals.connect(spider_opened, signal=signals.spider_opened, weak=False)
    await crawler.crawl_async(start_urls=[hosts.url(0), hosts.url(1)], follow=True)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Hosts: ")]
    assert len(lines) == len(read) >= 3
    blocked_seen = False
    for line, snap in zip(lines, read, strict=True):
        match = LINE.fullmatch(line)
        assert match, line
        crawl_ = snap["crawl"]
        blocked = sum(crawl_["states"][state] for state in BLOCKED_STATES)
        assert [int(match.group(i)) for i in range(1, 5)] == [
            crawl_["active_hosts"],
            blocked,
            crawl_["live_hosts"],
            crawl_["queued"],
        ], (line, crawl_)
        assert match.group(6) == crawl_["why"]["text"]
        rows = {row["host"]: row for row in snap["hosts"]}
        for shown in re.finditer(r"(\S+) (\d+)/(\d+)", match.group(5)):
            row = rows[shown.group(1)]
            assert (int(shown.group(2)), int(shown.group(3))) == (row["in_flight"], row["cap"])
            if row["block_left"]:
                blocked_seen = True
                reason = f"(blocked {row['block_left']:.1f}s: {row['block_reason']})"
                assert reason in match.group(5)
    # The host answering 429 with Retry-After was caught blocked in the line.
    assert blocked_seen, lines
