"""The live monitor: its snapshot from plain figures, its server in real crawls.

What it serves is checked against the stats and the local test hosts' own
counts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import HostQueueSettingsError
from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue.monitor._metrics import metrics_maker
from scrapy_hostqueue.monitor._snapshot import (
    GIVEN_UP,
    IDLE,
    IN_FLIGHT,
    READY,
    RETRY_AFTER,
    STATES,
    WAITING,
    CrawlFigures,
    HostDetail,
    HostRow,
    Snapshots,
)
from scrapy_hostqueue.monitor.extension import HostQueueMonitor
from scrapy_hostqueue.testing import HostSpec
from tests.helpers.crawling import ADDON, HostsFactory, PageSpider, monitor_of, settings

try:
    from prometheus_client import parser as prometheus_parser
except ImportError:  # the prometheus extra is not installed: /metrics is a 404
    prometheus_parser = None  # type: ignore[assignment]

# -- the snapshot, from plain figures ------------------------------------------

#: The fields of a snapshot and of its parts (docs/monitor.rst lists them).
TOP_FIELDS = {"version", "time", "uptime", "process", "controls", "crawl", "hosts", "other"}
CRAWL_FIELDS = {
    "pages_per_second",
    "responses",
    "statuses",
    "statuses_total",
    "in_flight",
    "queued",
    "active_hosts",
    "max_active_hosts",
    "concurrent_requests",
    "given_up_hosts",
    "paused",
    "hosts",
    "live_hosts",
    "states",
    "redis",
    "why",
}
HOST_FIELDS = {
    "host",
    "state",
    "in_flight",
    "cap",
    "limit",
    "queued",
    "queued_crawl",
    "overdue",
    "block_reason",
    "block_left",
    "interval",
    "pages_per_second",
    "responses",
    "statuses",
    "latency_p50",
    "latency_p95",
    "last_change",
}
OTHER_FIELDS = {"host", "hosts", "queued", "in_flight"}


def figures(**overrides: Any) -> CrawlFigures:
    values: dict[str, Any] = {
        "time": 1_700_000_000.0,
        "uptime": 5.0,
        "concurrent_requests": 16,
        "max_active_hosts": 16,
        "active_hosts": 2,
        "queued": 10,
        "responses": 0,
        "statuses": {},
    }
    values.update(overrides)
    return CrawlFigures(**values)


def row(host: str, rank: int, **overrides: Any) -> HostRow:
    values: dict[str, Any] = {
        "host": host,
        "queued": 1,
        "in_flight": 0,
        "cap": 2,
        "limit": 2,
        "rank": rank,
    }
    values.update(overrides)
    return HostRow(**values)


def test_snapshot_fields_and_types() -> None:
    snapshots = Snapshots(top=10)
    detail = HostDetail(
        responses=3,
        statuses={"200": 3},
        latency_p50=0.01,
        latency_p95=0.02,
        events=[(4.0, "limit", "fast", 2, 3)],
    )
    snap = snapshots.take(
        10.0, figures(), [row("a", 5, in_flight=1), row("b", 1)], lambda host: detail
    )
    # What the page and other readers get is JSON.
    snap = json.loads(json.dumps(snap))
    assert set(snap) == TOP_FIELDS
    assert snap["version"] == 1
    assert set(snap["crawl"]) == CRAWL_FIELDS
    assert set(snap["crawl"]["states"]) == set(STATES)
    assert set(snap["crawl"]["why"]) == {"bound", "text"}
    assert set(snap["other"]) == OTHER_FIELDS
    for host in snap["hosts"]:
        assert set(host) == HOST_FIELDS
        assert host["state"] in STATES
        assert host["last_change"] == {"ago": 4.0, "from": 2, "to": 3, "reason": "fast"}
    with_detail = snapshots.with_detail(snap, "a", 10.0, detail)
    shown = {host["host"]: host for host in with_detail["hosts"]}
    assert shown["a"]["events"] == [
        {"ago": 4.0, "kind": "limit", "reason": "fast", "from": 2, "to": 3}
    ]
    # 3 responses in the crawl's first 5 s.
    assert shown["a"]["history"] == [[0.0, 1, 2, 1, 0.6]]
    assert "history" not in shown["b"]


def test_top_hosts_by_a_stable_ranking_the_rest_folded() -> None:
    snapshots = Snapshots(top=3)
    rows = [row(f"h{i}", rank=i % 4, queued=i, in_flight=1) for i in range(10)]
    snap = snapshots.take(1.0, figures(), rows, lambda host: HostDetail())
    # Rank first, then the name: the same hosts in the same order every time.
    assert [host["host"] for host in snap["hosts"]] == ["h7", "h3", "h6"]
    folded = [r for r in rows if r.host not in {"h7", "h3", "h6"}]
    assert snap["other"] == {
        "host": "_other",
        "hosts": 7,
        "queued": sum(r.queued for r in folded),
        "in_flight": 7,
    }
    assert snap["crawl"]["hosts"] == 10
    assert snap["crawl"]["in_flight"] == 10
    again = snapshots.take(2.0, figures(), list(reversed(rows)), lambda host: HostDetail())
    assert [host["host"] for host in again["hosts"]] == ["h7", "h3", "h6"]


def test_states_of_hosts() -> None:
    rows = [
        row("given", 1, given_up=True, queued=0),
        row("throttled", 1, blocked_left=12.5, block_reason="retry-after", in_flight=1),
        row("busy", 1, in_flight=2),
        row("ready", 1),
        row("idle", 1, queued=0),
        row("spaced", 1, spaced_left=0.5),
    ]
    snap = Snapshots(top=10).take(1.0, figures(), rows, lambda host: HostDetail())
    states = {host["host"]: host["state"] for host in snap["hosts"]}
    assert states == {
        "given": GIVEN_UP,
        "throttled": RETRY_AFTER,
        "busy": IN_FLIGHT,
        "ready": READY,
        "idle": IDLE,
        "spaced": "delay",
    }
    throttled = next(host for host in snap["hosts"] if host["host"] == "throttled")
    assert throttled["block_left"] == 12.5
    assert throttled["block_reason"] == "retry-after"
    counts = snap["crawl"]["states"]
    assert sum(counts.values()) == len(rows)
    assert counts[GIVEN_UP] == counts[RETRY_AFTER] == counts[IN_FLIGHT] == 1
    # With every active-host place taken, a host with work waits for one.
    full = figures(max_active_hosts=2, active_hosts=2)
    snap = Snapshots(top=10).take(1.0, full, [row("a", 1)], lambda host: HostDetail())
    assert snap["hosts"][0]["state"] == WAITING
    assert snap["crawl"]["why"]["bound"] == "active-hosts"


@pytest.mark.parametrize(
    ("crawl", "rows", "bound"),
    [
        (figures(concurrent_requests=2), [row("a", 1, in_flight=2)], "concurrent-requests"),
        (
            figures(),
            [row("a", 1, queued=5, blocked_left=3.0, block_reason="retry-after")],
            "hosts",
        ),
        (figures(queued=0), [row("a", 1, queued=0, in_flight=1)], "spider"),
        # Work ready, room in the budget: the engine does not ask for it.
        (figures(), [row("a", 1, queued=5), row("b", 1, in_flight=2, cap=2)], "spider"),
        (figures(), [row("a", 1, queued=5, in_flight=2, cap=2)], "hosts"),
        (figures(queued=0), [], "idle"),
    ],
)
def test_why_not_faster(crawl: CrawlFigures, rows: list[HostRow], bound: str) -> None:
    why = Snapshots(top=10).take(1.0, crawl, rows, lambda host: HostDetail())["crawl"]["why"]
    assert why["bound"] == bound
    if bound == "hosts":
        assert why["text"].startswith("Bound by the hosts: their queued work waits on a (")
        blocked = rows[0].blocked_left
        assert ("a (retry-after, 3.0s left)" in why["text"]) == bool(blocked)


def redis_figures(**overrides: Any) -> dict[str, Any]:
    values = {"waited": 0.0, "round_trip_p95": 0.001, "away": 0.0, "full": False, "kept_back": 0}
    return {**values, **overrides}


@pytest.mark.parametrize(
    ("redis", "queued", "text"),
    [
        (redis_figures(waited=0.6, round_trip_p95=0.18), 10, "Redis 60% of the last 10s"),
        (redis_figures(away=12.34), 10, "it has not answered for 12.3s"),
        (redis_figures(full=True, kept_back=120), 10, "it is full (maxmemory); 120 new"),
        # A small share, or nothing queued anywhere: not Redis.
        (redis_figures(waited=0.2), 10, ""),
        (redis_figures(waited=0.9), 0, ""),
    ],
)
def test_why_not_faster_bound_by_redis(redis: dict[str, Any], queued: int, text: str) -> None:
    crawl = figures(queued=queued, redis=redis)
    # Nothing to hand out here: the hosts held are in flight at their limit.
    rows = [row("a", 1, queued=0, in_flight=1, cap=2)]
    snap = Snapshots(top=10).take(1.0, crawl, rows, lambda host: HostDetail())
    why = snap["crawl"]["why"]
    assert snap["crawl"]["redis"] == redis
    if not text:
        assert why["bound"] != "redis"
        return
    assert why["bound"] == "redis"
    assert why["text"].startswith("Bound by Redis: ")
    assert text in why["text"]
    if redis["waited"]:
        assert why["text"].endswith("(round trip p95 180 ms).")
    # The global limit all in flight goes first.
    crawl.concurrent_requests = 1
    snap = Snapshots(top=10).take(1.0, crawl, rows, lambda host: HostDetail())
    assert snap["crawl"]["why"]["bound"] == "concurrent-requests"


def test_rates_and_the_last_minute() -> None:
    snapshots = Snapshots(top=10)
    counts = {"a": 0}

    def detail(host: str) -> HostDetail:
        return HostDetail(responses=counts[host], statuses={"200": counts[host]})

    for second in range(101):
        counts["a"] = 5 * second
        snap = snapshots.take(
            float(second),
            figures(uptime=float(second), responses=5 * second, statuses={"200": 5 * second}),
            [row("a", 1)],
            detail,
        )
    # 5 responses a second, over the last RATE_WINDOW seconds.
    assert snap["crawl"]["pages_per_second"] == 5.0
    assert snap["hosts"][0]["pages_per_second"] == 5.0
    # The last minute's statuses, not the whole crawl's.
    assert snap["crawl"]["statuses"] == {"200": 300}
    assert snap["hosts"][0]["statuses"] == {"200": 300}
    assert snap["crawl"]["responses"] == 500


@pytest.mark.skipif(prometheus_parser is None, reason="prometheus_client is not installed")
def test_metrics_per_host_only_for_the_top_hosts() -> None:
    rows = [row(f"h{i}", rank=i, in_flight=1, queued=2) for i in range(10)]
    detail = HostDetail(responses=7, statuses={"200": 6, "503": 1}, latency_p50=0.1)
    crawl = figures(responses=70, statuses={"200": 60, "503": 10})
    snap = Snapshots(top=3).take(1.0, crawl, rows, lambda host: detail)
    render = metrics_maker(lambda: snap)
    assert render is not None
    families = {
        family.name: family
        for family in prometheus_parser.text_string_to_metric_families(render().decode())
    }
    for name, family in families.items():
        hosts = {sample.labels["host"] for sample in family.samples if "host" in sample.labels}
        if name.startswith("scrapy_hostqueue_host_"):
            assert hosts == {"h9", "h8", "h7"}, name
        else:
            assert not hosts, name
    classes = {
        s.labels["status_class"]: s.value
        for s in families["scrapy_hostqueue_responses_by_status_class"].samples
        if s.name.endswith("_total")
    }
    assert classes == {"1xx": 0, "2xx": 60, "3xx": 0, "4xx": 0, "5xx": 10}
    states = {s.labels["state"]: s.value for s in families["scrapy_hostqueue_hosts"].samples}
    assert states == {state: (10 if state == IN_FLIGHT else 0) for state in STATES}
    latency = families["scrapy_hostqueue_host_latency_seconds"].samples
    # p95 unknown: no series for it.
    assert {(s.labels["host"], s.labels["quantile"]) for s in latency} == {
        ("h9", "0.5"),
        ("h8", "0.5"),
        ("h7", "0.5"),
    }


# -- settings -----------------------------------------------------------------


def test_monitor_settings() -> None:
    config = HostQueueConfig.from_settings(get_crawler(settings_dict={}).settings)
    assert config.monitor is True
    assert config.monitor_bind == "127.0.0.1"
    assert config.monitor_port == 0
    for name, value in [
        ("HOSTQUEUE_MONITOR_BIND", "localhost"),
        ("HOSTQUEUE_MONITOR_BIND", 0),
        ("HOSTQUEUE_MONITOR_PORT", 70_000),
        ("HOSTQUEUE_MONITOR_HOSTS", 0),
        ("HOSTQUEUE_MONITOR", "maybe"),
    ]:
        with pytest.raises(HostQueueSettingsError, match=name):
            HostQueueConfig.from_settings(get_crawler(settings_dict={name: value}).settings)


# -- the server in a real crawl -------------------------------------------------


async def get(url: str, **kwargs: Any) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, timeout=aiohttp.ClientTimeout(total=10), **kwargs) as answer,
    ):
        return answer.status, await answer.text()


async def wait_for(condition: Any, timeout: float) -> Any:
    """Poll the async *condition* until it returns something true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = await condition()
        if result:
            return result
        await asyncio.sleep(0.1)
    raise AssertionError(f"not seen in {timeout}s")


