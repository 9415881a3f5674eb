"""``scrapy crawl`` with JOBDIR (the SQLite frontier), stopped by one SIGINT
(Ctrl-C) and started again: every page of a finite site is fetched exactly once
across the two runs.

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

from bench.runner import child_environment
from example_project.run_demo import PROJECT_DIR
from scrapy_hostqueue.store.sqlite import FRONTIER_FILE
from scrapy_hostqueue.testing import HostSpec, LocalHosts

pytestmark = pytest.mark.crawl

PAGES = 60
HOSTS = 3


def _crawl(hosts: LocalHosts, jobdir: Path, items: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "scrapy",
        "crawl",
        "pages",
        "-a",
        "start_urls=" + ",".join(hosts.page_url(i, 0) for i in range(len(hosts))),
        "-s",
        f"JOBDIR={jobdir}",
        "-s",
        "CLOSESPIDER_PAGECOUNT=0",
        "-s",
        "CONCURRENT_REQUESTS_PER_DOMAIN=2",
        "-s",
        "HOSTQUEUE_TIMELINE_FILE=",
        "-o",
        f"{items}:jsonlines",
    ]
    with log.open("wb") as out:
        return subprocess.Popen(
            command, cwd=PROJECT_DIR, env=child_environment(), stdout=out, stderr=subprocess.STDOUT
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
    with LocalHosts([spec] * HOSTS) as hosts:
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
