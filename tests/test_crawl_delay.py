"""The Crawl-delay rule (pure).

What robots.txt asks, the strictest of a host's ports, the wait after the
last request and the interval it needs.
"""

from __future__ import annotations

import pytest

from scrapy_hostqueue._crawl_delay import (
    CRAWL_DELAY_MARGIN,
    CrawlDelays,
    asked_delay,
    interval_for,
)


class Rules:
    def __init__(self, delay: object) -> None:
        self.delay = delay
        self.asked: list[str | bytes] = []

    def crawl_delay(self, user_agent: str | bytes) -> float | None:
        self.asked.append(user_agent)
        return self.delay  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, None), (2, 2.0), ("1.5", 1.5), ("soon", None), (object(), None)],
)
def test_asked_delay_is_a_number_or_none(given: object, expected: float | None) -> None:
    rules = Rules(given)
    assert asked_delay(rules, "bot") == expected
    assert rules.asked == ["bot"]


def test_the_strictest_delay_of_a_hosts_ports_wins_and_the_fetch_counts_as_sent() -> None:
    delays = CrawlDelays()
    assert not delays
    assert delays.delay("a") is None
    assert delays.wait("a", 100.0) == 0.0
    assert delays.learn("a", 2.0, 100.0) == (2.0, True)
    assert delays
    assert delays.learn("a", 1.0, 101.0) == (2.0, False)
    assert delays.learn("a", 3.0, 100.5) == (3.0, False)
    # The last fetch, not an earlier one, counts as the previous request.
    assert delays.wait("a", 102.0) == pytest.approx(2.0)
    delays.sent("a", 103.5)
    assert delays.wait("a", 104.0) == pytest.approx(2.5)
    assert delays.wait("a", 107.0) < 0
    delays.sent("b", 1.0)  # no delay: nothing kept
    assert delays.delay("b") is None


@pytest.mark.parametrize(
    ("delay", "interval", "jitter", "expected"),
    [
        (1.0, 0.0, 0.5, 1.0 + CRAWL_DELAY_MARGIN),
        # DOWNLOAD_DELAY spaces at least as much, even at its shortest.
        (1.0, 3.0, 0.5, None),
        # At its shortest (jitter) it would start requests too soon: the
        # longer interval stays, without jitter.
        (1.0, 1.5, 0.5, 1.5),
        (2.0, 1.0, 0.0, 2.0 + CRAWL_DELAY_MARGIN),
    ],
)
def test_interval_for_a_crawl_delay(
    delay: float, interval: float, jitter: float, expected: float | None
) -> None:
    assert interval_for(delay, interval, jitter) == (
        None if expected is None else pytest.approx(expected)
    )
