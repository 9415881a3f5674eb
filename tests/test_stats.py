"""The per-host stats recorder, driven directly (no crawl, no network)."""

from __future__ import annotations

import random
import sys
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue._hosts import StoreView
from scrapy_hostqueue._recorder import TRACKED_PER_NAMED
from scrapy_hostqueue.frontier.memory import HostState, MemoryStore
from scrapy_hostqueue.stats import (
    OTHER_HOSTS,
    HostQueueStats,
    HostStatsRecorder,
    LatencyHistogram,
    get_recorder,
    host_stat_key,
    stat_key,
)


def make_recorder(**settings: Any) -> HostStatsRecorder:
    crawler = get_crawler(Spider, settings)
    assert crawler.stats is not None
    return HostStatsRecorder(crawler.stats, HostQueueConfig.from_settings(crawler.settings))


def host_keys(recorder: HostStatsRecorder) -> dict[str, Any]:
    return {
        key: value
        for key, value in recorder.stats.get_stats().items()
        if key.startswith("hostqueue/hosts/")
    }


def test_key_helpers() -> None:
    assert stat_key("hosts_seen_count") == "hostqueue/hosts_seen_count"
    assert host_stat_key("example.com", "status_count/200") == (
        "hostqueue/hosts/example.com/status_count/200"
    )
    assert host_stat_key("", "request_count") == "hostqueue/hosts/_nohost/request_count"


def test_with_a_send_gate_in_flight_counts_what_passed_the_gate() -> None:
    recorder = make_recorder()
    # The first request of a host gives its send slot back before it leaves
    # the downloader (the response is read): its host still gets the key.
    recorder.in_flight_seen("a.test", 1)
    for on_wire in (2, 3, 1):
        recorder.in_flight_seen("a.test", on_wire)
    for handed_out in (1, 4, 2):
        recorder.request_done("a.test", handed_out, active_hosts=1)
    recorder.in_flight_seen("b.test", 1)
    recorder.flush()
    stats = recorder.stats.get_stats()
    assert stats[host_stat_key("a.test", "max_inflight")] == 3
    assert stats[host_stat_key("a.test", "max_handed_out")] == 4
    assert stats[host_stat_key("a.test", "request_count")] == 3
    assert stats[host_stat_key("b.test", "max_inflight")] == 1
    assert not any("_other" in key for key in stats)


class _StoreView(StoreView[str]):
    """The scheduler's HostView over a bare store, every request on the wire."""

    def __init__(self, store: MemoryStore[str]) -> None:
        self.store = store

    def on_wire(self, host: str) -> int:
        return self.store.in_flight(host)

    def sent_back_from_gate(self, request: Request) -> bool:
        return False


def test_a_silent_host_that_left_the_store_shows_its_one_request_in_the_timeline() -> None:
    """A silent host with nothing queued nor in flight leaves the store.

    Its last request failed; its timeline row for that interval shows the
    one request a silent host may have, as the rows before did, not its
    limit (4).
    """
    crawler = get_crawler(Spider)
    extension = HostQueueStats(crawler, HostQueueConfig.from_settings(crawler.settings))
    store: MemoryStore[str] = MemoryStore(lambda key: HostState(4, 0.0, 0.0))
    store.silent_limit = 1
    extension.hosts = _StoreView(store)
    for host in ("dead.test", "live.test"):
        store.push(host, 0, f"https://{host}/")
        popped = store.pop()
        assert popped is not None and popped[0] == host
        store.set_answering(host, host == "live.test")
    store.finish("dead.test")
    extension._failed["dead.test"] = 1
    samples = {sample.host: sample for sample in extension._samples(0.0, {})}
    assert "dead.test" not in {key for key, *_ in store.hosts()}
    assert samples["dead.test"].limit == 1
    assert samples["dead.test"].in_flight == 0
    assert samples["live.test"].limit == 4


