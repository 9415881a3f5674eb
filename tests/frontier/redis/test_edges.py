"""The shared crawl at Redis's edges, with real servers and real crawl processes.

The shared crawl at Redis's edges, with real ``redis-server`` processes and
real ``scrapy crawl`` processes: a Redis that lost the crawl (restarted
without persistence, flushed), one restarted with its append-only file or
stopped for a while, one too small for the crawl's frontier, and the
start-up checks of its settings.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bench.redis_full import run as run_full
from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.frontier.redis._db import part_prefix
from scrapy_hostqueue.testing import HostSpec, HostStats, LocalHosts
from tests.helpers.crawling import crawl_refused_at_start, ended_at_exit, start_demo_crawls
from tests.helpers.redis import CuttableProxy, RedisServer
from tests.helpers.requires_redis import import_redis, redis_server_marks

redis = import_redis()

pytestmark = redis_server_marks(pytest.mark.crawl, needs="signals, redis-server")

CRAWL = "edges"
P = part_prefix(CRAWL)
LEASE = 4.0


def _settings(server: RedisServer | str, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "HOSTQUEUE_FRONTIER": server if isinstance(server, str) else server.url,
        "HOSTQUEUE_CRAWL_ID": CRAWL,
        "HOSTQUEUE_LEASE_TIMEOUT": LEASE,
        "HOSTQUEUE_REDIS_SPILL_DIR": tmp_path,
        "HOSTQUEUE_REDIS_FINISH_GRACE": 1.0,
        "HOSTQUEUE_TIMELINE_FILE": "",
        "CLOSESPIDER_PAGECOUNT": 0,
        "CLOSESPIDER_TIMEOUT": 120,
        "ROBOTSTXT_OBEY": False,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        **extra,
    }


def _acked(client: Any) -> int:
    try:
        return int(client.hget(P + "stats", "acked") or 0)
    except redis.RedisError:
        return 0


def _wait_acked(client: Any, workers: list[subprocess.Popen[bytes]], count: int) -> None:
    """Wait until *count* requests are acknowledged and every worker joined the crawl.

    Until *count* requests are acknowledged and every one of *workers*
    has joined the crawl (a slow start must not meet the event).
    """
    deadline = time.monotonic() + 60
    while _acked(client) < count or client.zcard(P + "procs") < len(workers):
        assert time.monotonic() < deadline, "the crawl did not get going"
        assert all(worker.poll() is None for worker in workers), "a crawl ended early"
        time.sleep(0.01)


def _results(tmp_path: Path, count: int) -> tuple[list[str], list[dict[str, Any]]]:
    logs = [(tmp_path / f"worker{n}.log").read_text() for n in range(count)]
    results = [json.loads((tmp_path / f"stats{n}.json").read_text()) for n in range(count)]
    return logs, results


def _lines_about(log: str) -> list[str]:
    """Return the package's log lines about trouble and about the shared frontier.

    The log lines of the package at WARNING or above, and its INFO lines
    about the shared frontier or Redis, after its start-up line.
    """
    lines = log.splitlines()
    start = next(n for n, line in enumerate(lines) if "shared frontier at" in line)
    return [
        line
        for line in lines[start + 1 :]
        if re.search(r"\[scrapy_hostqueue[.\w]*\] (WARNING|ERROR|INFO)", line)
        and ("WARNING" in line or "ERROR" in line or "frontier" in line or "Redis" in line)
    ]


def _lost_crawl(
    server: RedisServer, tmp_path: Path, lose: Any, url: str | None = None
) -> tuple[list[int], list[float], list[str], list[dict[str, Any]], int]:
    """Run two crawls and call *lose* halfway; return what became of them.

    Two crawls of a site bigger than they finish before *lose* is called
    (once 300 pages are acknowledged); returns their exit codes, the seconds
    each took to exit after *lose* returned, their logs and stats, and the
    pages acknowledged before.
    """
    specs = [HostSpec(latency=0.03, pages=150, links=3)] * 10
    client = redis.Redis.from_url(server.url)
    with LocalHosts(specs, process=True) as hosts:
        settings = _settings(url or server, tmp_path)
        workers = start_demo_crawls(hosts, tmp_path, settings, 2)
        with ended_at_exit(workers):
            _wait_acked(client, workers, 300)
            acked = _acked(client)
            lose()
            back = time.monotonic()
            codes, took = [], []
            for worker in workers:
                codes.append(worker.wait(60))
                took.append(time.monotonic() - back)
    client.close()
    logs, results = _results(tmp_path, 2)
    return codes, took, logs, results, acked


def _check_lost(
    codes: list[int],
    took: list[float],
    logs: list[str],
    results: list[dict[str, Any]],
    cause: str,
) -> list[Path]:
    """Check what every process does when Redis lost the crawl.

    Returns the files of the requests they held.
    """
    files = []
    for code, seconds, log, result in zip(codes, took, logs, results, strict=True):
        assert "Traceback" not in log, log[-4000:]
        assert code != 0
        assert result["finish_reason"] == "hostqueue_frontier_lost"
        assert seconds < 2 * LEASE, (seconds, log[-3000:])
        errors = [line for line in log.splitlines() if " ERROR: " in line]
        assert len(errors) == 1, errors
        assert "no longer holds crawl 'edges'" in errors[0]
        assert cause in errors[0], errors[0]
        assert "heartbeat expired" not in log
        about = _lines_about(log)
        assert len(about) <= 5, about
        path = Path(re.findall(r"queue them with: .* --requests (\S+)", errors[0])[0])
        assert path.exists()
        files.append(path)
    return files


def test_a_redis_restarted_empty_stops_every_process_with_what_it_held_saved(
    tmp_path: Path,
) -> None:
    with RedisServer() as server:
        codes, took, logs, results, _acked_before = _lost_crawl(
            server, tmp_path, lambda: server.restart(pause=2.0)
        )
        files = _check_lost(codes, took, logs, results, "this Redis restarted")
        # Nothing written into the new, empty Redis under the old crawl.
        assert server.command(f"EXISTS {P}crawl") == 0
        # What they held goes into a new crawl of the same id.
        held = sum(len(path.read_text().splitlines()) for path in files)
        assert held > 0
        queued = 0
        for path in files:
            assert cli(["push", server.url, "--crawl-id", CRAWL, "--requests", str(path)]) == 0
        client = redis.Redis.from_url(server.url)
        queued = int(client.hget(P + "stats", "queued") or 0)
        client.close()
        assert 0 < queued <= held


def test_a_flushed_redis_stops_every_process(tmp_path: Path) -> None:
    with RedisServer() as server:
        codes, took, logs, results, _acked_before = _lost_crawl(server, tmp_path, server.flushall)
        _check_lost(codes, took, logs, results, "this Redis was flushed (FLUSHDB, FLUSHALL)")
        assert server.command("DBSIZE") == 0


def _every_page(stats: list[HostStats], specs: list[HostSpec]) -> int:
    """Assert every page was fetched; returns the fetches beyond one per page."""
    twice = 0
    for host, spec in zip(stats, specs, strict=True):
        assert set(host.pages) == {f"/page/{n}" for n in range(spec.pages or 0)}, host.hostname
        twice += sum(count - 1 for count in host.pages.values())
    return twice


def _survived(server: RedisServer, tmp_path: Path, event: Any) -> tuple[list[str], int]:
    """Two crawls of 4 hosts of 60 pages; *event* once 60 pages are acknowledged.

    Both must finish; returns their logs and the pages fetched more than once.
    """
    specs = [HostSpec(latency=0.03, pages=60, links=3)] * 4
    client = redis.Redis.from_url(server.url)
    with LocalHosts(specs, process=True) as hosts:
        workers = start_demo_crawls(hosts, tmp_path, _settings(server, tmp_path), 2)
        with ended_at_exit(workers):
            _wait_acked(client, workers, 60)
            event()
            for worker in workers:
                assert worker.wait(90) == 0
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)
    client.close()
    logs, results = _results(tmp_path, 2)
    for log, result in zip(logs, results, strict=True):
        assert "Traceback" not in log, log[-4000:]
        assert result["finish_reason"] == "finished"
    return logs, _every_page(stats, specs)


def test_a_redis_crash_with_its_append_only_file_loses_nothing(tmp_path: Path) -> None:
    with RedisServer(appendonly=True) as server:
        logs, twice = _survived(server, tmp_path, lambda: server.restart(pause=1.0))
    assert twice == 0
    for log in logs:
        about = _lines_about(log)
        assert len(about) <= 2, about


def test_a_redis_stopped_for_3_s_loses_nothing(tmp_path: Path) -> None:
    def pause() -> None:
        assert server._process is not None
        server._process.send_signal(signal.SIGSTOP)
        time.sleep(3)
        server._process.send_signal(signal.SIGCONT)

    with RedisServer(appendonly=True) as server:
        _survived(server, tmp_path, pause)


def test_an_evicting_policy_is_refused_at_start_up() -> None:
    with RedisServer(options=("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")) as s:
        error = crawl_refused_at_start(f"HOSTQUEUE_FRONTIER={s.url}")
    assert "maxmemory-policy allkeys-lru" in error
    assert "Set maxmemory-policy noeviction" in error


def test_a_redis_that_keeps_nothing_on_disk_is_one_warning(tmp_path: Path) -> None:
    specs = [HostSpec(latency=0.01, pages=5)]
    with RedisServer() as server, LocalHosts(specs, process=True) as hosts:
        (worker,) = start_demo_crawls(hosts, tmp_path, _settings(server, tmp_path), 1)
        assert worker.wait(60) == 0
    log = (tmp_path / "worker0.log").read_text()
    warnings = [line for line in log.splitlines() if "keeps nothing on disk" in line]
    assert len(warnings) == 1, log[-3000:]
    assert "a restart of this Redis loses the crawl" in warnings[0]
    assert "save '', appendonly no" in log  # the start-up line


def test_a_redis_too_small_for_the_frontier_still_gets_every_page(tmp_path: Path) -> None:
    """A Redis too small for the frontier still gets every page, slowly.

    ``maxmemory`` at half of what the frontier took of Redis at its peak
    (measured in a first crawl without a limit), ``noeviction``: 2,000 pages
    over 10 hosts, two processes (``python -m bench.redis_full`` runs the
    same with 10,000 pages over 20 hosts).
    """
    result = run_full(hosts=10, pages=200, workers=2, fraction=0.5, directory=tmp_path)
    limited = result["limited"]
    assert limited["missing"] == 0
    assert limited["twice"] <= 20, limited["twice"]
    processes = limited["processes"]
    for process in processes:
        assert process["tracebacks"] == 0
        assert process["code"] == 0
        assert process["finish_reason"] == "finished"
        assert len(process["full_lines"]) <= 10, process["full_lines"]
    # Redis was full, and said so.
    assert any(process["full_seconds"] > 0 for process in processes), processes
    assert any("is full" in line for process in processes for line in process["full_lines"])


def test_a_url_naming_another_server_stops_every_process(tmp_path: Path) -> None:
    """The crawl's Redis replaced by another server at the same address.

    A server that was already running, which never held the crawl.
    """
    with RedisServer() as server, RedisServer() as other, CuttableProxy(server.port) as proxy:

        def swap() -> None:
            proxy.target_port = other.port
            proxy.cut(0.5)

        codes, took, logs, results, _acked_before = _lost_crawl(
            server, tmp_path, swap, url=proxy.url
        )
    _check_lost(codes, took, logs, results, "the URL now names another Redis server")
