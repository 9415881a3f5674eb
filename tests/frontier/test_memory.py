"""Tests of the pure store core: per-host queues, the ring, the active-host cap.

Everything runs on a fake clock; nothing here sleeps or measures time.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from scrapy_hostqueue.frontier.memory import (
    BLOCKED,
    CAPPED,
    DRAINED,
    ENDING,
    FULL,
    IDLE,
    PREFETCH,
    READY,
    HostState,
    MemoryStore,
    _Fifo,
)
from tests.helpers.clock import FakeClock


def make(
    *,
    limit: int = 1,
    max_active: int = 0,
    turn: int = 1,
    grace: float = 0.0,
    remember: int = 10_000,
    interval: float = 0.0,
    jitter: float = 0.0,
    await_start: bool = False,
    clock: FakeClock | None = None,
    rng: random.Random | None = None,
) -> tuple[MemoryStore[str], FakeClock]:
    clock = clock or FakeClock()
    store: MemoryStore[str] = MemoryStore(
        lambda key: HostState(limit, interval, jitter),
        max_active=max_active,
        turn=turn,
        grace=grace,
        remember=remember,
        await_start=await_start,
        clock=clock,
        rng=rng or random.Random(0),
    )
    return store, clock


def drain_pops(store: MemoryStore[str], bound: int = 10_000) -> list[tuple[str, str]]:
    """Pop until the store returns None (bounded, so a bug cannot hang a test)."""
    out: list[tuple[str, str]] = []
    for _ in range(bound):
        got = store.pop()
        if got is None:
            return out
        out.append(got)
    raise AssertionError("pop() never returned None")


# -- round-robin, ranks, FIFO ----------------------------------------------


@pytest.mark.parametrize("n_hosts", [1, 2, 3, 5])
@pytest.mark.parametrize("per_host", [1, 2, 4])
def test_round_robin_among_ready_hosts(n_hosts: int, per_host: int) -> None:
    store, _ = make(limit=per_host)
    hosts = [f"h{i}" for i in range(n_hosts)]
    for host in hosts:
        for i in range(per_host):
            assert store.push(host, 0, f"{host}-{i}")
    popped = drain_pops(store)
    assert [key for key, _ in popped] == hosts * per_host
    # Each host's items come out in push order.
    for host in hosts:
        assert [item for key, item in popped if key == host] == [
            f"{host}-{i}" for i in range(per_host)
        ]


def test_round_robin_resumes_after_finish() -> None:
    store, _ = make(limit=1)
    for host in "abc":
        for i in range(3):
            store.push(host, 0, f"{host}{i}")
    order: list[str] = []
    for _ in range(9):
        got = store.pop()
        assert got is not None
        order.append(got[0])
        store.finish(got[0])
    assert order == list("abcabcabc")
    assert store.pop() is None


@pytest.mark.parametrize(
    "ranks",
    [
        [0, 5, 1, 5, 3],
        [2, 2, 2, 2],
        [-3, 0, 7, -3, 7, 0],
        [1, 0, 1, 0, 1, 0],
        [9],
    ],
)
def test_higher_rank_first_fifo_among_equals_within_a_host(ranks: list[int]) -> None:
    store, _ = make(limit=len(ranks))
    for i, rank in enumerate(ranks):
        store.push("a", rank, f"{rank}:{i}")
    expected = [f"{r}:{i}" for i, r in sorted(enumerate(ranks), key=lambda e: -e[1])]
    assert [item for _, item in drain_pops(store)] == expected


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=30))
def test_a_host_queue_is_first_in_first_out_and_drops_popped_slots(
    runs: list[tuple[int, int]],
) -> None:
    """Runs of pushes then pops (as many as are queued)."""
    fifo: _Fifo[int] = _Fifo()
    model: deque[int] = deque()
    pushed = itertools.count()
    for pushes, pops in runs:
        for _ in range(pushes):
            item = next(pushed)
            fifo.append(item)
            model.append(item)
        for _ in range(min(pops, len(model))):
            assert fifo.popleft() == model.popleft()
            # Popped slots are released: never more of them than items
            # queued, beyond the first 16.
            assert len(fifo.slots) <= max(2 * len(model), len(model) + 16)
            assert all(slot is None for slot in fifo.slots[: fifo.head])
        assert len(fifo) == len(model)
        assert list(fifo) == list(model)


@pytest.mark.parametrize(
    ("pushes", "expected_hosts"),
    [
        # (host, rank) in push order -> order in which hosts are served
        ([("a", 0), ("b", 1)], ["b", "a"]),
        ([("a", 1), ("b", 0), ("c", 2)], ["c", "a", "b"]),
        ([("a", 0), ("a", 0), ("b", 5), ("c", 5)], ["b", "c", "a", "a"]),
        # a's rank-3 item first; a then rejoins the rank-0 round behind b.
        ([("a", 0), ("b", 0), ("a", 3)], ["a", "b", "a"]),
    ],
)
def test_higher_rank_first_across_hosts(
    pushes: list[tuple[str, int]], expected_hosts: list[str]
) -> None:
    store, _ = make(limit=10)
    for i, (host, rank) in enumerate(pushes):
        store.push(host, rank, f"{host}{i}")
    assert [key for key, _ in drain_pops(store)] == expected_hosts


def test_push_of_a_higher_rank_moves_a_ready_host_up() -> None:
    store, _ = make(limit=10)
    store.push("a", 0, "a-low")
    store.push("b", 1, "b-mid")
    store.push("a", 2, "a-high")
    assert drain_pops(store) == [("a", "a-high"), ("b", "b-mid"), ("a", "a-low")]


@pytest.mark.parametrize(
    ("granularity", "expected"),
    [
        # Ranks 2 and 3 are one priority across hosts: round-robin.
        (2, ["a", "b", "a", "b", "a", "b"]),
        # Every rank counts across hosts: "b" waits for "a" to empty.
        (1, ["a", "a", "a", "b", "b", "b"]),
    ],
)
def test_ring_granularity_groups_ranks_across_hosts(granularity: int, expected: list[str]) -> None:
    store: MemoryStore[str] = MemoryStore(
        lambda key: HostState(10), ring_granularity=granularity, clock=FakeClock()
    )
    for i in range(3):
        store.push("a", 3, f"a{i}")
        store.push("b", 2, f"b{i}")
    assert [key for key, _ in drain_pops(store)] == expected


def test_ring_granularity_keeps_rank_order_within_a_host() -> None:
    store: MemoryStore[str] = MemoryStore(
        lambda key: HostState(1), ring_granularity=2, clock=FakeClock()
    )
    store.push("a", 2, "start")
    store.push("a", 3, "link")
    assert store.pop() == ("a", "link")


def test_pop_with_nothing_queued() -> None:
    store, _ = make()
    assert store.pop() is None
    assert len(store) == 0
    assert store.next_wakeup() is None


# -- limit ------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_limit_respected_until_finish(limit: int) -> None:
    store, _ = make(limit=limit)
    for i in range(limit + 3):
        store.push("a", 0, str(i))
    assert [item for _, item in drain_pops(store)] == [str(i) for i in range(limit)]
    assert store.in_flight("a") == limit
    assert store.standing("a") == FULL
    assert store.pop() is None
    store.finish("a")
    assert store.standing("a") == READY
    assert store.pop() == ("a", str(limit))
    assert store.pop() is None


def test_full_host_does_not_hold_back_others() -> None:
    store, _ = make(limit=1)
    for i in range(3):
        store.push("slow", 0, f"s{i}")
        store.push("fast", 0, f"f{i}")
    assert store.pop() == ("slow", "s0")
    served = []
    for _ in range(3):
        got = store.pop()
        assert got is not None
        served.append(got)
        store.finish("fast")
    assert served == [("fast", "f0"), ("fast", "f1"), ("fast", "f2")]
    assert store.in_flight("slow") == 1


@pytest.mark.parametrize(("old", "new"), [(1, 3), (2, 5)])
def test_raising_the_limit_frees_a_full_host_at_once(old: int, new: int) -> None:
    store, _ = make(limit=old)
    for i in range(10):
        store.push("a", 0, str(i))
    assert len(drain_pops(store)) == old
    store.set_limit("a", new)
    assert len(drain_pops(store)) == new - old
    assert store.in_flight("a") == new


def test_lowering_the_limit_below_in_flight_waits_for_enough_finishes() -> None:
    store, _ = make(limit=4)
    for i in range(10):
        store.push("a", 0, str(i))
    assert len(drain_pops(store)) == 4
    store.set_limit("a", 2)
    for expected_in_flight in (3, 2):
        store.finish("a")
        assert store.in_flight("a") == expected_in_flight
        assert store.pop() is None
    store.finish("a")
    assert store.pop() is not None
    assert store.pop() is None


def test_full_at_is_when_a_start_last_filled_the_limit() -> None:
    store, clock = make(limit=2)
    for i in range(4):
        store.push("a", 0, str(i))
    store.pop()
    assert store.host_state("a").full_at == float("-inf")  # 1 of 2
    clock.advance(1)
    store.pop()
    assert store.host_state("a").full_at == 101.0  # 2 of 2
    store.finish("a")
    clock.advance(1)
    store.pop()
    assert store.host_state("a").full_at == 102.0  # filled again
    store.finish("a")
    store.finish("a")
    clock.advance(1)
    store.pop()
    assert store.host_state("a").full_at == 102.0  # 1 of 2 does not
    store.adopt("a", clock())
    assert store.host_state("a").full_at == 103.0  # an adopted request fills it too


def test_a_silent_host_has_silent_limit_in_flight_until_it_answers() -> None:
    store: MemoryStore[str] = MemoryStore(
        lambda key: HostState(3), silent_limit=1, prefetch=1, clock=FakeClock()
    )
    for i in range(10):
        store.push("a", 0, str(i))
    assert len(drain_pops(store)) == 1  # not heard from: no prefetch either
    assert store.standing("a") == FULL
    store.set_answering("a", True)  # its first answer, still in flight
    assert len(drain_pops(store)) == 3  # its limit and one prefetched
    assert store.in_flight("a") == 4
    store.set_answering("a", False)  # a request timed out
    for left in (3, 2, 1):
        store.finish("a")
        assert store.in_flight("a") == left
        assert store.pop() is None
    store.finish("a")
    assert store.pop() == ("a", "4")
    assert store.pop() is None


def test_without_silent_limit_a_silent_host_has_its_limit() -> None:
    store, _ = make(limit=3)
    for i in range(5):
        store.push("a", 0, str(i))
    assert not store.host_state("a").answering
    assert len(drain_pops(store)) == 3


def test_silent_limit_below_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="silent_limit"):
        MemoryStore(lambda key: HostState(1), silent_limit=-1)


def test_prefetch_goes_only_when_no_host_can_send() -> None:
    clock = FakeClock()
    store: MemoryStore[str] = MemoryStore(lambda key: HostState(1), prefetch=1, clock=clock)
    for i in range(3):
        store.push("a", 0, f"a{i}")
    assert store.pop() == ("a", "a0")
    store.push("b", 0, "b0")
    # "a" is at its limit: its prefetch waits while "b" can send.
    assert store.pop() == ("b", "b0")
    assert store.pop() == ("a", "a1")
    assert store.standing("a") == FULL
    assert store.pop() is None
    store.finish("a")
    assert store.standing("a") == PREFETCH


def test_prefetch_goes_to_the_highest_head_rank_first() -> None:
    store: MemoryStore[str] = MemoryStore(lambda key: HostState(1), prefetch=1, clock=FakeClock())
    for key in ("a", "b", "c"):
        store.push(key, 0, f"{key}0")
        store.push(key, 0, f"{key}1")
    assert sorted(store.pop() or ("", "") for _ in range(3)) == [
        ("a", "a0"),
        ("b", "b0"),
        ("c", "c0"),
    ]
    # Every host is at its limit; "c" then gets a more urgent request, which
    # moves it ahead of the hosts that waited longer.
    store.push("c", 5, "c-urgent")
    assert store.pop() == ("c", "c-urgent")
    assert store.pop() == ("a", "a1")
    assert store.pop() == ("b", "b1")
    assert store.pop() is None


@pytest.mark.parametrize(("limit", "prefetch"), [(1, 1), (2, 1), (1, 3)])
def test_prefetch_hands_out_beyond_the_limit(limit: int, prefetch: int) -> None:
    clock = FakeClock()
    store: MemoryStore[str] = MemoryStore(
        lambda key: HostState(limit), prefetch=prefetch, clock=clock
    )
    for i in range(limit + prefetch + 2):
        store.push("a", 0, str(i))
    assert len(drain_pops(store)) == limit + prefetch
    assert store.standing("a") == FULL
    store.finish("a")
    assert len(drain_pops(store)) == 1


def test_a_host_with_an_interval_gets_no_prefetch() -> None:
    clock = FakeClock()
    store: MemoryStore[str] = MemoryStore(
        lambda key: HostState(1, interval=1.0), prefetch=2, clock=clock
    )
    for i in range(3):
        store.push("a", 0, str(i))
    assert store.pop() == ("a", "0")
    clock.now += 5  # long past the interval: only the limit holds it now
    assert store.pop() is None
    assert store.standing("a") == FULL
    store.finish("a")
    assert store.pop() == ("a", "1")


@pytest.mark.parametrize("bad", [0, -1])
def test_limit_below_one_is_refused(bad: int) -> None:
    store, _ = make()
    with pytest.raises(ValueError, match="limit"):
        store.set_limit("a", bad)
    with pytest.raises(ValueError, match="limit"):
        HostState(bad)


# -- block_until, set_interval, next_wakeup ---------------------------------


@pytest.mark.parametrize("delay", [0.001, 1.0, 30.0])
def test_block_until_delays_a_host(delay: float) -> None:
    store, clock = make(limit=5)
    store.push("a", 0, "a0")
    store.push("b", 0, "b0")
    store.block_until("a", clock.now + delay, reason="retry-after")
    assert store.standing("a") == BLOCKED
    assert store.known_state("a") is not None
    assert store.host_state("a").block_reason == "retry-after"
    assert store.pop() == ("b", "b0")
    assert store.pop() is None
    assert store.next_wakeup() == clock.now + delay
    clock.now += delay * 0.999
    assert store.pop() is None
    clock.now = store.host_state("a").blocked_until
    assert store.pop() == ("a", "a0")
    assert store.next_wakeup() is None


def test_block_until_only_extends() -> None:
    store, clock = make()
    store.push("a", 0, "a0")
    start = clock.now
    store.block_until("a", start + 10, reason="long")
    store.block_until("a", start + 3, reason="short")
    state = store.host_state("a")
    assert state.blocked_until == start + 10
    assert state.block_reason == "long"
    assert store.next_wakeup() == start + 10
    clock.now = start + 5
    assert store.pop() is None
    store.block_until("a", start + 20, reason="longer")
    assert store.next_wakeup() == start + 20
    clock.now = start + 19.5
    assert store.pop() is None
    clock.now = start + 20
    assert store.pop() == ("a", "a0")


def test_unblock_ends_a_block_now() -> None:
    store, clock = make()
    store.push("a", 0, "a0")
    store.push("a", 0, "a1")
    store.block_until("a", clock.now + 60, reason="retry-after")
    assert store.pop() is None
    store.unblock("a")
    state = store.host_state("a")
    assert (state.blocked_until, state.block_reason) == (0.0, None)
    assert store.standing("a") != BLOCKED
    assert store.pop() == ("a", "a0")
    store.finish("a")
    # A block after it holds again; an unknown host is left alone.
    store.block_until("a", clock.now + 5, reason="monitor")
    assert store.pop() is None
    store.unblock("nowhere")
    assert store.known_state("nowhere") is None
    clock.now += 5
    assert store.pop() == ("a", "a1")


def test_block_in_the_past_changes_nothing() -> None:
    store, clock = make()
    store.push("a", 0, "a0")
    store.block_until("a", clock.now - 5)
    assert store.standing("a") == READY
    assert store.pop() == ("a", "a0")


def test_block_of_a_full_host_holds_it_after_finish() -> None:
    store, clock = make(limit=1)
    store.push("a", 0, "a0")
    store.push("a", 0, "a1")
    assert store.pop() == ("a", "a0")
    store.block_until("a", clock.now + 4)
    store.finish("a")
    assert store.pop() is None
    assert store.next_wakeup() == clock.now + 4
    clock.advance(4)
    assert store.pop() == ("a", "a1")


def test_block_of_an_unseen_host_applies_when_it_arrives() -> None:
    store, clock = make()
    store.block_until("new", clock.now + 2)
    assert store.live_hosts == 0
    store.push("new", 0, "x")
    assert store.standing("new") == BLOCKED
    assert store.pop() is None
    clock.advance(2)
    assert store.pop() == ("new", "x")


@pytest.mark.parametrize("interval", [0.5, 1.0, 7.0])
def test_set_interval_spaces_starts(interval: float) -> None:
    store, clock = make(limit=10)
    store.set_interval("a", interval)
    for i in range(6):
        store.push("a", 0, str(i))
    starts: list[float] = []
    for _ in range(6):
        assert store.pop() is not None
        starts.append(clock.now)
        assert store.pop() is None  # limit allows more; the interval does not
        wake = store.next_wakeup()
        if wake is not None:
            clock.now = wake - interval / 100
            assert store.pop() is None
            clock.now = wake
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == pytest.approx([interval] * 5)


def test_unstart_lets_the_next_request_go_without_the_gap() -> None:
    store, clock = make(limit=10, interval=2.0)
    for i in range(4):
        store.push("a", 0, str(i))
    assert store.pop() == ("a", "0")
    clock.advance(2.0)
    assert store.pop() == ("a", "1")
    second = clock.now
    clock.advance(0.1)
    assert store.pop() is None
    # "1" never reached the host: "2" waits only for the gap after "0", over.
    store.unstart("a", second)
    assert store.pop() == ("a", "2")
    third = clock.now
    # Undoing a start that a later one followed changes nothing.
    store.unstart("a", second)
    assert store.pop() is None
    assert store.next_wakeup() == pytest.approx(third + 2.0)
    store.unstart("unknown", third)  # a host the store never met
    assert store.pop() is None


def test_await_start_hands_an_interval_host_nothing_until_its_last_hand_out_started() -> None:
    store, clock = make(limit=4, interval=1.0, await_start=True)
    for i in range(4):
        store.push("a", 0, str(i))
    assert store.pop() == ("a", "0")
    first = clock.now
    # "0" waits downstream (for robots.txt) past the interval: what the
    # host would be handed now would start together with it.
    clock.advance(1.5)
    assert store.pop() is None
    assert store.standing("a") == FULL
    assert store.next_wakeup() is None  # started() is what it waits for
    store.started("a", first, clock.now)
    # The interval counts from that start.
    assert store.pop() is None
    assert store.next_wakeup() == pytest.approx(clock.now + 1.0)
    clock.advance(1.0)
    assert store.pop() == ("a", "1")
    second = clock.now
    # Answered downstream (never started): the next need not wait.
    clock.advance(0.1)
    store.unstart("a", second)
    assert store.pop() == ("a", "2")
    # Its last request in flight done, a host waits for no start.
    store.finish("a")
    store.finish("a")
    store.finish("a")
    clock.advance(1.0)
    assert store.pop() == ("a", "3")


def test_started_moves_only_the_last_start() -> None:
    store, clock = make(limit=4, interval=1.0)
    for i in range(3):
        store.push("a", 0, str(i))
    assert store.pop() == ("a", "0")
    first = clock.now
    clock.advance(1.0)
    assert store.pop() == ("a", "1")  # without await_start: on time
    second = clock.now
    clock.advance(0.25)
    # "0" starting this late does not move the gap after "1".
    store.started("a", first, clock.now)
    assert store.next_wakeup() == pytest.approx(second + 1.0)
    # "1" does: the next waits the interval after it started.
    store.started("a", second, clock.now)
    assert store.next_wakeup() == pytest.approx(clock.now + 1.0)
    store.started("unknown", second, clock.now)  # a host the store never met
    clock.advance(0.9)
    assert store.pop() is None
    clock.advance(0.1)
    assert store.pop() == ("a", "2")


def test_an_adopted_request_counts_against_the_limit_until_finish() -> None:
    store, _ = make(limit=2, max_active=1)
    for i in range(3):
        store.push("a", 0, str(i))
    store.adopt("a", 100.0)
    assert store.in_flight("a") == 1
    assert store.pop() == ("a", "0")
    assert store.pop() is None  # 2 in flight: the adopted one and "0"
    store.finish("a")  # the adopted one left
    assert store.pop() == ("a", "1")
    # It takes no active place: "a" holds the only one, "b" still counts one.
    store.adopt("b", 100.0)
    assert store.in_flight("b") == 1
    assert store.active == 1
    store.finish("b")
    assert store.live_hosts == 1  # "b", with nothing left, retired


def test_an_adopted_request_spaces_the_next_start() -> None:
    store, clock = make(limit=5, interval=1.0)
    store.push("a", 0, "0")
    store.adopt("a", clock.now)
    assert store.pop() is None
    clock.advance(1.0)
    assert store.pop() == ("a", "0")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("interval", "jitter"), [(1.0, 0.5), (2.0, 0.1), (0.3, 1.0)])
def test_set_interval_with_jitter_keeps_gaps_in_range(
    seed: int, interval: float, jitter: float
) -> None:
    store, clock = make(limit=50, rng=random.Random(seed))
    store.set_interval("a", interval, jitter)
    n = 40
    for i in range(n):
        store.push("a", 0, str(i))
    starts: list[float] = []
    for _ in range(n):
        got = store.pop()
        assert got is not None
        starts.append(clock.now)
        assert store.pop() is None
        wake = store.next_wakeup()
        if wake is None:
            # Jitter may draw a zero gap (jitter == 1): the host is ready at once.
            assert store.standing("a") in (READY, DRAINED)
            continue
        clock.now = wake
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    low, high = interval * (1 - jitter), interval * (1 + jitter)
    assert all(low - 1e-9 <= gap <= high + 1e-9 for gap in gaps), gaps
    assert len({round(gap, 9) for gap in gaps}) > 5  # the jitter is really drawn


def test_interval_change_is_measured_from_the_last_start() -> None:
    store, clock = make(limit=10)
    store.set_interval("a", 5.0)
    for i in range(3):
        store.push("a", 0, str(i))
    start = clock.now
    assert store.pop() == ("a", "0")
    assert store.next_wakeup() == start + 5.0
    store.set_interval("a", 1.0)
    assert store.next_wakeup() == start + 1.0
    clock.now = start + 1.0
    assert store.pop() == ("a", "1")
    store.set_interval("a", 0.0)
    assert store.pop() == ("a", "2")


def test_negative_interval_is_refused() -> None:
    store, _ = make()
    with pytest.raises(ValueError, match="interval"):
        store.set_interval("a", -1.0)


def test_next_wakeup_is_the_earliest_blocked_time() -> None:
    store, clock = make(limit=5)
    t0 = clock.now
    delays = {"a": 7.0, "b": 3.0, "c": 11.0, "d": 3.5}
    for host, delay in delays.items():
        store.push(host, 0, host)
        store.block_until(host, t0 + delay)
    store.push("free", 0, "free")
    assert store.next_wakeup() == t0 + 3.0
    # A block that is extended leaves a stale timer behind; it must not count.
    store.block_until("b", t0 + 20)
    assert store.next_wakeup() == t0 + 3.5
    # A host whose queue is emptied is no longer waiting.
    assert store.remove_queued("d") == ["d"]
    assert store.next_wakeup() == t0 + 7.0
    assert store.pop() == ("free", "free")
    order = []
    for _ in range(10):
        wake = store.next_wakeup()
        if wake is None:
            break
        clock.now = wake
        got = store.pop()
        assert got is not None
        order.append((got[0], clock.now - t0))
    assert order == [("a", 7.0), ("c", 11.0), ("b", 20.0)]


def test_next_wakeup_ignores_a_host_that_is_ready_again() -> None:
    store, clock = make()
    store.set_interval("a", 2.0)
    store.push("a", 0, "a0")
    store.push("a", 0, "a1")
    assert store.pop() == ("a", "a0")
    assert store.next_wakeup() == clock.now + 2.0
    store.finish("a")
    store.set_interval("a", 0.0)
    assert store.standing("a") == READY
    assert store.next_wakeup() is None


# -- active-host cap ----------------------------------------------------------


@pytest.mark.parametrize("max_active", [1, 2, 3])
def test_active_cap_serves_capped_hosts_in_arrival_order(max_active: int) -> None:
    store, _ = make(limit=1, max_active=max_active)
    hosts = [f"h{i}" for i in range(6)]
    for host in hosts:
        store.push(host, 0, host)
    first = [key for key, _ in drain_pops(store)]
    assert first == hosts[:max_active]
    assert store.active == max_active
    assert [store.standing(h) for h in hosts[max_active:]] == [CAPPED] * (6 - max_active)
    served = list(first)
    for _ in range(6):
        if not served:
            break
        store.finish(served.pop(0))  # goes idle with nothing queued
        nxt = [key for key, _ in drain_pops(store)]
        assert len(nxt) <= 1
        served.extend(nxt)
        assert sum(store.in_flight(h) > 0 for h in hosts) <= max_active
    assert store.max_active_seen == max_active
    assert store.live_hosts == 0


@pytest.mark.parametrize("max_active", [1, 2])
def test_active_host_keeps_its_slot_while_it_has_work(max_active: int) -> None:
    # Within its turn (see the tests of turns below).
    store, _ = make(limit=2, max_active=max_active, turn=100)
    for host in ("a", "b", "c"):
        for i in range(20):
            store.push(host, 0, f"{host}{i}")
    drain_pops(store)
    active = {h for h in "abc" if store.in_flight(h)}
    assert len(active) == max_active
    # Work keeps flowing to the active hosts; the capped one waits.
    for _ in range(4):
        for host in sorted(active):
            if store.in_flight(host):
                store.finish(host)
        drain_pops(store)
        assert {h for h in "abc" if store.in_flight(h)} <= active
        assert store.active <= max_active


def serve_one_at_a_time(store: MemoryStore[str], rounds: int) -> list[str]:
    """Pop one request, finish it, *rounds* times: the hosts served, in order."""
    order = []
    for _ in range(rounds):
        got = store.pop()
        assert got is not None
        order.append(got[0])
        assert store.pop() is None  # the cap of 1 host, at a limit of 1
        store.finish(got[0])
    return order


@pytest.mark.parametrize(("turn", "expected"), [(1, "abab" * 3), (3, "aaabbb" * 2)])
def test_an_active_host_keeps_its_place_between_requests_for_its_turn(
    turn: int, expected: str
) -> None:
    # A host that takes one of the places keeps it while it has ready work,
    # so its keep-alive connections stay in use, until it has been handed
    # `turn` requests; then it waits behind the hosts waiting for a place.
    store, _ = make(limit=1, max_active=1, turn=turn)
    for host in "ab":
        for i in range(10):
            store.push(host, 0, f"{host}{i}")
    assert "".join(serve_one_at_a_time(store, 12)) == expected
    assert store.max_active_seen == 1


def test_a_host_that_must_wait_gives_its_place_up_during_its_turn() -> None:
    store, clock = make(limit=1, max_active=1, turn=100)
    store.set_interval("a", 1.0)
    for host in "ab":
        for i in range(3):
            store.push(host, 0, f"{host}{i}")
    assert store.pop() == ("a", "a0")
    store.finish("a")
    # a may not start again for 1 s: b takes the place and keeps it.
    assert serve_one_at_a_time(store, 3) == ["b", "b", "b"]
    for _ in range(2):
        clock.advance(1.0)
        assert serve_one_at_a_time(store, 1) == ["a"]
    assert store.active == 0
    assert len(store) == 0


def serve_keeping_requests_in_flight(store: MemoryStore[str], rounds: int) -> str:
    """Pop all that is ready, then finish the oldest request, *rounds* times.

    Returns the hosts served, in order. A busy host's requests overlap, so it
    has nothing in flight only when the store stops handing it requests.
    """
    order = []
    in_flight: list[str] = []
    for _ in range(rounds):
        while (got := store.pop()) is not None:
            order.append(got[0])
            in_flight.append(got[0])
        store.finish(in_flight.pop(0))
    return "".join(order)


def test_a_busy_host_lets_a_waiting_host_in_after_its_turn() -> None:
    # "a" always has a request in flight. After its turn of 3 it is handed
    # nothing more while "b" waits; it gives its place up when its last
    # request finishes, and then waits its own turn behind "b".
    store, _ = make(limit=2, max_active=1, turn=3)
    for host in "ab":
        for i in range(6):
            store.push(host, 0, f"{host}{i}")
    order = serve_keeping_requests_in_flight(store, 12)
    assert order == "aaabbbaaabbb"
    assert store.max_active_seen == 1


def test_a_busy_host_keeps_its_place_past_its_turn_while_nobody_waits() -> None:
    store, _ = make(limit=2, max_active=1, turn=3)
    for i in range(8):
        store.push("a", 0, f"a{i}")
    assert serve_keeping_requests_in_flight(store, 5) == "aaaaaa"
    # Nothing left it: every request after the turn was handed out with
    # others in flight, without waiting for the host to drain.
    assert store.in_flight("a") == 1
    store.push("b", 0, "b0")  # b waits now: a ends its turn
    assert store.standing("b") == CAPPED
    assert store.pop() is None
    assert store.standing("a") == ENDING
    store.finish("a")
    assert store.pop() == ("b", "b0")
    assert store.standing("a") == CAPPED


def test_a_waiting_host_that_gets_blocked_no_longer_ends_a_busy_hosts_turn() -> None:
    store, clock = make(limit=2, max_active=1, turn=3)
    for i in range(8):
        store.push("a", 0, f"a{i}")
    store.push("b", 0, "b0")
    assert [store.pop(), store.pop()] == [("a", "a0"), ("a", "a1")]
    store.finish("a")
    assert store.standing("b") == CAPPED
    store.block_until("b", clock.now + 10.0)  # a Retry-After, say
    assert store.standing("b") == BLOCKED
    # Nobody can use the place: a goes on past its turn of 3 without
    # draining, one request in flight while the next is handed out.
    for i in range(2, 6):
        assert store.pop() == ("a", f"a{i}")
        assert store.pop() is None
        store.finish("a")
    clock.advance(10.0)
    assert store.pop() is None  # b waits again: a ends its turn
    assert store.standing("b") == CAPPED
    assert store.standing("a") == ENDING


def test_a_host_keeps_its_place_for_the_grace_when_it_runs_out_of_work() -> None:
    # The links of a's last response come a moment after it finished: a keeps
    # its place meanwhile, b waits; when the grace ends b gets the place.
    store, clock = make(limit=1, max_active=1, turn=100, grace=0.5)
    start = clock.now
    store.push("a", 0, "a0")
    store.push("b", 0, "b0")
    assert store.pop() == ("a", "a0")
    store.finish("a")
    assert store.standing("a") == IDLE
    assert store.active == 1
    assert store.pop() is None
    assert store.next_wakeup() == start + 0.5  # b is woken when the grace ends
    clock.advance(0.3)
    store.push("a", 0, "a1")  # a link of a0
    assert store.pop() == ("a", "a1")
    store.finish("a")
    clock.advance(0.4)  # the grace runs from the last finish, at start + 0.3
    assert store.pop() is None
    assert store.next_wakeup() == pytest.approx(start + 0.8)
    clock.advance(0.1)
    assert store.pop() == ("b", "b0")
    assert store.standing("a") is None  # retired
    store.finish("b")
    assert store.active == 1  # b, idle in its grace
    clock.advance(0.5)
    assert store.pop() is None
    assert store.active == 0
    assert store.live_hosts == 0


def test_without_a_cap_an_idle_host_retires_at_once() -> None:
    store, _ = make(limit=1, max_active=0, turn=100, grace=0.5)
    store.push("a", 0, "a0")
    assert store.pop() == ("a", "a0")
    store.finish("a")
    assert store.live_hosts == 0
    assert store.next_wakeup() is None


def test_a_grace_is_not_negative() -> None:
    with pytest.raises(ValueError, match="grace"):
        MemoryStore(lambda key: HostState(1), max_active=1, grace=-1.0)


def test_a_turn_is_at_least_one_request() -> None:
    with pytest.raises(ValueError, match="turn"):
        MemoryStore(lambda key: HostState(1), max_active=1, turn=0)


@pytest.mark.parametrize("how", ["block", "remove_queued", "give_up"])
def test_freed_slot_is_not_lost_when_the_released_host_stops_being_ready(
    how: str,
) -> None:
    # finish() hands the freed slot to the first capped host; if that host
    # stops being ready before it is popped, the next capped host must get it.
    store, clock = make(limit=1, max_active=1)
    for host in "abc":
        store.push(host, 0, f"{host}0")
    assert store.pop() == ("a", "a0")
    assert store.pop() is None  # b and c meet the cap and wait, in order
    assert store.standing("b") == store.standing("c") == CAPPED
    store.finish("a")
    assert store.standing("b") == READY
    assert store.standing("c") == CAPPED
    if how == "block":
        store.block_until("b", clock.now + 100)
    elif how == "remove_queued":
        assert store.remove_queued("b") == ["b0"]
    else:
        assert store.give_up("b") == ["b0"]
    assert store.standing("b") != READY
    assert store.pop() == ("c", "c0")
    assert store.active == 1


def test_capped_host_that_was_blocked_waits_for_its_block() -> None:
    store, clock = make(limit=1, max_active=1)
    store.push("a", 0, "a0")
    store.push("b", 0, "b0")
    assert store.pop() == ("a", "a0")
    store.block_until("b", clock.now + 5)
    store.finish("a")
    assert store.pop() is None
    assert store.next_wakeup() == clock.now + 5
    clock.advance(5)
    assert store.pop() == ("b", "b0")


def test_no_cap_when_max_active_is_zero() -> None:
    store, _ = make(limit=1, max_active=0)
    for i in range(50):
        store.push(f"h{i}", 0, str(i))
    assert len(drain_pops(store)) == 50
    assert store.active == 50 == store.max_active_seen


# -- give_up, remove_queued, len ----------------------------------------------


def test_give_up_drops_queued_items_and_refuses_new_ones() -> None:
    store, _ = make(limit=1)
    for i, rank in enumerate([0, 2, 1, 2]):
        store.push("a", rank, f"a{i}")
    store.push("b", 0, "b0")
    assert store.pop() == ("a", "a1")
    assert len(store) == 4
    assert store.give_up("a") == ["a3", "a2", "a0"]
    assert len(store) == 1
    assert store.queued("a") == 0
    assert store.standing("a") == DRAINED
    assert not store.push("a", 5, "late")
    assert len(store) == 1
    store.finish("a")  # the request already in flight still completes
    assert store.standing("a") is None
    assert not store.push("a", 0, "later")  # remembered while retired
    assert drain_pops(store) == [("b", "b0")]


def test_give_up_of_an_unseen_host() -> None:
    store, _ = make()
    assert store.give_up("x") == []
    assert not store.push("x", 0, "x0")
    assert len(store) == 0
    assert store.live_hosts == 0


def test_given_up_host_outlives_the_memory_of_idle_hosts() -> None:
    store, _ = make(remember=2)
    forgotten: list[str] = []
    store.on_forget = forgotten.append
    store.give_up("x")
    # More idle hosts than the memory holds: the plain ones are forgotten,
    # the given-up one is kept in the second memory.
    for host in ("y", "z", "w", "v"):
        store.host_state(host)
    assert forgotten == ["y", "z"]
    assert store.known_state("x") is not None
    assert not store.push("x", 0, "x0")
    # The second memory is bounded too: two more given-up hosts pushed out of
    # the first one push "x" out of it.
    for host in ("g1", "g2"):
        store.give_up(host)
    for host in ("u1", "u2", "u3", "u4"):
        store.host_state(host)
    assert "x" in forgotten
    assert store.known_state("x") is None
    assert store.push("x", 0, "x0")
    assert len(store._retired) <= 2
    assert len(store._kept) <= 2


def test_blocked_idle_host_outlives_the_memory_of_idle_hosts_until_its_block_ends() -> None:
    store, clock = make(remember=2)
    forgotten: list[str] = []
    store.on_forget = forgotten.append
    store.push("a", 0, "a0")
    assert store.pop() == ("a", "a0")
    store.block_until("a", clock.now + 60, "retry-after")  # a 429 with Retry-After: 60
    store.finish("a")
    assert store.standing("a") is None  # idle: retired, blocked
    for i in range(5):
        store.host_state(f"h{i}")
    assert "a" not in forgotten
    assert [key for key, _ in store.blocked(clock.now)] == ["a"]
    store.push("a", 0, "a1")
    assert store.pop() is None  # still blocked
    clock.advance(61)
    assert store.pop() == ("a", "a1")
    store.finish("a")
    # Its block is over: forgotten like any idle host.
    for i in range(5, 10):
        store.host_state(f"h{i}")
    assert "a" in forgotten
    assert store.known_state("a") is None


def test_on_forget_reports_each_forgotten_host_once_and_never_a_live_one() -> None:
    store, _ = make(limit=1, remember=3)
    forgotten: list[str] = []
    store.on_forget = forgotten.append
    store.push("live", 0, "q0")
    store.push("live", 0, "q1")
    assert store.pop() == ("live", "q0")
    hosts = [f"h{i}" for i in range(20)]
    for host in hosts:
        store.push(host, 0, host)
        assert store.pop() == (host, host)
        store.finish(host)
    assert forgotten == hosts[:-3]
    assert store.standing("live") is not None


@pytest.mark.parametrize("in_flight", [0, 1])
def test_remove_queued(in_flight: int) -> None:
    store, _ = make(limit=5)
    for i, rank in enumerate([1, 0, 1]):
        store.push("a", rank, f"a{i}")
    store.push("b", 0, "b0")
    store.push("b", 0, "b1")
    for _ in range(in_flight):
        assert store.pop() == ("a", "a0")
    expected = ["a2", "a1"] if in_flight else ["a0", "a2", "a1"]
    assert store.remove_queued("a") == expected
    assert len(store) == 2
    assert store.queued("a") == 0
    assert store.standing("a") == (DRAINED if in_flight else None)
    assert store.remove_queued("a") == []
    assert store.remove_queued("never-seen") == []
    assert store.push("a", 0, "again")  # not given up: accepted
    assert len(store) == 3


def test_len_tracks_every_operation() -> None:
    store, _ = make(limit=2)
    expected = 0
    for i in range(5):
        for host in "abc":
            assert store.push(host, i % 2, f"{host}{i}")
            expected += 1
            assert len(store) == expected
    assert store.pop() is not None
    expected -= 1
    assert len(store) == expected
    expected -= len(store.remove_queued("b"))
    assert len(store) == expected
    expected -= len(store.give_up("c"))
    assert len(store) == expected
    assert not store.push("c", 0, "refused")
    assert len(store) == expected
    popped = drain_pops(store)
    assert len(store) == expected - len(popped)
    assert sum(q for _, q, _, _ in store.hosts()) == len(store)
    assert len(list(store.items())) == len(store)


def test_items_and_hosts_report_serving_order() -> None:
    store, _ = make(limit=3)
    store.push("a", 0, "a0")
    store.push("a", 1, "a1")
    store.push("b", 0, "b0")
    assert store.pop() == ("a", "a1")
    assert list(store.items()) == [("a", 0, "a0"), ("b", 0, "b0")]
    report = {key: (queued, in_flight) for key, queued, in_flight, _ in store.hosts()}
    assert report == {"a": (1, 1), "b": (1, 0)}


# -- finish ----------------------------------------------------------------


def test_finish_of_an_unknown_host_raises() -> None:
    store, _ = make()
    with pytest.raises(KeyError):
        store.finish("nobody")


def test_finish_more_often_than_popped_raises() -> None:
    store, _ = make(limit=2)
    store.push("a", 0, "a0")
    store.push("a", 0, "a1")
    assert store.pop() == ("a", "a0")
    store.finish("a")
    with pytest.raises(KeyError):
        store.finish("a")  # a1 is queued, not in flight
    assert store.in_flight("a") == 0
    assert store.active == 0


# -- retirement and the bounded memory of states ----------------------------


@pytest.mark.parametrize("remember", [0, 1, 5, 50])
def test_retired_host_states_are_bounded(remember: int) -> None:
    store, _ = make(remember=remember)
    hosts = [f"h{i}" for i in range(remember * 4 + 20)]
    for host in hosts:
        store.push(host, 0, host)
        assert store.pop() == (host, host)
        store.finish(host)
        assert store.standing(host) is None
        assert len(store._retired) <= remember
    assert store.live_hosts == 0
    known = [h for h in hosts if store.known_state(h) is not None]
    assert known == hosts[len(hosts) - remember :]


def test_learned_limit_survives_retirement_while_remembered() -> None:
    store, _ = make(limit=1, remember=3)
    store.push("a", 0, "a0")
    assert store.pop() == ("a", "a0")
    store.set_limit("a", 4)
    store.finish("a")
    assert store.standing("a") is None
    assert store.known_state("a") is not None
    for i in range(6):
        store.push("a", 0, f"a{i + 1}")
    assert len(drain_pops(store)) == 4  # the learned limit, not the factory's
    for _ in range(4):
        store.finish("a")
    assert len(drain_pops(store)) == 2
    for _ in range(2):
        store.finish("a")
    assert store.standing("a") is None
    # Three other hosts retire after it: it falls out of memory.
    for host in ("x", "y", "z"):
        store.push(host, 0, host)
        drain_pops(store)
        store.finish(host)
    assert store.known_state("a") is None
    for i in range(3):
        store.push("a", 0, f"again{i}")
    assert len(drain_pops(store)) == 1  # back to the factory limit


def test_state_of_unseen_host_is_remembered_without_making_it_live() -> None:
    store, _ = make(limit=3, remember=10)
    assert store.known_state("a") is None
    state = store.host_state("a")
    assert state.limit == 3
    assert store.known_state("a") is state
    assert store.live_hosts == 0
    store.push("a", 0, "a0")
    assert store.host_state("a") is state


# -- property-based: any interleaving against a reference model -------------------

HOST_KEYS = [f"h{i}" for i in range(6)]
DEFAULT_LIMIT = 2


@dataclass
class ModelHost:
    """What the reference model knows about one host."""

    limit: int = DEFAULT_LIMIT
    interval: float = 0.0
    blocked_until: float = 0.0
    last_start: float = -math.inf
    #: The wait after last_start: the interval, or 0 once that start was undone.
    gap: float = 0.0
    #: With await_start: the hand-out (item, handed out at) whose start the
    #: host waits for.
    pending: tuple[int, float] | None = None
    given_up: bool = False
    #: Answered its last request: goes before silent hosts of the same rank.
    answering: bool = False
    queue: list[tuple[int, int]] = field(default_factory=list)  # (rank, item)
    in_flight: list[int] = field(default_factory=list)
    #: Holds an active-host place, and requests handed out since it took it.
    active: bool = False
    served: int = 0
    #: Holding its place with nothing to do until then (the grace), and the
    #: order in which hosts became idle (the store's timer order).
    idle_until: float | None = None
    idle_seq: int = 0

    def ready_at(self) -> float:
        return max(self.blocked_until, self.last_start + self.gap)

    def live(self) -> bool:
        return bool(self.queue or self.in_flight or self.idle_until is not None)

    def head(self) -> tuple[int, int]:
        # max() keeps the first of equal ranks: FIFO among equals.
        return max(self.queue, key=lambda entry: entry[0])

    def serving_order(self) -> list[int]:
        return [item for _, item in sorted(self.queue, key=lambda e: -e[0])]


class StoreMachine(RuleBasedStateMachine):
    """Drives a MemoryStore and a plain model with the same operations."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.store: MemoryStore[int] = MemoryStore(lambda key: HostState(DEFAULT_LIMIT))
        self.cap = 0
        self.turn = 1
        self.grace = 0.0
        self.idle_seq = 0
        self.remember = 0
        self.prefetch = 0
        self.silent_limit = 0
        self.await_start = False
        self.default_limit = DEFAULT_LIMIT
        self.hosts: dict[str, ModelHost] = {}  # live or remembered
        self.retired: OrderedDict[str, None] = OrderedDict()
        # Pushed out of `retired` while given up or blocked.
        self.kept: OrderedDict[str, None] = OrderedDict()
        self.forgotten: list[str] = []  # on_forget calls the model expects
        self.reported: list[str] = []  # on_forget calls the store made
        self.next_item = 0
        self.accepted: list[int] = []
        self.popped: Counter[int] = Counter()
        self.dropped: Counter[int] = Counter()

    @initialize(
        cap=st.integers(0, 3),
        turn=st.integers(1, 3),
        grace=st.sampled_from([0.0, 0.5, 2.0]),
        remember=st.sampled_from([1, 3, 100]),
        prefetch=st.integers(0, 1),
        silent_limit=st.integers(0, 1),
        await_start=st.booleans(),
        default_limit=st.integers(1, 2),
    )
    def setup(
        self,
        *,
        cap: int,
        turn: int,
        grace: float,
        remember: int,
        prefetch: int,
        silent_limit: int,
        await_start: bool,
        default_limit: int,
    ) -> None:
        self.cap = cap
        self.turn = turn
        self.grace = grace
        self.remember = remember
        self.prefetch = prefetch
        self.silent_limit = silent_limit
        self.await_start = await_start
        self.default_limit = default_limit
        self.store = MemoryStore(
            lambda key: HostState(default_limit),
            max_active=cap,
            turn=turn,
            grace=grace,
            prefetch=prefetch,
            silent_limit=silent_limit,
            await_start=await_start,
            remember=remember,
            clock=self.clock,
            rng=random.Random(0),
        )
        self.store.on_forget = self.reported.append

    # -- the model's bookkeeping of remembered states (an LRU, and a --------
    # -- second one for hosts pushed out of it while given up or blocked) -----

    def _remember(self, key: str) -> None:
        self.retired[key] = None
        self.retired.move_to_end(key)
        while len(self.retired) > self.remember:
            old, _ = self.retired.popitem(last=False)
            host = self.hosts[old]
            if host.given_up or host.blocked_until > self.clock.now:
                self.kept[old] = None
                if len(self.kept) <= self.remember:
                    continue
                old, _ = self.kept.popitem(last=False)
            del self.hosts[old]
            self.forgotten.append(old)

    def _recall(self, key: str) -> bool:
        """Take *key* out of the memories of idle hosts; False if in neither."""
        for memory in (self.retired, self.kept):
            if key in memory:
                del memory[key]
                return True
        return False

    def _touch(self, key: str) -> ModelHost:
        """MemoryStore.host_state(): find or create, refreshing the LRU order."""
        host = self.hosts.get(key)
        if host is not None and host.live():
            return host
        if host is not None and key in self.retired:
            self.retired.move_to_end(key)
            return host
        if host is not None:
            del self.kept[key]
            self._remember(key)
            return host
        host = self.hosts[key] = ModelHost(limit=self.default_limit)
        self._remember(key)
        # The factory's state may be forgotten at once (remember is tiny).
        return host

    def _maybe_retire(self, key: str) -> None:
        self._settle()
        host = self.hosts.get(key)
        remembered = key in self.retired or key in self.kept
        if host is not None and not host.live() and not remembered:
            self._remember(key)

    def _settle(self) -> None:
        """Settle the model's hosts as the frontier does between two steps.

        A host with nothing in flight gives its active place up when it has
        nothing queued (with a grace and a cap: it goes idle, and pop() ends
        its place when the grace is over), must wait for its next start, or
        has had its turn. Nothing else changes these while the clock stands
        still, so checking after each step (and before the clock moves) is
        what the store does as each step happens.
        """
        now = self.clock.now
        for h in self.hosts.values():
            if not h.active or h.in_flight:
                continue
            if not h.queue:
                if self.grace and self.cap:
                    # It keeps its place for the grace (until a pop after it).
                    if h.idle_until is None:
                        self.idle_seq += 1
                        h.idle_until, h.idle_seq = now + self.grace, self.idle_seq
                    continue
                h.active = False
            elif h.ready_at() > now or h.served >= self.turn:
                h.active = False

    def _expire_idle(self) -> None:
        """Retire the idle hosts whose grace is over, as pop() does first.

        Idle hosts whose grace is over give their places up and retire, in the order of their
        timers.
        """
        now = self.clock.now
        expired = sorted(
            (h.idle_until, h.idle_seq, key)
            for key, h in self.hosts.items()
            if h.idle_until is not None and h.idle_until <= now
        )
        for _, _, key in expired:
            host = self.hosts[key]
            host.idle_until = None
            host.active = False
            self._maybe_retire(key)

    def _active(self) -> int:
        self._settle()
        return sum(1 for h in self.hosts.values() if h.active)

    def _active_at_pop(self) -> int:
        """Count the places held once pop() has ended the graces that are over."""
        now = self.clock.now
        expired = sum(
            1 for h in self.hosts.values() if h.idle_until is not None and h.idle_until <= now
        )
        return self._active() - expired

    def _may_end(self, h: ModelHost) -> bool:
        """Whether *h* has had its turn and may be withheld while other hosts wait.

        It still holds its place: it has work in flight.
        """
        return bool(self.cap and h.active and h.served >= self.turn and h.in_flight)

    def _full_at(self, h: ModelHost) -> int:
        """In flight from which *h* is handed nothing.

        A host with an interval between starts gets no prefetch; a silent one, with
        ``silent_limit``, has at most that many and no prefetch.
        """
        if self.silent_limit and not h.answering:
            return min(h.limit, self.silent_limit)
        return h.limit + (0 if h.interval else self.prefetch)

    def _servable(self) -> dict[str, ModelHost]:
        """Hosts the store may serve now."""
        now, active = self.clock.now, self._active_at_pop()
        return {
            key: h
            for key, h in self.hosts.items()
            if h.queue
            and len(h.in_flight) < self._full_at(h)
            and h.pending is None
            and now >= h.ready_at()
            and (h.active or self.cap == 0 or active < self.cap)
        }

    def _ready(self) -> dict[str, ModelHost]:
        """Hosts the store must serve now (if it returns None, none may be)."""
        return {key: h for key, h in self._servable().items() if not self._may_end(h)}

    # -- rules -----------------------------------------------------------

    def _push(self, key: str, rank: int) -> None:
        item = self.next_item
        self.next_item += 1
        host = self.hosts.get(key)
        if host is not None and host.live():
            expected = not host.given_up
            if expected:
                host.idle_until = None
        else:
            if self._recall(key):
                assert host is not None
            else:
                host = self.hosts[key] = ModelHost(limit=self.default_limit)
            expected = not host.given_up
            if not expected:
                self._remember(key)
        assert self.store.push(key, rank, item) is expected
        if expected:
            host.queue.append((rank, item))
            self.accepted.append(item)

    @rule(key=st.sampled_from(HOST_KEYS), rank=st.integers(0, 2))
    def push(self, key: str, rank: int) -> None:
        self._push(key, rank)

    @rule(key=st.sampled_from(HOST_KEYS[:3]), rank=st.integers(0, 2))
    def push_busy_host(self, key: str, rank: int) -> None:
        self._push(key, rank)

    def _check_pop(self, store: MemoryStore[int]) -> tuple[str, int, int] | None:
        """Pop from *store* and check the answer against the model.

        The model is left alone. Returns ``(key, rank, item)`` or None.
        """
        ready, servable = self._ready(), self._servable()
        got = store.pop()
        wake = store.next_wakeup()
        assert wake is None or wake > self.clock.now
        if got is None:
            assert not ready, f"pop() returned None while {sorted(ready)} are ready"
            # Nothing is ready: whoever waits only for time must be woken, and
            # so must the hosts waiting for a place when a grace ends.
            waiting = [
                h.ready_at()
                for h in self.hosts.values()
                if h.queue
                and len(h.in_flight) < self._full_at(h)
                and h.pending is None
                and (h.active or self.cap == 0 or self._active_at_pop() < self.cap)
                and h.ready_at() > self.clock.now
            ]
            waiting += [
                h.idle_until
                for h in self.hosts.values()
                if h.idle_until is not None and h.idle_until > self.clock.now
            ]
            if waiting:
                assert wake is not None
                assert wake <= min(waiting)
            return None
        key, item = got
        assert key in servable, f"{key} served but not ready"
        host = servable[key]
        rank, expected_item = host.head()
        assert item == expected_item, "rank order or FIFO violated within a host"
        # A request beyond a host's limit (prefetch) goes only when no host
        # can send at once.
        sendable = {k: h for k, h in ready.items() if len(h.in_flight) < h.limit}
        if len(host.in_flight) >= host.limit:
            assert not sendable, f"prefetch for {key} went before {sorted(sendable)}"
        if self.cap == 0:
            # The highest rank first; at the same rank, answering hosts first.
            best = max((h.head()[0], h.answering) for h in (sendable or ready).values())
            assert (rank, host.answering) == best
        assert self.popped[item] == 0, f"item {item} popped twice"
        assert len(host.in_flight) + 1 <= self._full_at(host)
        if self.cap:
            assert self._active_at_pop() + (0 if host.active else 1) <= self.cap
        return key, rank, item

    def _pop(self) -> tuple[str, int] | None:
        checked = self._check_pop(self.store)
        self._expire_idle()
        if checked is None:
            return None
        key, rank, item = checked
        host = self.hosts[key]
        self.popped[item] += 1
        host.queue.remove((rank, item))
        host.in_flight.append(item)
        host.last_start = self.clock.now
        host.gap = host.interval
        if self.await_start and host.interval:
            host.pending = (item, self.clock.now)
        if not host.active:
            host.active = True
            host.served = 0
        host.served += 1
        return key, item

    @rule()
    def pop(self) -> None:
        self._pop()

    @rule()
    def pop_twice(self) -> None:
        self._pop()
        self._pop()

    @precondition(lambda self: any(h.in_flight for h in self.hosts.values()))
    @rule(pick=st.integers(0, 1_000))
    def finish(self, pick: int) -> None:
        busy = [(key, item) for key, h in self.hosts.items() for item in h.in_flight]
        key, item = busy[pick % len(busy)]
        self.store.finish(key)
        host = self.hosts[key]
        host.in_flight.remove(item)
        if not host.in_flight:
            host.pending = None
        self._maybe_retire(key)

    @precondition(lambda self: any(h.pending for h in self.hosts.values()))
    @rule(pick=st.integers(0, 1_000), started=st.booleans())
    def start_or_unstart(self, pick: int, started: bool) -> None:
        """Start a hand-out a host waits for, or have it not start.

        The hand-out a host waits for starts (it reached the downloader),
        or will not (a downloader middleware answered it).
        """
        waiting = [(key, h) for key, h in self.hosts.items() if h.pending]
        key, host = waiting[pick % len(waiting)]
        assert host.pending is not None
        _, handed_out_at = host.pending
        host.pending = None
        if started:
            self.store.started(key, handed_out_at, self.clock.now)
            if host.last_start == handed_out_at:
                host.last_start = self.clock.now
        else:
            self.store.unstart(key, handed_out_at)
            if host.last_start == handed_out_at:
                host.gap = 0.0

    @rule(key=st.sampled_from(HOST_KEYS))
    def adopt(self, key: str) -> None:
        """Adopt a request that pop() did not hand out.

        A request that pop() did not hand out starts (the scheduler adopts
        one only while the host has room).
        """
        host = self.hosts.get(key)
        if host is not None and len(host.in_flight) >= host.limit:
            return
        if host is None or not host.live():
            if self._recall(key):
                assert host is not None
            else:
                host = self.hosts[key] = ModelHost(limit=self.default_limit)
        host.idle_until = None
        self.store.adopt(key, self.clock.now)
        host.in_flight.append(-1 - self.next_item)
        self.next_item += 1
        if host.interval:
            host.last_start = self.clock.now
            host.gap = host.interval

    @rule(key=st.sampled_from(HOST_KEYS))
    def finish_without_in_flight_raises(self, key: str) -> None:
        host = self.hosts.get(key)
        if host is None or not host.in_flight:
            with pytest.raises(KeyError):
                self.store.finish(key)

    @rule(key=st.sampled_from(HOST_KEYS), delay=st.sampled_from([-1.0, 0.5, 3.0, 7.0]))
    def block_until(self, key: str, delay: float) -> None:
        when = self.clock.now + delay
        self.store.block_until(key, when)
        host = self._touch(key)
        host.blocked_until = max(host.blocked_until, when)

    @rule(key=st.sampled_from(HOST_KEYS), answering=st.booleans())
    def set_answering(self, key: str, answering: bool) -> None:
        self.store.set_answering(key, answering)
        host = self.hosts.get(key)
        if host is not None:  # a host the store does not know is left alone
            host.answering = answering

    @rule(key=st.sampled_from(HOST_KEYS), limit=st.integers(1, 3))
    def set_limit(self, key: str, limit: int) -> None:
        self.store.set_limit(key, limit)
        self._touch(key).limit = limit

    @rule(key=st.sampled_from(HOST_KEYS), interval=st.sampled_from([0.0, 1.0, 2.5]))
    def set_interval(self, key: str, interval: float) -> None:
        self.store.set_interval(key, interval)
        host = self._touch(key)
        host.interval = host.gap = interval

    @rule(dt=st.sampled_from([0.25, 1.0, 3.0, 10.0]))
    def advance(self, dt: float) -> None:
        self._settle()
        self.clock.advance(dt)

    @precondition(lambda self: sum(h.given_up for h in self.hosts.values()) < 2)
    @rule(key=st.sampled_from(HOST_KEYS))
    def give_up(self, key: str) -> None:
        dropped = self.store.give_up(key)
        host = self._touch(key)
        host.given_up = True
        assert dropped == host.serving_order()
        self.dropped.update(dropped)
        host.queue.clear()
        self._maybe_retire(key)

    @rule(key=st.sampled_from(HOST_KEYS))
    def remove_queued(self, key: str) -> None:
        dropped = self.store.remove_queued(key)
        host = self.hosts.get(key)
        expected = host.serving_order() if host is not None else []
        assert dropped == expected
        self.dropped.update(dropped)
        if host is not None:
            host.queue.clear()
            self._maybe_retire(key)

    # -- invariants ------------------------------------------------------

    @invariant()
    def counts_match(self) -> None:
        store = self.store
        live = {k: h for k, h in self.hosts.items() if h.live()}
        assert len(store) == sum(len(h.queue) for h in live.values())
        assert store.live_hosts == len(live)
        assert store.active == self._active()
        if self.cap:
            assert store.max_active_seen <= self.cap
        for key in HOST_KEYS:
            host = live.get(key)
            assert store.queued(key) == (len(host.queue) if host else 0)
            assert store.in_flight(key) == (len(host.in_flight) if host else 0)
            assert (store.standing(key) is None) == (host is None)

    @invariant()
    def pop_now_would_agree_with_model(self) -> None:
        # Ask a copy, so that every step (not only the pop rules) checks that
        # no ready host is overlooked and no host is served too early.
        probe = copy.deepcopy(self.store)
        probe.on_forget = None  # what the copy forgets is not the store's
        self._check_pop(probe)

    @invariant()
    def standings_agree_with_model(self) -> None:
        now = self.clock.now
        for key in HOST_KEYS:
            standing = self.store.standing(key)
            if standing is None:
                continue
            host = self.hosts[key]
            full_at = self._full_at(host)
            if standing == READY:
                assert host.queue
                assert host.pending is None
                assert len(host.in_flight) < full_at
                assert host.ready_at() <= now
            elif standing == FULL:
                assert host.queue
                assert len(host.in_flight) >= full_at or host.pending is not None
            elif standing == PREFETCH:
                assert host.queue
                assert host.pending is None
                assert host.limit <= len(host.in_flight) < full_at
                assert host.ready_at() <= now
            elif standing == CAPPED:
                assert host.queue
                # Waiting for a place: in flight only requests it was not
                # handed (adopted ones).
                assert not host.active
                assert all(item < 0 for item in host.in_flight)
            elif standing == DRAINED:
                assert not host.queue
                assert host.in_flight
            elif standing == IDLE:
                assert not host.queue
                assert not host.in_flight
                assert host.active
                assert host.idle_until is not None
            elif standing == ENDING:
                assert host.queue
                assert host.in_flight
                assert self._may_end(host)
            else:
                assert standing == BLOCKED
                assert host.queue

    @invariant()
    def remembered_states_match(self) -> None:
        assert len(self.store._retired) <= self.remember
        assert len(self.store._kept) <= self.remember
        assert self.reported == self.forgotten
        for key in HOST_KEYS:
            state = self.store.known_state(key)
            host = self.hosts.get(key)
            assert (state is None) == (host is None), key
            if state is not None and host is not None:
                assert state.limit == host.limit
                assert state.blocked_until == max(0.0, host.blocked_until)
                assert state.interval == host.interval
                assert state.given_up == host.given_up
                assert state.answering == host.answering

    def teardown(self) -> None:
        # Drain: every accepted item is popped or dropped exactly once.
        if not hasattr(self, "store"):
            return
        self._settle()
        self.clock.advance(1_000.0)
        for _ in range(4 * len(self.accepted) + 20):
            if self._pop() is not None:
                continue
            busy = [(k, i) for k, h in self.hosts.items() for i in h.in_flight]
            if busy:
                for key, item in busy:
                    self.store.finish(key)
                    self.hosts[key].in_flight.remove(item)
                    if not self.hosts[key].in_flight:
                        self.hosts[key].pending = None
                    self._maybe_retire(key)
            elif len(self.store):
                self._settle()
                self.clock.advance(3.0)
            else:
                break
        # Idle hosts give their places up at the first pop after their grace.
        self._settle()
        self.clock.advance(self.grace + 1.0)
        assert self._pop() is None
        assert len(self.store) == 0
        assert self.store.live_hosts == 0
        assert self.store.active == 0
        assert self.popped + self.dropped == Counter(self.accepted)
        assert max((self.popped + self.dropped).values(), default=1) == 1


StoreMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_store_against_model = StoreMachine.TestCase


# -- cost: structures stay O(live hosts), pop/push never scan the hosts ----------


def structure_sizes(store: MemoryStore[Any]) -> dict[str, int]:
    return {
        "ring": sum(len(bucket) for bucket in store._buckets.values()),
        "buckets": len(store._buckets),
        "bucket_ranks": len(store._bucket_ranks),
        "timers": len(store._timers),
        "capped": len(store._capped),
    }


class BoundsWatcher:
    """Checks that no structure outgrows the largest live-host count seen."""

    def __init__(self, store: MemoryStore[Any], slack: int = 100) -> None:
        self.store = store
        self.peak_live = 0
        self.slack = slack
        self.largest: dict[str, int] = {}

    def check(self) -> None:
        self.peak_live = max(self.peak_live, self.store.live_hosts)
        bound = 2 * self.peak_live + self.slack
        for name, size in structure_sizes(self.store).items():
            self.largest[name] = max(self.largest.get(name, 0), size)
            assert size <= bound, (name, size, self.peak_live)


N_HOSTS = 10_000
ROUNDS = 8


def test_interval_churn_keeps_structures_bounded() -> None:
    store, clock = make(limit=1, interval=1.0)
    watch = BoundsWatcher(store)
    hosts = [f"h{i}" for i in range(N_HOSTS)]
    for host in hosts:
        for i in range(ROUNDS):
            store.push(host, i % 2, f"{host}-{i}")
    watch.check()
    popped = 0
    for _ in range(ROUNDS * 3):
        batch = drain_pops(store, bound=2 * N_HOSTS)
        popped += len(batch)
        for key, _ in batch:
            store.finish(key)
        watch.check()
        clock.advance(1.0)
    assert popped == N_HOSTS * ROUNDS
    assert store.live_hosts == 0
    assert store.pop() is None
    assert structure_sizes(store) == dict.fromkeys(structure_sizes(store), 0)


