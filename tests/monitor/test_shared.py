"""The monitor of a shared crawl, two ``scrapy crawl`` processes on one Redis.

On a real ``redis-server``: each page shows both processes and the
crawl-wide host table, and ``python -m scrapy_hostqueue monitor`` serving the
same from Redis alone; checked against the local hosts' own counts.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.runner import child_environment
from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.monitor._crawlwide import merge
from scrapy_hostqueue.testing import HostSpec
from tests.helpers.crawl_report import watched_hosts
from tests.helpers.crawling import start_demo_crawl
from tests.helpers.redis import RedisServer
from tests.helpers.requires_redis import import_redis

redis = import_redis()

PAGES = 40


def part(pid: int, hosts: list[dict[str, Any]], **crawl: Any) -> dict[str, Any]:
    """One process's snapshot, as it publishes it (the fields merge reads)."""
    figures = {
        "pages_per_second": 1.0,
        "responses": sum(host["responses"] for host in hosts),
        "statuses": {"200": 1},
        "statuses_total": {"200": 2},
        "in_flight": sum(host["in_flight"] for host in hosts),
        "queued": sum(host["queued"] for host in hosts),
        "active_hosts": len(hosts),
        "max_active_hosts": 16,
        "concurrent_requests": 16,
        "given_up_hosts": 0,
        "hosts": len(hosts),
        "live_hosts": len(hosts) - 1,
        "states": {"in-flight": len(hosts)},
        "redis": {"waited": 0.0, "round_trip_p95": 0.001, "away": 0.0, "full": False},
        "why": {"bound": "hosts", "text": "Bound by the hosts."},
    }
    figures.update(crawl)
    return {
        "time": 100.0,
        "uptime": 5.0,
        "process": {"hostname": "m", "pid": pid, "key": f"m:{pid}"},
        "crawl": figures,
        "hosts": hosts,
        "other": {"host": "_other", "hosts": 0, "queued": 0, "in_flight": 0},
    }


def host(name: str, **values: Any) -> dict[str, Any]:
    row = {
        "host": name,
        "state": "in-flight",
        "in_flight": 1,
        "cap": 2,
        "limit": 2,
        "queued": 3,
        "queued_crawl": None,
        "overdue": 0,
        "block_reason": None,
        "block_left": 0.0,
        "interval": 0.0,
        "pages_per_second": 1.0,
        "responses": 10,
        "statuses": {"200": 10},
        "latency_p50": 0.1,
        "latency_p95": 0.2,
        "last_change": None,
    }
    row.update(values)
    return row


def test_merge_adds_up_processes_and_hosts() -> None:
    one = part(1, [host("a", responses=10), host("b", responses=5, queued=0, in_flight=2)])
    # b is lent in part to process 2, which holds less of its work.
    two = part(2, [host("b", responses=1, queued=0, in_flight=1, limit=3), host("c", responses=9)])
    two["crawl"]["redis"] = {"waited": 0.5, "round_trip_p95": 0.2, "away": 0.0, "full": False}
    merged = merge([two, one], top=2, now=101.5)
    assert [p["pid"] for p in merged["processes"]] == [1, 2]
    assert merged["processes"][0]["age"] == 1.5
    # The hosts each holds, not every host it knows.
    assert [p["hosts"] for p in merged["processes"]] == [1, 1]
    assert merged["crawl"]["live_hosts"] == 2
    assert merged["crawl"]["responses"] == 25
    assert merged["crawl"]["statuses_total"] == {"200": 4}
    assert merged["crawl"]["states"] == {"in-flight": 4}
    assert merged["crawl"]["why"]["text"] == "2 of 2 processes: Bound by the hosts."
    # Redis as the process that waited on it most saw it.
    assert merged["crawl"]["redis"] == two["crawl"]["redis"]
    rows = {row["host"]: row for row in merged["hosts"]}
    # The top 2 by responses, then name; c is folded.
    assert list(rows) == ["a", "c"]
    assert merged["other"] == {"host": "_other", "hosts": 1, "queued": 0, "in_flight": 3}
    merged = merge([one, two], top=3, now=101.5)
    b = next(row for row in merged["hosts"] if row["host"] == "b")
    assert (b["responses"], b["in_flight"], b["statuses"]) == (6, 3, {"200": 20})
    # Lent: both holders have work for it, and its limit is split between them.
    assert b["limit"] == 5
    merged = merge([one, part(3, [host("b", in_flight=0, queued=0, limit=7)])], top=3, now=101.5)
    b = next(row for row in merged["hosts"] if row["host"] == "b")
    # Only remembered by the other process: the holder's limit.
    assert (b["limit"], b["responses"]) == (2, 15)
    assert b["queued_crawl"] == 0


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def _json_url(monitor_url: str) -> str:
    base, token = monitor_url.split("?")
    return f"{base}hosts.json?{token}"


