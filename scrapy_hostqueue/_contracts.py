"""What the parts of scrapy-hostqueue need of one another, in one place.

The scheduler's hosts (``scrapy_hostqueue._hosts.Hosts``, which the
scheduler creates and exposes as ``scheduler.hosts``) own the request store
and the records of handed-out requests; the other parts see them only through
these Protocols:

* :class:`PolicyHook`: what the scheduler needs of the AIMD middleware.
* :class:`HostControl`: what the AIMD middleware needs of the scheduler
  (queries about a host and commands that change its state).
* :class:`HostView`: what the stats extension reads for its log line and
  timeline.
* :class:`HostCommands`: what the monitor's controls tell the scheduler.
* The download handler talks to the send gate
  (:class:`scrapy_hostqueue._sendgate.GateClient`), never to the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request
    from scrapy.http import Response

    from scrapy_hostqueue._aimd import Adjustment
    from scrapy_hostqueue._direct import DirectDownloads
    from scrapy_hostqueue.frontier import HostState


class PolicyHook(Protocol):
    """Hear of a host's limit, of a host forgotten, and of every response.

    The limit of a host the scheduler meets, the moment the scheduler
    forgets a host (so that what the middleware learned about it is kept
    exactly as long), and every downloaded response.
    """

    def initial_limit(self, host: str, configured: int) -> int: ...

    def forget_host(self, host: str) -> None: ...

    def learned(self, host: str) -> dict[str, float] | None:
        """Return what was learned about *host*, for a store that outlives the process.

        What was learned about *host* (a small dict of numbers a JSON
        object holds), for a store that outlives the process; None if
        nothing.
        """

    def relearn(self, host: str, data: dict[str, float]) -> None:
        """Take back what :meth:`learned` gave for *host* before a resume."""

    def learn(self, request: Request, response: Response) -> None: ...

    def set_ceiling(self, host: str, ceiling: int) -> int:
        """Set *host*'s ceiling (the monitor's controls); return its limit under it."""

    def overdue_after(self, host: str) -> float:
        """Seconds after which a request of *host* in flight is overdue."""

    def overdue(self, request: Request, host: str, seconds: float) -> None:
        """*request* has been in flight *seconds*, past its host's overdue time."""


class HostView(Protocol):
    """Read-only view of the hosts, for stats and diagnostics."""

    @property
    def active_hosts(self) -> int: ...

    @property
    def queued_requests(self) -> int: ...

    def hosts(self) -> Iterator[tuple[str, int, int, HostState]]:
        """``(host, queued, in flight, state)`` of every live host."""

    def known_state(self, host: str) -> HostState | None: ...

    def in_flight_cap(self, state: HostState) -> int: ...

    def on_wire(self, host: str) -> int: ...

    def overdue(self, host: str) -> int: ...

    def sent_back_from_gate(self, request: Request) -> bool: ...

    def redis_figures(self) -> dict[str, Any] | None:
        """How much Redis holds this process back (None off the Redis frontier)."""


class HostControl(Protocol):
    """What the AIMD middleware asks of and tells the scheduler.

    A few queries about a request or a host, one command per decision of the AIMD
    rule (:meth:`adjust`), the Crawl-delay's spacing, and the room for
    requests that did not come from the scheduler (:attr:`direct`).
    """

    @property
    def direct(self) -> DirectDownloads:
        """Room for requests that reach the downloader without the scheduler."""

    def attach_policy(self, hook: PolicyHook) -> None:
        """Let *hook* choose the limit of every host, those known already included."""

    def host_of(self, request: Request) -> str: ...

    def host_state(self, host: str) -> HostState:
        """Return the state of *host*, made known to the scheduler if it is not."""

    def known_state(self, host: str) -> HostState | None: ...

    def handed_out_for(self, request: Request) -> str | None:
        """Return the host *request* was handed out for, None if it was not."""

    def given_up_host(self, request: Request) -> str | None:
        """Return the host of *request* if it was handed out only to fail."""

    def requeues(self, request: Request) -> int: ...

    def requeued(self, old: Request, new: Request) -> None: ...

    def note_full(self, host: str, now: float) -> None: ...

    def held_back_since(self, host: str, started: float) -> bool:
        """Whether *host* had its whole limit in flight since *started*."""

    def held_below_limit(self, host: str) -> bool:
        """Whether *host* is held below a limit with room by its in-flight cap.

        The cap is one request at a time while the host is silent, or its share.
        """

    def answered(self, request: Request) -> str | None: ...

    def host_silent(self, host: str) -> None: ...

    def adjust(self, adjustment: Adjustment, now: float) -> int:
        """Apply the AIMD rule's *adjustment* (limit, block, give-up).

        Returns the number of queued requests given up.
        """

    def block_until(self, host: str, when: float, reason: str) -> None: ...

    def set_interval(self, host: str, interval: float) -> None: ...


class HostCommands(Protocol):
    """What the monitor's controls tell the scheduler's hosts (and ask of them).

    A block, its end, a ceiling, giving a host up, pausing the crawl: each
    through the verbs the AIMD middleware uses, so that the page shows them
    like any other decision.
    """

    paused: bool

    def known_state(self, host: str) -> HostState | None: ...

    @property
    def fails_given_up(self) -> bool:
        """Whether the requests of a host given up go to their errbacks (the AIMD middleware)."""

    def holds(self, host: str) -> bool:
        """Whether this process works *host* now (queued or in flight here)."""

    def unblock(self, host: str) -> None: ...

    def set_ceiling(self, host: str, ceiling: int, now: float) -> tuple[int, int]:
        """Set *host*'s ceiling; return its limit before and after."""

    def adjust(self, adjustment: Adjustment, now: float) -> int: ...

    def pause(self, paused: bool) -> None:
        """Hand out no request while *paused*; the requests in flight finish."""