def test_repeated_block_extensions_keep_the_timer_heap_bounded() -> None:
    store, clock = make(limit=1)
    watch = BoundsWatcher(store)
    hosts = [f"h{i}" for i in range(N_HOSTS)]
    for host in hosts:
        store.push(host, 0, host)
    for extension in range(1, ROUNDS * 2 + 1):
        # Retry-After answers keep pushing every host's block further out.
        for host in hosts:
            store.block_until(host, clock.now + 3600 + extension)
        watch.check()
        assert store.pop() is None
    # The hosts leave while still blocked: their timers must not linger forever.
    for _ in range(ROUNDS):
        for host in hosts:
            store.remove_queued(host)
            store.push(host, 0, host)
            store.block_until(host, clock.now + 7200)
        watch.check()
    assert store.next_wakeup() is not None
    assert watch.largest["timers"] <= 2 * N_HOSTS + watch.slack


def test_state_changes_on_starved_hosts_keep_the_ring_bounded() -> None:
    store, _ = make(limit=1_000)
    watch = BoundsWatcher(store)
    cold = [f"cold{i}" for i in range(N_HOSTS)]
    for host in cold:
        store.push(host, 0, host)
    # One hot host with a higher rank is always ready, so the rank-0 bucket is
    # never walked by pop(); AIMD keeps adjusting the cold hosts' limits.
    for i in range(ROUNDS * 2):
        store.push("hot", 10, f"hot{i}")
    for r in range(ROUNDS * 2):
        for host in cold:
            store.set_limit(host, 2 + r % 2)
        got = store.pop()
        assert got is not None
        assert got[0] == "hot"
        store.finish("hot")
        watch.check()
    assert store.standing("cold0") == READY


