"""robots.txt ``Crawl-delay``: read, kept per host, and turned into spacing.

Pure logic: no Scrapy or Twisted import. The AIMD middleware feeds
:class:`CrawlDelays` with each parsed robots.txt (Scrapy's ``robots_parsed``
signal), asks it how long a request of a host must still wait, and tells it
when one starts; the scheduler's hosts get the delay as the host's interval
between starts (:func:`interval_for`) and a block while the requests handed
out before the delay was known go back to the scheduler.
"""

from __future__ import annotations

from typing import Protocol

#: Seconds added to a Crawl-delay: the time from the scheduler's hand-out to
#: the wire varies by a few tens of milliseconds on a busy event loop, and a
#: Crawl-delay is a minimum at the server.
CRAWL_DELAY_MARGIN = 0.05
#: The block reason (and requeue reason) of a Crawl-delay.
CRAWL_DELAY_REASON = "crawl-delay"


class RobotRules(Protocol):
    """What is read of a parsed robots.txt (Scrapy's ``RobotParser``)."""

    def crawl_delay(self, user_agent: str | bytes) -> float | None: ...


def asked_delay(rules: RobotRules, user_agent: str | bytes) -> float | None:
    """Return the Crawl-delay *rules* give *user_agent*, in seconds.

    None if there is none or it is no number.
    """
    delay = rules.crawl_delay(user_agent)
    if delay is None:
        return None
    try:
        return float(delay)
    except (TypeError, ValueError):
        return None


def interval_for(delay: float, interval: float, jitter: float) -> float | None:
    """Return the interval between starts that obeys a Crawl-delay of *delay*.

    For a host spaced by *interval* (with *jitter*); None if its interval
    already spaces requests at least as much. A Crawl-delay is a minimum: the
    new interval is meant to go without jitter.
    """
    wanted = delay + CRAWL_DELAY_MARGIN
    if wanted <= interval * (1 - jitter):
        return None
    return max(wanted, interval)


class _Delay:
    __slots__ = ("delay", "last_sent")

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.last_sent = float("-inf")


class CrawlDelays:
    """The Crawl-delay of every host that has one, for the whole crawl.

    Scrapy parses a site's robots.txt once per crawl (and keeps every
    parser), so a delay forgotten here would never come back. robots.txt is
    per netloc (with port), hosts are per hostname: the strictest Crawl-delay
    among a host's ports wins.
    """

    def __init__(self) -> None:
        self._delays: dict[str, _Delay] = {}

    def __bool__(self) -> bool:
        return bool(self._delays)

    def learn(self, host: str, seconds: float, now: float) -> tuple[float, bool]:
        """Record that *host*'s robots.txt asks for *seconds* between requests.

        Read at *now*: the fetch of robots.txt counts as the previous request.
        Returns the host's delay and whether the host had none before.
        """
        entry = self._delays.get(host)
        new = entry is None
        if entry is None:
            entry = self._delays[host] = _Delay(seconds)
        else:
            entry.delay = max(entry.delay, seconds)
        entry.last_sent = max(entry.last_sent, now)
        return entry.delay, new

    def delay(self, host: str) -> float | None:
        """*host*'s Crawl-delay, or None."""
        entry = self._delays.get(host)
        return None if entry is None else entry.delay

    def wait(self, host: str, now: float) -> float:
        """Return the seconds a request of *host* must still wait after the last one.

        Negative or 0: none.
        """
        entry = self._delays.get(host)
        if entry is None:
            return 0.0
        return entry.last_sent + entry.delay - now

    def sent(self, host: str, now: float) -> None:
        """Record that a request of *host* went on its way to the host at *now*."""
        entry = self._delays.get(host)
        if entry is not None:
            entry.last_sent = now


__all__ = [
    "CRAWL_DELAY_MARGIN",
    "CRAWL_DELAY_REASON",
    "CrawlDelays",
    "RobotRules",
    "asked_delay",
    "interval_for",
]
