"""The shared frontier through a failover of Redis.

A Redis Cluster of real ``redis-server`` nodes with one replica per master, the master serving the
crawl's slot handed over to its replica (``CLUSTER FAILOVER``) or killed with SIGKILL and its
replica promoted (``CLUSTER FAILOVER TAKEOVER``) while two ``scrapy crawl`` processes run one crawl
(``crawl`` marker); the writes a failover to a lagging replica lost, taken back or done again; the
scripts lost by Redis (a replica promoted on Redis 7, which does not copy ``SCRIPT LOAD``) loaded
again without an outage; a server made a replica; and the dupefilter's memory of this process's
pushes forgotten after an outage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.defer import deferred_f_from_coro_f, maybe_deferred_to_future
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import HostQueueScheduler
from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue.frontier.redis._db import part_prefix
from scrapy_hostqueue.frontier.redis._glue import async_client, connect, redis_errors
from scrapy_hostqueue.frontier.redis._store import RedisStore
from scrapy_hostqueue.testing import HostSpec, HostStats
from scrapy_hostqueue.testing._redis_server import RedisServer
from tests.helpers.crawl_report import watched_hosts
from tests.helpers.crawling import ended_at_exit, start_demo_crawls
from tests.helpers.redis import (
    RedisClusterServers,
    StoreProcess,
    crawl_stats,
    new_store,
    replication,
    wait_pushed,
)
from tests.helpers.requires_redis import import_redis, redis_server_marks

redis = import_redis()

pytestmark = redis_server_marks()

CRAWL = "pages"
P = part_prefix(CRAWL)
#: The site: 4 hosts of 40 pages, each page linking to 3 others.
SPECS = [HostSpec(latency=0.03, pages=40, links=3)] * 4
PAGES = sum(spec.pages or 0 for spec in SPECS)


@pytest.fixture
def cluster() -> Iterator[RedisClusterServers]:
    """Start three masters with a replica each, for one test.

    Three masters with a replica each, for one test (a failover changes
    the roles, a kill ends a node).
    """
    with RedisClusterServers(3, replicas=1) as running:
        yield running


def _crawl_stat(cluster: RedisClusterServers, name: str) -> int:
    """Read a crawl-wide total from the node serving the crawl's slot."""
    home = cluster.serving(redis.cluster.key_slot(P.encode()))
    return int(home.command(f"HGET {P}stats {name}") or 0)


def _crawl_through(
    cluster: RedisClusterServers, tmp_path: Path, failover: Callable[[RedisServer], None]
) -> tuple[list[HostStats], list[str], list[dict[str, Any]], int]:
    """Two ``scrapy crawl`` processes crawl :data:`SPECS` on *cluster*.

    Once a third of the pages is acknowledged, *failover* is called with the master serving the
    crawl's slot. Returns the hosts' counts, each process's log and stats, and the pages
    acknowledged before the failover.
    """
    with watched_hosts(SPECS, process=True) as hosts:
        settings: dict[str, Any] = {
            "HOSTQUEUE_FRONTIER": cluster.url,
            "HOSTQUEUE_CRAWL_ID": CRAWL,
            "CLOSESPIDER_PAGECOUNT": 0,
            "CLOSESPIDER_TIMEOUT": 60,
            "HOSTQUEUE_TIMELINE_FILE": "",
            "ROBOTSTXT_OBEY": False,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            "HOSTQUEUE_MAX_ACTIVE_HOSTS": 1,
            "HOSTQUEUE_REDIS_FINISH_GRACE": 0.5,
            # One partition: every host of the crawl on the master failed
            # over (a crawl over the masters: test_cluster.py).
            "HOSTQUEUE_REDIS_PARTITIONS": 1,
        }
        workers = start_demo_crawls(hosts, tmp_path, settings, 2)
        with ended_at_exit(workers):
            deadline = time.monotonic() + 30
            while (acked := _crawl_stat(cluster, "acked")) < PAGES // 3:
                assert time.monotonic() < deadline, "the crawl did not get going"
                assert all(worker.poll() is None for worker in workers), "a crawl ended early"
                time.sleep(0.01)
            failover(cluster.serving(redis.cluster.key_slot(P.encode())))
            for worker in workers:
                worker.wait(60)
        hosts.wait_idle(10)
        stats = hosts.all_stats(arrivals=False)
    logs = [(tmp_path / f"worker{n}.log").read_text() for n in range(2)]
    results = [json.loads((tmp_path / f"stats{n}.json").read_text()) for n in range(2)]
    return stats, logs, results, acked