def test_capped_churn_keeps_the_capped_queue_bounded() -> None:
    store, _ = make(limit=1, max_active=1)
    watch = BoundsWatcher(store)
    store.push("busy", 0, "b0")
    assert store.pop() == ("busy", "b0")
    hosts = [f"h{i}" for i in range(N_HOSTS)]
    for _ in range(ROUNDS * 2):
        for host in hosts:
            store.push(host, 0, host)
        watch.check()
        assert store.pop() is None
        assert store.standing(hosts[0]) == CAPPED
        for host in hosts:
            assert store.remove_queued(host) == [host]
        watch.check()
    store.push("late", 0, "late")
    store.finish("busy")
    assert store.pop() == ("late", "late")
    store.finish("late")
    assert store.pop() is None
    assert store.live_hosts == 0
    assert structure_sizes(store)["capped"] == 0


def test_many_short_lived_hosts_keep_memory_bounded() -> None:
    store, clock = make(limit=2, remember=500, interval=0.5)
    watch = BoundsWatcher(store)
    for i in range(N_HOSTS):
        host = f"h{i}"
        store.push(host, 0, f"{host}a")
        store.push(host, 1, f"{host}b")
        if i % 1000 == 0:
            watch.check()
        got = store.pop()
        assert got == (host, f"{host}b")
        store.finish(host)
        clock.advance(0.5)
        assert store.pop() == (host, f"{host}a")
        store.finish(host)
        assert store.standing(host) is None
    assert store.live_hosts == 0
    assert len(store._retired) == 500
    watch.check()


