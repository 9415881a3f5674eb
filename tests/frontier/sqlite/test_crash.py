"""``scrapy crawl`` with JOBDIR, killed with SIGKILL again and again, loses nothing.

``scrapy crawl`` with JOBDIR (the SQLite frontier), killed with SIGKILL at
seeded random moments and started again each time until it finishes: no page
and no item is lost, and what is fetched twice stays within what was in
flight at the kills plus one commit window.

The crawls run as a user runs them, in subprocesses in ``example_project``;
the hosts run in a child process of their own and count, per page, what they
served.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import pytest

from scrapy_hostqueue.frontier.sqlite._glue import COMMIT_INTERVAL
from scrapy_hostqueue.testing import HostSpec, LocalHosts
from tests.helpers.crawl_report import watched_hosts
from tests.helpers.crawling import start_demo_crawl

pytestmark = [
    pytest.mark.crawl,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL"),
]

HOSTS = 20
PAGES = 50
#: Each kill takes 50 to 150 more pages: the crawl (1,000 pages) outlasts them.
KILLS = 5
SEED = 27
#: Pages served within this many seconds before a kill may be fetched again:
#: acknowledged after the last commit (one commit interval, plus the time a
#: busy event loop may add), or downloaded and not yet through their callback.
WINDOW = COMMIT_INTERVAL + 0.5


def _crawl(hosts: LocalHosts, jobdir: Path, items: Path, log: Path) -> subprocess.Popen[bytes]:
    return start_demo_crawl(
        (hosts.page_url(i, 0) for i in range(HOSTS)),
        log,
        {
            "JOBDIR": jobdir,
            "DEMO_ITEMS_FILE": items,
            "CLOSESPIDER_PAGECOUNT": 0,
            "HOSTQUEUE_TIMELINE_FILE": "",
            "ROBOTSTXT_OBEY": False,
            "CONCURRENT_REQUESTS": 8,
        },
    )


def test_sigkill_at_random_moments_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    jobdir = tmp_path / "job"
    items = tmp_path / "items.jsonl"
    log = tmp_path / "crawl.log"
    spec = HostSpec(latency=0.02, pages=PAGES, links=3)
    refetch_bound = 0
    with watched_hosts([spec] * HOSTS, process=True) as hosts:

        def served() -> tuple[int, int]:
            stats = hosts.all_stats(arrivals=False)
            return sum(s.served for s in stats), sum(s.in_flight for s in stats)

        kills = 0
        for run in range(KILLS + 20):
            process = _crawl(hosts, jobdir, items, log)
            if kills == KILLS:
                try:
                    code = process.wait(240)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    pytest.fail(f"the last run did not end:\n{log.read_text()[-3000:]}")
                assert code == 0, log.read_text()[-3000:]
                break
            start, _ = served()
            target = start + rng.randint(50, 150)
            history: deque[tuple[float, int]] = deque()
            deadline = time.monotonic() + 120
            while process.poll() is None and time.monotonic() < deadline:
                count, in_flight = served()
                now = time.monotonic()
                history.append((now, count))
                while history and history[0][0] < now - WINDOW:
                    history.popleft()
                if count >= target:
                    process.send_signal(signal.SIGKILL)
                    process.wait()
                    count, in_flight = served()
                    refetch_bound += in_flight + count - history[0][1]
                    kills += 1
                    break
                time.sleep(0.01)
            else:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                    pytest.fail(f"run {run} made no progress:\n{log.read_text()[-3000:]}")
                # It finished before its kill: the crawl is done.
                assert process.returncode == 0, log.read_text()[-3000:]
                break
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)

    text = log.read_text()
    assert kills >= KILLS, f"only {kills} kills: the crawl finished first"
    assert text.count("'finish_reason': 'finished'") == 1
    assert "Traceback" not in text, text[-3000:]
    expected = {f"/page/{n}" for n in range(PAGES)}
    refetched = 0
    for host in stats:
        assert set(host.pages) == expected, host.hostname
        refetched += sum(count - 1 for count in host.pages.values())
    assert refetched <= refetch_bound, (refetched, refetch_bound)
    urls = {json.loads(line)["url"] for line in items.read_text().splitlines() if line}
    assert len(urls) == HOSTS * PAGES
