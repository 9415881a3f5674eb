"""The Redis store against a real ``redis-server``.

Two stores on one crawl stand for two processes; the task's steps are run one at a time.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.frontier.redis import _store as redis_store
from scrapy_hostqueue.frontier.redis._db import (
    LAYOUT_VERSION,
    RedisFrontierError,
    part_prefix,
    prefix,
    register,
)
from scrapy_hostqueue.frontier.redis._link import batched
from scrapy_hostqueue.frontier.redis._store import RedisStore
from tests.helpers.redis import RedisServer, StoreProcess, crawl_stats, new_store
from tests.helpers.requires_redis import import_redis

redis = import_redis()

pytestmark = pytest.mark.requires_redis

CRAWL = "unit"
P = part_prefix(CRAWL)


def _store(redis_client: Any, **options: Any) -> RedisStore[str]:
    return new_store(redis_client, CRAWL, **options)


def _process(url: str, store: RedisStore[str]) -> StoreProcess:
    """Make a store and an asyncio client, stepped by hand."""
    client = redis.asyncio.Redis.from_url(url)
    return StoreProcess(store, client, (redis.exceptions.ConnectionError,))


def _stats(redis_client: Any) -> dict[str, int]:
    return crawl_stats(redis_client, CRAWL)


@deferred_f_from_coro_f
async def test_push_dedupes_across_processes_and_claims_are_exclusive(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server.url, _store(redis_client))
    b = _process(redis_server.url, _store(redis_client))
    for url in ("h1/a", "h1/b", "h1/a", "h2/a"):
        a.store.push(url.split("/")[0], 0, url)
    b.store.push("h1", 0, "h1/b")
    await a.step()
    await b.step()
    stats = _stats(redis_client)
    assert stats["pushed"] == 3
    assert stats["duplicates"] == 2
    # a pushed first and claimed both hosts; b got none.
    await a.step()
    await b.step()
    assert sorted(a.store.held_hosts) == ["h1", "h2"]
    assert b.store.held_hosts == []
    assert sorted(a.pop_all()) == ["h1/a", "h1/b", "h2/a"]
    assert b.pop_all() == []
    assert redis_client.hgetall(P + "owner") == {
        b"h1": a.store.proc.encode(),
        b"h2": a.store.proc.encode(),
    }
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_a_child_of_a_held_host_stays_here_and_acks_end_leases(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server.url, _store(redis_client))
    a.store.push("h1", 0, "h1/0")
    await a.step()
    await a.step()
    (first,) = a.pop_all()
    assert first == "h1/0"
    a.store.push("h1", 0, "h1/1")
    a.store.push("h1", 0, "h1/0")  # a duplicate: dropped in Redis
    a.store.ack(first)
    await a.step()
    (second,) = a.pop_all()
    assert second == "h1/1"
    stats = _stats(redis_client)
    assert (stats["queued"], stats["leased"], stats["acked"], stats["duplicates"]) == (0, 1, 1, 1)
    a.store.ack(second)
    await a.step()
    assert _stats(redis_client)["leased"] == 0
    assert redis_client.hlen(P + "r") == 0
    await a.aclose()


@deferred_f_from_coro_f
async def test_a_dead_process_hosts_and_requests_go_to_the_others(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server.url, _store(redis_client))
    b = _process(redis_server.url, _store(redis_client))
    for n in range(3):
        a.store.push("h1", 0, f"h1/{n}")
    await a.step()
    await a.step()
    handed = a.pop_all()
    assert len(handed) == 3
    await b.step()
    assert b.store.held_hosts == []
    # a stops renewing its heartbeat: its lease expires.
    redis_client.zadd(P + "procs", {a.store.proc: 1})
    await b.step()  # the heartbeat reclaims
    await b.step()  # the claim
    assert b.store.held_hosts == ["h1"]
    assert sorted(b.pop_all()) == sorted(handed)
    assert _stats(redis_client)["reclaimed"] == 3
    # a hears it was taken back at its next heartbeat, and forgets the host.
    await a.step()
    assert a.store.held_hosts == []
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_a_process_that_waits_for_hosts_gets_its_share(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server.url, _store(redis_client, max_hold=8))
    b = _process(redis_server.url, _store(redis_client, max_hold=8))
    for host in ("h1", "h2", "h3", "h4"):
        for n in range(3):
            a.store.push(host, 0, f"{host}/{n}")
    await a.step()
    await a.step()
    assert len(a.store.held_hosts) == 4
    in_flight = [a.store.pop() for _ in range(2)]  # one request of 2 hosts
    await b.step()  # finds no host: waits
    assert b.store.held_hosts == []
    assert redis_client.zscore(P + "hungry", b.store.proc) is not None
    # a holds twice its share (4 hosts, 2 processes): it gives back the two
    # hosts with nothing in flight, keeps the other two (it hears of b, drains
    # two hosts, gives them back).
    for _ in range(3):
        await a.step()
    assert len(a.store.held_hosts) == 2
    busy = {popped[0] for popped in in_flight if popped is not None}
    assert busy <= set(a.store.held_hosts)
    # Meanwhile a does not claim them back: b's are they.
    await a.step()
    await b.step()
    assert len(b.store.held_hosts) == 2
    assert set(a.store.held_hosts).isdisjoint(b.store.held_hosts)
    assert redis_client.zscore(P + "hungry", b.store.proc) is None
    assert len(b.pop_all()) == 6
    # Both hold their share: nothing moves any more.
    for _ in range(3):
        await a.step()
        await b.step()
    assert len(a.store.held_hosts) == len(b.store.held_hosts) == 2
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_a_host_never_handed_out_while_others_keep_the_budget_is_given_back(
    redis_server: RedisServer, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store, "UNUSED_GRACE", 0.2)
    a = _process(redis_server.url, _store(redis_client))
    for host in ("h1", "h2"):
        for n in range(3):
            a.store.push(host, 0, f"{host}/{n}")
    await a.step()
    await a.step()
    assert sorted(a.store.held_hosts) == ["h1", "h2"]
    popped = a.store.pop()  # the scheduler asks once, and is busy since
    assert popped is not None
    await a.step()
    assert sorted(a.store.held_hosts) == ["h1", "h2"]
    time.sleep(0.3)
    await a.step()
    await a.step()
    # The host it worked stays; the other goes back, and is not claimed
    # again while this process has no room for it.
    assert a.store.held_hosts == [popped[0]]
    assert redis_client.zscore(P + "avail", "h2" if popped[0] == "h1" else "h1") is not None
    # Room again (nothing to hand out): it claims.
    assert a.store.pop() is not None
    assert a.store.pop() is not None
    assert a.store.pop() is None
    await a.step()
    assert sorted(a.store.held_hosts) == ["h1", "h2"]
    await a.aclose()


@deferred_f_from_coro_f
async def test_requests_cost_a_few_redis_commands_each(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server.url, _store(redis_client))
    for host in ("h1", "h2"):
        a.store.push(host, 0, f"{host}/0")
    await a.step()
    await a.step()
    parents = a.pop_all()
    assert len(parents) == 2
    redis_server.reset_stats()
    # 200 children of held hosts (kept here), 200 of a host nobody holds
    # (queued in Redis), and the parents acknowledged: one batch.
    for n in range(1, 101):
        for host in ("h1", "h2", "h3"):
            a.store.push(host, 0, f"{host}/{n}")
    for parent in parents:
        a.store.ack(parent)
    await a.step(beat=False, totals=False)
    stats = _stats(redis_client)
    assert stats["pushed"] == 302
    assert stats["acked"] == 2
    calls = {name: stat.calls for name, stat in redis_server.commandstats().items()}
    # Per request: is its fingerprint new, and for one queued in Redis (the
    # held hosts keep 64 here) its place in its host's queue. The rest
    # (counters, values, leases, host lookups) once per script call.
    scripts = calls["evalsha"]
    assert scripts <= 5, calls
    assert calls.get("hincrby", 0) <= 3 * scripts, calls
    # Given up, owner, ready: once per host and script call.
    assert calls.get("sismember", 0) + calls.get("hget", 0) <= 3 * 3 * scripts, calls
    total = sum(calls.values()) - calls.get("info", 0) - calls.get("config", 0)
    assert calls.get("hexists", 0) == 0, calls
    assert total <= 2 * 300 + 10 * scripts, calls
    await a.aclose()


@deferred_f_from_coro_f
async def test_a_graceful_close_hands_back_at_once_with_the_host_state(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server.url, _store(redis_client, window=2))
    b = _process(redis_server.url, _store(redis_client))
    for n in range(5):
        a.store.push("h1", 0, f"h1/{n}")
    await a.step()
    await a.step()
    popped = a.store.pop()
    assert popped is not None
    a.store.ack(popped[1])
    a.store.block_until("h1", a.store._mem.clock() + 0.5, "retry-after")
    assert await a.link.close() is None
    assert redis_client.zscore(P + "procs", a.store.proc) is None
    assert _stats(redis_client)["queued"] == 4
    # Blocked: not claimable before the block ends, then with its block.
    await b.step()
    assert b.store.held_hosts == []
    time.sleep(0.6)
    await b.step()
    assert b.store.held_hosts == ["h1"]
    assert sorted(b.pop_all()) == [f"h1/{n}" for n in range(1, 5)]
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_state_and_learned_blob_travel_with_the_host(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server.url, _store(redis_client))
    b = _process(redis_server.url, _store(redis_client))
    learned: dict[str, dict[str, float]] = {}
    a.store.export_learned = lambda host: {"limit": 3.0, "latency": 0.2}
    b.store.import_learned = learned.__setitem__
    a.store.push("h1", 0, "h1/0")
    a.store.push("h1", 0, "h1/1")
    await a.step()
    await a.step()
    a.store.set_limit("h1", 3)
    a.store.set_interval("h1", 0.25)
    assert await a.link.close() is None
    await b.step()
    assert b.store.held_hosts == ["h1"]
    state = b.store.host_state("h1")
    assert (state.limit, state.interval) == (3, 0.25)
    assert learned == {"h1": {"limit": 3.0, "latency": 0.2}}
    await a.aclose()
    await b.aclose()


@deferred_f_from_coro_f
async def test_the_crawl_finishes_when_nothing_is_queued_or_leased(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server.url, _store(redis_client))
    waiting = _process(redis_server.url, _store(redis_client, wait_for_urls=True))
    a.store.push("h1", 0, "h1/0")
    await a.step()
    await a.step()
    assert len(a.store) > 0 and not a.store.finished()
    request = a.pop_all()[0]
    await a.step()
    assert not a.store.finished()  # leased
    a.store.ack(request)
    await a.step()
    await a.step()
    assert a.store.finished() and len(a.store) == 0
    await waiting.step()
    await waiting.step()
    assert not waiting.store.finished()
    await a.aclose()
    await waiting.aclose()


def test_a_crawl_id_of_another_layout_is_refused(redis_client: Any) -> None:
    # Where every layout keeps its version: layout 3 (one hash tag per
    # crawl, no partitions) wrote it there too.
    redis_client.set(prefix(CRAWL) + "version", "3")
    with pytest.raises(RedisFrontierError, match="layout 3, this scrapy-hostqueue uses layout 4"):
        register(redis_client, CRAWL, 0)
    assert redis_client.keys("hq:*") == [prefix(CRAWL).encode() + b"version"]
    redis_client.delete(prefix(CRAWL) + "version")
    assert register(redis_client, CRAWL, 0)
    assert redis_client.get(prefix(CRAWL) + "version") == LAYOUT_VERSION.encode()


@deferred_f_from_coro_f
async def test_a_batch_sent_twice_changes_nothing_more(
    redis_server: RedisServer, redis_client: Any
) -> None:
    """Send a batch whose answer was lost again as it was, marked as sent before.

    The requests queued lean answer "queued" again (their fingerprints name
    this process), not "duplicate".
    """
    a = _process(redis_server.url, _store(redis_client))
    a.store.push("h1", 0, "h1/0")
    a.store.push("h2", 0, "h2/0")
    a.store.push("h1", 0, "h1/1")
    ops = list(a.store.outbox)
    await a.step()

    def now() -> tuple[Any, ...]:
        lists = [redis_client.lrange(P + f"l:{host}:0", 0, -1) for host in ("h1", "h2")]
        return _stats(redis_client), redis_client.hget(P + "fp", "n"), lists

    before = now()
    assert before[0]["pushed"] == 3 and before[1] == b"3", before
    a.store.outbox[:0] = a.store.failed(ops, sent=True)
    a.store._unanswered += len(ops)
    await a.step(beat=False)
    assert now() == before
    assert a.store.counts["duplicates"] == 0
    await a.aclose()


def test_push_and_frontier_commands(
    redis_server: RedisServer, redis_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "http://127.0.0.2:8000/page/"
    assert (
        cli(["push", redis_server.url, "--crawl-id", CRAWL, url + "1", url + "2", url + "1"]) == 0
    )
    assert capsys.readouterr().out.strip() == "queued 2, 1 already seen"
    assert cli(["push", redis_server.url, "--crawl-id", CRAWL, url + "2"]) == 0
    assert capsys.readouterr().out.strip() == "queued 0, 1 already seen"
    proc = register(redis_client, CRAWL, int((time.time() + 30) * 1000))
    redis_client.hset(
        P + "state", "127.0.0.2", '{"limit":3,"blocked_until":%f}' % (time.time() + 60)
    )
    assert cli(["frontier", redis_server.url, "--crawl-id", CRAWL]) == 0
    out = capsys.readouterr().out
    assert "2 requests queued and 0 leased" in out
    assert re.search(r"127\.0\.0\.2 +2 queued +0 leased", out), out
    assert f"  {proc}  alive, 0 leased, 0 hosts held" in out
    assert "blocked hosts:\n  127.0.0.2  until" in out
    assert "127.0.0.2  limit 3" in out
    with pytest.raises(SystemExit):
        cli(["frontier", redis_server.url])
    assert "needs --crawl-id" in capsys.readouterr().err


@deferred_f_from_coro_f
async def test_a_resync_gives_back_what_a_lost_answer_handed_out(
    redis_server: RedisServer, redis_client: Any
) -> None:
    a = _process(redis_server.url, _store(redis_client))
    for n in range(3):
        a.store.push("h1", 0, f"h1/{n}")
    a.store._claim_after = float("inf")  # pushed, not claimed
    await a.link.step(beat=True, totals=False)
    assert a.store.held_hosts == []
    # A claim whose answer never came back: Redis handed the host out.
    assert a.link.shas is not None
    claim = a.link.shas["claim"]
    now_ms = int(time.time() * 1000)
    await a.client.evalsha(claim, 1, P, a.store.token, a.store.proc, now_ms, 4, 16)
    assert redis_client.hget(P + "owner", "h1") == a.store.proc.encode()
    assert a.store.held_hosts == []
    await a.link.resync()
    assert redis_client.hget(P + "owner", "h1") is None
    assert _stats(redis_client)["queued"] == 3
    await a.step()
    assert a.store.held_hosts == ["h1"]
    assert sorted(a.pop_all()) == ["h1/0", "h1/1", "h1/2"]
    await a.aclose()


def test_the_package_works_without_the_redis_client() -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "import scrapy_hostqueue, scrapy_hostqueue.scheduler\n"
        "from scrapy_hostqueue.frontier.redis._glue import redis_client_module\n"
        "try:\n"
        "    redis_client_module()\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == (
        "RedisFrontierError HOSTQUEUE_FRONTIER names a Redis server, and the redis client "
        "is not installed: pip install 'scrapy-hostqueue[redis]'"
    )


def test_a_step_sends_each_run_of_pushes_and_acknowledgements_in_one_script_call() -> None:
    # A page's links pushed, then the page acknowledged, page after page;
    # a claim and a hand-back in between.
    ops: list[tuple[Any, ...]] = []
    for page in range(3):
        ops += [("push", f"{page}.{link}") for link in range(3)] + [("ack", f"{page}")]
    ops.insert(8, ("claim", 4))
    ops.append(("give_back", "h"))
    ops += [("ack", "9"), ("push", "9.0")]
    out = batched(ops)
    assert sorted(out) == sorted(ops)
    kinds = [op[0] for op in out]
    runs = [kind for n, kind in enumerate(kinds) if n == 0 or kinds[n - 1] != kind]
    assert runs == ["push", "ack", "claim", "push", "ack", "give_back", "push", "ack"]
    # Every acknowledgement still follows the pushes that came before it,
    # and the other operations keep their place among them.
    for n, op in enumerate(ops):
        if op[0] != "push":
            before = {o for o in ops[:n] if o[0] == "push" or o[0] not in ("push", "ack")}
            assert before <= set(out[: out.index(op)]), op


@deferred_f_from_coro_f
async def test_a_process_redis_forgot_says_so_once_and_registers_again(
    redis_server: RedisServer, redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A process Redis forgot says so once, registers again and claims again.

    Another process's heartbeat reclaimed what this one held (its own
    heartbeat expired, or a failover lost its registration): its claims find
    it gone until it is registered again. One WARNING, then its next step
    renews the heartbeat, which registers it, and it claims the host again,
    without waiting for its next beat.
    """
    a = _process(redis_server.url, _store(redis_client))
    b = _process(redis_server.url, _store(redis_client))
    a.store.push("h", 0, "h/0")
    await a.step(2, totals=False)
    assert a.store.held_hosts == ["h"]
    redis_client.zadd(P + "procs", {a.store.proc: 1})  # a's heartbeat expired
    b.store._claim_after = float("inf")  # b claims nothing: a's share is the host
    await b.link.step(beat=True, totals=False)  # b's heartbeat takes back what a held
    assert redis_client.zscore(P + "procs", a.store.proc) is None
    for _ in range(10):  # between two beats, claims only
        await a.step(beat=False, totals=False)
    warnings = [r.getMessage() for r in caplog.records if "heartbeat expired" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert a.store.counts["lost_leases"] == 1
    assert redis_client.zscore(P + "procs", a.store.proc) is not None
    assert a.store.held_hosts == ["h"], crawl_stats(redis_client, CRAWL)
    assert a.pop_all() == ["h/0"]
    await a.aclose()
    await b.aclose()
