"""``scrapy crawl`` with JOBDIR, stopped by one SIGINT and started again.

``scrapy crawl`` with JOBDIR (the SQLite frontier), stopped by one SIGINT
(Ctrl-C) and started again: every page of a finite site is fetched exactly once
across the two runs, and a host the AIMD middleware slowed down stays slowed
down in the run that resumes.

The crawl runs as a user runs it, in a subprocess in ``example_project`` with the
add-on; the test hosts run in this process and count what they serve.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.frontier import FRONTIER_FILE
from scrapy_hostqueue.testing import HostSpec, LocalHosts
from tests.helpers.crawl_report import watched_hosts
from tests.helpers.crawling import start_demo_crawl

pytestmark = pytest.mark.crawl

PAGES = 60
HOSTS = 3


def _crawl(
    hosts: LocalHosts, jobdir: Path, items: Path, log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    return start_demo_crawl(
        (hosts.page_url(i, 0) for i in range(len(hosts))),
        log,
        {
            "JOBDIR": jobdir,
            "CLOSESPIDER_PAGECOUNT": 0,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            "HOSTQUEUE_TIMELINE_FILE": "",
        },
        "-o",
        f"{items}:jsonlines",
        *extra,
        log_mode="wb",
    )


def _wait(process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"scrapy crawl did not end in {timeout} s:\n{log.read_text()[-3000:]}")
    assert code == 0, log.read_text()[-3000:]


def _until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met in {timeout} s")
        time.sleep(0.01)


def _urls(items: Path) -> list[str]:
    return [json.loads(line)["url"] for line in items.read_text().splitlines() if line]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_sigint_then_resume_fetches_every_page_once(tmp_path: Path) -> None:
    jobdir = tmp_path / "job"
    spec = HostSpec(latency=0.05, pages=PAGES, links=3)
    with watched_hosts([spec] * HOSTS) as hosts:
        served = lambda: sum(s.served for s in hosts.all_stats(arrivals=False))  # noqa: E731
        first = _crawl(hosts, jobdir, tmp_path / "first.jsonl", tmp_path / "first.log")
        _until(lambda: served() >= 30 or first.poll() is not None, 60)
        assert first.poll() is None, "the crawl ended before it could be interrupted"
        first.send_signal(signal.SIGINT)
        _wait(first, tmp_path / "first.log", 60)
        log = (tmp_path / "first.log").read_text()
        assert "'finish_reason': 'shutdown'" in log
        assert (jobdir / FRONTIER_FILE).exists()
        stopped_at = served()
        assert stopped_at < HOSTS * PAGES

        second = _crawl(hosts, jobdir, tmp_path / "second.jsonl", tmp_path / "second.log")
        _wait(second, tmp_path / "second.log", 120)
        assert "'finish_reason': 'finished'" in (tmp_path / "second.log").read_text()
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)

    first_urls = _urls(tmp_path / "first.jsonl")
    second_urls = _urls(tmp_path / "second.jsonl")
    assert len(first_urls) >= 30
    assert second_urls
    # Every page parsed exactly once across the two runs...
    counts = Counter(first_urls + second_urls)
    assert len(counts) == HOSTS * PAGES
    assert set(counts.values()) == {1}
    # ...and fetched exactly once at the hosts (no request both finished at
    # the stop and queued again).
    assert [s.served for s in stats] == [PAGES] * HOSTS
    assert all(s.max_in_flight <= 2 for s in stats)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_a_resumed_crawl_starts_a_host_at_its_learned_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The host answers 429 (Retry-After: 1) to a second request in flight.
    # The AIMD middleware starts it at 4 and halves its limit down to 1; no
    # answer is fast enough to raise it again (HOSTQUEUE_AIMD_FAST_LATENCY).
    jobdir = tmp_path / "job"
    spec = HostSpec(latency=0.05, pages=400, links=3, throttle_above=1, retry_after="1")
    aimd = [
        *("-s", "HOSTQUEUE_AIMD_START=4", "-s", "HOSTQUEUE_AIMD_CEILING=4"),
        *("-s", "HOSTQUEUE_AIMD_FAST_LATENCY=0.001", "-s", "HOSTQUEUE_AIMD_DEBUG=True"),
        *("-s", "ROBOTSTXT_OBEY=False", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=4"),
    ]
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    with watched_hosts([spec]) as hosts:
        first = _crawl(hosts, jobdir, tmp_path / "first.jsonl", first_log, *aimd)
        _until(lambda: "limit 2 -> 1" in first_log.read_text() or first.poll() is not None, 60)
        assert first.poll() is None, first_log.read_text()[-3000:]
        # Answered at limit 1 for a while (each commit of the frontier file
        # writes the host), then stopped.
        served_at_one = hosts.stats(0, arrivals=False).served
        _until(lambda: hosts.stats(0, arrivals=False).served >= served_at_one + 10, 60)
        first.send_signal(signal.SIGINT)
        _wait(first, first_log, 60)
        assert hosts.stats(0, arrivals=False).statuses.get(429, 0) >= 2

        # What python -m scrapy_hostqueue frontier shows of the job (its
        # command line, in this process).
        assert cli(["frontier", str(jobdir)]) == 0
        shown = capsys.readouterr().out
        assert "AIMD limit 1, latency" in shown, shown

        hosts.wait_idle(10)
        hosts.reset()
        second = _crawl(hosts, jobdir, tmp_path / "second.jsonl", second_log, *aimd)
        _until(lambda: hosts.stats(0, arrivals=False).served >= 20 or second.poll() is not None, 60)
        second.send_signal(signal.SIGINT)
        _wait(second, second_log, 60)
        stats = hosts.stats(0, arrivals=False)

    # At the host: one request at a time from the start, no 429. A crawl that
    # forgot the limit would have sent 4 at once after the first answer.
    assert stats.served >= 20
    assert stats.max_in_flight == 1, stats
    assert stats.statuses == {200: stats.served}
    assert "resumed what was learned about 1 host(s)" in second_log.read_text()
