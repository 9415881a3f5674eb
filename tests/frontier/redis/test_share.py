"""A busy host shared by two processes within its one limit.

The Redis store's share rules against a real ``redis-server``, two stores standing for two
processes, their task's steps run by hand on a fake clock.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.frontier.redis._db import part_prefix
from scrapy_hostqueue.frontier.redis._share import OFFER_WAIT, may_share
from tests.helpers.clock import FakeClock
from tests.helpers.redis import RedisServer, StoreProcess, new_store
from tests.helpers.requires_redis import import_redis

redis = import_redis()

pytestmark = pytest.mark.requires_redis

CRAWL = "share"
P = part_prefix(CRAWL)
LIMIT = 4


class Process(StoreProcess):
    """A store on the fake clock and an asyncio client, stepped by hand."""

    def __init__(self, url: str, redis_client: Any, clock: FakeClock, **options: Any) -> None:
        options = {"share_hosts": True, **options}
        store = new_store(redis_client, CRAWL, limit=LIMIT, clock=clock, **options)
        client = redis.asyncio.Redis.from_url(url)
        super().__init__(store, client, (redis.exceptions.ConnectionError,))
        self.handed: list[str] = []

    def pop_all(self) -> list[str]:
        out = []
        while (popped := self.store.pop()) is not None:
            self.store.set_answering(popped[0], True)
            out.append(popped[1])
        self.handed += out
        return out

    def finish(self, n: int = 1) -> None:
        for _ in range(n):
            item = self.handed.pop(0)
            self.store.finish("h")
            self.store.ack(item)

    def in_flight(self) -> int:
        return self.store.in_flight("h")

    def limit(self) -> int:
        return self.store.host_state("h").limit


async def _shared(
    redis_server: RedisServer, redis_client: Any, clock: FakeClock
) -> tuple[Process, Process]:
    """Share "h" between a holder and a process without a host.

    a holds "h" (limit 4, 60 requests queued) with 4 in flight; b has no host. Returns them once b
    works a part of "h".
    """
    a = Process(redis_server.url, redis_client, clock)
    b = Process(redis_server.url, redis_client, clock)
    for n in range(60):
        a.store.push("h", 0, f"h/{n}")
    await a.step(2)
    assert a.store.held_hosts == ["h"]
    assert len(a.pop_all()) == LIMIT
    await b.step()  # finds no host: wants a part of one
    assert b.store.held_hosts == []
    clock.now += OFFER_WAIT
    await a.step(2)  # reads that b wants one, lowers itself to 1
    assert a.limit() == 1
    assert redis_client.zcard(P + "offers") == 0  # not before it has its part in flight
    a.finish(2)
    await a.step()  # 2 in flight: it offers 2 and keeps 2
    assert a.limit() == 2
    assert redis_client.zrange(P + "offers", 0, -1) == [b"h"]
    await b.step()
    assert b.store.held_hosts == ["h"]
    assert b.limit() == 2
    return a, b


@deferred_f_from_coro_f
async def test_a_busy_host_is_lent_in_part_and_the_limit_holds(
    redis_server: RedisServer, redis_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = FakeClock(1000.0)
    a, b = await _shared(redis_server, redis_client, clock)
    assert cli(["frontier", redis_server.url, "--crawl-id", CRAWL]) == 0
    out = capsys.readouterr().out
    assert f"held by {a.store.proc}, 2 of its limit lent to {b.store.proc}" in out
    assert len(b.pop_all()) == 2
    assert a.pop_all() == []
    assert a.in_flight() + b.in_flight() == LIMIT
    # Its AIMD may lower b's part and raise it back, never past it.
    b.store.set_limit("h", 1)
    assert b.limit() == 1
    b.store.set_limit("h", LIMIT + 4)
    assert b.limit() == 2
    # a's learned limit is what it saves with the host, not its part.
    a.store.set_limit("h", LIMIT)
    assert a.limit() == 2
    assert a.store._state("h")[0].startswith('{"limit":4')
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_a_block_seen_by_one_holder_reaches_the_other(
    redis_server: RedisServer, redis_client: Any
) -> None:
    clock = FakeClock(1000.0)
    a, b = await _shared(redis_server, redis_client, clock)
    b.pop_all()
    b.store.block_until("h", clock.now + 5, "retry-after")
    await b.step()
    await a.step()
    assert a.store.host_state("h").blocked_until == pytest.approx(clock.now + 5, abs=0.05)
    a.finish(2)
    assert a.pop_all() == []
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_the_holder_gets_its_part_back_only_once_the_co_holder_is_done(
    redis_server: RedisServer, redis_client: Any
) -> None:
    clock = FakeClock(1000.0)
    a, b = await _shared(redis_server, redis_client, clock)
    b.pop_all()
    # a's AIMD halves its limit twice (errors): the host is no longer worth
    # two processes.
    a.store.set_limit("h", 2)
    a.store.set_limit("h", 1)
    await a.step()  # recalls the part
    await b.step()  # b reads it: hands out nothing more
    assert redis_client.hget(P + "share:h", "recall") == b"1"
    assert b.pop_all() == []
    for _ in range(3):
        await a.step()
        assert a.store._held["h"].share is not None  # b still has 2 in flight
    b.finish(2)
    await b.step()  # nothing in flight: the part ends
    assert b.store.held_hosts == []
    assert not redis_client.exists(P + "share:h")
    await a.step()
    assert a.store._held["h"].share is None
    a.store.set_limit("h", LIMIT)  # and its AIMD may raise it to the whole limit again
    assert a.limit() == LIMIT
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_a_holder_that_lets_go_leaves_the_host_unclaimable_until_the_part_ends(
    redis_server: RedisServer, redis_client: Any
) -> None:
    clock = FakeClock(1000.0)
    a, b = await _shared(redis_server, redis_client, clock)
    b.pop_all()
    a.finish(2)
    a.store.hand_back_all()  # a graceful close
    await a.step()
    assert not redis_client.hexists(P + "owner", "h")
    assert redis_client.zscore(P + "avail", "h") is None  # b has 2 in flight
    c = Process(redis_server.url, redis_client, clock, share_hosts=False)
    await c.step(2)
    assert c.store.held_hosts == []
    await b.step()
    b.finish(2)
    await b.step()  # its part ends (and it may claim the host whole)
    assert not redis_client.exists(P + "share:h")
    await c.step()
    (holder,) = [p for p in (b, c) if p.store.held_hosts == ["h"]]
    assert holder.store._held["h"].share is None
    assert holder.limit() == LIMIT
    for process in (a, b, c):
        await process.aclose()


@deferred_f_from_coro_f
async def test_a_dead_co_holders_part_comes_back_when_its_lease_expires(
    redis_server: RedisServer, redis_client: Any
) -> None:
    clock = FakeClock(1000.0)
    a, b = await _shared(redis_server, redis_client, clock)
    b.pop_all()
    await a.step(3)
    assert a.limit() == 2
    redis_client.zadd(P + "procs", {b.store.proc: 1})  # b's heartbeat expired
    await a.step()  # the heartbeat reclaims what b held
    await a.step()
    assert a.limit() == LIMIT
    assert not redis_client.exists(P + "share:h")
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_a_host_not_busy_enough_is_not_lent(
    redis_server: RedisServer, redis_client: Any
) -> None:
    clock = FakeClock(1000.0)
    a = Process(redis_server.url, redis_client, clock)
    b = Process(redis_server.url, redis_client, clock)
    for n in range(12):  # fewer than 4 times its limit
        a.store.push("h", 0, f"h/{n}")
    await a.step(2)
    a.pop_all()
    await b.step()
    clock.now += OFFER_WAIT
    await a.step(3)
    assert a.limit() == LIMIT
    assert not redis_client.exists(P + "share:h")
    await a.aclose()
    await b.aclose()


@pytest.mark.parametrize(
    ("limit", "options", "expected"),
    [
        (4, {}, True),
        (3, {}, True),
        (2, {}, False),  # with prefetch 1 it could not bring itself to 1
        (2, {"prefetch": 0}, True),
        (1, {"prefetch": 0}, False),
        (4, {"interval": 1.0}, False),
        (4, {"blocked": True}, False),
        (4, {"given_up": True}, False),
        (4, {"answering": False}, False),
        (4, {"queued": 15}, False),
    ],
)
def test_which_hosts_may_be_lent(limit: int, options: dict[str, Any], expected: bool) -> None:
    args: dict[str, Any] = {
        "interval": 0.0,
        "blocked": False,
        "given_up": False,
        "answering": True,
        "queued": 16,
        "prefetch": 1,
    }
    args.update(options)
    assert may_share(limit, **args) is expected


@deferred_f_from_coro_f
async def test_two_holders_never_have_more_than_the_limit_in_flight(
    redis_server: RedisServer, redis_client: Any
) -> None:
    """Random hand-outs, answers, steps and time on two processes.

    At every moment the two have at most the host's limit in flight between them.
    """
    rng = random.Random(7)
    clock = FakeClock(1000.0)
    a = Process(redis_server.url, redis_client, clock)
    b = Process(redis_server.url, redis_client, clock)
    for n in range(400):
        a.store.push("h", 0, f"h/{n}")
    await a.step(2)
    shared = 0
    for _ in range(600):
        process = rng.choice((a, b))
        action = rng.random()
        if action < 0.3:
            process.pop_all()
        elif action < 0.6 and process.handed:
            process.finish(rng.randint(1, len(process.handed)))
        elif action < 0.9:
            await process.step()
        else:
            clock.now += rng.choice((0.1, 0.5, 1.0))
        assert a.in_flight() + b.in_flight() <= LIMIT
        shared += b.in_flight() > 0 and a.in_flight() > 0
    assert shared > 20
    await a.aclose()
    await b.aclose()
