"""The report a crawl test prints when it fails.

Covered: ``crawl_report`` and the watch of tests/helpers/crawl_report.py; what it says, read from a
crawl in this process, from a ``scrapy crawl`` log, and in the output of a failed test.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_hostqueue.testing import HostSpec, HostStats, crawl_report
from tests.helpers import ROOT
from tests.helpers.crawl_report import WATCHED, ProcessCrawl
from tests.helpers.crawling import HostsFactory, crawl


def test_the_report_names_what_a_host_missed_and_what_the_crawl_counted() -> None:
    stats = {
        "finish_reason": "finished",
        "elapsed_time_seconds": 1.25,
        "scheduler/enqueued": 7,
        "scheduler/dequeued": 7,
        "dupefilter/filtered": 3,
        "retry/count": 1,
        "downloader/exception_type_count/builtins.OSError": 1,
        "start_time": "left out",
        "hostqueue/hosts/127.0.0.2/block_count/429": 2,
        "hostqueue/hosts/127.0.0.2/response_count": 3,
        "hostqueue/hosts/127.0.0.1/response_count": 4,
        "hostqueue/hosts/127.0.0.1/max_inflight": 2,
    }
    full = {"/": 1, "/page/1": 1, "/page/2": 1, "/page/3": 1}
    hosts = [
        HostStats("127.0.0.1", 1, served=4, requests=4, statuses={200: 4}, pages=full),
        HostStats("127.0.0.3", 3, served=4, requests=4, statuses={200: 4}, pages=full),
        HostStats(
            "127.0.0.2",
            2,
            served=4,
            requests=5,
            statuses={200: 3, 429: 1},
            resets=1,
            pages={"/": 1, "/page/1": 2, "/page/3": 1},
        ),
    ]
    report = crawl_report(
        stats,
        hosts=hosts,
        specs=[HostSpec(pages=4)] * 3,
        log=["one line", "the last line"],
        title="the crawl",
    )
    lines = report.splitlines()
    assert lines[0] == "== the crawl"
    assert lines[1] == "finish_reason 'finished', 1.25 s"
    assert lines[2].startswith("enqueued 7, dequeued 7, requeued 0, duplicates filtered 3, ")
    assert "blocks 2 {'429': 2}, download errors 0, retries 1," in lines[2]
    assert "downloader: exception_type_count/builtins.OSError 1" in lines
    assert "left out" not in report
    assert "per host, summed: block_count/429 2, max_inflight 2, response_count 7" in lines
    # Neighbours that counted the same share a line; the host that missed a
    # page has its own, and the crawler's stats of it follow.
    assert "  127.0.0.1 .. 127.0.0.3 (2 hosts): served 4 of 4 pages, requests 4, " in report
    (short,) = [line for line in lines if line.startswith("  127.0.0.2:")]
    assert "served 4 of 4 pages, missing 1 (/page/2), served more than once 1 (/page/1)" in short
    assert "statuses {200: 3, 429: 1}, resets 1" in short
    assert "crawler's stats of 127.0.0.2: block_count/429 2, response_count 3" in lines
    assert lines[-3:] == ["last 2 log lines:", "  one line", "  the last line"]
    assert "no stats: the crawl did not close" in crawl_report(None)


def test_a_scrapy_crawl_log_gives_its_stats_and_its_last_records(tmp_path: Path) -> None:
    log = tmp_path / "crawl.log"
    log.write_text(
        textwrap.dedent(
            """\
            2026-01-02 03:04:05 [scrapy.crawler] INFO: Overridden settings:
            {'BOT_NAME': 'demo',
             'LOG_LEVEL': 'INFO'}
            2026-01-02 03:04:06 [scrapy.core.scraper] ERROR: Spider error processing
            Traceback (most recent call last):
              File "x.py", line 1, in parse
            ValueError: no such page
            2026-01-02 03:04:07 [scrapy.statscollectors] INFO: Dumping Scrapy stats:
            {'downloader/response_count': 7,
             'elapsed_time_seconds': 0.5,
             'finish_reason': 'finished',
             'start_time': datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)}
            2026-01-02 03:04:07 [scrapy.core.engine] INFO: Spider closed (finished)
            """
        )
    )
    report = ProcessCrawl(log).render("crawl 1 of 1", [])
    assert "finish_reason 'finished', 0.50 s" in report
    assert ", responses 7, " in report
    assert report.splitlines()[-4:] == [
        "  2026-01-02 03:04:05 [scrapy.crawler] INFO: Overridden settings: [+2 lines]",
        "  2026-01-02 03:04:06 [scrapy.core.scraper] ERROR: Spider error processing"
        " | ValueError: no such page",
        "  2026-01-02 03:04:07 [scrapy.statscollectors] INFO: Dumping Scrapy stats: [+4 lines]",
        "  2026-01-02 03:04:07 [scrapy.core.engine] INFO: Spider closed (finished)",
    ]
    # A process killed before its end left no stats dump.
    log.write_text("2026-01-02 03:04:05 [scrapy.core.engine] INFO: Spider opened\n")
    assert "no stats: the crawl did not close" in ProcessCrawl(log).render("crawl", [])


@pytest.mark.crawl
@deferred_f_from_coro_f
async def test_a_crawl_keeps_its_log_and_leaves_the_tests_log_as_it_was(
    local_hosts: HostsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = local_hosts("2x latency=0,pages=4,links=3")
    await crawl([hosts.url(0), hosts.url(1)], follow=True)
    report = WATCHED.report()
    assert report is not None
    assert "== crawl 1 of 1 in this process (PageSpider)" in report
    assert "finish_reason 'finished'" in report
    assert "enqueued 8, dequeued 8, " in report
    assert "127.0.0.1 .. 127.0.0.2 (2 hosts): served 4 of 4 pages" in report
    assert "[scrapy.core.engine] INFO: Spider closed (finished)" in report
    # The INFO records went to the crawl's tail only: what the test sees of
    # the log (caplog, pytest's captured log) is what it saw without it.
    assert not [r for r in caplog.records if r.levelno < logging.WARNING]
    assert logging.getLogger("scrapy").level == logging.NOTSET
    assert logging.getLogger("scrapy").propagate


@pytest.mark.crawl
def test_a_failed_crawl_test_prints_the_crawl_report_through_xdist(tmp_path: Path) -> None:
    failing = tmp_path / "test_failing.py"
    failing.write_text(
        textwrap.dedent(
            """\
            from scrapy.utils.defer import deferred_f_from_coro_f
            from tests.helpers.crawling import crawl

            @deferred_f_from_coro_f
            async def test_every_page(local_hosts):
                hosts = local_hosts("2x latency=0,pages=4,links=3")
                await crawl([hosts.url(0), hosts.url(1)], follow=True)
                assert [s.served for s in hosts.all_stats()] == [4, 5]
            """
        )
    )
    command = [sys.executable, "-m", "pytest", "-c", str(ROOT / "setup.cfg")]
    command += ["--rootdir", str(ROOT), "-p", "tests.conftest", "-n", "1", str(failing)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    out = done.stdout
    assert done.returncode == 1, out[-3000:] + done.stderr[-3000:]
    assert "At index 1 diff: 4 != 5" in out
    section = out.split(" crawl report ", 1)[1]
    assert "finish_reason 'finished'" in section
    assert "127.0.0.1 .. 127.0.0.2 (2 hosts): served 4 of 4 pages" in section
    assert "INFO: Spider closed (finished)" in section
