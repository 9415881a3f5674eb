"""The monitor's controls: what they accept, what they do to the hosts, over HTTP.

The fast tests apply them to the hosts of a real scheduler (with the AIMD
middleware attached) and post them to a real monitor server; the crawl tests
check what the local test hosts see when a page gives them during a crawl.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

import aiohttp
import pytest
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import AIMDMiddleware, HostQueueScheduler
from scrapy_hostqueue._aimd import AimdSettings, AimdTable
from scrapy_hostqueue._recorder import get_recorder
from scrapy_hostqueue._sendgate import SendGate, gate_of
from scrapy_hostqueue.monitor._controls import (
    MAX_BLOCK,
    MONITOR,
    BadControl,
    Control,
    Controller,
    parse_control,
)
from scrapy_hostqueue.monitor._server import MonitorServer
from scrapy_hostqueue.monitor._snapshot import GIVEN_UP
from scrapy_hostqueue.monitor.extension import HostQueueMonitor
from scrapy_hostqueue.testing import HostSpec
from tests.helpers.crawling import (
    ADDON,
    OUR_HANDLER,
    HostsFactory,
    PageSpider,
    monitor_of,
    settings,
    until,
)

HOST = "a.test"

# -- what a control may ask -----------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"action": "explode", "host": HOST}, "unknown action 'explode'"),
        ({}, "action is missing"),
        ({"action": "block", "seconds": "5"}, "block needs a host"),
        ({"action": "block", "host": " ", "seconds": "5"}, "block needs a host"),
        ({"action": "block", "host": HOST}, "seconds is missing"),
        ({"action": "block", "host": HOST, "seconds": "soon"}, "seconds must be a number"),
        ({"action": "block", "host": HOST, "seconds": "0"}, "seconds must be between"),
        ({"action": "block", "host": HOST, "seconds": "-3"}, "seconds must be between"),
        ({"action": "block", "host": HOST, "seconds": "inf"}, "seconds must be between"),
        ({"action": "block", "host": HOST, "seconds": MAX_BLOCK + 1}, "seconds must be between"),
        ({"action": "block", "host": HOST, "seconds": True}, "seconds must be between"),
        ({"action": "ceiling", "host": HOST, "ceiling": "0"}, "ceiling must be between"),
        ({"action": "ceiling", "host": HOST, "ceiling": "2.5"}, "a whole number"),
        ({"action": "ceiling", "host": HOST, "ceiling": "many"}, "ceiling must be a number"),
        ({"action": "ceiling", "host": HOST, "ceiling": 100_000}, "ceiling must be between"),
    ],
)
def test_bad_controls_are_refused_with_a_reason(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(BadControl, match=re.escape(message)):
        parse_control(fields)


def test_controls_parsed() -> None:
    assert parse_control({"action": "block", "host": HOST, "seconds": "2.5"}) == Control(
        "block", HOST, 2.5
    )
    assert parse_control({"action": "ceiling", "host": HOST, "ceiling": 3}) == Control(
        "ceiling", HOST, 3
    )
    assert parse_control({"action": "give-up", "host": HOST}) == Control("give-up", HOST)
    assert parse_control({"action": "pause", "host": "ignored"}) == Control("pause")
    # What it sends to another process reads back the same.
    for control in [Control("block", HOST, 2.5), Control("ceiling", HOST, 3), Control("resume")]:
        assert parse_control(control.as_dict()) == control


# -- what they do to the hosts ---------------------------------------------------


def scheduler_with_aimd(**extra: Any) -> tuple[HostQueueScheduler, AIMDMiddleware]:
    """Return a real scheduler with the AIMD middleware attached, and a request queued."""
    crawler = get_crawler(
        settings_dict={"SCHEDULER": "scrapy_hostqueue.HostQueueScheduler", **extra}
    )
    scheduler = HostQueueScheduler.from_crawler(crawler)
    middleware = AIMDMiddleware.from_crawler(crawler)
    middleware.hosts = scheduler.hosts
    scheduler.hosts.attach_policy(middleware)
    for page in range(3):
        scheduler._push(Request(f"http://{HOST}/{page}"))
    return scheduler, middleware


def test_block_and_unblock_through_the_hosts() -> None:
    scheduler, _ = scheduler_with_aimd()
    hosts = scheduler.hosts
    controller = Controller(hosts, get_recorder(scheduler.crawler))
    before = time.monotonic()
    assert controller.apply(Control("block", HOST, 30)) == "blocked for 30.0s"
    state = hosts.host_state(HOST)
    assert state.block_reason == MONITOR
    assert before + 30 <= state.blocked_until <= time.monotonic() + 30
    assert scheduler.next_request() is None
    # A shorter block leaves the longer one be.
    assert controller.apply(Control("block", HOST, 5)).startswith("already blocked longer")
    assert controller.apply(Control("unblock", HOST)) == "unblocked (it was blocked by monitor)"
    assert state.blocked_until == 0.0
    assert state.block_reason is None
    assert scheduler.next_request() is not None
    assert controller.apply(Control("unblock", HOST)) == "it was not blocked"
    events = get_recorder(scheduler.crawler).entry(HOST).events or ()
    assert [(kind, reason) for _, kind, reason, _, _ in events] == [
        ("block", MONITOR),
        ("unblock", MONITOR),
    ]
    with pytest.raises(BadControl, match=re.escape("unknown host 'b.test'")):
        controller.apply(Control("block", "b.test", 5))


def test_a_ceiling_holds_the_aimd_limit_and_travels_with_what_it_learned() -> None:
    scheduler, middleware = scheduler_with_aimd(HOSTQUEUE_AIMD_START=4)
    hosts = scheduler.hosts
    controller = Controller(hosts, get_recorder(scheduler.crawler))
    assert hosts.host_state(HOST).limit == 4
    assert controller.apply(Control("ceiling", HOST, 2)) == "ceiling 2: limit 4 -> 2"
    assert hosts.host_state(HOST).limit == 2
    # Fast answers with the limit full: the AIMD rule would climb, not past 2.
    for _ in range(50):
        assert middleware.table.on_success(HOST, time.monotonic(), 0.001) is None
    assert middleware.table.get(HOST).limit == 2  # type: ignore[union-attr]
    # A higher ceiling lets it climb again; the limit stays until it does.
    assert controller.apply(Control("ceiling", HOST, 6)) == "ceiling 6: limit 2 -> 2"
    # What the rule learned keeps the chosen ceiling (a frontier file, Redis).
    learned = middleware.learned(HOST)
    assert learned is not None
    assert learned["ceiling"] == 6
    table = AimdTable(AimdSettings(ceiling=8))
    assert table.restore(HOST, learned).ceiling == 6
    events = get_recorder(scheduler.crawler).entry(HOST).events or ()
    assert [(kind, reason, before, after) for _, kind, reason, before, after in events] == [
        ("limit", MONITOR, 4, 2)
    ]


def test_give_up_and_pause_through_the_hosts() -> None:
    scheduler, _ = scheduler_with_aimd()
    hosts = scheduler.hosts
    stats = scheduler.crawler.stats
    controller = Controller(hosts, get_recorder(scheduler.crawler))
    assert controller.apply(Control("pause")).startswith("paused")
    assert scheduler.next_request() is None
    assert controller.apply(Control("resume")) == "resumed"
    first = scheduler.next_request()
    assert first is not None
    assert controller.apply(Control("give-up", HOST)).startswith("given up: 2 queued request(s)")
    assert controller.apply(Control("give-up", HOST)) == "it was given up already"
    # Each is handed out once more, for the AIMD middleware to fail it.
    failing = [scheduler.next_request(), scheduler.next_request()]
    assert all(hosts.given_up_host(request) == HOST for request in failing)
    assert scheduler.next_request() is None
    assert stats.get_value("hostqueue/hosts_given_up_count") == 1
    assert stats.get_value("hostqueue/dropped_request_count") == 2
    # A new request for it is dropped and counted too.
    scheduler._push(Request(f"http://{HOST}/late"))
    assert stats.get_value("hostqueue/dropped_request_count") == 3


def test_give_up_needs_the_aimd_middleware() -> None:
    crawler = get_crawler(settings_dict={"SCHEDULER": "scrapy_hostqueue.HostQueueScheduler"})
    scheduler = HostQueueScheduler.from_crawler(crawler)
    scheduler._push(Request(f"http://{HOST}/"))
    controller = Controller(scheduler.hosts, get_recorder(crawler))
    with pytest.raises(BadControl, match="needs the AIMD middleware"):
        controller.apply(Control("give-up", HOST))
    # Without it a ceiling is the host's limit.
    assert controller.apply(Control("ceiling", HOST, 3)).endswith("-> 3")
    assert scheduler.hosts.host_state(HOST).limit == 3


# -- over HTTP ------------------------------------------------------------------


async def post(url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, timeout=aiohttp.ClientTimeout(total=10), **kwargs) as answer,
    ):
        return answer.status, await answer.json()


@deferred_f_from_coro_f
async def test_the_control_endpoint(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, _ = scheduler_with_aimd()
    controller = Controller(scheduler.hosts, get_recorder(scheduler.crawler))

    async def control(given: Control, remote: str) -> str:
        return controller.apply(given)

    server = MonitorServer(lambda host: {}, control=control)
    off = MonitorServer(lambda host: {})
    port = await server.start("127.0.0.1", 0)
    off_port = await off.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}/control"
    bearer = {"Authorization": f"Bearer {server.token}"}
    block = {"action": "block", "host": HOST, "seconds": 30}
    try:
        with caplog.at_level(logging.INFO, logger="scrapy_hostqueue.monitor._server"):
            # No token, a wrong one, the token in the URL only: refused.
            assert (await post(base, json=block))[0] == 401
            assert (await post(base, json=block, headers={"Authorization": "Bearer x"}))[0] == 401
            status, answer = await post(f"{base}?token={server.token}", json=block)
            assert status == 401
            assert "Authorization header or the body" in answer["error"]
            # Another site's form, even with the token: refused before anything.
            status, answer = await post(
                base, data={**block, "token": server.token}, headers={"Origin": "http://evil.test"}
            )
            assert (status, answer["ok"]) == (403, False)
            assert scheduler.hosts.host_state(HOST).blocked_until == 0.0
            # Bad input: 400 with the reason.
            for fields, reason in [
                ({"action": "block", "host": "b.test", "seconds": 5}, "unknown host 'b.test'"),
                ({"action": "block", "host": HOST, "seconds": "x"}, "must be a number"),
                ({"action": "ceiling", "host": HOST, "ceiling": 0}, "must be between 1 and"),
                ({"action": "reboot"}, "unknown action 'reboot'"),
            ]:
                status, answer = await post(base, json=fields, headers=bearer)
                assert (status, answer["ok"]) == (400, False), fields
                assert reason in answer["error"]
            status, answer = await post(
                base, data="[1]", headers={**bearer, "Content-Type": "application/json"}
            )
            assert status == 400
            # The token in the header, or in a form's body from the page's origin.
            status, answer = await post(base, json=block, headers=bearer)
            assert (status, answer["result"]) == (200, "blocked for 30.0s")
            assert answer["host"] == HOST
            status, answer = await post(
                base,
                data={"action": "ceiling", "host": HOST, "ceiling": "1", "token": server.token},
                headers={"Origin": f"http://127.0.0.1:{port}"},
            )
            assert (status, answer["result"]) == (200, "ceiling 1: limit 2 -> 1")
        # Controls off: 404 with the setting's name (after the token).
        off_url = f"http://127.0.0.1:{off_port}/control"
        assert (await post(off_url, json=block))[0] == 401
        status, answer = await post(
            off_url, json=block, headers={"Authorization": f"Bearer {off.token}"}
        )
        assert status == 404
        assert "HOSTQUEUE_MONITOR_CONTROLS" in answer["error"]
    finally:
        await server.stop()
        await off.stop()
    # One INFO line per control applied: who, what, which host, what value.
    audit = [r.getMessage() for r in caplog.records if "Monitor control" in r.getMessage()]
    assert audit == [
        f"Monitor control from 127.0.0.1: block host {HOST} for 30s: blocked for 30.0s",
        f"Monitor control from 127.0.0.1: set the ceiling of host {HOST} to 1: "
        "ceiling 1: limit 2 -> 1",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records if "Monitor control" in r.msg)


def test_controls_are_off_by_default() -> None:
    from scrapy_hostqueue._config import HostQueueConfig

    assert HostQueueConfig.from_settings(get_crawler().settings).monitor_controls is False
    config = HostQueueConfig.from_settings(
        get_crawler(settings_dict={"HOSTQUEUE_MONITOR_CONTROLS": True}).settings
    )
    assert config.monitor_controls is True


# -- in real crawls ---------------------------------------------------------------


#: The crawls' settings: the add-on, the controls on, fresh snapshots.
CONTROLLED = {
    "ADDONS": ADDON,
    "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
    "HOSTQUEUE_MONITOR_CONTROLS": True,
    "HOSTQUEUE_MONITOR_INTERVAL": 0.05,
    "HOSTQUEUE_LOG_INTERVAL": 0,
    "HOSTQUEUE_AIMD_START": 4,
    # The add-on's own handler, as users get it: its send gate holds a
    # blocked host's requests already handed out.
    "DOWNLOAD_HANDLERS": {"http": OUR_HANDLER},
}


class Page:
    """Posts controls to a crawl's monitor, as its page does."""

    def __init__(self, monitor: HostQueueMonitor) -> None:
        assert monitor.url is not None
        self.base = monitor.url.split("?")[0]
        self.token = monitor.server.token

    async def control(self, **fields: Any) -> str:
        status, answer = await post(
            self.base + "control",
            json=fields,
            headers={"Authorization": f"Bearer {self.token}"},
        )
        assert status == 200, answer
        return str(answer["result"])

    async def snapshot(self) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.base + f"hosts.json?token={self.token}") as answer,
        ):
            return dict(json.loads(await answer.text()))


