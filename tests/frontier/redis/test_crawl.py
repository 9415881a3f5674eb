"""Several ``scrapy crawl`` processes on one shared frontier in Redis (a real ``redis-server``).

One politeness budget per host, asserted from the hosts' side, and nothing lost when one process is
killed.

The crawls run as a user runs them, in subprocesses in ``example_project``;
the hosts run in a child process of their own and count what they served.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from bench.runner import child_environment
from scrapy_hostqueue.frontier.redis._db import part_prefix
from scrapy_hostqueue.testing import HostSpec, HostStats, LocalHosts
from tests.helpers.crawl_report import watched_hosts
from tests.helpers.crawling import (
    ADDON,
    HostsFactory,
    crawl,
    crawl_refused_at_start,
    start_demo_crawl,
)
from tests.helpers.redis import CuttableProxy, RedisServer
from tests.helpers.requires_redis import import_redis, redis_server_marks

redis = import_redis()

pytestmark = redis_server_marks(pytest.mark.crawl, needs="signals, redis-server")

WORKERS = 3


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    """Return the session's Redis server, emptied for this test.

    The session's Redis server, emptied for this test (each test has a
    crawl id of its own too).
    """
    redis_server.flushall()
    redis_server.reset_stats()
    return redis_server


def _worker(
    server: RedisServer,
    hosts: LocalHosts,
    tmp_path: Path,
    n: int,
    crawl_id: str,
    *,
    start: list[str] | None = None,
    **extra: Any,
) -> subprocess.Popen[bytes]:
    settings = {
        "HOSTQUEUE_FRONTIER": server.url,
        "HOSTQUEUE_CRAWL_ID": crawl_id,
        "CLOSESPIDER_PAGECOUNT": 0,
        "CLOSESPIDER_TIMEOUT": 90,
        "HOSTQUEUE_TIMELINE_FILE": "",
        "ROBOTSTXT_OBEY": False,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "HOSTQUEUE_REDIS_FINISH_GRACE": 1.0,
        "DEMO_STATS_FILE": tmp_path / f"stats{n}.json",
        "DEMO_ITEMS_FILE": tmp_path / "items.jsonl",
    }
    settings.update(extra)
    return start_demo_crawl(
        start or [hosts.page_url(i, 0) for i in range(len(hosts))],
        tmp_path / f"worker{n}.log",
        settings,
    )


def _wait(processes: list[subprocess.Popen[bytes]], tmp_path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
                other.wait()
            pytest.fail(f"a worker did not end:\n{_logs(tmp_path)[-4000:]}")


def _logs(tmp_path: Path) -> str:
    return "\n".join(path.read_text() for path in sorted(tmp_path.glob("worker*.log")))


def _responses(tmp_path: Path) -> list[int]:
    """Responses per worker that ended normally."""
    out = []
    for path in sorted(tmp_path.glob("stats*.json")):
        data = json.loads(path.read_text())
        assert data["finish_reason"] == "finished", data["finish_reason"]
        out.append(data["stats"].get("downloader/response_count", 0))
    return out


def test_three_processes_hold_one_limit_per_host(server: RedisServer, tmp_path: Path) -> None:
    specs = [HostSpec(latency=0.01, pages=80)] * 3 + [HostSpec(latency=0.2, pages=40)]
    with watched_hosts(specs, process=True) as hosts:
        # Two hosts per process at most: the first two processes take the
        # four hosts, then give some back to the third, which waits for hosts.
        workers = [
            _worker(
                server,
                hosts,
                tmp_path,
                n,
                "limit",
                HOSTQUEUE_MAX_ACTIVE_HOSTS=2,
                HOSTQUEUE_TURN_REQUESTS=20,
            )
            for n in range(WORKERS)
        ]
        _wait(workers, tmp_path)
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)
    logs = _logs(tmp_path)
    assert "Traceback" not in logs, logs[-4000:]
    responses = _responses(tmp_path)
    assert len(responses) == WORKERS
    assert sum(1 for count in responses if count) >= 2, responses
    for host, spec in zip(stats, specs, strict=True):
        # Three schedulers of their own would have allowed 12.
        assert host.max_in_flight <= 4, (host.hostname, host.max_in_flight)
        assert set(host.pages) == {f"/page/{n}" for n in range(spec.pages or 0)}
        assert max(host.pages.values()) == 1, host.hostname


def test_a_retry_after_seen_by_one_process_holds_for_all(
    server: RedisServer, tmp_path: Path
) -> None:
    throttling = HostSpec(latency=0.05, pages=24, throttle_above=2, retry_after="2")
    specs = [throttling] + [HostSpec(latency=0.02, pages=24)] * 2
    with watched_hosts(specs, process=True) as hosts:
        workers = [_worker(server, hosts, tmp_path, n, "retry") for n in range(WORKERS)]
        _wait(workers, tmp_path)
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)
    logs = _logs(tmp_path)
    assert "Traceback" not in logs, logs[-4000:]
    _responses(tmp_path)
    throttled = stats[0]
    windows = throttled.statuses.get(429, 0)
    assert windows >= 1, throttled.statuses
    # Inside a window the host sees only requests that were already on their
    # way when it answered 429 (as with one process): at most the others in
    # flight then. No process starts one inside it.
    assert throttled.in_retry_after_window <= 2 * windows, throttled
    # The host went from process to process, its block with it.
    key = f"hostqueue/hosts/{throttled.hostname}/request_count"
    workers = [json.loads(path.read_text())["stats"] for path in tmp_path.glob("stats*.json")]
    assert sum(1 for worker in workers if worker.get(key)) >= 2
    for host, spec in zip(stats, specs, strict=True):
        assert set(host.pages) == {f"/page/{n}" for n in range(spec.pages or 0)}


def _proc_of(log: Path) -> str:
    for line in log.read_text().splitlines():
        if "shared frontier at" in line and "this process" in line:
            return line.split("this process ", 1)[1].split(",", 1)[0]
    raise AssertionError(f"no process id in {log}")


def test_a_process_killed_mid_crawl_loses_nothing(server: RedisServer, tmp_path: Path) -> None:
    # The site: 2,000 pages over 20 hosts.
    hosts_count, pages = 20, 100
    spec = HostSpec(latency=0.02, pages=pages, links=3)
    client = redis.Redis.from_url(server.url)
    with watched_hosts([spec] * hosts_count, process=True) as hosts:
        workers = [
            _worker(
                server,
                hosts,
                tmp_path,
                n,
                "kill",
                HOSTQUEUE_LEASE_TIMEOUT=3,
                CONCURRENT_REQUESTS=8,
                HOSTQUEUE_MAX_ACTIVE_HOSTS=4,
            )
            for n in range(WORKERS)
        ]
        victim = workers[0]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(s.served for s in hosts.all_stats(arrivals=False)) >= 600:
                break
            time.sleep(0.02)
        # Frozen first, so that what it holds cannot change while it is read.
        victim.send_signal(signal.SIGSTOP)
        proc = _proc_of(tmp_path / "worker0.log")
        held = client.scard(part_prefix("kill") + f"lease:{proc}")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        served_at_kill = sum(s.served for s in hosts.all_stats(arrivals=False))
        _wait(workers[1:], tmp_path)
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)
    client.close()
    assert served_at_kill < hosts_count * pages, "the crawl finished before the kill"
    assert held > 0
    logs = _logs(tmp_path)
    assert "Traceback" not in logs, logs[-4000:]
    refetched = 0
    for host in stats:
        assert set(host.pages) == {f"/page/{n}" for n in range(pages)}, host.hostname
        refetched += sum(count - 1 for count in host.pages.values())
    assert refetched <= held, (refetched, held)


@deferred_f_from_coro_f
async def test_losing_redis_mid_crawl_pauses_and_loses_nothing(
    server: RedisServer, local_hosts: HostsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    pages = 60
    hosts = local_hosts([HostSpec(latency=0.02, pages=pages)] * 3)
    proxy = CuttableProxy(server.port)
    proxy.start()

    async def cut_when_busy() -> None:
        deadline = time.monotonic() + 30
        while sum(s.served for s in hosts.all_stats(arrivals=False)) < 40:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)
        proxy.cut(1.5)

    cutter = asyncio.ensure_future(cut_when_busy())
    try:
        crawler = await crawl(
            [hosts.page_url(i, 0) for i in range(len(hosts))],
            follow=True,
            ADDONS=ADDON,
            HOSTQUEUE_FRONTIER=proxy.url,
            HOSTQUEUE_CRAWL_ID="outage",
            HOSTQUEUE_REDIS_FINISH_GRACE=0.5,
            HOSTQUEUE_TIMELINE_FILE="",
        )
    finally:
        cutter.cancel()
        proxy.close()
    assert proxy.cuts == 1
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("Lost the shared frontier") for m in messages) == 1, messages
    assert sum(m.startswith("The shared frontier at Redis is back") for m in messages) == 1
    assert crawler.stats is not None
    assert crawler.stats.get_value("finish_reason") == "finished"
    for host in hosts.all_stats(arrivals=False):
        assert set(host.pages) == {f"/page/{n}" for n in range(pages)}, host.hostname
        assert max(host.pages.values()) == 1


def test_redis_unreachable_at_start_up_is_one_error_line(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error = crawl_refused_at_start(f"HOSTQUEUE_FRONTIER=redis://127.0.0.1:{port}/0")
    assert f"cannot use the shared frontier at redis://127.0.0.1:{port}/0" in error


def test_urls_pushed_from_outside_are_crawled(server: RedisServer, tmp_path: Path) -> None:
    specs = [HostSpec(latency=0.01, pages=20)] * 2
    with watched_hosts(specs, process=True) as hosts:
        pushed = subprocess.run(
            [sys.executable, "-m", "scrapy_hostqueue", "push", server.url, "--crawl-id", "fed"],
            input=f"{hosts.page_url(1, 0)}\n{hosts.page_url(1, 0)}\n",
            env=child_environment(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert pushed.stdout.strip() == "queued 1, 1 already seen"
        # The worker starts from the first host only; the second comes from Redis.
        worker = _worker(server, hosts, tmp_path, 0, "fed", start=[hosts.page_url(0, 0)])
        _wait([worker], tmp_path)
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)
    for host, spec in zip(stats, specs, strict=True):
        assert set(host.pages) == {f"/page/{n}" for n in range(spec.pages or 0)}


def _host_counts(tmp_path: Path, hostname: str) -> list[tuple[int, int]]:
    """Per worker: the host's responses, and the parts of busy hosts it was lent."""
    out = []
    for path in sorted(tmp_path.glob("stats*.json")):
        stats = json.loads(path.read_text())["stats"]
        out.append(
            (
                stats.get(f"hostqueue/hosts/{hostname}/response_count", 0),
                stats.get("hostqueue/redis/shared_hosts_count", 0),
            )
        )
    return out