def test_compaction_keeps_the_round_robin_order() -> None:
    store, _ = make(limit=10)
    hosts = [f"h{i:03d}" for i in range(100)]
    for host in hosts:
        store.push(host, 0, f"{host}-0")
        store.push(host, 0, f"{host}-1")
    # Each change re-queues the host at the back of its round and leaves a
    # stale entry behind: 400 changes for 100 hosts force a compaction.
    for limit in (3, 4, 5, 6):
        for host in hosts:
            store.set_limit(host, limit)
    assert structure_sizes(store)["ring"] <= 2 * len(hosts) + 64
    assert [key for key, _ in drain_pops(store)] == hosts * 2


class NoScanDict(dict[str, Any]):
    """A host table that fails the test if anything walks it."""

    def _refuse(self, *args: Any) -> Any:
        raise AssertionError("the store scanned its host table")

    __iter__ = _refuse
    keys = _refuse
    values = _refuse
    items = _refuse


def test_request_path_never_scans_the_hosts() -> None:
    store, clock = make(limit=2, max_active=50)
    store._hosts = NoScanDict()
    for i in range(2_000):
        host = f"h{i}"
        store.push(host, i % 3, f"{host}a")
        store.push(host, 0, f"{host}b")
        if i % 7 == 0:
            store.block_until(host, clock.now + 5)
        if i % 11 == 0:
            store.set_interval(host, 1.0)
            store.set_limit(host, 1)
    assert store.next_wakeup() is not None
    in_flight: list[str] = []
    served = 0
    for _ in range(20_000):
        got = store.pop()
        if got is not None:
            served += 1
            in_flight.append(got[0])
            continue
        if in_flight:
            for key in in_flight:
                store.finish(key)
            in_flight.clear()
            continue
        wake = store.next_wakeup()
        if wake is None:
            break
        clock.now = wake
    assert served == 4_000
    assert len(store) == 0
    assert store.live_hosts == 0
    assert store.give_up("h1") == []
    assert store.remove_queued("h2") == []