def _check_crawl(
    stats: list[HostStats],
    logs: list[str],
    results: list[dict[str, Any]],
    acked: int,
    *,
    limit: int = 2,
) -> None:
    """Check what holds through any failover.

    The crawl went on after it and finished in both processes, no host had more than *limit* in
    flight, every page was fetched, and an outage, if any, was logged once and ended.
    """
    assert 0 < acked < PAGES, acked  # the failover came mid-crawl
    for log, result in zip(logs, results, strict=True):
        assert "Traceback" not in log, log[-4000:]
        assert result["finish_reason"] == "finished", result["finish_reason"]
        assert result["stats"].get("downloader/response_count", 0) > 0  # it took part
        assert log.count("Lost the shared frontier at Redis") <= 1, log[-4000:]
        assert log.count("Lost the shared frontier at Redis") == log.count(
            "The shared frontier at Redis is back"
        ), log[-4000:]
        assert "The shared frontier at Redis failed" not in log, log[-4000:]
    for host, spec in zip(stats, SPECS, strict=True):
        assert host.max_in_flight <= limit, (host.hostname, host.max_in_flight)
        assert set(host.pages) == {f"/page/{n}" for n in range(spec.pages or 0)}, host.hostname


@pytest.mark.crawl
def test_a_crawl_goes_on_through_a_manual_failover_fetching_every_page_once(
    cluster: RedisClusterServers, tmp_path: Path
) -> None:
    """``CLUSTER FAILOVER`` sent to the replica.

    The master stops taking writes, waits until its replica has every one, and hands over; nothing
    the crawl wrote is lost.
    """
    stats, logs, results, acked = _crawl_through(
        cluster, tmp_path, lambda master: cluster.failover(cluster.replica_of(master))
    )
    _check_crawl(stats, logs, results, acked)
    for host in stats:
        assert max(host.pages.values()) == 1, (host.hostname, host.pages)
    assert _crawl_stat(cluster, "acked") == PAGES
    # No connection was lost: the clients followed the slot to the new master.
    assert not any("Lost the shared frontier" in log for log in logs)


@pytest.mark.crawl
@pytest.mark.parametrize("lag", [0.0, 0.3], ids=["replica-in-sync", "replica-behind"])
def test_a_crawl_goes_on_when_its_master_is_killed_and_its_replica_takes_over(
    cluster: RedisClusterServers, tmp_path: Path, lag: float
) -> None:
    """The master serving the crawl's slot killed, its replica promoted: the crawl goes on.

    The master serving the crawl's slot killed with SIGKILL, its replica
    promoted without it (``TAKEOVER``): each process loses Redis once, waits,
    finds the new master and goes on. With *lag*, the replica had stopped
    copying the master's writes that long before: the writes of those
    seconds are lost (replication is asynchronous), and what they held is
    done again: a page is fetched twice at most once per acknowledgement or
    push lost, and none is missed.
    """
    lost: dict[str, int] = {}

    def kill(master: RedisServer) -> None:
        replica = cluster.replica_of(master)
        if lag:
            cluster.cut_replication(master, replica)
            time.sleep(lag)
        # No write from here to the kill, so that what the master wrote and
        # what its replica kept are read from the same moment.
        master.command("CLIENT PAUSE 10000 WRITE")
        written = _stats_of(master)
        master.kill()
        cluster.failover(replica, "TAKEOVER")
        kept = _stats_of(replica)
        lost.update({name: written[name] - kept.get(name, 0) for name in ("acked", "pushed")})

    stats, logs, results, acked = _crawl_through(cluster, tmp_path, kill)
    dropped = sum(log.count("to another process after Redis lost") for log in logs)
    _check_crawl(stats, logs, results, acked, limit=2 if not dropped else 4)
    for log in logs:
        assert log.count("Lost the shared frontier at Redis") == 1, log[-4000:]
    if lag:
        assert lost["acked"] > 0, lost  # the writes of the lag were lost
    twice = sum(count - 1 for host in stats for count in host.pages.values())
    assert twice <= lost["acked"] + lost["pushed"], (twice, lost)
    assert (_crawl_stat(cluster, "queued"), _crawl_stat(cluster, "leased")) == (0, 0)


