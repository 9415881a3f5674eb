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
from scrapy.utils.defer import deferred_f_from_coro_f

from bench.runner import child_environment
from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.frontier import monitor_board
from scrapy_hostqueue.frontier.redis._monitor import CONTROL_TTL
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


def _start(
    hosts: Any,
    tmp_path: Path,
    settings: dict[str, Any],
    arguments: list[str],
    env: dict[str, str] | None = None,
) -> tuple[list[Path], list[subprocess.Popen[bytes]], subprocess.Popen[str]]:
    """Start two crawl processes from every host's first page, and the monitor command.

    Returns the processes' logs, the processes, and the command (its output piped).
    """
    logs = [tmp_path / f"worker{n}.log" for n in range(2)]
    workers = [
        start_demo_crawl([hosts.page_url(i, 0) for i in range(len(hosts))], log, settings)
        for log in logs
    ]
    reader = subprocess.Popen(
        [sys.executable, "-m", "scrapy_hostqueue", "monitor", *arguments],
        env={**child_environment(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return logs, workers, reader


def _stop(reader: subprocess.Popen[str], workers: list[subprocess.Popen[bytes]]) -> None:
    """Stop the monitor command *reader* and the crawl processes *workers* (Ctrl-C)."""
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
        logs, workers, reader = _start(
            hosts,
            tmp_path,
            settings,
            ["env:HQ_TEST_REDIS", "--crawl-id", "watched"],
            {"HQ_TEST_REDIS": redis_server.url},
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
            _stop(reader, workers)
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


def _post(url: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Post a control to the page at *url* (its token in the header), as the page does."""
    base, token = url.split("?token=")
    request = urllib.request.Request(
        base + "control",
        data=json.dumps(fields).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return dict(json.loads(answer.read()))


BLOCK = 4.0


@pytest.mark.crawl
@pytest.mark.requires_redis
@pytest.mark.skipif(sys.platform == "win32", reason="signals")
def test_controls_reach_the_process_that_holds_the_host(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    redis_server.flushall()
    pages = 60
    specs = [HostSpec(latency=0.2, links=3, pages=pages)] * 2
    settings = {
        "HOSTQUEUE_FRONTIER": redis_server.url,
        "HOSTQUEUE_CRAWL_ID": "steered",
        "HOSTQUEUE_MONITOR_CONTROLS": True,
        "HOSTQUEUE_AIMD_CEILING": 2,
        "CLOSESPIDER_PAGECOUNT": 0,
        "CLOSESPIDER_TIMEOUT": 90,
        "ROBOTSTXT_OBEY": False,
    }
    with watched_hosts(specs, process=True) as hosts:
        # The page served from Redis alone holds no host: its controls go
        # through Redis to the process that holds it.
        logs, workers, reader = _start(
            hosts, tmp_path, settings, [redis_server.url, "--crawl-id", "steered", "--controls"]
        )
        try:
            urls = [_monitor_url(log.read_text) for log in logs]
            assert reader.stdout is not None
            reader_url = reader.stdout.readline().split()[1]
            target = hosts.hostnames[0]
            _until(lambda: hosts.stats(0, arrivals=False).served >= 3)
            _until(lambda: any(r["host"] == target for r in _get(_json_url(reader_url))["hosts"]))
            sent = _post(reader_url, {"action": "block", "host": target, "seconds": BLOCK})
            sent_at = time.monotonic()
            # Applied at the holder's next heartbeat (2 s) at the latest.
            time.sleep(BLOCK + 0.5)
            blocked_arrivals = [
                t for t in hosts.stats(0).arrivals if sent_at + 2.5 < t < sent_at + BLOCK - 0.1
            ]
            audit = [
                line
                for log in logs
                for line in log.read_text().splitlines()
                if "Monitor control from 127.0.0.1 on the monitor command" in line
            ]
            # A pause given on one process's page reaches both.
            paused = _post(urls[0], {"action": "pause"})
            time.sleep(2.5)
            hosts.wait_idle(10)
            quiet = sum(len(s.arrivals) for s in hosts.all_stats())
            time.sleep(1.0)
            while_paused = sum(len(s.arrivals) for s in hosts.all_stats()) - quiet
            shown_paused = _get(_json_url(urls[1]))["crawl"]["paused"]
            resumed = _post(urls[1], {"action": "resume"})
            _until(lambda: sum(s.served for s in hosts.all_stats(arrivals=False)) == 2 * pages)
            # The blocked host had work left: it went on after the block.
            after_block = [t for t in hosts.stats(0).arrivals if t > sent_at + BLOCK]
        finally:
            _stop(reader, workers)
    assert sent["result"].startswith("sent to the process that holds the host"), sent
    assert len(audit) == 1, audit
    assert f"block host {target} for 4s: blocked for " in audit[0]
    assert blocked_arrivals == []
    assert after_block
    assert paused["result"].endswith("in every process of the crawl"), paused
    assert while_paused == 0
    assert shown_paused is True
    assert resumed["ok"]


@pytest.mark.requires_redis
@deferred_f_from_coro_f
async def test_the_board_carries_controls(redis_url: str, redis_client: Any) -> None:
    giver = monitor_board(redis_url, "steer")
    holder = monitor_board(redis_url, "steer")
    holder.read_controls = True
    await giver.open()
    await holder.open()
    try:
        # Controls off: a heartbeat reads neither key.
        redis_client.config_resetstat()
        await giver.beat(None)
        read = redis_client.info("commandstats")
        assert "cmdstat_lrange" not in read
        assert "cmdstat_get" not in read
        await giver.post({"action": "block", "host": "a", "seconds": 5, "from": "x"})
        await giver.set_paused(True)
        # Read in the heartbeat's round trip.
        await holder.beat(None)
        assert holder.paused is True
        assert [(control["action"], control["host"]) for _, control in holder.controls] == [
            ("block", "a")
        ]
        raw = holder.controls[0][0]
        assert 0 < redis_client.pttl("hq:{steer}:controls") <= CONTROL_TTL * 1000
        # Taken out by the first process that applies it, once.
        assert await holder.done(raw) is True
        assert await giver.done(raw) is False
        # One no process took in time is dropped.
        stale = {"action": "unblock", "host": "b", "at": time.time() - CONTROL_TTL - 1}
        redis_client.rpush("hq:{steer}:controls", json.dumps(stale))
        await giver.set_paused(False)
        await holder.beat(None)
        assert holder.controls == []
        assert holder.paused is False
        assert redis_client.exists("hq:{steer}:paused") == 0
    finally:
        await giver.close()
        await holder.close()
