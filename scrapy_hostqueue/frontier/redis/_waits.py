"""How long this process waited on Redis: what the monitor's "bound by Redis" reads.

Pure logic, times given by the caller. The scheduler *waits on Redis* while
two things hold at once: it found nothing to hand out (the store's ``pop``
gave nothing, and has not handed anything out since), and it asked Redis for
work that has not come (a claim of hosts, a refill of a held host's window, a
push its window keeps: sent and not answered, or due while Redis is away or
still busy with an earlier exchange). :class:`RedisWaits` keeps those spells
over the last :data:`WINDOW` seconds, the round trips of the last exchanges,
and since when an exchange is unanswered.
"""

from __future__ import annotations

from collections import deque

__all__ = ["WINDOW", "RedisWaits"]

#: Seconds over which the share of time waiting is measured.
WINDOW = 10.0
#: Round trips kept, the last ones, for their 95th percentile.
ROUND_TRIPS = 128
#: Spells kept at most (a few per exchange that may bring work).
SPELLS = 4096
#: Seconds an exchange may go unanswered before Redis counts as away.
SLOW_ANSWER = 1.0


class RedisWaits:
    """The scheduler's waits on Redis, and Redis's round trips."""

    def __init__(self) -> None:
        #: Since when the scheduler found nothing to hand out (None: it did since).
        self.starved_since: float | None = None
        #: Since when an exchange that may bring work is unanswered, or Redis
        #: is away (None: answered).
        self.asked_since: float | None = None
        #: Since when Redis is away (None while it answers).
        self.away_since: float | None = None
        #: Since when an exchange is unanswered (None: none is).
        self.sent_since: float | None = None
        self._spells: deque[tuple[float, float]] = deque(maxlen=SPELLS)
        self._round_trips: deque[float] = deque(maxlen=ROUND_TRIPS)

    def starved(self, now: float) -> None:
        """Note that the scheduler found nothing to hand out at *now*."""
        if self.starved_since is None:
            self.starved_since = now

    def fed(self, now: float) -> None:
        """Note that the scheduler handed a request out at *now*."""
        self._end_spell(now)
        self.starved_since = None

    def ask(self, now: float) -> None:
        """Note that work was asked of Redis at *now* (or it went away)."""
        if self.asked_since is None:
            self.asked_since = now

    def sent(self, now: float, *, asks: bool) -> None:
        """Note that an exchange was sent at *now*; *asks*: it may bring work."""
        self.sent_since = now
        if asks:
            self.ask(now)

    def answered(self, now: float) -> None:
        """Note that the exchange sent last was answered at *now*."""
        self._end_spell(now)
        if self.sent_since is not None:
            self._round_trips.append(now - self.sent_since)
        self.asked_since = self.away_since = self.sent_since = None

    def away(self, now: float) -> None:
        """Note that Redis stopped answering at *now*: whatever may come from it waits."""
        if self.away_since is None:
            self.away_since = now
        self.sent_since = None
        self.ask(now)

    def silent_for(self, now: float) -> float:
        """Return the seconds Redis has not answered.

        Since it went away, or since an exchange it has left unanswered for
        :data:`SLOW_ANSWER` seconds or more; 0 while it answers.
        """
        if self.away_since is not None:
            return now - self.away_since
        if self.sent_since is not None and now - self.sent_since >= SLOW_ANSWER:
            return now - self.sent_since
        return 0.0

    def _spell_start(self) -> float | None:
        if self.starved_since is None or self.asked_since is None:
            return None
        return max(self.starved_since, self.asked_since)

    def _end_spell(self, now: float) -> None:
        start = self._spell_start()
        if start is not None and now > start:
            self._spells.append((start, now))

    def share(self, now: float) -> float:
        """Return the share of the last :data:`WINDOW` seconds spent waiting on Redis."""
        since = now - WINDOW
        spells = self._spells
        while spells and spells[0][1] <= since:
            spells.popleft()
        waited = sum(end - max(start, since) for start, end in spells)
        start = self._spell_start()
        if start is not None and now > start:
            waited += now - max(start, since)
        return min(1.0, waited / WINDOW)

    def round_trip_p95(self) -> float | None:
        """Return the 95th percentile of the last round trips, in seconds (None before one)."""
        if not self._round_trips:
            return None
        ordered = sorted(self._round_trips)
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
