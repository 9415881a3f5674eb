"""The scheduler's waits on Redis, what the monitor's "bound by Redis" reads."""

from __future__ import annotations

import pytest

from scrapy_hostqueue.frontier.redis._waits import SLOW_ANSWER, WINDOW, RedisWaits


def test_a_wait_counts_only_while_starved_and_asking() -> None:
    waits = RedisWaits()
    waits.sent(1.0, asks=True)  # a claim sent; the scheduler still has work
    waits.starved(2.0)  # now it has none
    assert waits.share(3.0) == pytest.approx(1.0 / WINDOW)
    waits.answered(4.0)  # the claim answered: 2 s waited
    waits.sent(5.0, asks=True)  # a claim while starved still
    waits.fed(5.5)  # work came from elsewhere (a new request kept here)
    waits.answered(6.0)
    waits.sent(6.5, asks=False)  # acknowledgements only: nothing to wait for
    waits.starved(7.0)
    waits.answered(8.0)
    assert waits.share(9.0) == pytest.approx(2.5 / WINDOW)
    # Past the window, the spells leave it.
    assert waits.share(2.0 + WINDOW + 1.0) == pytest.approx(1.5 / WINDOW)
    assert waits.share(5.5 + WINDOW) == 0.0
    assert waits.round_trip_p95() == 3.0


def test_redis_silent_or_away_counts_until_it_answers() -> None:
    waits = RedisWaits()
    assert waits.round_trip_p95() is None
    waits.starved(1.0)
    waits.sent(2.0, asks=False)
    # Not answered yet: silent only past SLOW_ANSWER.
    assert waits.silent_for(2.0 + SLOW_ANSWER / 2) == 0.0
    assert waits.silent_for(2.0 + SLOW_ANSWER) == SLOW_ANSWER
    waits.away(10.0)
    assert waits.silent_for(14.0) == 4.0
    assert waits.share(14.0) == pytest.approx(4.0 / WINDOW)
    waits.answered(15.0)
    assert waits.silent_for(15.0) == 0.0
    assert waits.share(15.0) == pytest.approx(5.0 / WINDOW)
    assert waits.share(100.0) == 0.0
