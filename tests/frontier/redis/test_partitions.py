"""A shared crawl spread over several partitions, each under its own hash tag, on one server.

Hosts land in their partition by a stable hash, claims reach every partition, the dupefilter stays
exact, the crawl finishes, and the crawl-wide figures are the sums of the partitions'.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import HostQueueScheduler
from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.exceptions import HostQueueSettingsError
from scrapy_hostqueue.frontier.redis._db import (
    RedisFrontierError,
    part_prefix,
    partition_of,
    partition_prefixes,
    prefix,
    register,
)
from scrapy_hostqueue.frontier.redis._link import GATHER
from tests.helpers.redis import RedisServer, StoreProcess, crawl_stats, new_store
from tests.helpers.requires_redis import import_redis, redis_server_marks

redis = import_redis()

pytestmark = redis_server_marks()

CRAWL = "parts"
HOSTS = [f"h{n}.example" for n in range(24)]


def _process(server: RedisServer, sync: Any, **options: Any) -> StoreProcess:
    store = new_store(sync, CRAWL, partitions=4, **options)
    client = redis.asyncio.Redis.from_url(server.url)
    return StoreProcess(store, client, (redis.exceptions.ConnectionError,))


def test_a_host_goes_to_the_partition_of_its_crc32() -> None:
    # The same in every process and every run (not Python's salted hash()).
    assert [partition_of("h1.example", n) for n in (1, 4, 16)] == [0, 2, 6]
    assert partition_of("h1.example", 4) == partition_of("h1.example", 4)


@deferred_f_from_coro_f
async def test_pushes_and_acknowledgements_wait_a_little_while_there_is_work_here(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server, redis_client)
    for n in range(6):
        a.store.push(HOSTS[0], 0, f"{HOSTS[0]}/{n}")
    await a.step(2)  # pushed, then claimed
    popped = a.store.pop()
    assert popped is not None and a.store.queued(HOSTS[0]) == 5
    a.store.push(HOSTS[1], 0, f"{HOSTS[1]}/0")
    a.store.ack(popped[1])
    # Work left here: they wait (the totals are read all the same).
    await a.link.step(beat=False, totals=True)
    stats = crawl_stats(redis_client, CRAWL)
    assert (stats["pushed"], stats.get("acked", 0)) == (6, 0)
    assert len(a.store.outbox) == 2
    a.link._sent_at -= GATHER
    await a.link.step(beat=False, totals=False)
    stats = crawl_stats(redis_client, CRAWL)
    assert (stats["pushed"], stats["acked"]) == (7, 1)
    await a.aclose()


@deferred_f_from_coro_f
async def test_a_crawl_over_four_partitions_is_whole_and_exact(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server, redis_client, max_hold=64)
    b = _process(redis_server, redis_client, max_hold=64)
    prefixes = partition_prefixes(redis_client, CRAWL)
    assert prefixes == [part_prefix(CRAWL, str(k)) for k in range(4)]
    pages = [f"{host}/{n}" for host in HOSTS for n in range(3)]
    for page in pages:
        a.store.push(page.split("/")[0], 0, page)
    for page in pages[::2]:  # duplicates, from the other process
        b.store.push(page.split("/")[0], 0, page)
    await a.step(beat=False, totals=False)
    await b.step(beat=False, totals=False)
    stats = crawl_stats(redis_client, CRAWL)
    # (a claimed hosts in the same step.)
    assert (stats["pushed"], stats["duplicates"], stats["queued"] + stats["leased"]) == (72, 36, 72)
    # Each host in its partition (queued there, or held), every partition with some.
    for host in HOSTS:
        k = partition_of(host, 4)
        assert [
            redis_client.zscore(p + "qcount", host) is not None
            or redis_client.hexists(p + "owner", host)
            for p in prefixes
        ] == [n == k for n in range(4)], host
    assert sorted({partition_of(host, 4) for host in HOSTS}) == [0, 1, 2, 3]
    # The frontier command's totals are the sums of the partitions'.
    assert cli(["frontier", redis_server.url, "--crawl-id", CRAWL]) == 0
    # Both processes claim, from every partition, until everything is done.
    handed: list[str] = []
    for _ in range(60):
        for process in (a, b):
            await process.step()
            for page in process.pop_all():
                handed.append(page)
                process.store.ack(page)
        if a.store.finished() and b.store.finished():
            break
    assert sorted(handed) == sorted(pages)  # every page once
    assert a.store.finished() and b.store.finished()
    claims = [int(redis_client.hget(p + "stats", "claims") or 0) for p in prefixes]
    assert all(claims), claims
    assert a.store.counts["claimed_hosts"] and b.store.counts["claimed_hosts"]
    stats = crawl_stats(redis_client, CRAWL)
    assert (stats["acked"], stats["queued"], stats["leased"]) == (72, 0, 0)
    # No request and no lease left in any partition; the fingerprints stay.
    assert not [key for key in redis_client.keys("hq:*") if b":r" in key or b":lease:" in key]
    assert sum(int(redis_client.hget(p + "fp", "n")) for p in prefixes) == 72
    assert await a.link.close() is None
    assert await b.link.close() is None
    assert all(redis_client.zcard(p + "procs") == 0 for p in prefixes)
    await a.aclose()
    await b.aclose()


def test_the_frontier_command_adds_the_partitions_up(
    redis_server: RedisServer, redis_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    register(redis_client, CRAWL, int((time.time() + 30) * 1000), partitions=3)
    urls = [f"http://{host}/{n}" for host in HOSTS for n in range(2)]
    assert cli(["push", redis_server.url, "--crawl-id", CRAWL, *urls, urls[0]]) == 0
    assert capsys.readouterr().out.strip() == "queued 48, 1 already seen"
    prefixes = partition_prefixes(redis_client, CRAWL)
    queued = [int(redis_client.hget(p + "stats", "queued") or 0) for p in prefixes]
    assert sum(queued) == 48 and all(queued), queued
    assert cli(["frontier", redis_server.url, "--crawl-id", CRAWL]) == 0
    out = capsys.readouterr().out
    assert "crawl id 'parts', 3 partitions" in out
    assert "48 requests queued and 0 leased; 48 pushed, 1 duplicates dropped" in out
    assert "48 fingerprints seen" in out
    assert "processes (1):" in out


def test_a_process_joins_with_the_partitions_of_the_crawl(
    redis_server: RedisServer, redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings = {"HOSTQUEUE_FRONTIER": redis_server.url, "HOSTQUEUE_CRAWL_ID": CRAWL}
    first = HostQueueScheduler.from_crawler(
        get_crawler(settings_dict={**settings, "HOSTQUEUE_REDIS_PARTITIONS": 4})
    )
    assert first is not None
    client = redis_client
    assert client.get(prefix(CRAWL) + "partitions") == b"0 1 2 3"
    with caplog.at_level(logging.WARNING):
        HostQueueScheduler.from_crawler(
            get_crawler(settings_dict={**settings, "HOSTQUEUE_REDIS_PARTITIONS": 8})
        )
    assert (
        "HOSTQUEUE_REDIS_PARTITIONS is 8, and crawl 'parts' was made with 4 partitions: "
        "this process joins it with 4" in caplog.text
    )
    assert len(partition_prefixes(client, CRAWL)) == 4
    # Every process is registered in every partition.
    assert [client.zcard(p + "procs") for p in partition_prefixes(client, CRAWL)] == [2] * 4


@pytest.mark.parametrize("value", [-1, 1.5, "many", 1025])
def test_a_bad_number_of_partitions_is_refused(value: Any) -> None:
    crawler = get_crawler(settings_dict={"HOSTQUEUE_REDIS_PARTITIONS": value})
    with pytest.raises(HostQueueSettingsError, match="HOSTQUEUE_REDIS_PARTITIONS must be"):
        HostQueueScheduler.from_crawler(crawler)


def test_a_crawl_that_lost_a_partition_is_refused(redis_client: Any) -> None:
    register(redis_client, CRAWL, 0, partitions=4)
    redis_client.delete(part_prefix(CRAWL, "2") + "crawl")
    with pytest.raises(RedisFrontierError, match="has lost 1 of its 4 partitions"):
        register(redis_client, CRAWL, 0)


def test_processes_making_the_crawl_at_once_agree_on_its_identity(redis_client: Any) -> None:
    # What a process that stopped while making the crawl leaves: its
    # partitions and the first one's token, no version yet.
    redis_client.set(prefix(CRAWL) + "partitions", "0 1 2")
    redis_client.set(part_prefix(CRAWL, "0") + "crawl", "first")
    register(redis_client, CRAWL, 0, partitions=8)
    register(redis_client, CRAWL, 0)
    prefixes = partition_prefixes(redis_client, CRAWL)
    assert [redis_client.get(p + "crawl") for p in prefixes] == [b"first"] * 3
    assert redis_client.get(prefix(CRAWL) + "version") == b"4"


@deferred_f_from_coro_f
async def test_a_process_with_no_host_finds_the_partition_where_a_part_is_offered(
    redis_server: RedisServer, redis_client: Any
) -> None:
    holder = _process(redis_server, redis_client, share_hosts=True)
    idle = _process(redis_server, redis_client, share_hosts=True)
    busy = HOSTS[0]
    for n in range(100):
        holder.store.push(busy, 0, f"{busy}/{n}")
    await holder.step()
    await holder.step()
    assert holder.store.held_hosts == [busy]
    # The holder offers a part of it (as its share logic does).
    redis_client.hset(
        part_prefix(CRAWL, str(partition_of(busy, 4))) + f"share:{busy}",
        mapping={"owner": holder.store.proc, "limit": 8, "grant": 4, "block": 0},
    )
    redis_client.zadd(part_prefix(CRAWL, str(partition_of(busy, 4))) + "offers", {busy: 1})
    # The idle process reads where it is (each partition's totals about
    # every fourth step) and claims there, not in turn.
    k = partition_of(busy, 4)
    for _ in range(8):
        idle.store._claiming = True  # no claim yet: the totals only
        await idle.step()
    idle.store._claiming = False
    assert idle.store.offered == [1 if n == k else 0 for n in range(4)]
    assert idle.store.claimable == [0, 0, 0, 0]
    assert {idle.store._claim_partition(part=True) for _ in range(4)} == {k}
    assert {idle.store._claim_partition(part=False) for _ in range(4)} == {0, 1, 2, 3}
    await idle.step()
    assert idle.store.held_hosts == [busy] and idle.store.pop() is not None
    await holder.aclose()
    await idle.aclose()
