"""The Redis store on a Redis Cluster of real ``redis-server`` nodes (three masters).

The client is found from the URL of any node, every key of a crawl lives on the node serving the
crawl's slot, and hand-out, acknowledgement and lease expiry work through the cluster client as on
one server; and two ``scrapy crawl`` processes run one crawl on it (``crawl`` marker).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import HostQueueScheduler
from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.frontier.redis._db import (
    SCRIPTS,
    RedisFrontierError,
    part_prefix,
    partition_prefixes,
    prefix,
    register,
)
from scrapy_hostqueue.frontier.redis._glue import async_client, connect, redis_errors
from scrapy_hostqueue.testing import HostSpec
from tests.helpers.crawl_report import watched_hosts
from tests.helpers.crawling import crawl_refused_at_start, ended_at_exit, start_demo_crawls
from tests.helpers.redis import (
    RedisClusterServers,
    RedisServer,
    StoreProcess,
    crawl_stats,
    new_store,
)
from tests.helpers.requires_redis import import_redis, redis_server_marks

redis = import_redis()

pytestmark = redis_server_marks()

CRAWL = "clustered"
#: The one partition of the crawl of the store tests (``_process``).
P = part_prefix(CRAWL)
#: The crawl's own keys (its version, its partitions).
HOME = prefix(CRAWL)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    with RedisClusterServers(3) as running:
        yield running


@pytest.fixture
def sync(cluster: RedisClusterServers) -> Iterator[Any]:
    cluster.flushall()
    client, is_cluster = connect(redis, cluster.url)
    assert is_cluster
    yield client
    client.close()


def _crawl_node(cluster: RedisClusterServers, sync: Any, key: str = P) -> int:
    """Return the index of the node serving the slot of *key* (the crawl's one partition)."""
    port = sync.get_node_from_key(key).port
    return [node.port for node in cluster.nodes].index(int(port))


def _home_keys(keys: list[str]) -> list[str]:
    """Take the crawl's own keys out of *keys*."""
    return [key for key in keys if not key.startswith(HOME)]


def _process(url: str, sync: Any, **options: Any) -> StoreProcess:
    """Make a store on the cluster, its task's steps run by hand."""
    client = async_client(redis, url, cluster=True)
    return StoreProcess(new_store(sync, CRAWL, **options), client, redis_errors(redis))


def _stats(sync: Any) -> dict[str, int]:
    return crawl_stats(sync, CRAWL)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_command_of_a_script_touches_a_key_of_the_crawl(name: str) -> None:
    """On a cluster a script may touch keys of its node's slots only.

    Every key it touches is built on the prefix, its one key (``KEYS[1]``).
    """
    script = SCRIPTS[name]
    # A key is written P..'name', or held in a local set to one.
    on_prefix = ("P..", *(f"{var} " for var in re.findall(r"local (\w+) = P\.\.", script)))
    calls = re.findall(r"redis\.call\(([^)]*)", script)
    assert calls
    for call in calls:
        command, _, rest = call.partition(",")
        keys = [key.strip() + " " for key in rest.split(",")]
        if command.strip("'") not in ("DEL", "EXISTS", "UNLINK"):
            keys = keys[:1]
        assert all(key.startswith(on_prefix) for key in keys), (name, call)
    assert "local P = KEYS[1]" in script
    assert "KEYS[2]" not in script


@deferred_f_from_coro_f
async def test_a_crawl_runs_through_the_cluster_on_the_node_of_its_slot(
    cluster: RedisClusterServers, sync: Any
) -> None:
    home = _crawl_node(cluster, sync)
    # The URL of a node that does not serve the crawl's slot works too.
    url = cluster.nodes[(home + 1) % len(cluster.nodes)].url
    a = _process(url, sync)
    b = _process(url, sync)
    for path in ("h1/a", "h1/b", "h1/a", "h2/a"):
        a.store.push(path.split("/")[0], 0, path)
    b.store.push("h1", 0, "h1/b")
    await a.step()
    await b.step()
    assert (_stats(sync)["pushed"], _stats(sync)["duplicates"]) == (3, 2)
    # a claims both hosts; b gets none.
    await a.step()
    await b.step()
    assert sorted(a.store.held_hosts) == ["h1", "h2"]
    assert b.store.held_hosts == []
    handed = a.pop_all()
    assert sorted(handed) == ["h1/a", "h1/b", "h2/a"]
    # One acknowledged; a stops renewing its heartbeat: its lease expires,
    # and b gets the hosts and the two requests a never acknowledged.
    a.store.ack(handed[0])
    await a.step()
    assert _stats(sync)["acked"] == 1
    sync.zadd(P + "procs", {a.store.proc: 1})
    await b.step()  # the heartbeat reclaims
    await b.step()  # the claim
    assert sorted(b.store.held_hosts) == ["h1", "h2"]
    assert sorted(b.pop_all()) == sorted(handed[1:])
    assert _stats(sync)["reclaimed"] == 2
    await a.step()
    assert a.store.held_hosts == []
    assert await b.link.close() is None
    stats = _stats(sync)
    assert (stats["queued"], stats["leased"]) == (2, 0)
    # Every key of the crawl's partition is on the node of its slot; its
    # version and its partitions on the node of its own.
    keys = cluster.node_keys("hq:*")
    assert HOME + "partitions" in keys[_crawl_node(cluster, sync, HOME)]
    keys = [_home_keys(on) for on in keys]
    assert all(key.startswith(P) for key in keys[home]), keys[home]
    # (The two queued were given back: queued by id, their values in r.)
    crawl_keys = {P + "r", P + "fp", P + "f:0", P + "stats", P + "b:h1"}
    assert crawl_keys <= set(keys[home]), keys[home]
    assert [len(on) for n, on in enumerate(keys) if n != home] == [0, 0], keys
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_connections_to_the_crawl_node_lost_mid_crawl_are_an_outage_retried(
    cluster: RedisClusterServers, sync: Any, caplog: pytest.LogCaptureFixture
) -> None:
    home = cluster.nodes[_crawl_node(cluster, sync)]
    a = _process(cluster.url, sync)
    a.link.start()

    async def pushed(n: int) -> None:
        deadline = time.monotonic() + 10
        while _stats(sync).get("pushed", 0) < n:
            assert time.monotonic() < deadline, _stats(sync)
            await asyncio.sleep(0.01)

    a.store.push("h1", 0, "h1/0")
    await pushed(1)
    assert int(home.command("CLIENT KILL TYPE normal")) >= 1  # the task's among them
    a.store.push("h2", 0, "h2/0")
    await pushed(2)
    assert await a.link.close() is None
    messages = [record.getMessage() for record in caplog.records]
    assert sum(m.startswith("Lost the shared frontier at Redis") for m in messages) == 1
    assert sum(m.startswith("The shared frontier at Redis is back") for m in messages) == 1
    assert not any(m.startswith("The shared frontier at Redis failed") for m in messages)
    assert (_stats(sync)["pushed"], _stats(sync)["queued"]) == (2, 2)
    await a.aclose()


@deferred_f_from_coro_f
async def test_the_crawl_goes_on_when_its_slot_moves_to_another_node(
    cluster: RedisClusterServers, sync: Any
) -> None:
    home = _crawl_node(cluster, sync)
    a = _process(cluster.url, sync)
    for n in range(4):
        a.store.push("h1", 0, f"h1/{n}")
    await a.step()
    await a.step()
    first = a.store.pop()
    assert first is not None
    target = (home + 1) % len(cluster.nodes)
    cluster.move_slot(redis.cluster.key_slot(P.encode()), home, target)
    keys = [_home_keys(on) for on in cluster.node_keys("hq:*")]
    assert keys[home] == [] and P + "r" in keys[target], keys
    # The task's next batch is redirected to the new node, with the scripts
    # already loaded there.
    a.store.ack(first[1])
    a.store.push("h1", 0, "h1/4")
    await a.step()
    assert sorted(a.pop_all()) == [f"h1/{n}" for n in range(1, 5)]
    stats = _stats(sync)
    assert (stats["pushed"], stats["acked"], stats["leased"]) == (5, 1, 4)
    assert _crawl_node(cluster, sync) == target
    await a.aclose()


@deferred_f_from_coro_f
async def test_over_partitions_an_acknowledgement_waits_for_the_pushes_before_it(
    cluster: RedisClusterServers, sync: Any
) -> None:
    # Two partitions on two masters: a pipeline's commands reach them in no
    # order between them, so a page is acknowledged only once the requests
    # found on it are in Redis.
    a = _process(
        cluster.url, sync, partitions=2, master_of=lambda key: sync.get_node_from_key(key).name
    )
    a.link.cluster = True
    prefixes = a.store.prefixes
    assert len({_crawl_node(cluster, sync, p) for p in prefixes}) == 2
    first, other = (
        "h1",
        next(h for h in ("h2", "h3", "h4", "h5") if a.store.part(h) != a.store.part("h1")),
    )
    a.store.push(first, 0, f"{first}/0")
    await a.step()
    await a.step()
    (page,) = a.pop_all()
    a.store.push(other, 0, f"{other}/0")
    a.store.push(first, 0, f"{first}/1")
    a.store.ack(page)
    # (hurry: without the wait of a log of pushes and acknowledgements.)
    await a.link.step(beat=False, totals=False, hurry=True)
    assert (_stats(sync)["pushed"], _stats(sync).get("acked", 0)) == (3, 0)
    await a.link.step(beat=False, totals=False, hurry=True)
    assert _stats(sync)["acked"] == 1
    assert await a.link.close() is None
    await a.aclose()


def test_push_and_frontier_commands_on_a_cluster(
    cluster: RedisClusterServers, sync: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = cluster.nodes[2].url
    pages = [f"http://127.0.0.{n}:8000/page/{k}" for n in range(2, 14) for k in range(2)]
    assert cli(["push", url, "--crawl-id", CRAWL, *pages, pages[0]]) == 0
    assert capsys.readouterr().out.strip() == "queued 24, 1 already seen"
    # Made with four partitions per master, dealt evenly over the masters.
    prefixes = partition_prefixes(sync, CRAWL)
    assert len(prefixes) == 12
    served = [_crawl_node(cluster, sync, p) for p in prefixes]
    assert sorted(served.count(n) for n in range(3)) == [4, 4, 4], served
    proc = register(sync, CRAWL, int((time.time() + 30) * 1000))
    assert cli(["frontier", url, "--crawl-id", CRAWL]) == 0
    out = capsys.readouterr().out
    assert "crawl id 'clustered', 12 partitions" in out
    # The crawl's totals are the sums of its partitions', spread over the masters.
    queued = [int(sync.hget(p + "stats", "queued") or 0) for p in prefixes]
    assert sum(queued) == 24 and sum(1 for n in queued if n) >= 4, queued
    assert "24 requests queued and 0 leased" in out
    assert re.search(r"127\.0\.0\.2 +2 queued +0 leased", out), out
    assert f"  {proc}  alive, 0 leased, 0 hosts held" in out
    # One line per master: its memory, and the partitions it holds.
    masters = re.findall(r"^  Redis (\S+) \((\d+) partitions\): [\d.]+ [kMG]?B used", out, re.M)
    assert sorted(int(n) for _, n in masters) == [4, 4, 4], out
    assert {name for name, _ in masters} == {f"127.0.0.1:{node.port}" for node in cluster.nodes}
    assert all(cluster.node_keys("hq:*")), "every master holds a part of the crawl"


def test_a_cluster_that_does_not_serve_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A node of a cluster that has no slots yet: cluster_state:fail.
    with RedisServer(cluster=True) as node:
        crawler = get_crawler(settings_dict={"HOSTQUEUE_FRONTIER": node.url})
        with pytest.raises(RedisFrontierError) as refused:
            HostQueueScheduler.from_crawler(crawler)
        assert str(refused.value) == (
            f"the Redis Cluster at {node.url} is not serving (cluster_state:fail, 0 of 16384 "
            "slots served): wait until every slot is served, or fix HOSTQUEUE_FRONTIER"
        )
        assert cli(["frontier", node.url, "--crawl-id", CRAWL]) == 2
        assert "is not serving (cluster_state:fail" in capsys.readouterr().err


def test_a_cluster_url_with_another_database_is_refused(cluster: RedisClusterServers) -> None:
    crawler = get_crawler(settings_dict={"HOSTQUEUE_FRONTIER": cluster.nodes[0].url_for(3)})
    with pytest.raises(RedisFrontierError) as refused:
        HostQueueScheduler.from_crawler(crawler)
    assert "is a node of a Redis Cluster, which has only database 0" in str(refused.value)


def test_an_option_the_asyncio_cluster_client_does_not_take_is_refused(
    cluster: RedisClusterServers,
) -> None:
    # The synchronous clients take retry_on_timeout, the asyncio cluster
    # client of the crawl's task does not: refused at start, not with a
    # traceback when the task starts.
    url = cluster.nodes[0].url + "?retry_on_timeout=true"
    crawler = get_crawler(settings_dict={"HOSTQUEUE_FRONTIER": url})
    with pytest.raises(RedisFrontierError) as refused:
        HostQueueScheduler.from_crawler(crawler)
    assert str(refused.value) == (
        f"HOSTQUEUE_FRONTIER: {url} is a node of a Redis Cluster, whose asyncio client "
        "does not take the option retry_on_timeout: leave it out"
    )


def _crawl_memory(cluster: RedisClusterServers, crawl_id: str) -> list[int]:
    """Return the bytes of *crawl_id*'s keys on each master (``MEMORY USAGE`` of each)."""
    out = []
    for node in cluster.nodes:
        keys = node.command(f"KEYS hq:{{{crawl_id}*")
        assert isinstance(keys, list)
        out.append(sum(int(str(node.command(f"MEMORY USAGE {key}"))) for key in keys))
    return out


@pytest.mark.crawl
def test_two_scrapy_crawls_spread_one_crawl_over_the_masters_within_the_limit(
    cluster: RedisClusterServers, sync: Any, tmp_path: Path
) -> None:
    # 24 hosts, a few held at once per process: the first process alone would
    # take a few seconds, so the second has hosts left when it is up.
    specs = [HostSpec(latency=0.03, pages=6, links=3)] * 24
    with watched_hosts(specs, process=True) as hosts:
        settings: dict[str, Any] = {
            "HOSTQUEUE_FRONTIER": cluster.url,
            "HOSTQUEUE_CRAWL_ID": "pages",
            "CLOSESPIDER_PAGECOUNT": 0,
            "CLOSESPIDER_TIMEOUT": 60,
            "HOSTQUEUE_TIMELINE_FILE": "",
            "ROBOTSTXT_OBEY": False,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            "HOSTQUEUE_MAX_ACTIVE_HOSTS": 4,
            "HOSTQUEUE_REDIS_FINISH_GRACE": 0.5,
            "DEMO_ITEMS_FILE": tmp_path / "items.jsonl",
        }
        workers = start_demo_crawls(hosts, tmp_path, settings, 2)
        with ended_at_exit(workers):
            for worker in workers:
                worker.wait(90)
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)
    logs = "\n".join(path.read_text() for path in sorted(tmp_path.glob("worker*.log")))
    assert "Traceback" not in logs, logs[-4000:]
    assert logs.count("(a Redis Cluster), crawl id 'pages' in 12 partitions") == 2, logs[-4000:]
    responses = []
    for n in range(2):
        data = json.loads((tmp_path / f"stats{n}.json").read_text())
        assert data["finish_reason"] == "finished", data["finish_reason"]
        responses.append(data["stats"].get("downloader/response_count", 0))
    assert all(responses), responses  # both processes took part
    for host, spec in zip(stats, specs, strict=True):
        assert host.max_in_flight <= 2, (host.hostname, host.max_in_flight)
        assert set(host.pages) == {f"/page/{n}" for n in range(spec.pages or 0)}, host.hostname
        assert max(host.pages.values()) == 1, host.hostname
    assert crawl_stats(sync, "pages")["acked"] == 24 * 6
    # Each master holds 20-50 % of the crawl's memory (what it keeps once
    # done: fingerprints, the hosts' states, the counters).
    memory = _crawl_memory(cluster, "pages")
    assert all(0.2 <= each / sum(memory) <= 0.5 for each in memory), memory


@pytest.mark.crawl
def test_scrapy_crawl_on_a_cluster_that_does_not_serve_is_one_error_line(tmp_path: Path) -> None:
    with RedisServer(cluster=True) as node:
        url = node.url
        error = crawl_refused_at_start(f"HOSTQUEUE_FRONTIER={url}")
    assert f"the Redis Cluster at {url} is not serving (cluster_state:fail" in error