def test_events_become_per_host_keys() -> None:
    recorder = make_recorder()
    recorder.host_seen("a.test")
    recorder.host_seen("b.test")
    for in_flight in (1, 2, 3, 2):
        recorder.request_done("a.test", in_flight, active_hosts=2)
        recorder.in_flight_seen("a.test", in_flight)
    recorder.request_done("b.test", 1, active_hosts=1)
    recorder.response("a.test", 200, 0.1)
    recorder.response("a.test", 200, 0.3)
    recorder.response("a.test", 429, None)
    recorder.exception("b.test", "TimeoutError")
    for limit in (4, 2, 6, 5):
        recorder.limit_changed("a.test", limit)
    recorder.backoff("a.test", "429")
    recorder.blocked("a.test", 2.5, "retry-after")
    recorder.blocked("a.test", 1.0, "retry-after")
    recorder.host_parked("b.test")
    recorder.host_given_up("b.test", 7)
    recorder.inc("a.test", "connections_opened_count")
    recorder.flush()

    stats = recorder.stats.get_stats()

    def a(name: str) -> Any:
        return stats[host_stat_key("a.test", name)]

    def b(name: str) -> Any:
        return stats[host_stat_key("b.test", name)]

    assert a("request_count") == 4
    assert a("max_inflight") == 3
    assert a("max_handed_out") == 3
    assert a("response_count") == 3
    assert a("status_count/200") == 2
    assert a("status_count/429") == 1
    assert a("limit") == 5
    assert a("min_limit") == 2
    assert a("max_limit") == 6
    assert a("backoff_count/429") == 1
    assert a("block_count/retry-after") == 2
    assert a("blocked_seconds") == pytest.approx(3.5)
    assert a("latency_mean") == pytest.approx(0.2)
    assert a("latency_p95") == pytest.approx(0.3)
    assert a("connections_opened_count") == 1
    assert b("request_count") == 1
    assert b("exception_count") == 1
    assert b("exception_type_count/TimeoutError") == 1
    assert b("parked_count") == 1
    assert b("given_up_count") == 1
    assert b("dropped_request_count") == 7
    assert stats[stat_key("hosts_seen_count")] == 2
    assert stats[stat_key("max_active_hosts")] == 2
    assert stats[stat_key("hosts_parked_count")] == 1
    assert stats[stat_key("hosts_given_up_count")] == 1
    assert stats[stat_key("dropped_request_count")] == 7
    assert not any(OTHER_HOSTS in key for key in stats)


def test_every_key_is_lowercase_and_counters_end_in_count() -> None:
    recorder = make_recorder()
    recorder.request_done("h", 1, 1)
    recorder.response("h", 503, 0.2)
    recorder.exception("h", "ConnectionRefusedError")
    recorder.limit_changed("h", 3)
    recorder.backoff("h", "503")
    recorder.blocked("h", 1, "backoff")
    recorder.flush()
    for key in recorder.stats.get_stats():
        if not key.startswith("hostqueue/"):
            continue
        fixed = key.split("/")[:4] if key.startswith("hostqueue/hosts/") else key.split("/")
        fixed_name = "/".join(fixed)
        # Exception class names are the dynamic part; everything else is lowercase.
        assert fixed_name == fixed_name.lower() or "exception_type_count" in key, key


def test_disabled_recorder_writes_nothing() -> None:
    recorder = make_recorder(HOSTQUEUE_STATS_ENABLED=False)
    recorder.host_seen("a")
    recorder.request_done("a", 1, 1)
    recorder.response("a", 200, 0.1)
    recorder.limit_changed("a", 2)
    recorder.host_given_up("a", 3)
    recorder.flush()
    assert not any(key.startswith("hostqueue/") for key in recorder.stats.get_stats())
    assert recorder.table_size() == 0