RETRY_AFTER_SECONDS = 30


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_monitor_during_a_crawl(
    local_hosts: HostsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = local_hosts(
        [
            HostSpec(latency=0.02, links=3, pages=30),
            # Every page answers 429 with a Retry-After of 30 s.
            HostSpec(latency=0.02, links=3, throttle_above=0, retry_after=str(RETRY_AFTER_SECONDS)),
            HostSpec(refuse=True),
        ]
    )
    fine, throttled, refused = hosts.hostnames
    crawler = get_crawler(
        PageSpider,
        settings(
            ADDONS=ADDON,
            TWISTED_REACTOR="twisted.internet.asyncioreactor.AsyncioSelectorReactor",
            RETRY_ENABLED=False,
            HOSTQUEUE_ERROR_BUDGET=2,
            HOSTQUEUE_ERROR_MAX_COOLDOWNS=0,
            HOSTQUEUE_MONITOR_INTERVAL=0.05,
            HOSTQUEUE_LOG_INTERVAL=0,
        ),
    )
    start = [hosts.url(i) for i in range(3)] + [
        hosts.url(i, f"/page/{page}") for i in (1, 2) for page in range(1, 6)
    ]
    seen: dict[str, Any] = {}

    async def watch() -> None:
        monitor = await wait_for(lambda: _started(crawler), 15)
        url = monitor.url
        seen["url"] = url
        base = url.split("?")[0]
        # No token, a wrong one: refused.
        seen["no_token"] = (await get(base + "hosts.json"))[0]
        seen["wrong_token"] = (await get(base + "hosts.json?token=x"))[0]
        seen["bearer"] = (
            await get(
                base + "hosts.json", headers={"Authorization": f"Bearer {monitor.server.token}"}
            )
        )[0]
        seen["page"] = await get(url)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                base + "control",
                json={"action": "pause"},
                headers={"Authorization": f"Bearer {monitor.server.token}"},
            ) as answer,
        ):
            seen["control"] = answer.status, await answer.json()

        async def settled() -> dict[str, Any] | None:
            status, text = await get(base + "hosts.json?token=" + monitor.server.token)
            assert status == 200
            snap = json.loads(text)
            shown = {host["host"]: host for host in snap["hosts"]}
            fine_done = hosts.stats(0).served == 30 and snap["crawl"]["in_flight"] == 0
            if (
                fine_done
                and shown.get(throttled, {}).get("state") == RETRY_AFTER
                and shown.get(refused, {}).get("state") == GIVEN_UP
                and shown[fine]["responses"] == 30
            ):
                return snap
            return None

        snap = await wait_for(settled, 30)
        seen["snapshot"] = snap
        seen["metrics"] = await get(base + "metrics?token=" + monitor.server.token)
        seen["metrics_no_token"] = (await get(base + "metrics"))[0]
        seen["at"] = time.monotonic()
        seen["stats"] = dict(crawler.stats.get_stats())
        await crawler.stop_async()

    watcher = asyncio.ensure_future(watch())
    with caplog.at_level(logging.INFO, logger="scrapy_hostqueue.monitor.extension"):
        await crawler.crawl_async(start_urls=start, follow=True)
    await watcher

    # One INFO line with the URL, on loopback, with the token.
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Monitor: ")]
    assert lines == [f"Monitor: {seen['url']}"]
    assert re.fullmatch(r"Monitor: http://127\.0\.0\.1:\d+/\?token=[\w-]{20,}", lines[0])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "Monitor" in r.msg]
    assert seen["no_token"] == seen["wrong_token"] == 401
    assert seen["bearer"] == 200
    status, page = seen["page"]
    assert status == 200
    assert "hosts.json" in page
    assert "<script src" not in page
    assert "<link" not in page
    # The controls are off by default.
    status, answer = seen["control"]
    assert status == 404
    assert "HOSTQUEUE_MONITOR_CONTROLS" in answer["error"]
    assert seen["snapshot"]["controls"] is False
    assert seen["snapshot"]["crawl"]["paused"] is False

    snap = seen["snapshot"]
    stats = seen["stats"]
    shown = {host["host"]: host for host in snap["hosts"]}
    # What the hosts saw.
    server = {i: hosts.stats(i) for i in range(3)}
    assert shown[fine]["responses"] == server[0].served == 30
    assert shown[fine]["statuses"] == {"200": 30}
    assert shown[throttled]["responses"] == server[1].statuses[429] >= 1
    assert shown[throttled]["statuses"] == {"429": server[1].statuses[429]}
    assert shown[throttled]["queued"] >= 1
    assert shown[refused]["responses"] == 0
    # What the stats say.
    assert snap["crawl"]["responses"] == stats["response_received_count"]
    assert snap["crawl"]["responses"] == sum(host["responses"] for host in snap["hosts"])
    assert snap["crawl"]["given_up_hosts"] == stats["hostqueue/hosts_given_up_count"] == 1
    assert snap["crawl"]["statuses"] == {
        "200": stats["downloader/response_status_count/200"],
        "429": stats["downloader/response_status_count/429"],
    }
    assert snap["crawl"]["in_flight"] == sum(s.in_flight for s in server.values()) == 0
    # The block ends RETRY_AFTER_SECONDS after the 429 reached the client
    # (just after the host answered it).
    answered = server[1].arrivals[-1]
    expected_left = RETRY_AFTER_SECONDS - (seen["at"] - answered)
    block_left = shown[throttled]["block_left"]
    assert shown[throttled]["block_reason"] == RETRY_AFTER
    assert expected_left - 1.0 <= block_left <= expected_left + 0.5, (block_left, expected_left)
    assert snap["crawl"]["states"][RETRY_AFTER] == 1
    assert snap["crawl"]["states"][GIVEN_UP] == 1
    assert snap["crawl"]["why"]["bound"] == "hosts"
    assert throttled in snap["crawl"]["why"]["text"]

    # /metrics says the same (when prometheus_client is installed).
    assert seen["metrics_no_token"] == 401
    status, text = seen["metrics"]
    if prometheus_parser is None:
        assert status == 404
        return
    assert status == 200
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in prometheus_parser.text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("scrapy_hostqueue_responses_total", ())] == stats["response_received_count"]
    assert samples[("scrapy_hostqueue_hosts", (("state", RETRY_AFTER),))] == 1
    assert samples[("scrapy_hostqueue_hosts", (("state", GIVEN_UP),))] == 1
    assert samples[("scrapy_hostqueue_bound", (("bound", "hosts"),))] == 1
    assert samples[("scrapy_hostqueue_host_responses_total", (("host", fine),))] == 30
    left = samples[("scrapy_hostqueue_host_block_remaining_seconds", (("host", throttled),))]
    assert block_left - 1.0 <= left <= block_left