# -- answering and silent hosts ---------------------------------------------------


def test_answering_hosts_go_first_at_the_same_rank() -> None:
    store, _ = make(limit=3)
    for host in "sa":
        for i in range(5):
            store.push(host, 0, f"{host}{i}")
    store.set_answering("a", True)
    order = [got[0] for _ in range(6) if (got := store.pop()) is not None]
    assert order == ["a", "a", "a", "s", "s", "s"]
    # A higher priority still goes first.
    store.push("s", 1, "s-urgent")
    store.finish("a")
    store.finish("s")
    assert store.pop() == ("s", "s-urgent")
    # Silent again (a failed connection): round-robin with the others.
    store.set_answering("a", False)
    store.finish("s")
    served = {got[0] for _ in range(2) if (got := store.pop()) is not None}
    assert served == {"a", "s"}


def push_answering_sites(store: MemoryStore[str], hosts: str, count: int = 20) -> None:
    """Queue *count* requests for each of *hosts*, which have answered."""
    for host in hosts:
        for i in range(count):
            store.push(host, 0, f"{host}{i}")
        store.set_answering(host, True)


def test_silent_hosts_holding_their_share_of_places_leave_answering_hosts_theirs() -> None:
    # Two sites that answer, and six hosts whose one request hangs: with 4
    # places, the silent hosts take at most half while the others wait.
    store, _ = make(limit=1, max_active=4, turn=2)
    push_answering_sites(store, "ab")
    for i in range(6):
        store.push(f"x{i}", 0, f"x{i}")
    first = drain_pops(store)
    assert sorted(host for host, _ in first) == ["a", "b", "x0", "x1"]
    served = []
    for _ in range(16):  # the hanging requests never finish meanwhile
        for host in "ab":
            if store.in_flight(host):
                store.finish(host)
        served += [host for host, _ in drain_pops(store)]
        assert store.active <= 4
    assert served.count("a") == served.count("b") == 16
    assert not [host for host in served if host.startswith("x")]
    # When a hanging request ends, its place goes to the next silent host.
    store.finish("x0")
    assert [host for host, _ in drain_pops(store)] == ["x2"]