def test_hosts_beyond_the_cap_add_up_under_the_aggregate() -> None:
    recorder = make_recorder(HOSTQUEUE_STATS_MAX_HOSTS=3)
    hosts = [f"h{i}.test" for i in range(10)]
    for host in hosts:
        recorder.request_done(host, 1, 1)
        recorder.response(host, 200, 0.01)
    recorder.flush()
    stats = recorder.stats.get_stats()
    named = {key.split("/")[2] for key in host_keys(recorder)} - {OTHER_HOSTS}
    assert len(named) == 3
    assert recorder.named_hosts() == sorted(named, key=recorder.named_hosts().index)
    # Nothing is lost: named hosts plus the aggregate add up to every event.
    total = sum(stats[host_stat_key(host, "response_count")] for host in named)
    assert total + stats[host_stat_key(OTHER_HOSTS, "response_count")] == 10
    assert host_stat_key(OTHER_HOSTS, "limit") not in stats


def test_zero_named_hosts_puts_everything_in_the_aggregate() -> None:
    recorder = make_recorder(HOSTQUEUE_STATS_MAX_HOSTS=0)
    for i in range(5):
        recorder.response(f"h{i}", 200, 0.01)
    recorder.flush()
    assert host_keys(recorder) == {
        host_stat_key(OTHER_HOSTS, "response_count"): 5,
        host_stat_key(OTHER_HOSTS, "status_count/200"): 5,
        host_stat_key(OTHER_HOSTS, "latency_mean"): pytest.approx(0.01),
        host_stat_key(OTHER_HOSTS, "latency_p95"): pytest.approx(0.01),
    }


def test_a_busy_host_that_shows_up_late_keeps_its_own_keys() -> None:
    recorder = make_recorder(HOSTQUEUE_STATS_MAX_HOSTS=10)
    rng = random.Random(7)
    busy = ["busy-early.test", "busy-late.test"]
    for i in range(5000):
        # A stream of one-off hosts, with the two busy hosts among them (the
        # second one only from the middle of the crawl on).
        recorder.request_done(f"once{i}.test", 1, 1)
        if rng.random() < 0.3:
            recorder.request_done(busy[0], 1, 1)
        if i > 2500 and rng.random() < 0.3:
            recorder.request_done(busy[1], 1, 1)
    named = recorder.named_hosts()
    assert busy[0] in named[:2]
    assert busy[1] in named[:2]
    assert len(named) == 10


def test_the_named_hosts_are_the_busiest_after_many_small_ones() -> None:
    """Ten hosts of 30 pages, then 150 hosts of one.

    The ten keep their keys (the table once held only the named hosts, and the newcomers, starting
    from a floor that each eviction raised, pushed them all out).
    """
    recorder = make_recorder(HOSTQUEUE_STATS_MAX_HOSTS=10)
    busy = [f"busy{i}.test" for i in range(10)]
    for _ in range(30):
        for host in busy:
            recorder.request_done(host, 1, 1)
            recorder.response(host, 200, 0.01)
    for i in range(150):
        recorder.request_done(f"once{i}.test", 1, 1)
        recorder.response(f"once{i}.test", 200, 0.01)
    assert sorted(recorder.named_hosts()) == busy
    recorder.flush()
    stats = recorder.stats.get_stats()
    assert {key.split("/")[2] for key in host_keys(recorder)} == {*busy, OTHER_HOSTS}
    assert all(stats[host_stat_key(host, "request_count")] == 30 for host in busy)
    assert stats[host_stat_key(OTHER_HOSTS, "request_count")] == 150


def test_flush_replaces_per_host_keys_of_evicted_hosts() -> None:
    recorder = make_recorder(HOSTQUEUE_STATS_MAX_HOSTS=1)
    recorder.request_done("first", 1, 1)
    recorder.flush()
    assert host_stat_key("first", "request_count") in recorder.stats.get_stats()
    for _ in range(3):
        recorder.request_done("second", 1, 1)
    recorder.flush()
    stats = recorder.stats.get_stats()
    assert host_stat_key("first", "request_count") not in stats
    assert stats[host_stat_key("second", "request_count")] == 3
    assert stats[host_stat_key(OTHER_HOSTS, "request_count")] == 1
    # Keys of other components are untouched.
    recorder.stats.set_value("downloader/request_count", 42)
    recorder.flush()
    assert recorder.stats.get_value("downloader/request_count") == 42