async def page_once_busy(crawler: Any, hosts: Any) -> Page:
    """Return the crawl's page once every host served a few pages."""
    await until(lambda: (m := monitor_of(crawler)) is not None and m.url, 15, "the monitor")
    monitor = monitor_of(crawler)
    assert monitor is not None
    await until(
        lambda: all(stat.served >= 4 for stat in hosts.all_stats(arrivals=False)),
        15,
        "pages of every host",
    )
    return Page(monitor)


BLOCK_SECONDS = 2.0
PAGES = 40


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_controls_change_what_the_hosts_see(local_hosts: HostsFactory) -> None:
    hosts = local_hosts([HostSpec(latency=0.03, links=3, pages=PAGES) for _ in range(3)])
    blocked, ceiled, dropped = hosts.hostnames
    crawler = get_crawler(PageSpider, settings(**CONTROLLED))
    seen: dict[str, Any] = {}

    async def drive() -> None:
        try:
            page = await page_once_busy(crawler, hosts)
            seen["ceiling"] = await page.control(action="ceiling", host=ceiled, ceiling=1)
            # What was sent under the old limit finishes (those past the send
            # gate on their way too, which no host counts yet); from then on
            # the server counts afresh.
            gate = gate_of(crawler)
            assert isinstance(gate, SendGate)
            await until(
                lambda: gate.on_wire(ceiled) <= 1 and hosts.stats(1, arrivals=False).in_flight <= 1,
                10,
                "one in flight",
            )
            hosts.reset()
            seen["block"] = await page.control(action="block", host=blocked, seconds=BLOCK_SECONDS)
            seen["blocked_at"] = time.monotonic()
            # Requests the send gate let through before the block (not done:
            # a host answers in 30 ms) may still reach the host.
            seen["on_wire"] = gate.on_wire(hosts.hostnames[0])
            # It ends 2 s after the crawl applied it, before the answer came.
            seen["block_ends"] = gate.store.host_state(hosts.hostnames[0]).blocked_until
            seen["give_up"] = await page.control(action="give-up", host=dropped)
            seen["given_up_at"] = time.monotonic()
            snap = await page.snapshot()
            seen["shown"] = {row["host"]: row for row in snap["hosts"]}
        except BaseException:
            await crawler.stop_async()
            raise

    driver = asyncio.ensure_future(drive())
    await crawler.crawl_async(start_urls=[hosts.url(i) for i in range(3)], follow=True)
    await driver

    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    assert "hostqueue/lost_at_close_count" not in stats
    # The block: no request started while it ran (only those already sent
    # reached the host, at its start), and the host's pages were all fetched
    # after it.
    assert seen["block"] == f"blocked for {BLOCK_SECONDS:.1f}s"
    shown = seen["shown"]
    assert shown[blocked]["state"] == MONITOR
    assert shown[blocked]["block_reason"] == MONITOR
    assert 0 < shown[blocked]["block_left"] <= BLOCK_SECONDS
    arrivals = hosts.stats(0).arrivals
    during = [t for t in arrivals if seen["blocked_at"] < t < seen["block_ends"]]
    assert len(during) <= seen["on_wire"], (during, seen)
    assert all(t < seen["blocked_at"] + 0.5 for t in during), (during, seen)
    assert (
        seen["blocked_at"] + BLOCK_SECONDS - 0.5
        < seen["block_ends"]
        <= seen["blocked_at"] + BLOCK_SECONDS
    )
    assert [t for t in arrivals if t >= seen["block_ends"]]
    pages_of = {
        name: {url for url in crawler.spider.seen if name in url} for name in hosts.hostnames
    }
    assert len(pages_of[blocked]) == PAGES
    # The ceiling: one request at a time at the host from then on.
    assert seen["ceiling"].startswith("ceiling 1: limit ")
    assert seen["ceiling"].endswith("-> 1")
    assert hosts.stats(1).max_in_flight == 1
    assert len(pages_of[ceiled]) == PAGES
    # Given up: its pages left unfetched, counted as given up.
    assert seen["give_up"].startswith("given up: ")
    assert shown[dropped]["state"] == GIVEN_UP
    assert len(pages_of[dropped]) < PAGES
    assert stats["hostqueue/hosts_given_up_count"] == 1
    assert stats["hostqueue/dropped_request_count"] >= 1
    late = [t for t in hosts.stats(2).arrivals if t > seen["given_up_at"] + 0.5]
    assert late == []


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_pause_and_resume(local_hosts: HostsFactory) -> None:
    hosts = local_hosts([HostSpec(latency=0.03, links=3, pages=30) for _ in range(2)])
    crawler = get_crawler(PageSpider, settings(**CONTROLLED))
    seen: dict[str, Any] = {}

    def arrivals() -> int:
        return sum(len(hosts.stats(i).arrivals) for i in range(2))

    async def drive() -> None:
        try:
            page = await page_once_busy(crawler, hosts)
            seen["pause"] = await page.control(action="pause")
            # The requests handed out before the pause finish (those on their
            # way to a host too, which no host counts yet); then nothing
            # reaches the hosts.
            assert crawler.engine is not None
            downloader = crawler.engine.downloader
            await until(
                lambda: (
                    not downloader.active
                    and all(hosts.stats(i, arrivals=False).in_flight == 0 for i in range(2))
                ),
                10,
                "the requests handed out to finish",
            )
            quiet = arrivals()
            await asyncio.sleep(1.5)
            seen["while_paused"] = arrivals() - quiet
            seen["paused_shown"] = (await page.snapshot())["crawl"]["paused"]
            seen["resume"] = await page.control(action="resume")
        except BaseException:
            await crawler.stop_async()
            raise

    driver = asyncio.ensure_future(drive())
    await crawler.crawl_async(start_urls=[hosts.url(i) for i in range(2)], follow=True)
    await driver

    assert seen["pause"].startswith("paused")
    assert seen["while_paused"] == 0
    assert seen["paused_shown"] is True
    assert seen["resume"] == "resumed"
    assert crawler.stats.get_value("finish_reason") == "finished"
    # Every page, once.
    assert [hosts.stats(i).served for i in range(2)] == [30, 30]