def test_places_freed_at_once_give_silent_hosts_no_more_than_their_share() -> None:
    # The two hanging requests time out together, then both sites end their
    # turns, before the engine asks for a request: four places are free at
    # once. Silent hosts let out of the line for them count at their first
    # request, so the first two took the share and the sites get the others.
    store, _ = make(limit=1, max_active=4, turn=2)
    push_answering_sites(store, "ab")
    for i in range(6):
        store.push(f"x{i}", 0, f"x{i}")
    assert sorted(host for host, _ in drain_pops(store)) == ["a", "b", "x0", "x1"]
    for _ in range(3):  # the sites' turns are over
        for host in "ab":
            store.finish(host)
        assert sorted(host for host, _ in drain_pops(store)) == ["a", "b"]
    for host in ("x0", "x1", "a", "b"):
        store.finish(host)
    served = sorted(host for host, _ in drain_pops(store))
    assert served == ["a", "b", "x2", "x3"]
    # The two sent back stay at the head of the line, ahead of the others.
    store.push("x6", 0, "x6")
    later = []
    for host in ("x2", "x3"):
        store.finish(host)
        later += [host for host, _ in drain_pops(store)]
    assert sorted(later) == ["x4", "x5"]


def test_silent_hosts_still_get_places_from_busy_answering_hosts() -> None:
    store, _ = make(limit=1, max_active=2, turn=2)
    push_answering_sites(store, "ab")
    store.push("x", 0, "x0")
    order = []
    for _ in range(6):
        got = drain_pops(store)
        order += [host for host, _ in got]
        for host, _ in got:
            if host != "x":
                store.finish(host)
    # x holds fewer than its share (1 of 2 places): an answering host's turn
    # ends for it.
    assert "x" in order[:6]


