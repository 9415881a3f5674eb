"""A full Redis and a Redis that lost the crawl, at the store's level.

A full Redis (``maxmemory`` with ``noeviction``) and a Redis that lost the
crawl, at the store's level on a real ``redis-server``: pushes refused and
kept back (in memory, past a bound in a file) while acknowledgements, the
heartbeat and claims go on; a batch refused halfway; nothing lost, nothing
pushed twice. And the pure parts: the backlog's order, when to log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.frontier.redis import _link as redislink
from scrapy_hostqueue.frontier.redis import _store as store_module
from scrapy_hostqueue.frontier.redis._capacity import (
    BLIND,
    LOG_EVERY,
    Backlog,
    Capacity,
    HeldRequest,
    read_held,
    write_held,
)
from scrapy_hostqueue.frontier.redis._check import persistence_warning, read
from scrapy_hostqueue.frontier.redis._db import part_prefix
from scrapy_hostqueue.frontier.redis._glue import async_client, redis_errors
from tests.helpers.clock import FakeClock
from tests.helpers.redis import RedisServer, StoreProcess, crawl_stats, new_store
from tests.helpers.requires_redis import import_redis, redis_server_marks

redis = import_redis()

pytestmark = redis_server_marks()

CRAWL = "full"
P = part_prefix(CRAWL)
#: A request's path padded to about 1 KB, so that a few hundred fill Redis.
PAD = "x" * 1000


def _held(n: int) -> HeldRequest:
    return HeldRequest(f"1.{n}", b"fp%d" % n, "h1", 0, b"data%d" % n)


def test_the_backlog_keeps_its_order_through_its_file(tmp_path: Path) -> None:
    path = str(tmp_path / "spill.jsonl")
    backlog = Backlog(3, path)
    for n in range(8):
        backlog.append(_held(n))
    assert len(backlog) == 8 and backlog.spilled == 5
    assert os.path.exists(path)
    assert [held.rid for held in backlog.items()] == [f"1.{n}" for n in range(8)]
    first = backlog.take(2)
    backlog.put_back(first)  # refused again: before every other
    backlog.append(_held(8))
    taken = [held for _ in range(5) for held in backlog.take(2)]
    assert taken == [_held(n) for n in range(9)]
    assert not backlog and not os.path.exists(path)


def test_held_requests_are_written_and_read_back(tmp_path: Path) -> None:
    path = str(tmp_path / "held.jsonl")
    requests = [_held(n) for n in range(3)]
    assert write_held(path, requests, lambda held: f"http://h1/{held.rid}") == 3
    with open(path, encoding="utf-8") as lines:
        assert list(read_held(lines)) == requests
    with pytest.raises(ValueError, match="line 1 is not a held request"):
        list(read_held(['{"host": "h1"}']))


def test_a_full_redis_is_one_warning_per_spell_and_retried_with_a_back_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock(100.0)
    capacity = Capacity(Backlog(10, str(tmp_path / "b.jsonl")), "redis://x", clock)
    capacity.memory(50_000, 100_000)
    assert not capacity.holding
    capacity.memory(85_000, 100_000)  # nearly full: one WARNING, pushes slowed
    capacity.memory(90_000, 100_000)
    assert capacity.holding
    capacity.backlog.append(_held(1))
    assert capacity.budget(acks=30) == 30 + 20
    assert capacity.refused()  # full: a WARNING is due
    assert capacity.budget(acks=30) == 0  # backing off
    clock.now += 0.1
    assert capacity.budget(acks=30) == BLIND  # a few, blindly
    assert not capacity.refused()  # the same spell
    clock.now += 0.1
    assert capacity.budget(acks=0) == 0  # the back-off doubled
    capacity.memory(100_000 - 5_500, 100_000)  # Redis says it has room again
    assert capacity.budget(acks=0) == 5  # what fits
    assert capacity.budget(acks=0) == 0  # taken
    capacity.backlog.take(1)
    clock.now += 1.0
    capacity.accepted()  # the spell is over: one INFO
    assert capacity.full_seconds == pytest.approx(1.2)
    capacity.backlog.append(_held(2))
    clock.now += 10
    assert not capacity.refused()  # full again soon after: no new WARNING
    capacity.backlog.take(1)
    capacity.accepted()
    clock.now += LOG_EVERY
    capacity.backlog.append(_held(3))
    assert capacity.refused()
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert "uses 85 % of its maxmemory" in messages[0]
    assert "takes new requests again" in messages[1]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def _process(server: RedisServer, sync: Any, **options: Any) -> StoreProcess:
    client = async_client(redis, server.url, cluster=False)
    store = new_store(sync, CRAWL, limit=32, **options)
    return StoreProcess(store, client, redis_errors(redis))


def _fill(sync: Any, room: int = 0) -> None:
    """Redis refuses writes that may grow it once it uses *room* bytes more."""
    used = int(sync.info("memory")["used_memory"])
    sync.config_set("maxmemory", max(1, used + room))


def _make_room(sync: Any) -> None:
    sync.config_set("maxmemory", 0)


def _pages(first: int, count: int) -> list[str]:
    return [f"h1/{n}-{PAD}" for n in range(first, first + count)]


@deferred_f_from_coro_f
async def test_a_full_redis_keeps_pushes_here_and_takes_acknowledgements(
    server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sync = redis.Redis.from_url(server.url)
    a = _process(server, sync, spill_dir=str(tmp_path))
    for page in _pages(0, 20):
        a.store.push("h1", 0, page)
    await a.step(2)
    leased = a.pop_all()
    assert len(leased) == 16  # a window
    _fill(sync)
    for page in _pages(100, 50):
        a.store.push("h1", 0, page)
    for item in leased:
        a.store.ack(item)
    with caplog.at_level(logging.INFO):
        await a.step()
        stats = crawl_stats(sync, CRAWL)
        # The acknowledgements freed memory (4 more leased: the window's
        # refill); the pushes wait here.
        assert stats["acked"] == 16 and stats["leased"] == 4
        assert stats["pushed"] == 20
        assert len(a.store.capacity.backlog) == 50
        assert a.store.capacity.full_since is not None
        assert len(a.store) > 0 and not a.store.finished()
        await a.step(3)  # the heartbeat and claims go on; nothing logged again
        assert a.store.counts["lost_leases"] == 0
        assert sorted(a.pop_all()) == sorted(_pages(16, 4))
        _make_room(sync)
        for _ in range(20):
            await asyncio.sleep(0.1)
            await a.step()
            if not a.store.capacity.backlog and not a.store.outbox:
                break
    stats = crawl_stats(sync, CRAWL)
    assert stats["pushed"] == 70 and stats.get("duplicates", 0) == 0
    # Queued lean, in h1's list, or leased by the claims that went on.
    assert stats["queued"] + stats["leased"] == 54
    assert sync.llen(P + "l:h1:0") == stats["queued"] and sync.hlen(P + "r") == stats["leased"]
    assert a.store.capacity.full_since is None and a.store.capacity.full_seconds > 0
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("scrapy_hostqueue")]
    full = [m for m in messages if "is full" in m]
    assert len(full) == 1, messages
    assert "refuses new requests" in full[0] and "fingerprints in" in full[0]
    assert sum("takes new requests again" in m for m in messages) == 1
    await a.aclose()
    sync.close()


@deferred_f_from_coro_f
async def test_a_batch_refused_halfway_is_sent_again_from_where_it_stopped(
    server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One batch of 40 push scripts of 5 requests each, on a Redis with room for a few.

    The first scripts start below maxmemory and run to their end, the others are refused before they
    write. The requests of the first are in Redis once; the others wait here, and go when there is
    room.
    """
    monkeypatch.setattr(redislink, "CHUNK", 5)
    sync = redis.Redis.from_url(server.url)
    a = _process(server, sync, spill_dir=str(tmp_path))
    a.store._claim_after = float("inf")
    await a.link.step(beat=True, totals=True)  # the scripts loaded
    pages = _pages(0, 200)
    # Valkey counts the batch it is reading (its query buffer) as used
    # memory before the first script runs; Redis 6.2 does not.
    buffered = 2 * sum(map(len, pages)) if "valkey_version" in sync.info("server") else 0
    _fill(sync, room=50_000 + buffered)
    for page in pages:
        a.store.push("h1", 0, page)
    await a.link.step(beat=True, totals=True)
    pushed = crawl_stats(sync, CRAWL).get("pushed", 0)
    kept = len(a.store.capacity.backlog)
    assert 0 < pushed < 200 and pushed + kept == 200, (pushed, kept)
    assert pushed % 5 == 0  # whole scripts, never a part of one
    assert a.store._unanswered == kept
    _make_room(sync)
    await a.link.read_memory()  # as the task does while Redis is full
    await a.link.step(beat=False, totals=True)
    stats = crawl_stats(sync, CRAWL)
    assert stats["pushed"] == 200 and stats["queued"] == 200
    assert stats.get("duplicates", 0) == 0
    assert sync.llen(P + "l:h1:0") == 200 and sync.hlen(P + "r") == 0
    assert a.store._unanswered == 0 and not a.store.capacity.backlog
    await a.aclose()
    sync.close()