def _deep_size(obj: Any, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set)):
        size += sum(_deep_size(item, seen) for item in obj)
    elif hasattr(obj, "__slots__"):
        size += sum(_deep_size(getattr(obj, name), seen) for name in obj.__slots__)
    return size


def test_100k_hosts_keep_the_stats_bounded() -> None:
    max_hosts = 100
    recorder = make_recorder(HOSTQUEUE_STATS_MAX_HOSTS=max_hosts)
    statuses = (200, 200, 200, 301, 404, 429, 503)
    sizes = []
    for i in range(100_000):
        host = f"host{i}.example"
        recorder.host_seen(host)
        recorder.request_done(host, 1, 50)
        recorder.response(host, statuses[i % len(statuses)], (i % 997) / 1000)
        if i % 10 == 0:
            recorder.limit_changed(host, 1 + i % 8)
            recorder.exception(host, "TimeoutError")
            recorder.backoff(host, "timeout")
            recorder.blocked(host, 1.0, "retry-after")
        if i % 20_000 == 19_999:
            recorder.flush()
            sizes.append(len(recorder.stats.get_stats()))
    stats = recorder.stats.get_stats()
    named = {key.split("/")[2] for key in host_keys(recorder)}
    assert len(named) <= max_hosts + 1
    assert OTHER_HOSTS in named
    # At most ~20 keys per named host and the aggregate, plus a few global ones.
    assert len(stats) <= 20 * (max_hosts + 1) + 10
    assert max(sizes) <= 20 * (max_hosts + 1) + 10
    assert recorder.table_size() <= 2 * TRACKED_PER_NAMED * max_hosts
    # Memory of the recorder's own structures does not grow with hosts either.
    assert _deep_size(recorder.other) < 50_000
    assert _deep_size(recorder._table) < 5_000_000
    # And nothing is lost.
    assert stats[stat_key("hosts_seen_count")] == 100_000
    responses = sum(value for key, value in stats.items() if key.endswith("/response_count"))
    assert responses == 100_000


@pytest.mark.parametrize("q", [0.5, 0.9, 0.95, 0.99])
def test_latency_histogram_quantiles_are_close(q: float) -> None:
    rng = random.Random(3)
    samples = [rng.lognormvariate(-2, 1) for _ in range(20_000)]
    histogram = LatencyHistogram()
    for sample in samples:
        histogram.add(sample)
    exact = sorted(samples)[max(0, int(q * len(samples)) - 1)]
    estimate = histogram.quantile(q)
    assert estimate is not None
    assert exact * 0.99 <= estimate <= exact * 1.05
    assert histogram.mean() == pytest.approx(sum(samples) / len(samples))
    assert len(histogram.buckets) <= 2 * LatencyHistogram.HIGHEST + 1


def test_latency_histogram_edges() -> None:
    histogram = LatencyHistogram()
    assert histogram.quantile(0.95) is None
    assert histogram.mean() is None
    for value in (0.0, -1.0, float("nan"), float("inf"), 1e-12, 1e9):
        histogram.add(value)
    # Negative and non-finite values are ignored; extremes land in the end buckets.
    assert histogram.count == 3
    assert min(histogram.buckets) == LatencyHistogram.LOWEST
    assert max(histogram.buckets) == LatencyHistogram.HIGHEST
    assert histogram.quantile(1.0) == 1e9


def test_get_recorder_is_one_per_crawler_and_flushes_at_close() -> None:
    crawler = get_crawler(Spider)
    recorder = get_recorder(crawler)
    assert get_recorder(crawler) is recorder
    assert get_recorder(get_crawler(Spider)) is not recorder
    recorder.request_done("a.test", 1, 1)
    assert host_stat_key("a.test", "request_count") not in recorder.stats.get_stats()
    from scrapy import signals

    crawler.signals.send_catch_log(signals.spider_closed, spider=None, reason="finished")
    assert recorder.stats.get_value(host_stat_key("a.test", "request_count")) == 1