# -- overdue requests ---------------------------------------------------------


def test_a_host_with_only_overdue_requests_in_flight_gives_its_place_up() -> None:
    store, _clock = make(limit=2, max_active=1, turn=10)
    for key in ("hangs", "waits"):
        for page in range(3):
            store.push(key, 0, f"{key}{page}")
    assert store.pop() == ("hangs", "hangs0")
    assert store.pop() == ("hangs", "hangs1")
    assert store.pop() is None  # hangs is full, waits has no place
    store.set_overdue("hangs")
    assert store.active == 1  # one of its two still answers
    store.set_overdue("hangs")
    # Both hang: the place goes to the host that waited for it.
    assert store.pop() == ("waits", "waits0")
    assert store.in_flight("hangs") == 2
    assert store.overdue("hangs") == 2
    assert store.active == 1
    # An overdue request that ends frees its host's room, not a place.
    store.finish("hangs", overdue=True)
    assert store.overdue("hangs") == 1
    assert store.in_flight("hangs") == 1


def test_overdue_requests_still_count_against_their_hosts_limit() -> None:
    store, _clock = make(limit=2)
    for page in range(4):
        store.push("h", 0, f"p{page}")
    assert store.pop() is not None
    assert store.pop() is not None
    store.set_overdue("h")
    store.set_overdue("h")
    assert store.pop() is None
    store.finish("h", overdue=True)
    assert store.pop() == ("h", "p2")


def test_marking_more_overdue_than_in_flight_is_refused() -> None:
    store, _clock = make(limit=2)
    store.push("h", 0, "p")
    assert store.pop() is not None
    store.set_overdue("h")
    with pytest.raises(KeyError):
        store.set_overdue("h")


# -- a host's share of the global limit ----------------------------------------


def test_with_a_global_limit_each_active_host_gets_its_share() -> None:
    store, _clock = make(limit=4)
    store.global_limit = 4
    for key in ("a", "b"):
        for page in range(8):
            store.push(key, 0, f"{key}{page}")
    handed = [store.pop() for _ in range(8)]
    served = [popped for popped in handed if popped is not None]
    # Two active hosts share a global limit of 4: two each, not their limit of 4.
    assert sorted(key for key, _ in served) == ["a", "a", "b", "b"]
    assert store.in_flight_cap(store.host_state("a")) == 2


def test_a_host_alone_gets_its_whole_limit_within_the_global_limit() -> None:
    store, _clock = make(limit=4)
    store.global_limit = 16
    for page in range(8):
        store.push("a", 0, f"a{page}")
    served = [store.pop() for _ in range(6)]
    assert [popped for popped in served if popped is not None] == [
        ("a", f"a{page}") for page in range(4)
    ]


def test_while_hosts_wait_for_a_place_each_place_gets_an_equal_part_of_the_global_limit() -> None:
    # Two places, a global limit of 2. "a" leaves its place with two hosts waiting:
    # "c" is let in (not served yet) and "d" still waits. Counted among the
    # active hosts, "b" alone would have its whole limit; with hosts waiting
    # for a place it has its place's part of the global limit: one request.
    store, _clock = make(limit=4, max_active=2, turn=100)
    store.global_limit = 2
    store.push("a", 0, "a0")
    for key in ("b", "c", "d"):
        for page in range(8):
            store.push(key, 0, f"{key}{page}")
    store.set_answering("a", True)
    store.set_answering("b", True)
    assert store.pop() == ("a", "a0")
    assert store.pop() == ("b", "b0")
    assert store.pop() is None  # c and d wait for a place; b has its share
    store.finish("a")
    assert store.active == 1
    assert store.standing("c") == READY
    assert store.standing("d") == CAPPED
    assert store.in_flight_cap(store.host_state("b")) == 1
    assert store.pop() == ("c", "c0")
    assert store.pop() is None
    assert (store.in_flight("b"), store.in_flight("c")) == (1, 1)


def test_the_part_of_each_place_is_rounded_up_so_the_global_limit_is_used() -> None:
    store, _clock = make(limit=4, max_active=2, turn=100)
    store.global_limit = 3
    for key in ("a", "b", "c"):
        for page in range(8):
            store.push(key, 0, f"{key}{page}")
    served = [store.pop() for _ in range(6)]
    # "c" waits for a place; the two places share 3 requests, 2 each at most.
    assert store.standing("c") == CAPPED
    assert Counter(key for key, _ in filter(None, served)) == {"a": 2, "b": 2}


def test_a_host_at_its_share_gets_its_prefetch_only_when_no_host_can_send() -> None:
    store, _clock = make(limit=4)
    store.global_limit = 2
    store.prefetch = 1
    for key in ("a", "b"):
        for page in range(4):
            store.push(key, 0, f"{key}{page}")
    assert [store.pop(), store.pop()] == [("a", "a0"), ("b", "b0")]
    # Each has its share (1 of 2) in flight, below its limit: one more each
    # would wait downstream, so a host that can send at once goes first.
    store.push("c", 0, "c0")
    assert store.pop() == ("c", "c0")
    assert (store.standing("a"), store.standing("b")) == (PREFETCH, PREFETCH)
    assert store.pop() in {("a", "a1"), ("b", "b1")}


@pytest.mark.parametrize("turn_seconds", [0.0, 5.0])
def test_a_turn_also_ends_after_turn_seconds_while_hosts_wait(turn_seconds: float) -> None:
    # One place, turns of 100 requests: "a" answers a request per 2 s. With
    # turn_seconds it lets "b" in once its turn has lasted that long.
    store, clock = make(max_active=1, turn=100)
    store.turn_seconds = turn_seconds
    for key in ("a", "b"):
        for page in range(10):
            store.push(key, 0, f"{key}{page}")
    served = []
    for _ in range(6):
        popped = store.pop()
        assert popped is not None
        served.append(popped[0])
        assert store.pop() is None  # one request at a time (limit 1)
        clock.advance(2.0)
        store.finish(popped[0])
    if turn_seconds:
        # Served at 0, 2 and 4 s; at its third answer (6 s) its turn is over.
        assert served == ["a", "a", "a", "b", "b", "b"]
    else:
        assert served == ["a"] * 6