@deferred_f_from_coro_f
async def test_past_its_bound_the_backlog_spills_to_a_file_and_comes_back(
    server: RedisServer, tmp_path: Path
) -> None:
    sync = redis.Redis.from_url(server.url)
    a = _process(server, sync, spill_dir=str(tmp_path), backlog=10)
    a.store._claim_after = float("inf")
    await a.link.step(beat=True, totals=True)  # the scripts loaded
    _fill(sync)
    for page in _pages(0, 100):
        a.store.push("h1", 0, page)
    await a.link.step(beat=False, totals=True)
    capacity = a.store.capacity
    assert len(capacity.backlog) == 100
    for page in _pages(100, 30):  # Redis full: behind the others
        a.store.push("h1", 0, page)
    assert len(capacity.backlog) == 130 and capacity.backlog.spilled > 0
    spill = capacity.backlog.path
    assert os.path.exists(spill)
    await a.link.step(beat=False, totals=True)
    # Redis knows this process keeps requests: the crawl is not finished.
    assert sync.hget(P + "backlog", a.store.proc) is not None
    _make_room(sync)
    for _ in range(40):
        await asyncio.sleep(0.1)
        await a.link.step(beat=False, totals=True)
        if not capacity.backlog and not a.store.outbox:
            break
    assert crawl_stats(sync, CRAWL)["pushed"] == 130
    assert sync.llen(P + "l:h1:0") == 130
    assert not os.path.exists(spill)
    await a.link.step(beat=False, totals=True)
    assert sync.hget(P + "backlog", a.store.proc) is None
    await a.aclose()
    sync.close()


