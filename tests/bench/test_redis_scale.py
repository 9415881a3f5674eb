"""``python -m bench.redis_scale``.

The window its pages per second are counted in, its ratios and targets, and a tiny run end to end.
Timing is the benchmark's business, not asserted here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE

import pytest

from bench.redis_cluster import ClusterRun
from bench.redis_cluster import report_lines as cluster_report_lines
from bench.redis_cluster import summarise as cluster_summarise
from bench.redis_scale import (
    OverheadRun,
    ScaleRun,
    report_lines,
    summarise,
    window_rate,
)
from bench.runner import Run
from tests.helpers import ROOT


def test_the_rate_leaves_out_start_up_and_exit() -> None:
    # 100 arrivals a second for 10 s, plus a slow start (1 a second for 1 s
    # before) and a tail after: the window's margins leave both out.
    steady = [1.0 + i / 100 for i in range(1000)]
    assert window_rate(steady) == pytest.approx(100, rel=0.02)
    ragged = [0.0, 0.5, *steady, 11.5]
    # The span is 11.5 s, so the margin is 1.15 s at each end, inside the
    # steady part.
    assert window_rate(ragged) == pytest.approx(100, rel=0.02)
    assert window_rate([1.0]) is None
    assert window_rate([1.0, 1.2]) is None  # shorter than two margins


def _overhead(scenario: str, store: str, round_: int, seconds: float) -> OverheadRun:
    run = Run(scenario, f"hq-full/{store}", round_, ok=True, time_to_budget=seconds, pages=1200)
    run.max_in_flight = {"127.0.0.1": 4}
    commands = {"evalsha": 2400, "get": 600} if store == "redis" else {}
    return OverheadRun(
        scenario, store, run, redis_commands=sum(commands.values()) or None, commands=commands
    )


def test_ratios_and_targets_from_the_runs() -> None:
    scale = [
        ScaleRun(
            "redis", 1, 0, pages_per_second=400.0, pages=4000, redis_commands=12000, redis_cpu=0.4
        ),
        ScaleRun("redis", 2, 0, pages_per_second=680.0, pages=6800, redis_commands=20400),
        ScaleRun("memory", 1, 0, pages_per_second=420.0, pages=4200),
        ScaleRun("memory", 2, 0, pages_per_second=714.0, pages=7140),
    ]
    overhead = [
        _overhead("S1", "memory", 0, 3.0),
        _overhead("S1", "redis", 0, 3.3),
        _overhead("S2", "memory", 0, 5.0),
        _overhead("S2", "redis", 0, 6.0),
    ]
    summary = summarise(scale, overhead, None)
    assert summary["scale"]["redis_ratio"] == pytest.approx(1.7)
    assert summary["scale"]["memory_ratio"] == pytest.approx(1.7)
    assert summary["scale"]["redisx1"]["commands_per_page"] == pytest.approx(3.0)
    assert summary["overhead"]["S1"]["ratio"] == pytest.approx(1.1)
    assert summary["overhead"]["S2"]["ratio"] == pytest.approx(1.2)
    assert summary["overhead"]["S1"]["commands_per_page"] == pytest.approx(2.5)
    text = "\n".join(report_lines(summary, "ab"))
    assert "Target: 2 processes on Redis >= 1.6x 1: 1.70x PASS" in text
    assert re.search(r"S1: .*\n.*<= 1.15x: 1.10x \(rounds: 1.10\) PASS", text)
    assert re.search(r"S2: .*\n.*<= 1.15x: 1.20x \(rounds: 1.20\) FAIL", text)
    assert "(c) Redis commands per crawled page: (a) x1 3.0, (a) x2 3.0, (b) S1 2.5" in text
    assert "of which script calls (EVALSHA, a batch each): (a) x1 0.00, (a) x2 0.00, " in text
    assert "(b) S1 2.00, (b) S2 2.00" in text
    assert "most called: evalsha 80 %, get 20 %" in text
    assert "Redis server CPU per page in (a): x1 0.10 ms, x2 -" in text


def test_a_refused_redis_frontier_is_said_and_measures_nothing() -> None:
    scale = [
        ScaleRun("memory", 1, 0, pages_per_second=420.0, pages=4200),
        ScaleRun("memory", 2, 0, pages_per_second=714.0, pages=7140),
    ]
    refusal = "HOSTQUEUE_FRONTIER = 'redis://...': no Redis store"
    summary = summarise(scale, [_overhead("S1", "memory", 0, 3.0)], refusal)
    text = "\n".join(report_lines(summary, "ab"))
    assert f"The Redis frontier was refused: {refusal}" in text
    assert "1: - NOT MEASURED (Redis frontier refused)" in text
    assert "the machine's yardstick: 1.70x" in text
    assert "<= 1.15x: - (rounds: -) NOT MEASURED" in text
    assert "(c) Redis commands per crawled page: not measured" in text


@pytest.mark.crawl
@pytest.mark.requires_redis
def test_the_redis_scale_bench_runs_tiny(tmp_path: Path) -> None:
    # Parts a and m in one run, parts d and b in another, side by side: each
    # part runs end to end as in a whole run (their crawls are time-limited
    # or tiny, so the two runs take about as long as the longer one).
    runs = {}
    for parts in ("am", "db"):
        out = tmp_path / parts
        command = [
            sys.executable,
            "-m",
            "bench.redis_scale",
            *("--parts", parts, "--quick", "--hosts", "8", "--seconds", "3"),
            *("--budget", "100", "--scenarios", "S1", "--out", str(out)),
            *("--queued", "3000", "--queued-hosts", "30", "--fingerprints", "5000"),
        ]
        process = subprocess.Popen(command, cwd=ROOT, stdout=PIPE, stderr=PIPE, text=True)
        runs[parts] = (out, process)
    done = {}
    try:
        for parts, (out, process) in runs.items():
            stdout, _ = process.communicate(timeout=240)
            (result_file,) = out.glob("redis_scale-*.json")
            done[parts] = (process.returncode, stdout, json.loads(result_file.read_text()))
    finally:
        for _, process in runs.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    (a_code, a_out, a_result), (db_code, db_out, db_result) = done["am"], done["db"]
    memory = [run for run in a_result["scale_runs"] if run["store"] == "memory"]
    assert [run["processes"] for run in memory] == [1, 2]
    for run in memory:
        assert run["error"] is None, run
        assert run["pages_per_second"] > 0
        # Each process on its own crawls: every one has pages.
        assert len(run["process_pages"]) == run["processes"]
        assert all(run["process_pages"])
        assert sum(run["process_pages"]) == run["pages"]
    assert re.search(r"Target: 2 processes on Redis >= 1.6x 1: ", a_out), a_out
    assert re.search(r"Target: Redis / memory <= 1.15x: ", db_out), db_out
    assert re.search(r"CPU probe before each crawl .*: .*\(a\) memory x1 [0-9.]+", a_out)
    if a_result["summary"]["refused"]:
        # This version refuses a Redis frontier: the runs say so and fail.
        assert a_code == db_code == 1
        for stdout in (a_out, db_out):
            assert "The Redis frontier is refused, memory parts only" in stdout
        assert (a_out + db_out).count("NOT MEASURED (Redis frontier refused)") == 2
        assert [run["store"] for run in db_result["overhead_runs"]] == ["memory"]
    else:
        assert db_result["summary"]["refused"] is None
        figures = a_result["memory"]
        assert 0 < figures["queued_bytes"] < 130, figures
        assert 0 < figures["fingerprint_bytes"] < figures["queued_bytes"], figures
        assert re.search(r"this package [0-9.]+ B per queued request with its fingerprint", a_out)
        if figures["scrapy_redis_queued_bytes"] is not None:
            # The same requests through scrapy-redis's own scheduler.
            assert figures["scrapy_redis_queued_bytes"] > figures["queued_bytes"], figures
        else:
            assert "scrapy-redis: not installed" in a_out
        redis = [run for run in a_result["scale_runs"] if run["store"] == "redis"]
        assert [run["processes"] for run in redis] == [1, 2]
        for run in redis:
            assert run["error"] is None, run
            assert run["commands_per_page"] > 0
            # One budget per host across the processes.
            assert run["max_in_flight"] <= 4
        stores = [run["store"] for run in db_result["overhead_runs"]]
        assert sorted(stores) == ["memory", "redis"]
        busy = [(run["store"], run["processes"]) for run in db_result["busy_runs"]]
        assert busy == [("shared", 1), ("shared", 2), ("whole", 2)]
        for run in db_result["busy_runs"]:
            assert run["error"] is None, run
            # Shared or not, the one host's limit holds across the processes.
            assert 0 < run["max_in_flight"] <= 16
        assert re.search(r"\(d\) one busy host \(limit 16\), pages/s: shared x1 \d+", db_out)
        assert re.search(r"Redis commands per crawled page: \(a\) x1 [0-9.]+", a_out)


def test_the_busy_host_ratios_from_the_runs() -> None:
    busy = [
        ScaleRun("shared", 1, 0, pages_per_second=200.0, pages=2000, max_in_flight=16),
        ScaleRun("shared", 2, 0, pages_per_second=340.0, pages=3400, max_in_flight=16),
        ScaleRun("whole", 2, 0, pages_per_second=204.0, pages=2040, max_in_flight=15),
    ]
    summary = summarise([], [], None, busy)
    assert summary["busy"]["sharedx2"]["ratio"] == pytest.approx(1.7)
    assert summary["busy"]["wholex2"]["ratio"] == pytest.approx(1.02)
    text = "\n".join(report_lines(summary, "d"))
    assert "(d) one busy host (limit 16), pages/s: shared x1 200, shared x2 340" in text
    assert "lent a part 1.70x, whole hosts only 1.02x; max in flight 16" in text
    assert "(c)" not in text


def _clustered(where: str, processes: int, rate: float, node_bytes: list[int]) -> ClusterRun:
    crawl = ScaleRun(where, processes, 0, pages_per_second=rate, pages=800, max_in_flight=4)
    return ClusterRun(
        where, processes, 0, crawl, site_pages=800, distinct=800, served=800, node_bytes=node_bytes
    )


def test_the_cluster_part_from_the_runs() -> None:
    runs = [
        _clustered("server", 1, 400.0, [90_000]),
        _clustered("cluster", 1, 380.0, [30_000, 27_000, 33_000]),
        _clustered("server", 2, 680.0, [90_000]),
        _clustered("cluster", 2, 700.0, [60_000, 30_000, 0]),
    ]
    summary = cluster_summarise(runs)
    assert summary["clusterx1"]["ratio"] == pytest.approx(0.95)
    assert summary["clusterx2"]["ratio"] == pytest.approx(700 / 680)
    # One master without a key of the crawl, one with two thirds: the target fails.
    assert not summary["shares_ok"]
    assert summary["every_page"]
    text = "\n".join(cluster_report_lines(summary, runs))
    assert "pages/s: server x1 400, cluster x1 380 (0.95x the server), server x2 680" in text
    assert "x1: each master's share of the crawl's memory" in text
    assert ": 33 % / 30 % / 37 %\n" in text
    assert ": 67 % / 33 % / 0 %\n" in text
    assert "Target: each master 20-50 % of the crawl's memory: FAIL" in text
    assert "Every page fetched: 800 of 800, 800 of 800, 800 of 800, 800 of 800" in text
    assert "Most in flight at a host, counted by the host: 4 (limit 4): PASS" in text
    # A page missing, one fetched twice, a host above its limit: each said.
    runs[1].distinct, runs[1].served, runs[1].crawl.max_in_flight = 799, 800, 5
    runs[3].node_bytes = [30_000, 30_000, 30_000]
    summary = cluster_summarise(runs)
    assert (summary["shares_ok"], summary["every_page"]) == (True, False)
    lines = cluster_report_lines(summary, runs)
    for said in (
        "800 of 800, 799 of 800, 800 of 800, 800 of 800 (1 fetched twice): FAIL",
        "counted by the host: 5 (limit 4): FAIL",
        "20-50 % of the crawl's memory: PASS",
    ):
        assert any(said in line for line in lines), (said, lines)


@pytest.mark.crawl
@pytest.mark.requires_redis
def test_the_cluster_part_runs_tiny(tmp_path: Path) -> None:
    # 8 sites of 10 pages, each crawl to its end with 1 and 2 processes, on one
    # server and on a cluster of 3 masters.
    command = [
        sys.executable,
        "-m",
        "bench.redis_scale",
        *("--parts", "k", "--quick", "--hosts", "8", "--out", str(tmp_path)),
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False
    )
    (result_file,) = tmp_path.glob("redis_scale-*.json")
    result = json.loads(result_file.read_text())
    if result["summary"]["refused"]:
        assert done.returncode == 1
        assert result["cluster_runs"] == []
        return
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [(run["where"], run["processes"]) for run in result["cluster_runs"]]
    assert runs == [("server", 1), ("cluster", 1), ("server", 2), ("cluster", 2)]
    for run in result["cluster_runs"]:
        assert run["crawl"]["error"] is None, run
        # Every page of the sites, once, and no host above its limit of 4.
        assert run["distinct"] == run["served"] == run["site_pages"] == 80, run
        assert 0 < run["crawl"]["max_in_flight"] <= 4, run
        # The crawl's keys, on one server or over the three masters.
        assert len(run["node_bytes"]) == (3 if run["where"] == "cluster" else 1), run
        assert sum(run["node_bytes"]) > 0
        assert sum(run["shares"]) == pytest.approx(1.0)
    assert "(k) one crawl on a Redis Cluster of 3 masters, pages/s: server x1" in done.stdout
    assert re.search(
        r"Every page fetched: (80 of 80, ){3}80 of 80 \(0 fetched twice\): PASS", done.stdout
    )