def _monitor_url(read: Callable[[], str], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"Monitor: (http://\S+)", read())
        if found:
            return found.group(1)
        time.sleep(0.1)
    raise AssertionError("no monitor URL:\n" + read()[-3000:])


def _until(condition: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"not seen in {timeout}s")


@pytest.mark.crawl
@pytest.mark.requires_redis
@pytest.mark.skipif(sys.platform == "win32", reason="signals")
def test_two_processes_one_view(redis_server: RedisServer, tmp_path: Path) -> None:
    redis_server.flushall()
    specs = [HostSpec(latency=0.02, links=3, pages=PAGES)] * 3
    settings = {
        "HOSTQUEUE_FRONTIER": redis_server.url,
        "HOSTQUEUE_CRAWL_ID": "watched",
        "CLOSESPIDER_PAGECOUNT": 0,
        "CLOSESPIDER_TIMEOUT": 90,
        "ROBOTSTXT_OBEY": False,
        # Open until stopped, so that the figures settle once every page is in.
        "DEMO_KEEP_OPEN": True,
        "HOSTQUEUE_MAX_ACTIVE_HOSTS": 2,
    }
    with watched_hosts(specs, process=True) as hosts:
        logs = [tmp_path / f"worker{n}.log" for n in range(2)]
        workers = [
            start_demo_crawl([hosts.page_url(i, 0) for i in range(3)], log, settings)
            for log in logs
        ]
        reader = subprocess.Popen(
            [
                *(sys.executable, "-m", "scrapy_hostqueue", "monitor"),
                *("env:HQ_TEST_REDIS", "--crawl-id", "watched"),
            ],
            env={**child_environment(), "HQ_TEST_REDIS": redis_server.url},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            urls = [_monitor_url(log.read_text) for log in logs]
            assert reader.stdout is not None
            line = reader.stdout.readline()
            assert line.startswith("Monitor: http://127.0.0.1:"), line
            reader_url = line.split()[1]
            served = PAGES * 3
            _until(lambda: sum(s.served for s in hosts.all_stats(arrivals=False)) == served)
            hosts.wait_idle(10)

            def settled(url: str) -> dict[str, Any] | None:
                snap = _get(_json_url(url))
                processes = snap.get("processes") or []
                if len(processes) == 2 and snap["crawl"]["responses"] == served:
                    return snap
                return None

            views = [_until(lambda url=url: settled(url)) for url in [*urls, reader_url]]
            stats = hosts.all_stats(arrivals=False)
        finally:
            reader.send_signal(signal.SIGINT)
            for worker in workers:
                worker.send_signal(signal.SIGINT)
            for process in [*workers, reader]:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if reader.stdout is not None:
                reader.stdout.close()
    pids = {worker.pid for worker in workers}
    for view in views:
        assert {p["pid"] for p in view["processes"]} == pids
        # Each process's own responses, and the crawl's, add up to what the hosts served.
        assert sum(p["responses"] for p in view["processes"]) == served
        rows = {row["host"]: row for row in view["hosts"]}
        for stat in stats:
            assert rows[stat.hostname]["responses"] == stat.served == PAGES
            # The last minute's: the crawl is younger.
            assert rows[stat.hostname]["statuses"] == {"200": PAGES}
        assert view["crawl"]["in_flight"] == 0
    # The reader has no process of its own.
    assert views[-1]["process"] is None
    assert views[0]["process"]["pid"] in pids
    # A process withdraws its snapshot when it ends.
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.zcard("hq:{watched}:monitor") == 0
    finally:
        client.close()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["monitor", "memory", "--crawl-id", "c"], "not a Redis URL"),
        (["monitor", "redis://127.0.0.1:1/0", "--crawl-id", "c", "--port", "70000"], "--port"),
        (["monitor", "redis://127.0.0.1:1/0", "--crawl-id", "c", "--bind", "here"], "--bind"),
        (["monitor", "env:HQ_NO_SUCH_VARIABLE", "--crawl-id", "c"], "HQ_NO_SUCH_VARIABLE"),
    ],
)
def test_monitor_command_refuses_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_monitor_command_without_redis_is_one_error_line() -> None:
    # Nothing listens on port 1. A process of its own: the tests' asyncio
    # loop runs in this one.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "scrapy_hostqueue",
            "monitor",
            "redis://127.0.0.1:1/0",
            "--crawl-id",
            "c",
        ],
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot reach Redis at redis://127.0.0.1:1/0")
    assert done.stderr.count("\n") == 1, done.stderr
    assert not done.stdout
