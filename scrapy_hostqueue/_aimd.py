"""The per-host AIMD rule, back-off and error budget.

Pure logic: no Scrapy or Twisted import, an injectable clock and random
source. :class:`AimdTable` turns what happened to one request (a fast or slow
success, a back-off status, a connection failure) into an
:class:`Adjustment` of its host: a new concurrency limit, a block, a give-up.
The caller (the middleware) applies it to the scheduler.

The rule, for a host with limit ``L``, floor ``F`` and ceiling ``C``:

* a success faster than ``fast_latency`` extends the host's run of fast
  successes if the host's limit was what held it back while the request was
  in flight (the caller says: ``limited``); one from a host with fewer
  requests in flight than its limit all along (held back by its delay, or
  with too little work queued) says nothing about a higher limit and leaves
  the run as it is. When the run reaches ``L * p`` the limit becomes
  ``min(L + 1, C)`` and the run restarts. ``p`` is 1, except when ``L + 1``
  would reach the level where the host last pushed back (``probe_level``):
  then ``p`` is a penalty, :data:`PROBE_PENALTY` at the first push-back at a
  level and multiplied by it (up to :data:`MAX_PROBE_PENALTY`) at each
  further push-back at that same level, or at a back-off status below it, so
  a host with a hard limit is probed ever more rarely instead of on every
  cycle (plain AIMD against a host that refuses its 4th concurrent request
  gets a 429 every few responses). A decrease at the floor leaves the level
  and penalty alone. A run at the old level that completes without push-back
  forgets it. A run is therefore about one round of the window at ``p = 1``;
* a success between the two latencies breaks the run; one slower than
  ``slow_latency`` is a decrease;
* a back-off status, a connection failure or timeout, and a request still
  in flight after :meth:`AimdTable.overdue_after` (overdue) are decreases;
* a decrease sets ``L = max(F, L // 2)``, at most once per burst: an outcome
  of a request that *started* before the last decrease is the same congestion
  seen again and changes nothing;
* a back-off status also blocks the host: for ``min(Retry-After,
  retry_after_max)`` when the header is usable, else for
  ``backoff_base * 2**k`` capped at ``backoff_max``, drawn uniformly in the
  upper half of that ("equal jitter"); ``k`` grows with each back-off block
  and returns to 0 after a response that is not a back-off, and at a
  cool-down;
* ``error_budget`` failures in a row park the host for
  ``error_cooldown * 2**(n - 1)`` (the ``n``-th cool-down in a row); the
  failure after ``error_max_cooldowns`` cool-downs gives the host up. A
  failure is a connection failure or timeout, or a back-off status counted
  once per burst as its decrease is: a host that answers nothing but 503 is
  given up as one that refuses connections is, instead of being waited for
  ever longer. A response that is not a back-off status resets the count of
  failures in a row and the cool-downs. Failures of requests that started
  before the host was parked do not count toward the next error budget.

What the rule learned about a host outlives the process with a frontier file:
:meth:`AimdTable.export` gives it as a small dict of numbers (the limit, the
smoothed latency, the error budget spent, the probe level), and
:meth:`AimdTable.restore` takes it back in a resumed crawl. Times (the last
decrease, the last park) are not kept: every request of the resumed crawl
starts after them.
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MAX_PROBE_PENALTY",
    "PROBE_PENALTY",
    "Adjustment",
    "AimdHost",
    "AimdSettings",
    "AimdTable",
]

#: How much longer a run must be before probing a level at which the host
#: pushed back once; each further push-back there multiplies it again.
PROBE_PENALTY = 4
#: A request is overdue after this many times its host's usual latency.
OVERDUE_FACTOR = 4
#: Weights of a new answer in the smoothed latency and in its deviation.
_SRTT_GAIN = 0.125
_RTTVAR_GAIN = 0.25
#: The largest factor by which a run is lengthened before such a probe.
MAX_PROBE_PENALTY = 64
_MAX_BACKOFF_EXPONENT = 60

# Reasons, as they appear in logs and stats keys.
FAST = "fast"
SLOW = "slow"
BACKOFF = "backoff"
ERROR = "error"
OVERDUE = "overdue"
# Block reasons.
RETRY_AFTER = "retry-after"
COOLDOWN = "error-cooldown"


@dataclass(frozen=True)
class AimdSettings:
    """The parameters of the rule (validated by ``HostQueueConfig``)."""

    start: int = 2
    floor: int = 1
    ceiling: int = 8
    fast_latency: float = 0.5
    slow_latency: float = 5.0
    retry_after_max: float = 300.0
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    error_budget: int = 5
    error_cooldown: float = 10.0
    error_max_cooldowns: int = 3


class AimdHost:
    """What the rule remembers about one host."""

    __slots__ = (
        "backoff_exponent",
        "ceiling",
        "chosen_ceiling",
        "cooldowns",
        "failures",
        "given_up",
        "last_backoff_block",
        "last_decrease",
        "limit",
        "parked_at",
        "probe_level",
        "probe_penalty",
        "rttvar",
        "run",
        "srtt",
        "warned",
    )

    def __init__(self, limit: int, ceiling: int) -> None:
        self.limit = limit
        self.ceiling = ceiling
        #: The ceiling was chosen for this host (the monitor's controls): it
        #: is kept with what the rule learned.
        self.chosen_ceiling = False
        self.run = 0
        self.last_decrease = float("-inf")
        self.probe_level = 0  # 0: no level known to push back
        self.probe_penalty = 1
        self.backoff_exponent = 0
        self.last_backoff_block = float("-inf")
        self.failures = 0
        self.cooldowns = 0
        self.parked_at = float("-inf")
        self.given_up = False
        self.warned = False  # the back-off WARNING was logged
        #: Smoothed latency of the host's answers and its mean deviation
        #: (None until the first answer), as TCP keeps a round-trip time.
        self.srtt: float | None = None
        self.rttvar = 0.0

    def __repr__(self) -> str:
        return (
            f"AimdHost(limit={self.limit}, ceiling={self.ceiling}, run={self.run}, "
            f"probe_level={self.probe_level}, probe_penalty={self.probe_penalty}, "
            f"failures={self.failures}, cooldowns={self.cooldowns}, given_up={self.given_up})"
        )


@dataclass
class Adjustment:
    """What the caller must apply to a host after one outcome."""

    host: str
    old_limit: int
    new_limit: int
    reason: str
    #: The outcome was a decrease (also at the floor, where the limit stays).
    decreased: bool = False
    #: Block the host for this many seconds from now (None: no new block).
    block: float | None = None
    block_reason: str | None = None
    #: The block is an error-budget cool-down.
    parked: bool = False
    #: The error budget is spent: drop the host's queued requests.
    give_up: bool = False
    #: Why it is given up, among the host's events.
    give_up_reason: str = "error-budget"
    #: The first back-off of this host (the caller warns once).
    first_backoff: bool = False

    @property
    def limit_changed(self) -> bool:
        return self.new_limit != self.old_limit


class AimdTable:
    """Per-host AIMD state.

    *max_hosts* bounds memory: past it, the least recently used host is
    forgotten and starts again from ``start`` if it comes back. ``None``: no
    bound of its own; the owner calls :meth:`forget` (the AIMD middleware
    does when the scheduler forgets a host, so that a host with work queued
    keeps its state however many hosts the crawl has). *clock* is monotonic
    time, the same clock the caller stamps request starts with.
    """

    def __init__(
        self,
        settings: AimdSettings,
        *,
        max_hosts: int | None = 10_000,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.max_hosts = None if max_hosts is None else max(1, max_hosts)
        self.clock = clock
        self._rng = rng or random.Random()
        self._hosts: OrderedDict[str, AimdHost] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hosts)

    def __contains__(self, key: str) -> bool:
        return key in self._hosts

    def get(self, key: str) -> AimdHost | None:
        """Return the state of *key* if known, without creating or touching it."""
        return self._hosts.get(key)

    def host(self, key: str, ceiling: int | None = None) -> AimdHost:
        """Return the state of *key*, created at ``start`` on first sight.

        *ceiling* replaces the global ceiling for this host, above or below
        it (a ``DOWNLOAD_SLOTS`` concurrency); it applies to a known host too.
        """
        s = self.settings
        host_ceiling = s.ceiling if ceiling is None else max(1, ceiling)
        state = self._hosts.get(key)
        if state is None:
            state = AimdHost(min(s.start, host_ceiling), host_ceiling)
            self._hosts[key] = state
            if self.max_hosts is not None:
                while len(self._hosts) > self.max_hosts:
                    self._hosts.popitem(last=False)
        else:
            self._hosts.move_to_end(key)
            if ceiling is not None:
                state.ceiling = host_ceiling
                state.limit = min(state.limit, host_ceiling)
        return state

    def set_ceiling(self, key: str, ceiling: int) -> AimdHost:
        """Set the ceiling of *key* (at least 1); its limit comes down to it if above.

        A ceiling chosen so (the monitor's controls) outlives the process with
        what the rule learned (see :meth:`export`).
        """
        state = self.host(key, ceiling)
        state.chosen_ceiling = True
        return state

    def forget(self, key: str) -> None:
        """Drop what is known about *key*; it starts again from ``start``."""
        self._hosts.pop(key, None)

    def export(self, key: str) -> dict[str, float] | None:
        """Return what the rule learned about *key*, as JSON numbers.

        What the rule learned about *key*, as numbers a JSON object holds
        (None if the host is unknown); fields at their starting value are
        left out.
        """
        state = self._hosts.get(key)
        if state is None:
            return None
        data: dict[str, float] = {"limit": state.limit}
        if state.srtt is not None:
            data["srtt"] = round(state.srtt, 6)
            data["rttvar"] = round(state.rttvar, 6)
        for name in _COUNTS:
            value = getattr(state, name)
            if value:
                data[name] = value
        if state.probe_penalty != 1:
            data["probe_penalty"] = state.probe_penalty
        if state.chosen_ceiling:
            data["ceiling"] = state.ceiling
        return data

    def restore(self, key: str, data: dict[str, float], ceiling: int | None = None) -> AimdHost:
        """Take back what :meth:`export` gave for *key* in the run before.

        Take back what :meth:`export` gave for *key* (in a resumed crawl):
        the host's state is made, or updated, from *data*. Values out of
        range (the settings changed since) are brought within the rule's
        bounds; unknown or unusable fields are ignored. *ceiling* as for
        :meth:`host`.
        """
        chosen = _count(data, "ceiling")
        if chosen is not None and chosen >= 1:
            state = self.set_ceiling(key, chosen)
        else:
            state = self.host(key, ceiling)
        s = self.settings
        limit = _count(data, "limit")
        if limit is not None:
            state.limit = min(state.ceiling, max(min(s.floor, state.ceiling), limit))
        srtt = _seconds(data, "srtt")
        if srtt is not None:
            state.srtt = srtt
            state.rttvar = _seconds(data, "rttvar") or 0.0
        for name in _COUNTS:
            value = _count(data, name)
            if value is not None:
                setattr(state, name, value)
        state.backoff_exponent = min(state.backoff_exponent, _MAX_BACKOFF_EXPONENT)
        penalty = _count(data, "probe_penalty")
        if penalty is not None:
            state.probe_penalty = min(MAX_PROBE_PENALTY, max(1, penalty))
        return state

    # -- outcomes --------------------------------------------------------

    def on_success(
        self, key: str, started: float, latency: float, limited: bool = True
    ) -> Adjustment | None:
        """Learn from a response that asks for no back-off.

        A response that is not a back-off status, *latency* seconds long,
        for a request that started at *started*. *limited*: the host had as
        many requests in flight as its limit at some moment while this one
        was in flight. None when nothing changed.
        """
        state = self.host(key)
        if state.given_up:
            return None
        state.failures = 0
        state.cooldowns = 0
        state.backoff_exponent = 0
        _observe_latency(state, latency)
        s = self.settings
        if latency > s.slow_latency:
            return self._decrease(key, state, started, SLOW)
        if latency >= s.fast_latency:
            state.run = 0
            return None
        if started < state.last_decrease:
            # Sent under the limit that just proved too high: no evidence
            # for a higher one.
            return None
        if not limited:
            # The host never used its whole limit meanwhile: a higher one
            # would not have been tried, so this answer cannot vouch for it.
            return None
        state.run += 1
        if state.limit >= state.ceiling:
            state.run = 0
            return None
        probing = state.probe_level and state.limit + 1 >= state.probe_level
        needed = state.limit * (state.probe_penalty if probing else 1)
        if state.run < needed:
            return None
        old = state.limit
        state.limit = old + 1
        state.run = 0
        if state.probe_level and state.limit > state.probe_level:
            # A whole run at the level that pushed back went through.
            state.probe_level = 0
            state.probe_penalty = 1
        return Adjustment(key, old, state.limit, FAST)

    def on_backoff(self, key: str, started: float, retry_after: float | None) -> Adjustment | None:
        """Learn from a back-off status (429, 503).

        *retry_after* is the parsed header (seconds, uncapped) or None when missing or unusable.
        """
        state = self.host(key)
        if state.given_up:
            return None
        adjustment = self._decrease(key, state, started, BACKOFF)
        # A new burst pushed back: it spends the error budget like a failure.
        counts = adjustment is not None and started >= state.parked_at
        if adjustment is None:
            adjustment = Adjustment(key, state.limit, state.limit, BACKOFF)
        if not state.warned:
            state.warned = True
            adjustment.first_backoff = True
        s = self.settings
        if retry_after is not None:
            # The server's own word; the scheduler only ever extends a block.
            adjustment.block = min(max(0.0, retry_after), s.retry_after_max)
            adjustment.block_reason = RETRY_AFTER
        elif started >= state.last_backoff_block:
            exponent = min(state.backoff_exponent, _MAX_BACKOFF_EXPONENT)
            ceiling = min(s.backoff_max, s.backoff_base * 2.0**exponent)
            adjustment.block = self._rng.uniform(ceiling / 2, ceiling)
            adjustment.block_reason = BACKOFF
            state.backoff_exponent += 1
            state.last_backoff_block = self.clock()
        # else: the request was in flight when the host was last blocked for
        # this burst; that block already covers it.
        if counts:
            state.failures += 1
            if state.failures >= s.error_budget:
                self._spend_budget(state, adjustment)
                # After the cool-down the host is probed afresh.
                state.backoff_exponent = 0
        return adjustment

    def overdue_after(self, key: str) -> float:
        """Seconds after which a request of *key* in flight is overdue.

        Four times the host's usual latency (smoothed latency plus four mean deviations), within
        ``[fast_latency, slow_latency]``; ``slow_latency`` for a host not heard from yet.
        """
        s = self.settings
        state = self._hosts.get(key)
        if state is None or state.srtt is None:
            return s.slow_latency
        usual = state.srtt + 4 * state.rttvar
        return min(s.slow_latency, max(s.fast_latency, OVERDUE_FACTOR * usual))

    def on_overdue(self, key: str, started: float) -> Adjustment | None:
        """Decrease the limit of *key* for a request still in flight past its overdue time.

        A request of *key* that started at *started* is still in flight
        after :meth:`overdue_after`: a decrease now, not at its timeout, so a
        host that hangs now and then does not pile up hung requests. The
        error budget is spent when (if) it fails.
        """
        state = self.host(key)
        if state.given_up:
            return None
        return self._decrease(key, state, started, OVERDUE)

    def on_failure(self, key: str, started: float) -> Adjustment | None:
        """Learn from a connection failure or timeout of a request started at *started*."""
        state = self.host(key)
        if state.given_up:
            return None
        adjustment = self._decrease(key, state, started, ERROR)
        if started < state.parked_at:
            return adjustment
        state.failures += 1
        if state.failures < self.settings.error_budget:
            return adjustment
        if adjustment is None:
            adjustment = Adjustment(key, state.limit, state.limit, ERROR)
        self._spend_budget(state, adjustment)
        return adjustment

    # -- internals -------------------------------------------------------

    def _spend_budget(self, state: AimdHost, adjustment: Adjustment) -> None:
        """Act on a spent error budget.

        Park the host, or give it up after ``error_max_cooldowns`` cool-downs. A longer block
        already in *adjustment* (a Retry-After) is kept.
        """
        s = self.settings
        state.failures = 0
        state.cooldowns += 1
        if state.cooldowns > s.error_max_cooldowns:
            state.given_up = True
            adjustment.give_up = True
            return
        exponent = min(state.cooldowns - 1, _MAX_BACKOFF_EXPONENT)
        cooldown = s.error_cooldown * 2.0**exponent
        if adjustment.block is None or cooldown >= adjustment.block:
            adjustment.block = cooldown
            adjustment.block_reason = COOLDOWN
        adjustment.parked = True
        state.parked_at = self.clock()

    def _decrease(
        self, key: str, state: AimdHost, started: float, reason: str
    ) -> Adjustment | None:
        if started < state.last_decrease:
            return None  # the same burst, already answered
        old = state.limit
        new = max(min(self.settings.floor, state.ceiling), old // 2)
        if new < old:
            # A push-back again at the remembered level, or a back-off status
            # below it (the host's real limit is lower still), is stronger
            # evidence; a decrease already at the floor says nothing new.
            level = state.probe_level
            if level and (old == level or (reason == BACKOFF and old < level)):
                state.probe_penalty = min(state.probe_penalty * PROBE_PENALTY, MAX_PROBE_PENALTY)
            else:
                state.probe_penalty = PROBE_PENALTY
            state.probe_level = old
        state.limit = new
        state.run = 0
        state.last_decrease = self.clock()
        return Adjustment(key, old, new, reason, decreased=True)


#: The counters :meth:`AimdTable.export` keeps (0 at the start).
_COUNTS = ("failures", "cooldowns", "probe_level", "backoff_exponent")


def _count(data: dict[str, float], name: str) -> int | None:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def _seconds(data: dict[str, float], name: str) -> float | None:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _observe_latency(state: AimdHost, latency: float) -> None:
    """Fold one answer's *latency* into the host's smoothed latency and deviation.

    This is the estimator TCP uses for its retransmission timeout.
    """
    if state.srtt is None:
        state.srtt = latency
        state.rttvar = latency / 2
        return
    state.rttvar += _RTTVAR_GAIN * (abs(state.srtt - latency) - state.rttvar)
    state.srtt += _SRTT_GAIN * (latency - state.srtt)