def _crawl_one_busy_host(
    server: RedisServer, tmp_path: Path, spec: HostSpec, crawl: str, **settings: Any
) -> tuple[HostStats, list[tuple[int, int]]]:
    """Two ``scrapy crawl`` processes on one host of *spec*.

    The host's counts at the server, and per process its responses and the parts of the host it was
    lent. Both processes ended normally.
    """
    with watched_hosts([spec], process=True) as hosts:
        workers = [
            _worker(server, hosts, tmp_path, n, crawl, HOSTQUEUE_AIMD_START=4, **settings)
            for n in range(2)
        ]
        _wait(workers, tmp_path)
        hosts.wait_idle(10)
        (host,) = hosts.all_stats(arrivals=False)
    logs = _logs(tmp_path)
    assert "Traceback" not in logs, logs[-4000:]
    _responses(tmp_path)
    return host, _host_counts(tmp_path, host.hostname)


def test_one_busy_host_is_shared_by_two_processes_within_its_limit(
    server: RedisServer, tmp_path: Path
) -> None:
    spec = HostSpec(latency=0.01, pages=600, links=3)
    host, counts = _crawl_one_busy_host(server, tmp_path, spec, "busy")
    # Two processes on one host: never more than its one limit at the host.
    assert host.max_in_flight <= 4, host.max_in_flight
    assert set(host.pages) == {f"/page/{n}" for n in range(600)}
    assert max(host.pages.values()) == 1
    # The process that did not hold it was lent a part, and crawled a real
    # part of the pages.
    assert sum(lent for _, lent in counts) >= 1, counts
    assert min(responses for responses, _ in counts) >= 60, counts


def test_a_retry_after_seen_by_one_holder_of_a_shared_host_holds_for_both(
    server: RedisServer, tmp_path: Path
) -> None:
    # Every 100th request gets a 429; the host's limit stays 4 (the AIMD
    # floor), so that it stays worth sharing after its 429s.
    spec = HostSpec(latency=0.02, pages=300, fault="throttle", fault_rate=0.01, retry_after="1")
    host, counts = _crawl_one_busy_host(
        server, tmp_path, spec, "busy-retry", HOSTQUEUE_AIMD_FLOOR=4
    )
    assert sum(lent for _, lent in counts) >= 1, counts
    assert min(responses for responses, _ in counts) >= 40, counts
    windows = host.statuses.get(429, 0)
    assert windows >= 1, host.statuses
    assert host.max_in_flight <= 4, host.max_in_flight
    assert host.in_retry_after_window <= 3 * windows, host
    assert set(host.pages) == {f"/page/{n}" for n in range(300)}