async def _started(crawler: Any) -> HostQueueMonitor | None:
    if crawler.extensions is None:
        return None
    monitor = monitor_of(crawler)
    assert monitor is not None
    return monitor if monitor.url else None


def test_the_schema_is_documented() -> None:
    page = (Path(__file__).parents[2] / "docs" / "monitor.rst").read_text()
    terms = set()
    for line in page.splitlines():
        # Definition-list terms: ``name``, or ``a``, ``b`` (with ?host=).
        if line.startswith("``"):
            terms.update(re.findall(r"``(\w+)``", line.split(" (with")[0]))
    assert TOP_FIELDS | CRAWL_FIELDS | HOST_FIELDS | {"events", "history"} <= terms
    assert set(STATES) <= set(re.findall(r"``([\w-]+)``", page))


@pytest.mark.crawl
def test_the_demo_prints_the_monitor_and_keeps_it_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from example_project import run_demo as demo

    # No Enter comes (the test's stdin is closed): the crawl runs until
    # --timeout, past the 20 pages its one host has.
    code = demo.main(
        [
            *("--monitor", "--hosts", "latency=5ms,pages=20", "--timeout", "6"),
            *("--output-dir", str(tmp_path), "--no-timeline"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"^monitor: http://127\.0\.0\.1:\d+/\?token=\S+$", out, re.MULTILINE), out
    report = json.loads((tmp_path / "hosts.json").read_text())
    assert report["crawl"]["finish_reason"] == "shutdown"
    # Kept up: the spider stayed open, idle, once the site was crawled.
    assert report["hosts"][0]["stats"]["served"] == 20
    assert report["crawl"]["seconds"] >= 6
