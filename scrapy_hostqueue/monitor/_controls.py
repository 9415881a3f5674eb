"""The monitor's controls: block, unblock, ceiling, give up; pause and resume.

Opt-in (``HOSTQUEUE_MONITOR_CONTROLS``). The page posts one control at a time
to ``/control``; :func:`parse_control` checks what it posted, and
:class:`Controller` applies it to this process's hosts through the verbs the
AIMD middleware uses (``scrapy_hostqueue._contracts.HostCommands``), so that a
block shows with its reason (:data:`MONITOR`) and time left like any other, a
ceiling keeps the AIMD limit at or below it, and a host given up has its
requests fail and counted as any host given up. On the Redis frontier a
control for a host another process holds goes to it through Redis
(``_shared``). No Scrapy import.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_hostqueue._aimd import Adjustment

if TYPE_CHECKING:
    from scrapy_hostqueue._contracts import HostCommands
    from scrapy_hostqueue._recorder import HostStatsRecorder

#: The reason of what the controls do, among a host's blocks and events.
MONITOR = "monitor"
#: Longest block a control may set (seconds: a week), highest ceiling.
MAX_BLOCK = 7 * 86_400.0
MAX_CEILING = 10_000
BLOCK = "block"
UNBLOCK = "unblock"
CEILING = "ceiling"
GIVE_UP = "give-up"
PAUSE = "pause"
RESUME = "resume"
HOST_ACTIONS = (BLOCK, UNBLOCK, CEILING, GIVE_UP)
ACTIONS = (*HOST_ACTIONS, PAUSE, RESUME)


class BadControl(ValueError):
    """A control that cannot be applied; its message says why, for the page."""


@dataclass(frozen=True)
class Control:
    """One control: its action, its host (host actions only) and value.

    The value is the block's seconds, or the ceiling.
    """

    action: str
    host: str = ""
    value: float = 0.0

    def describe(self) -> str:
        """Say what the control asks, in a few words (the audit line's)."""
        if self.action == BLOCK:
            return f"block host {self.host} for {self.value:g}s"
        if self.action == CEILING:
            return f"set the ceiling of host {self.host} to {int(self.value)}"
        if self.action in HOST_ACTIONS:
            return f"{self.action.replace('-', ' ')} host {self.host}"
        return f"{self.action} the crawl"

    def as_dict(self) -> dict[str, Any]:
        """Return the fields :func:`parse_control` reads back into this control."""
        fields: dict[str, Any] = {"action": self.action}
        if self.action in HOST_ACTIONS:
            fields["host"] = self.host
        if self.action == BLOCK:
            fields["seconds"] = self.value
        elif self.action == CEILING:
            fields["ceiling"] = int(self.value)
        return fields


def _number(fields: Mapping[str, Any], name: str, low: float, high: float) -> float:
    raw = fields.get(name)
    if raw is None or raw == "":
        raise BadControl(f"{name} is missing")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise BadControl(f"{name} must be a number, got {str(raw)[:40]!r}") from None
    if isinstance(raw, bool) or not math.isfinite(value) or not low <= value <= high:
        raise BadControl(f"{name} must be between {low:g} and {high:g}, got {str(raw)[:40]}")
    return value


def parse_control(fields: Mapping[str, Any]) -> Control:
    """Return the control *fields* (a form or JSON object) asks for.

    Raises :class:`BadControl` with a message for the page.
    """
    action = fields.get("action")
    if action is None:
        raise BadControl(f"action is missing: one of {', '.join(ACTIONS)}")
    if action not in ACTIONS:
        raise BadControl(f"unknown action {str(action)[:40]!r}: one of {', '.join(ACTIONS)}")
    if action not in HOST_ACTIONS:
        return Control(action)
    host = fields.get("host")
    if not isinstance(host, str) or not host.strip():
        raise BadControl(f"{action} needs a host")
    host = host.strip()
    if action == BLOCK:
        return Control(action, host, _number(fields, "seconds", 0.001, MAX_BLOCK))
    if action == CEILING:
        value = _number(fields, "ceiling", 1, MAX_CEILING)
        if value != int(value):
            raise BadControl(f"ceiling must be a whole number, got {value:g}")
        return Control(action, host, int(value))
    return Control(action, host)


class Controller:
    """Applies controls to this process's hosts.

    *clock* is the monotonic clock the hosts' blocks are in.
    """

    def __init__(
        self,
        hosts: HostCommands,
        recorder: HostStatsRecorder,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hosts = hosts
        self.recorder = recorder
        self.clock = clock

    def apply(self, control: Control, *, until: float | None = None) -> str:
        """Apply *control*; returns what it did, in words.

        *until*: a block's end on the wall clock (one given in another
        process), instead of its seconds from now. Raises :class:`BadControl`
        for a host this process does not know.
        """
        hosts = self.hosts
        if control.action == PAUSE:
            hosts.pause(True)
            return "paused: no new request is handed out; those in flight finish"
        if control.action == RESUME:
            hosts.pause(False)
            return "resumed"
        host = control.host
        state = hosts.known_state(host)
        if state is None:
            raise BadControl(f"unknown host {host!r}")
        now = self.clock()
        if control.action == BLOCK:
            seconds = control.value if until is None else until - time.time()
            if seconds <= 0:
                return "the block had ended"
            when = now + seconds
            if state.blocked_until >= when:
                left = state.blocked_until - now
                return f"already blocked longer: {left:.1f}s left ({state.block_reason})"
            limit = state.limit
            hosts.adjust(
                Adjustment(host, limit, limit, MONITOR, block=seconds, block_reason=MONITOR), now
            )
            return f"blocked for {seconds:.1f}s"
        if control.action == UNBLOCK:
            if state.blocked_until <= now:
                return "it was not blocked"
            reason = state.block_reason
            hosts.unblock(host)
            self.recorder.unblocked(host, MONITOR)
            return f"unblocked (it was blocked by {reason})"
        if control.action == CEILING:
            old, new = hosts.set_ceiling(host, int(control.value), now)
            return f"ceiling {int(control.value)}: limit {old} -> {new}"
        # GIVE_UP
        if not hosts.fails_given_up:
            raise BadControl("giving a host up needs the AIMD middleware, which fails its requests")
        if state.given_up:
            return "it was given up already"
        limit = state.limit
        dropped = hosts.adjust(
            Adjustment(host, limit, limit, MONITOR, give_up=True, give_up_reason=MONITOR), now
        )
        return f"given up: {dropped} queued request(s) go to their errbacks with HostGivenUp"