@deferred_f_from_coro_f
async def test_a_redis_that_lost_the_crawl_is_told_apart_and_left_alone(
    server: RedisServer, tmp_path: Path
) -> None:
    sync = redis.Redis.from_url(server.url)
    a = _process(server, sync, spill_dir=str(tmp_path))
    lost: list[str] = []
    a.store.on_lost = lost.append
    for page in _pages(0, 5):
        a.store.push("h1", 0, page)
    await a.step(2)
    assert len(a.pop_all()) == 5
    server.flushall()
    a.store.push("h2", 0, "h2/new")
    task = a.link.start()
    await asyncio.wait_for(task, 5)
    assert lost == ["lost"] and a.store.frontier_lost
    assert server.command("DBSIZE") == 0  # nothing written into the empty Redis
    assert a.store.pop() is None
    held = sorted(held.data.decode() for held, _item in a.store.held_requests())
    assert held == sorted([*_pages(0, 5), "h2/new"])
    await a.aclose()
    sync.close()


@deferred_f_from_coro_f
async def test_a_redis_full_with_nothing_that_could_free_memory_stops_the_crawl(
    server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing queued or leased anywhere, Redis full: waiting would be for ever.

    The store says so once (the crawl then stops), and keeps what Redis refused for the file.
    """
    monkeypatch.setattr(store_module, "STUCK_FULL", 0.3)
    sync = redis.Redis.from_url(server.url)
    a = _process(server, sync, spill_dir=str(tmp_path), lease_timeout=0.3)
    stops: list[str] = []
    a.store.on_lost = stops.append
    await a.step()  # the scripts loaded
    _fill(sync, room=-50_000)
    for page in _pages(0, 5):
        a.store.push("h1", 0, page)
    await a.step()
    assert len(a.store.capacity.backlog) == 5
    for _ in range(10):
        await asyncio.sleep(0.1)
        await a.step()
    assert stops == ["full"] and a.store.stuck_full
    assert a.store.pop() is None
    assert len(list(a.store.unsent_requests())) == 5
    a.store.drop_unsent()
    assert a.store._unanswered == 0 and not list(a.store.unsent_requests())
    await a.aclose()
    sync.close()


def test_the_frontier_command_shows_memory_policy_and_persistence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    managed = ("--maxmemory", "50000000", "--rename-command", "CONFIG", "")
    with RedisServer(options=managed) as server:
        assert cli(["push", server.url, "--crawl-id", CRAWL, "http://127.0.0.2/"]) == 0
        assert cli(["frontier", server.url, "--crawl-id", CRAWL]) == 0
        out = capsys.readouterr().out
        assert re.search(r"Redis: [\d.]+ MB used of maxmemory 50\.0 MB \(\d+ %\)", out), out
        assert "maxmemory-policy noeviction, persistence unknown (CONFIG refused)" in out
        sync = redis.Redis.from_url(server.url)
        warning = persistence_warning(read(sync), "here")
        sync.close()
    assert warning is not None and warning.startswith("Could not check whether Redis at here")
    with RedisServer(appendonly=True) as server:
        assert cli(["push", server.url, "--crawl-id", CRAWL, "http://127.0.0.2/"]) == 0
        assert cli(["frontier", server.url, "--crawl-id", CRAWL]) == 0
        out = capsys.readouterr().out
        assert "no maxmemory, maxmemory-policy noeviction, persistence: appendonly yes" in out
