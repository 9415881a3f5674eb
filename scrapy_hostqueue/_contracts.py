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
* The download handler talks to the send gate
  (:class:`scrapy_hostqueue._sendgate.GateClient`), never to the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request
    from scrapy.http import Response

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


class HostControl(HostView, Protocol):
    """What the AIMD middleware asks of and tells the scheduler."""

    @property
    def prefetch(self) -> int: ...

    def attach_policy(self, hook: PolicyHook) -> None: ...

    def host_of(self, request: Request) -> str: ...

    def host_state(self, host: str) -> HostState:
        """Return the state of *host*, made known to the scheduler if it is not."""

    def inflight(self, host: str) -> int: ...

    def handed_out(self, request: Request) -> bool: ...

    def handed_out_for(self, request: Request) -> str | None: ...

    def given_up_host(self, request: Request) -> str | None: ...

    def host_given_up(self, host: str) -> bool: ...

    def is_full(self, host: str) -> bool: ...

    def note_full(self, host: str, now: float) -> None: ...

    def requeues(self, request: Request) -> int: ...

    def requeued(self, old: Request, new: Request) -> None: ...

    def answered(self, request: Request) -> str | None: ...

    def host_silent(self, host: str) -> None: ...

    def set_limit(self, host: str, limit: int) -> None: ...

    def block_until(self, host: str, when: float, reason: str) -> None: ...

    def set_interval(self, host: str, interval: float) -> None: ...

    def give_up(self, host: str) -> int: ...

    def direct_delay(self, host: str, now: float, *, spacing: bool = True) -> float: ...

    def has_room(self, host: str) -> bool: ...

    async def wait_for_room(self, host: str, timeout: float) -> bool: ...

    def adopt(self, request: Request, host: str, now: float) -> None: ...
