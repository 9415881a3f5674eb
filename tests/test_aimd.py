"""The pure AIMD rule, back-off and error budget, with a fake clock."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_hostqueue._aimd import (
    BACKOFF,
    COOLDOWN,
    ERROR,
    FAST,
    MAX_PROBE_PENALTY,
    OVERDUE,
    PROBE_PENALTY,
    RETRY_AFTER,
    SLOW,
    AimdSettings,
    AimdTable,
)
from tests.helpers.clock import FakeClock

FAST_LATENCY = 0.01
SLOW_LATENCY = 9.0


#: How far the clock moves between two outcomes, unless a test says otherwise.
TICK = 0.01


def make(**overrides: object) -> tuple[AimdTable, FakeClock]:
    clock = FakeClock(1000.0)
    values: dict[str, object] = {"start": 2, "floor": 1, "ceiling": 8}
    values.update(overrides)
    table = AimdTable(
        AimdSettings(**values),  # type: ignore[arg-type]
        clock=clock,
        rng=random.Random(7),
    )
    return table, clock


def fast(table: AimdTable, clock: FakeClock, host: str = "h", count: int = 1) -> None:
    for _ in range(count):
        started = clock.advance(TICK)
        clock.advance(TICK)
        table.on_success(host, started, FAST_LATENCY)


def limit(table: AimdTable, host: str = "h") -> int:
    return table.host(host).limit


# -- additive increase ------------------------------------------------------


def test_fast_successes_while_the_limit_was_not_filled_raise_nothing() -> None:
    # A host held back by its delay, or with too few URLs, answers one request
    # at a time: no evidence that it takes more than it was given.
    table, clock = make()
    for _ in range(50):
        started = clock.advance(TICK)
        assert table.on_success("h", started, FAST_LATENCY, limited=False) is None
    assert limit(table) == 2
    # Nor do they break a run: the filled-limit answers before and after add up.
    table.on_success("h", clock.advance(TICK), FAST_LATENCY)
    table.on_success("h", clock.advance(TICK), FAST_LATENCY, limited=False)
    adjustment = table.on_success("h", clock.advance(TICK), FAST_LATENCY)
    assert adjustment is not None
    assert adjustment.new_limit == 3


def test_a_run_of_fast_successes_as_long_as_the_limit_adds_one() -> None:
    table, clock = make()
    assert limit(table) == 2
    fast(table, clock, count=1)
    assert limit(table) == 2
    started = clock.advance(TICK)
    adjustment = table.on_success("h", started, FAST_LATENCY)
    assert adjustment is not None
    assert (adjustment.old_limit, adjustment.new_limit, adjustment.reason) == (2, 3, FAST)
    assert not adjustment.decreased
    fast(table, clock, count=2)
    assert limit(table) == 3
    fast(table, clock, count=1)
    assert limit(table) == 4


def test_the_limit_climbs_to_the_ceiling_and_stays() -> None:
    table, clock = make()
    # 2 + 3 + ... + 7 fast successes reach 8.
    fast(table, clock, count=sum(range(2, 8)))
    assert limit(table) == 8
    fast(table, clock, count=100)
    assert limit(table) == 8


def test_a_medium_latency_breaks_the_run() -> None:
    table, clock = make(fast_latency=0.5, slow_latency=5.0)
    fast(table, clock, count=1)
    assert table.on_success("h", clock.advance(TICK), 1.0) is None  # neither fast nor slow
    fast(table, clock, count=1)
    assert limit(table) == 2  # the run restarted
    fast(table, clock, count=1)
    assert limit(table) == 3


# -- multiplicative decrease ------------------------------------------------


@pytest.mark.parametrize(
    ("start", "expected"),
    [(8, 4), (7, 3), (3, 1), (2, 1), (1, 1)],
)
def test_a_back_off_halves_the_limit_down_to_the_floor(start: int, expected: int) -> None:
    table, clock = make(start=start, floor=1)
    adjustment = table.on_backoff("h", clock.advance(TICK), None)
    assert adjustment is not None
    assert adjustment.decreased
    assert (adjustment.old_limit, adjustment.new_limit) == (start, expected)


def test_the_floor_holds() -> None:
    table, clock = make(start=8, floor=3)
    for _ in range(5):
        table.on_backoff("h", clock.advance(TICK), 0)
    assert limit(table) == 3


@pytest.mark.parametrize("reason", [BACKOFF, SLOW, ERROR])
def test_one_decrease_per_burst(reason: str) -> None:
    """Four outcomes of requests that were in flight together halve once."""
    table, clock = make(start=8)
    starts = [clock.advance(TICK) for _ in range(4)]
    clock.advance(1)
    results = []
    for started in starts:
        if reason == BACKOFF:
            results.append(table.on_backoff("h", started, 0))
        elif reason == SLOW:
            results.append(table.on_success("h", started, SLOW_LATENCY + 1))
        else:
            results.append(table.on_failure("h", started))
    assert limit(table) == 4
    assert [r is not None and r.decreased for r in results] == [True, False, False, False]
    # A request started after that decrease can decrease again.
    started = clock.advance(TICK)
    table.on_backoff("h", started, 0)
    assert limit(table) == 2


def test_successes_of_requests_started_before_a_decrease_do_not_count() -> None:
    table, clock = make(start=4)
    starts = [clock.advance(TICK) for _ in range(20)]
    table.on_backoff("h", clock.advance(TICK), 0)
    assert limit(table) == 2
    for started in starts:
        table.on_success("h", started, FAST_LATENCY)
    assert limit(table) == 2


def test_slow_responses_decrease() -> None:
    table, clock = make(start=8, slow_latency=5.0)
    adjustment = table.on_success("h", clock.advance(TICK), 6.0)
    assert adjustment is not None
    assert (adjustment.reason, adjustment.new_limit) == (SLOW, 4)
    assert adjustment.block is None


# -- probing a level that pushed back ----------------------------------------


def test_a_level_that_pushed_back_is_probed_ever_more_rarely() -> None:
    """A host that refuses a 4th concurrent request.

    The limit settles at 3 and each probe of 4 needs a longer run than the one before, up to a
    bound.
    """
    table, clock = make(start=4)
    table.on_backoff("h", clock.advance(TICK), 0)  # 4 -> 2, level 4 remembered
    runs = []
    for _ in range(5):
        fast(table, clock, count=2)  # 2 -> 3
        assert limit(table) == 3
        count = 0
        while limit(table) == 3:
            fast(table, clock)
            count += 1
            assert count < 10_000
        runs.append(count)
        assert limit(table) == 4
        table.on_backoff("h", clock.advance(TICK), 0)  # pushed back again at 4
        assert limit(table) == 2
    assert PROBE_PENALTY == 4
    assert runs[:3] == [3 * 4, 3 * 16, 3 * 64]
    assert runs[3:] == [3 * MAX_PROBE_PENALTY] * 2


def test_a_level_that_holds_is_forgotten() -> None:
    table, clock = make(start=4)
    table.on_backoff("h", clock.advance(TICK), 0)  # 4 -> 2
    fast(table, clock, count=2 + 3 * PROBE_PENALTY)  # 2 -> 3 -> 4 (probe)
    assert limit(table) == 4
    fast(table, clock, count=4 * PROBE_PENALTY)  # a whole run at 4, penalised: -> 5
    assert limit(table) == 5
    fast(table, clock, count=5)  # no penalty any more
    assert limit(table) == 6


def test_a_back_off_below_the_remembered_level_escalates() -> None:
    table, clock = make(start=8)
    table.on_backoff("h", clock.advance(TICK), 0)  # at 8: level 8, penalty 4
    fast(table, clock, count=4 + 5 + 6)  # 4 -> 7
    assert limit(table) == 7
    table.on_backoff("h", clock.advance(TICK), 0)  # at 7, below 8: stronger evidence
    host = table.host("h")
    assert (host.probe_level, host.probe_penalty) == (7, PROBE_PENALTY**2)


def test_a_slow_spell_below_the_level_does_not_escalate() -> None:
    table, clock = make(start=8, slow_latency=5.0)
    table.on_backoff("h", clock.advance(TICK), 0)  # level 8, penalty 4
    clock.advance(TICK)
    table.on_success("h", clock.advance(TICK), 6.0)  # slow at 4: a new level, base penalty
    host = table.host("h")
    assert (host.limit, host.probe_level, host.probe_penalty) == (2, 4, PROBE_PENALTY)


def test_decreases_at_the_floor_leave_the_level_alone() -> None:
    table, clock = make(start=2, floor=1)
    table.on_backoff("h", clock.advance(TICK), 0)  # 2 -> 1: level 2
    for _ in range(5):
        clock.advance(TICK)
        outcome = table.on_backoff("h", clock.advance(TICK), 0)
        assert outcome is not None
        assert outcome.decreased
    host = table.host("h")
    assert (host.limit, host.probe_level, host.probe_penalty) == (1, 2, PROBE_PENALTY)
    # So the way back up is not made longer by how long the trouble lasted.
    fast(table, clock, count=PROBE_PENALTY)
    assert limit(table) == 2


# -- blocks -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [(2.0, 2.0), (0.0, 0.0), (10_000.0, 300.0), (float("inf"), 300.0)],
)
def test_retry_after_blocks_capped(retry_after: float, expected: float) -> None:
    table, clock = make(retry_after_max=300.0)
    adjustment = table.on_backoff("h", clock.advance(TICK), retry_after)
    assert adjustment is not None
    assert adjustment.block == expected
    assert adjustment.block_reason == RETRY_AFTER


def test_retry_after_applies_inside_a_burst_too() -> None:
    table, clock = make(start=8)
    first, second = clock.advance(TICK), clock.advance(TICK)
    clock.advance(TICK)
    table.on_backoff("h", first, 2.0)
    adjustment = table.on_backoff("h", second, 3.0)
    assert adjustment is not None
    assert not adjustment.decreased
    assert adjustment.block == 3.0  # the server's word; the scheduler only extends


def test_missing_retry_after_backs_off_exponentially_with_jitter() -> None:
    # An error budget that no run of back-offs here spends.
    table, clock = make(backoff_base=1.0, backoff_max=10.0, error_budget=100)
    blocks = []
    for _ in range(7):
        adjustment = table.on_backoff("h", clock.advance(TICK), None)
        assert adjustment is not None
        assert adjustment.block_reason == BACKOFF
        assert adjustment.block is not None
        blocks.append(adjustment.block)
    bounds = [1, 2, 4, 8, 10, 10, 10]
    for block, bound in zip(blocks, bounds, strict=True):
        assert bound / 2 <= block <= bound
    # A success resets the exponent.
    fast(table, clock)
    adjustment = table.on_backoff("h", clock.advance(TICK), None)
    assert adjustment is not None
    assert adjustment.block is not None
    assert 0.5 <= adjustment.block <= 1.0


def test_exponential_back_off_does_not_escalate_inside_a_burst() -> None:
    table, clock = make(backoff_base=1.0, backoff_max=100.0)
    starts = [clock.advance(TICK) for _ in range(4)]
    clock.advance(TICK)
    blocks = [table.on_backoff("h", started, None) for started in starts]
    assert blocks[0] is not None
    assert blocks[0].block is not None
    assert all(b is not None and b.block is None for b in blocks[1:])
    adjustment = table.on_backoff("h", clock.advance(TICK), None)
    assert adjustment is not None
    assert adjustment.block is not None
    assert 1.0 <= adjustment.block <= 2.0


def test_the_first_back_off_of_a_host_is_flagged_once() -> None:
    table, clock = make()
    flags = []
    for host in ("a", "a", "b"):
        adjustment = table.on_backoff(host, clock.advance(TICK), 1)
        assert adjustment is not None
        flags.append(adjustment.first_backoff)
    assert flags == [True, False, True]


# -- error budget -----------------------------------------------------------


def test_failures_in_a_row_park_then_give_up() -> None:
    table, clock = make(error_budget=3, error_cooldown=1.0, error_max_cooldowns=2)
    parks = []
    for _ in range(3):
        outcomes = [table.on_failure("h", clock.advance(TICK)) for _ in range(3)]
        assert all(o is None or not o.give_up for o in outcomes[:-1])
        last = outcomes[-1]
        assert last is not None
        if last.give_up:
            break
        assert last.parked
        assert last.block_reason == COOLDOWN
        parks.append(last.block)
    else:
        pytest.fail("never gave up")
    assert parks == [1.0, 2.0]  # the cool-down doubles
    assert table.host("h").given_up
    # A given-up host is left alone.
    assert table.on_failure("h", clock.advance(TICK)) is None
    assert table.on_success("h", clock.advance(TICK), FAST_LATENCY) is None


def test_zero_cooldowns_gives_up_at_the_first_spent_budget() -> None:
    table, clock = make(error_budget=2, error_max_cooldowns=0)
    first = table.on_failure("h", clock.advance(TICK))
    assert first is not None
    assert not first.give_up
    outcome = table.on_failure("h", clock.advance(TICK))
    assert outcome is not None
    assert outcome.give_up


def test_a_response_resets_failures_and_cooldowns() -> None:
    table, clock = make(error_budget=3, error_cooldown=1.0, error_max_cooldowns=1)
    for _ in range(2):
        table.on_failure("h", clock.advance(TICK))
    table.on_success("h", clock.advance(TICK), 1.0)  # the host answered, slowly
    for _ in range(2):
        outcome = table.on_failure("h", clock.advance(TICK))
        assert outcome is None or not outcome.parked
    outcome = table.on_failure("h", clock.advance(TICK))
    assert outcome is not None
    assert outcome.parked
    fast(table, clock)  # recovered: the next spent budget parks again
    for _ in range(3):
        outcome = table.on_failure("h", clock.advance(TICK))
    assert outcome is not None
    assert outcome.parked
    assert not outcome.give_up
    assert outcome.block == 1.0


def test_back_off_statuses_in_a_row_park_then_give_up_the_host() -> None:
    table, clock = make(
        backoff_base=1.0,
        backoff_max=100.0,
        error_budget=3,
        error_cooldown=1.5,
        error_max_cooldowns=1,
    )
    outcomes = [table.on_backoff("h", clock.advance(TICK), None) for _ in range(3)]
    assert all(o is not None and not o.parked for o in outcomes[:2])
    third = outcomes[2]
    assert third is not None
    assert third.parked
    assert not third.give_up
    assert third.block is not None
    # The longer of the back-off block (2-4 s) and the cool-down (1.5 s).
    assert 2.0 <= third.block <= 4.0
    # After the cool-down the back-off starts again from its base.
    outcome = table.on_backoff("h", clock.advance(TICK), None)
    assert outcome is not None
    assert outcome.block is not None
    assert 0.5 <= outcome.block <= 1.0
    outcome = table.on_backoff("h", clock.advance(TICK), None)
    assert outcome is not None
    assert not outcome.give_up
    outcome = table.on_backoff("h", clock.advance(TICK), None)
    assert outcome is not None
    assert outcome.give_up
    assert table.host("h").given_up
    assert table.on_backoff("h", clock.advance(TICK), 1.0) is None


def test_a_cool_down_longer_than_the_back_off_block_replaces_it() -> None:
    table, clock = make(error_budget=2, error_cooldown=30.0)
    table.on_backoff("h", clock.advance(TICK), 2.0)
    outcome = table.on_backoff("h", clock.advance(TICK), 2.0)
    assert outcome is not None
    assert outcome.parked
    assert (outcome.block, outcome.block_reason) == (30.0, COOLDOWN)
    # A Retry-After longer than the cool-down stays the server's word.
    clock.advance(31.0)
    table.on_backoff("h", clock.advance(TICK), 90.0)
    outcome = table.on_backoff("h", clock.advance(TICK), 90.0)
    assert outcome is not None
    assert outcome.parked
    assert (outcome.block, outcome.block_reason) == (90.0, RETRY_AFTER)


def test_back_offs_count_toward_the_error_budget_once_per_burst() -> None:
    table, clock = make(error_budget=2)
    starts = [clock.advance(TICK) for _ in range(4)]
    clock.advance(TICK)
    outcomes = [table.on_backoff("h", started, 1.0) for started in starts]
    assert not any(o is not None and o.parked for o in outcomes)
    assert table.host("h").failures == 1
    # Connection failures and back-offs add up; a response resets them.
    table.on_success("h", clock.advance(TICK), 0.1)
    table.on_backoff("h", clock.advance(TICK), 1.0)
    table.on_success("h", clock.advance(TICK), 0.1)
    outcome = table.on_failure("h", clock.advance(TICK))
    assert outcome is None or not outcome.parked
    outcome = table.on_backoff("h", clock.advance(TICK), 1.0)
    assert outcome is not None
    assert outcome.parked


def test_failures_of_requests_started_before_parking_do_not_count() -> None:
    table, clock = make(error_budget=2, error_cooldown=1.0, error_max_cooldowns=1)
    in_flight = [clock.advance(TICK) for _ in range(5)]
    table.on_failure("h", clock.advance(TICK))
    outcome = table.on_failure("h", clock.advance(TICK))
    assert outcome is not None
    assert outcome.parked
    for started in in_flight:
        outcome = table.on_failure("h", started)
        assert outcome is None or not outcome.give_up
    assert not table.host("h").given_up


# -- table ------------------------------------------------------------------


def test_the_table_is_bounded_lru() -> None:
    clock = FakeClock(1000.0)
    table = AimdTable(AimdSettings(start=2, ceiling=8), max_hosts=3, clock=clock)
    for host in ("a", "b", "c"):
        table.host(host)
    table.host("a")  # touched: "b" is now the oldest
    table.host("d")
    assert len(table) == 3
    assert "b" not in table
    assert {"a", "c", "d"} <= {h for h in ("a", "b", "c", "d") if h in table}


def test_a_host_ceiling_below_or_above_the_global_one() -> None:
    table, clock = make(start=4, ceiling=8)
    assert table.host("h", ceiling=3).limit == 3
    fast(table, clock, count=100)
    assert limit(table) == 3
    big = table.host("big", ceiling=20)
    assert (big.ceiling, big.limit) == (20, 4)
    fast(table, clock, "big", count=1000)
    assert limit(table, "big") == 20


# -- invariant ------------------------------------------------------------------

_EVENT = st.tuples(
    st.sampled_from(["fast", "medium", "slow", "backoff", "backoff-ra", "failure"]),
    st.floats(min_value=0.0, max_value=2.0),  # how long before now the request started
    st.floats(min_value=0.0, max_value=1.0),  # time passing after the outcome
)


@settings(max_examples=200, deadline=None)
@given(
    floor=st.integers(1, 4),
    extra=st.integers(0, 6),
    spread=st.integers(0, 6),
    events=st.lists(_EVENT, max_size=200),
)
def test_the_limit_always_stays_within_floor_and_ceiling(
    floor: int, extra: int, spread: int, events: list[tuple[str, float, float]]
) -> None:
    start, ceiling = floor + min(extra, spread), floor + spread
    table, clock = make(
        start=start,
        floor=floor,
        ceiling=ceiling,
        fast_latency=0.5,
        slow_latency=5.0,
        error_budget=3,
        error_max_cooldowns=2,
    )
    for kind, age, pause in events:
        started = clock.now - age
        before = table.host("h").limit
        if kind == "fast":
            outcome = table.on_success("h", started, 0.1)
        elif kind == "medium":
            outcome = table.on_success("h", started, 1.0)
        elif kind == "slow":
            outcome = table.on_success("h", started, 6.0)
        elif kind == "backoff":
            outcome = table.on_backoff("h", started, None)
        elif kind == "backoff-ra":
            outcome = table.on_backoff("h", started, 1.0)
        else:
            outcome = table.on_failure("h", started)
        after = table.host("h").limit
        assert floor <= after <= ceiling
        assert after - before <= 1  # additive: one at a time
        if outcome is not None:
            assert outcome.new_limit == after
            if outcome.block is not None:
                assert outcome.block >= 0
        clock.advance(pause)


# -- overdue requests ---------------------------------------------------------


def test_a_host_not_heard_from_is_overdue_after_the_slow_latency() -> None:
    table, _clock = make(fast_latency=0.5, slow_latency=SLOW_LATENCY)
    assert table.overdue_after("new") == SLOW_LATENCY


@pytest.mark.parametrize(
    ("latencies", "expected"),
    [
        ([0.02] * 20, 0.5),  # four times its usual 20 ms is below the floor
        ([0.3] * 40, pytest.approx(1.2, rel=0.05)),  # steady: about 4 x 0.3 s
        ([5.0] * 5, SLOW_LATENCY),  # capped at the slow latency
    ],
)
def test_overdue_time_follows_the_hosts_latency(latencies: list[float], expected: float) -> None:
    table, clock = make(fast_latency=0.5, slow_latency=SLOW_LATENCY)
    for latency in latencies:
        table.on_success("h", clock.advance(TICK), latency)
    assert table.overdue_after("h") == expected


def test_a_varying_latency_moves_the_overdue_time_up() -> None:
    steady, clock = make(fast_latency=0.1, slow_latency=SLOW_LATENCY)
    varying, _ = make(fast_latency=0.1, slow_latency=SLOW_LATENCY)
    for index in range(40):
        started = clock.advance(TICK)
        steady.on_success("h", started, 0.2)
        varying.on_success("h", started, 0.1 if index % 2 else 0.3)
    assert varying.overdue_after("h") > steady.overdue_after("h")


def test_an_overdue_request_decreases_once_per_burst_and_spends_no_budget() -> None:
    table, clock = make(start=8, error_budget=1)
    started = clock.advance(TICK)
    clock.advance(0.5)  # in flight since
    adjustment = table.on_overdue("h", started)
    assert adjustment is not None
    assert (adjustment.old_limit, adjustment.new_limit, adjustment.reason) == (8, 4, OVERDUE)
    # Another request of the same burst: no second decrease.
    assert table.on_overdue("h", started) is None
    # No failure counted: the budget of one would have parked the host.
    assert table.host("h").failures == 0
    assert table.on_overdue("h", clock.advance(TICK)).new_limit == 2  # type: ignore[union-attr]


# -- what a resumed crawl takes back -------------------------------------------


def test_what_was_learned_is_taken_back_by_a_new_table() -> None:
    table, clock = make(start=8, error_budget=5)
    table.on_success("h", clock.advance(TICK), 0.2)
    table.on_success("h", clock.advance(TICK), 0.3)
    table.on_backoff("h", clock.advance(TICK), None)  # 8 -> 4, one failure
    table.on_failure("h", clock.advance(TICK))  # 4 -> 2, level 4, a second failure in a row
    before = table.host("h")
    data = table.export("h")
    assert data is not None
    assert data["limit"] == 2

    again, _ = make(start=8, error_budget=5)
    restored = again.restore("h", data)
    assert restored.limit == 2
    assert restored.srtt == pytest.approx(before.srtt)
    assert restored.rttvar == pytest.approx(before.rttvar)
    assert restored.failures == before.failures == 2
    assert (restored.probe_level, restored.probe_penalty) == (4, PROBE_PENALTY)
    assert again.overdue_after("h") == pytest.approx(table.overdue_after("h"))
    # It goes on from there: three more failures spend the budget.
    clock2 = again.clock
    assert isinstance(clock2, FakeClock)
    for _ in range(3):
        adjustment = again.on_failure("h", clock2.advance(TICK))
    assert adjustment is not None and adjustment.parked


def test_an_unknown_host_has_nothing_to_export() -> None:
    table, _ = make()
    assert table.export("h") is None
    table.host("h")
    assert table.export("h") == {"limit": 2}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"limit": 50}, 8),  # the ceiling was lowered since
        ({"limit": 0}, 1),
        ({"limit": -3}, 2),  # unusable: the start
        ({"limit": "3"}, 2),
        ({"limit": float("nan")}, 2),
        ({"limit": 3, "unknown": 1.0}, 3),
    ],
)
def test_a_restored_limit_stays_within_the_rules_bounds(
    data: dict[str, float], expected: int
) -> None:
    table, _ = make()
    assert table.restore("h", data).limit == expected
    assert table.restore("k", {"limit": 6}, ceiling=4).limit == 4