def _stats_of(node: RedisServer) -> dict[str, int]:
    """Return the crawl-wide totals as *node* holds them."""
    reply = node.command(f"HGETALL {P}stats")
    assert isinstance(reply, list)
    return {str(name): int(str(value)) for name, value in zip(reply[::2], reply[1::2], strict=True)}


@deferred_f_from_coro_f
async def test_scripts_redis_lost_are_loaded_again_without_an_outage(
    redis_server: RedisServer, redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis that lost the scripts has them loaded again, without an outage.

    A Redis that lost the scripts (a replica promoted on Redis 7, which
    does not copy ``SCRIPT LOAD`` to replicas; here ``SCRIPT FLUSH``): the
    task loads them again and sends its batch at once, no outage.
    """
    caplog.set_level(logging.INFO, "scrapy_hostqueue")
    a = StoreProcess(
        new_store(redis_client, "scripts"),
        async_client(redis, redis_server.url, cluster=False),
        redis_errors(redis),
    )
    a.link.start()

    a.store.push("h1", 0, "h1/0")
    await wait_pushed(redis_client, "scripts", 1)
    redis_client.script_flush()
    a.store.push("h1", 0, "h1/1")
    await wait_pushed(redis_client, "scripts", 2)
    assert await a.link.close() is None
    messages = [record.getMessage() for record in caplog.records]
    assert sum("lacks this package's scripts" in m for m in messages) == 1, messages
    assert not any(m.startswith("Lost the shared frontier") for m in messages), messages
    assert a.store.counts["outages"] == 0
    assert crawl_stats(redis_client, "scripts")["queued"] == 2
    await a.aclose()


@deferred_f_from_coro_f
async def test_writes_a_failover_lost_are_taken_back_or_redone(
    cluster: RedisClusterServers, caplog: pytest.LogCaptureFixture
) -> None:
    """What a failover lost is taken back or done again.

    The master killed while its replica had not copied its last writes
    (asynchronous replication), the replica promoted: what the processes
    wrote meanwhile is lost. The request acknowledged meanwhile is queued
    again (fetched twice, not lost), and so is a request queued lean that
    the claim lost had leased; a host claimed meanwhile is the claimer's
    again when it reconnects first, and dropped by it when another process
    claimed it first; no request is leased to two processes.
    """
    sync, _ = connect(redis, cluster.url)
    home = cluster.serving(redis.cluster.key_slot(P.encode()))
    replica = cluster.replica_of(home)

    def process(**options: Any) -> StoreProcess:
        client = async_client(redis, cluster.url, cluster=True)
        return StoreProcess(new_store(sync, CRAWL, **options), client, redis_errors(redis))

    a, b = process(), process(max_hold=1)
    for n in range(3):
        a.store.push("h1", 0, f"h1/{n}")
    await a.step(2)  # pushed, h1 claimed
    assert a.store.held_hosts == ["h1"]
    for host in ("h2", "h3"):
        b.store.push(host, 0, f"{host}/0")
    b.store._claim_after = float("inf")  # b pushes and claims nothing
    await b.link.step(beat=True, totals=False)
    first = a.store.pop()
    assert first is not None
    a.store.finish("h1")
    a.store.ack(first[1])
    a.store._claim_after = float("inf")  # not h2 or h3 yet
    await a.link.step(beat=True, totals=False)
    assert a.store.held_hosts == ["h1"]
    cluster.cut_replication(home, replica)
    # Lost: a's acknowledgement of its second request, its claim of h2, h3.
    second = a.store.pop()
    assert second is not None
    a.store.finish("h1")
    a.store.ack(second[1])
    await a.step()
    assert sorted(a.store.held_hosts) == ["h1", "h2", "h3"]
    in_flight = [popped[1] for popped in iter(a.store.pop, None)]
    assert sorted(in_flight) == ["h1/2", "h2/0", "h3/0"]
    assert int(home.command(f"HGET {P}stats acked")) == 2
    home.kill()
    cluster.failover(replica, "TAKEOVER")
    assert _crawl_stat(cluster, "acked") == 1
    assert sync.hget(P + "owner", "h2") is None

    async def back(p: StoreProcess) -> None:
        """Do what the task does when Redis is back: the scripts, the resync."""
        deadline = time.monotonic() + 10
        while True:
            try:
                p.link.shas = await p.link.load_scripts()
                await p.link.resync()
                return
            except redis_errors(redis):  # the client has yet to find the new master
                assert time.monotonic() < deadline, "the client did not find the new master"
                await asyncio.sleep(0.05)

    # b finds the new master first and claims h2 (one host at most).
    await back(b)
    b.store._claim_after = 0.0
    await b.step()
    assert b.store.held_hosts == ["h2"]
    taken = b.pop_all()
    assert taken == ["h2/0"]
    # a finds it next: h3 is a's again, h2 is b's; the acknowledgement lost
    # puts the request back in h1's queue.
    await back(a)
    assert sorted(a.store.held_hosts) == ["h1", "h3"]
    assert a.store.counts["lost_hosts"] == 1
    assert sum("gave host h2 to another process" in r.getMessage() for r in caplog.records) == 1
    owners = {k.decode(): v.decode() for k, v in sync.hgetall(P + "owner").items()}
    assert owners == {"h1": a.store.proc, "h2": b.store.proc, "h3": a.store.proc}
    leases = [sync.smembers(f"{P}lease:{p.store.proc}") for p in (a, b)]
    assert not leases[0] & leases[1], leases
    # The requests in flight at a finish; a fetches h1's again.
    for item in in_flight:
        a.store.finish(item.split("/")[0])
        a.store.ack(item)
    b.store.finish("h2")
    b.store.ack(taken[0])
    await b.step()
    # a learns of h1's request when it gives h1 back, idle, and claims it
    # again; h3's request, queued lean, was leased by the claim lost: it is
    # in h3's queue again and a reads it again (fetched twice, not lost).
    deadline = time.monotonic() + 5
    again: list[str] = []
    while len(again) < 2:
        assert time.monotonic() < deadline, (again, crawl_stats(sync, CRAWL))
        await a.step()
        for item in a.pop_all():
            again.append(item)
            a.store.finish(item.split("/")[0])
            a.store.ack(item)
        await asyncio.sleep(0.05)
    assert sorted(again) == [second[1], "h3/0"]
    await a.step()
    stats = crawl_stats(sync, CRAWL)
    assert (stats["queued"], stats["leased"]) == (0, 0), stats
    await a.aclose()
    await b.aclose()
    sync.close()


async def _fail_over(master: RedisServer, replica: RedisServer) -> None:
    """``FAILOVER`` sent to *master* (no cluster).

    It stops taking writes, waits until *replica* has every one, and the two swap roles. Returns
    once *master* is a replica with its link to *replica* up: nothing written is lost. (A replica
    promoted with ``REPLICAOF NO ONE`` while it lags drops the writes it missed, and the old master,
    made its replica, drops them too with a full resynchronisation.)
    """
    deadline = time.monotonic() + 10
    while replication(replica).get("master_link_status") != "up":
        assert time.monotonic() < deadline, replication(replica)
        await asyncio.sleep(0.01)
    assert master.command("FAILOVER") == "OK"
    while True:
        old, new = replication(master), replication(replica)
        if (
            old.get("role") == "slave"
            and old.get("master_link_status") == "up"
            and old.get("master_failover_state") == "no-failover"
            and new.get("role") == "master"
        ):
            return
        assert time.monotonic() < deadline, (old, new)
        await asyncio.sleep(0.01)


@deferred_f_from_coro_f
async def test_a_server_made_a_replica_is_an_outage_until_it_is_a_master_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One Redis server (no cluster) with a replica.

    A failover makes the crawl's server a replica of the other, which answers its writes with
    ``READONLY``; the process waits, as for a lost connection, and goes on once the server is a
    master again.
    """
    with RedisServer() as first, RedisServer() as second:
        for server in (first, second):
            # The first sync at once (Redis 7 waits 5 s before a diskless one).
            server.command("CONFIG SET repl-diskless-sync-delay 0")
        second.command(f"REPLICAOF 127.0.0.1 {first.port}")
        sync = redis.Redis.from_url(first.url)
        a = StoreProcess(
            new_store(sync, "demoted"),
            async_client(redis, first.url, cluster=False),
            redis_errors(redis),
        )
        backs: list[bool] = []
        a.store.on_back = lambda: backs.append(a.store.connected)
        a.link.start()

        a.store.push("h1", 0, "h1/0")
        await wait_pushed(sync, "demoted", 1)
        await _fail_over(first, second)
        a.store.push("h1", 0, "h1/1")
        deadline = time.monotonic() + 10
        while not a.store.counts["outages"]:
            assert time.monotonic() < deadline, "no outage"
            await asyncio.sleep(0.01)
        assert a.store.connected is False
        # Back: the first server a master again, the second its replica.
        await _fail_over(second, first)
        await wait_pushed(sync, "demoted", 2)
        assert await a.link.close() is None
        messages = [record.getMessage() for record in caplog.records]
        assert sum(m.startswith("Lost the shared frontier at Redis") for m in messages) == 1
        lost = next(m for m in messages if m.startswith("Lost the shared"))
        assert "You can't write against a read only replica" in lost
        assert sum(m.startswith("The shared frontier at Redis is back") for m in messages) == 1
        assert not any(m.startswith("The shared frontier at Redis failed") for m in messages)
        assert backs == [True]  # called once, when the outage ended
        stats = crawl_stats(sync, "demoted")
        assert (stats["pushed"], stats["queued"]) == (2, 2), stats
        await a.aclose()
        sync.close()


@deferred_f_from_coro_f
async def test_the_dupefilter_forgets_its_fingerprints_when_redis_is_back(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an outage the dupefilter forgets the fingerprints Redis may have lost.

    After an outage Redis may lack requests this process pushed (a
    failover to a replica that missed them): a link to one, found again when
    the page that had it is fetched again, must be pushed again, not dropped
    by the dupefilter's memory of this process's pushes.
    """
    crawler = get_crawler(Spider, {"HOSTQUEUE_FRONTIER": redis_url, "HOSTQUEUE_CRAWL_ID": "forget"})
    # No engine here.
    monkeypatch.setattr(internals, "on_request_leaving_downloader", lambda *_: lambda: None)
    scheduler = HostQueueScheduler.from_crawler(crawler)
    scheduler.open(Spider("forget"))
    store = scheduler._store
    assert isinstance(store, RedisStore) and store.on_back is not None
    request = Request("http://127.0.0.2/page/1")
    assert not scheduler.df.request_seen(request)
    assert scheduler.df.request_seen(request)
    store.on_back()  # what the store's task calls when Redis is back
    assert not scheduler.df.request_seen(request)
    closed = scheduler.close("finished")
    if closed is not None:
        await maybe_deferred_to_future(closed)
