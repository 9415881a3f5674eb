"""The monitor on the Redis frontier when Redis holds the crawl back.

A real ``redis-server``, stopped with SIGSTOP during a crawl: the snapshot
says that Redis bounds the crawl, and no longer once it answers again.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue.testing import HostSpec
from tests.helpers.crawling import ADDON, HostsFactory, PageSpider, monitor_of, until
from tests.helpers.crawling import settings as crawl_settings
from tests.helpers.redis import RedisServer
from tests.helpers.requires_redis import import_redis

import_redis()


@pytest.mark.crawl
@pytest.mark.requires_redis
@pytest.mark.skipif(sys.platform == "win32", reason="signals")
@deferred_f_from_coro_f
async def test_a_stopped_redis_is_what_bounds_the_crawl(local_hosts: HostsFactory) -> None:
    """Redis stopped (SIGSTOP) during a crawl: the monitor says that Redis bounds it."""
    hosts = local_hosts([HostSpec(latency=0.02, links=3, pages=60)] * 2)
    seen: dict[str, Any] = {}
    with RedisServer() as server:
        crawler = get_crawler(
            PageSpider,
            crawl_settings(
                ADDONS=ADDON,
                HOSTQUEUE_FRONTIER=server.url,
                HOSTQUEUE_CRAWL_ID="stopped",
                HOSTQUEUE_REDIS_FINISH_GRACE=0.5,
                HOSTQUEUE_MONITOR_INTERVAL=0.05,
                HOSTQUEUE_LOG_INTERVAL=0,
            ),
        )

        def bound_by_redis() -> dict[str, Any] | None:
            snap = monitor.local_snapshot()
            return snap if snap["crawl"]["why"]["bound"] == "redis" else None

        async def stop_redis_when_busy() -> None:
            nonlocal monitor
            monitor = await until(lambda: monitor_of(crawler), 15, "the monitor")
            await until(lambda: monitor.local_snapshot()["crawl"]["responses"] >= 10, 15)
            seen["before"] = monitor.local_snapshot()
            process = server._process
            assert process is not None
            process.send_signal(signal.SIGSTOP)
            try:
                seen["stopped"] = await until(bound_by_redis, 5)
            finally:
                process.send_signal(signal.SIGCONT)
            seen["back"] = await until(
                lambda: not bound_by_redis() and monitor.local_snapshot(), 10
            )

        monitor: Any = None
        watcher = asyncio.ensure_future(stop_redis_when_busy())
        try:
            await crawler.crawl_async(
                start_urls=[hosts.page_url(i, 0) for i in range(2)], follow=True
            )
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    assert seen["before"]["crawl"]["redis"]["away"] == 0.0
    stopped = seen["stopped"]["crawl"]
    assert re.fullmatch(
        r"Bound by Redis: it has not answered for \d+\.\ds; no new work comes from it\.",
        stopped["why"]["text"],
    ), stopped["why"]
    assert stopped["redis"]["away"] >= 1.0
    assert seen["back"]["crawl"]["redis"]["away"] == 0.0
    assert crawler.stats is not None
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert sum(host.served for host in hosts.all_stats(arrivals=False)) == 120
