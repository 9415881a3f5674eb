"""The demo's shared mode (``--workers N``).

N ``scrapy crawl`` processes on one crawl, and the hosts' table that shows whether the per-host
limits held across them and which pages were fetched twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from example_project import run_demo as demo
from scrapy_hostqueue.testing import HostStats

HOSTS = "2x latency=5ms"


def run(tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    code = demo.main(
        [
            "--pages",
            "60",
            "--hosts",
            HOSTS,
            "--output-dir",
            str(tmp_path),
            "--timeout",
            "60",
            *extra,
        ]
    )
    return code, json.loads((tmp_path / "hosts.json").read_text())


def test_fetched_again_leaves_out_pages_the_host_throttled() -> None:
    stats = HostStats(
        "127.0.0.1", 1, served=7, statuses={200: 5, 429: 2}, pages={"/page/0": 4, "/page/1": 3}
    )
    # 7 fetches of 2 pages, 2 of them after a 429: 3 fetches were duplicates.
    assert demo.fetched_again(stats) == 3
    assert demo.fetched_again(HostStats("127.0.0.1", 1, served=2, pages={"/": 1, "/a": 1})) == 0


def test_the_limit_comes_from_the_settings() -> None:
    parser = demo.build_parser()
    assert demo.per_host_limit(parser.parse_args([])) == 4
    args = parser.parse_args(["-s", "CONCURRENT_REQUESTS_PER_DOMAIN=2"])
    assert demo.per_host_limit(args) == 2


@pytest.mark.parametrize(
    "argv",
    [["--workers", "2", "--jobdir", "x"], ["--independent"], ["--workers", "0"]],
)
def test_bad_worker_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        demo.main(argv)
    assert caught.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.crawl
def test_independent_workers_crawl_the_same_pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run(tmp_path, "--workers", "2", "--independent")
    out = capsys.readouterr().out
    assert code == 0, out
    assert report["mode"] == "independent"
    assert len(report["crawls"]) == 2
    assert all(crawl["responses"] for crawl in report["crawls"])
    # Each process starts from the same pages: the hosts serve them twice.
    stats = [HostStats.from_dict(host["stats"]) for host in report["hosts"]]
    assert sum(demo.fetched_again(s) for s in stats) >= 2
    assert "fetched again" in out
    assert "process 2:" in out
    for k in (1, 2):
        assert (tmp_path / f"crawl-{k}.log").stat().st_size > 0
        assert (tmp_path / f"timeline-{k}.jsonl").is_file()


@pytest.mark.crawl
def test_workers_share_one_frontier_when_the_package_accepts_redis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run(tmp_path, "--workers", "2")
    out = capsys.readouterr().out
    assert code == 0, out
    stats = [HostStats.from_dict(host["stats"]) for host in report["hosts"]]
    if report["mode"] == "shared":
        # One budget per host across the processes, and no page fetched twice.
        assert max(s.max_in_flight for s in stats) <= report["limit"]
        assert sum(demo.fetched_again(s) for s in stats) == 0
        assert report["redis_commands"] > 0
    else:
        # This version refuses a Redis frontier: the demo says so and runs
        # the processes on their own.
        assert report["mode"] == "independent"
        assert "the shared frontier is refused" in out
        assert "Redis store" in out
