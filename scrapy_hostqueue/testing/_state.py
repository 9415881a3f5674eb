"""Per-host counters (:class:`HostState`) and their snapshot (:class:`HostStats`).

The server mutates a :class:`HostState` on its event loop; other threads read it
through :meth:`HostState.snapshot`, so every access holds the state's lock.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any

from scrapy_hostqueue.testing._spec import HostSpec

# Arrival timestamps kept per host; past this the list stops growing (min_gap,
# counts and everything else stay exact) so a long benchmark cannot eat memory.
MAX_ARRIVALS = 200_000
# Distinct page paths counted in ``HostStats.pages``, for the same reason.
MAX_PAGES = 100_000


def host_address(index: int) -> str:
    """Return the loopback address of host ``index``: 127.0.0.1 .. 127.0.0.254, 127.0.1.1, ...

    Every 127/8 address answers on Linux; ``.0`` and ``.255`` are skipped.
    """
    if index < 0:
        raise ValueError(f"host index must be >= 0, got {index}")
    block, octet = divmod(index, 254)
    if block >= 256 * 256:
        raise ValueError(f"host index {index} is beyond the 127/8 address space")
    return f"127.{block // 256}.{block % 256}.{octet + 1}"


@dataclass
class HostStats:
    """What one host has seen since start or the last reset (a snapshot).

    ``served`` counts page requests answered completely (every status; robots.txt
    is counted apart in ``robots_served``), ``statuses`` splits them by status. An
    answer is counted just before its last bytes go out, so a client that has read
    a whole answer always finds it counted. ``requests`` counts page request
    arrivals, so ``requests == served + resets + in_flight`` whenever no answer is
    being written. ``in_flight`` runs from a request's arrival until its
    response is completely written or its connection drops (:meth:`LocalHosts.wait_idle`
    waits for none to be). ``faults`` counts
    requests that got the spec's fault; ``resets`` counts page requests whose
    connection closed before their response was complete (a reset or truncate
    fault, or a client giving up on a hanging host). ``arrivals`` holds monotonic
    (``time.monotonic``) arrival times of page requests, ``min_gap`` the smallest
    gap between two consecutive ones. ``in_retry_after_window`` counts page requests
    that arrived while a ``Retry-After`` this host had sent was still running.
    ``connections`` counts connections accepted, ``open_connections`` those open
    now (they stay counted through a reset) and ``max_open_connections`` the most
    open at once.
    ``pages`` counts, per path, the page requests answered completely (``served``
    per page: a page fetched twice counts 2).
    """

    hostname: str
    port: int
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0
    served: int = 0
    robots_served: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    in_retry_after_window: int = 0
    min_gap: float | None = None
    arrivals: list[float] = field(default_factory=list)
    faults: int = 0
    resets: int = 0
    connections: int = 0
    open_connections: int = 0
    max_open_connections: int = 0
    pages: dict[str, int] = field(default_factory=dict)

    def to_dict(self, *, arrivals: bool = True) -> dict[str, Any]:
        """JSON-ready form (status keys become strings, as JSON requires)."""
        data = dataclasses.asdict(self)
        data["statuses"] = {str(code): count for code, count in self.statuses.items()}
        if not arrivals:
            del data["arrivals"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostStats:
        """Inverse of :meth:`to_dict`."""
        values = dict(data)
        values["statuses"] = {
            int(code): int(count) for code, count in values.get("statuses", {}).items()
        }
        return cls(**values)


@dataclass
class Ticket:
    """What the server decided for one page request at its arrival."""

    spec: HostSpec
    arrival: float
    throttled: bool
    faulted: bool


class HostState:
    """One host's spec and counters, shared by the server loop and readers."""

    def __init__(self, index: int, spec: HostSpec) -> None:
        self.index = index
        self.hostname = host_address(index)
        self.port = 0
        self._lock = threading.Lock()
        self._spec = spec
        self._stats = HostStats(self.hostname, 0)
        self._last_arrival: float | None = None
        self._eligible = 0  # page requests (pages, with fault_attempts) that could get the fault
        # With fault_attempts: the faults each page requested so far has left.
        self._faults_left: dict[str, int] = {}
        self._window_end = float("-inf")

    @property
    def spec(self) -> HostSpec:
        with self._lock:
            return self._spec

    @spec.setter
    def spec(self, spec: HostSpec) -> None:
        with self._lock:
            self._spec = spec

    def snapshot(self, *, arrivals: bool = True) -> HostStats:
        with self._lock:
            return dataclasses.replace(
                self._stats,
                port=self.port,
                statuses=dict(self._stats.statuses),
                pages=dict(self._stats.pages),
                arrivals=list(self._stats.arrivals) if arrivals else [],
            )

    def reset(self) -> None:
        """Zero every counter; requests still in flight stay counted as in flight."""
        with self._lock:
            in_flight = self._stats.in_flight
            opened = self._stats.open_connections
            self._stats = HostStats(
                self.hostname,
                self.port,
                in_flight=in_flight,
                max_in_flight=in_flight,
                open_connections=opened,
                max_open_connections=opened,
            )
            self._last_arrival = None
            self._eligible = 0
            self._faults_left.clear()
            self._window_end = float("-inf")

    def connection_opened(self) -> None:
        with self._lock:
            stats = self._stats
            stats.connections += 1
            stats.open_connections += 1
            stats.max_open_connections = max(stats.max_open_connections, stats.open_connections)

    def connection_closed(self) -> None:
        with self._lock:
            self._stats.open_connections = max(0, self._stats.open_connections - 1)

    def arrive(self, now: float, path: str = "/") -> Ticket:
        """Count a page request (for ``path``) arriving at monotonic time ``now``.

        Decide its fate.
        """
        with self._lock:
            stats = self._stats
            spec = self._spec
            stats.requests += 1
            stats.in_flight += 1
            stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
            if self._last_arrival is not None:
                gap = now - self._last_arrival
                if stats.min_gap is None or gap < stats.min_gap:
                    stats.min_gap = gap
            self._last_arrival = now
            if len(stats.arrivals) < MAX_ARRIVALS:
                stats.arrivals.append(now)
            if now < self._window_end:
                stats.in_retry_after_window += 1
            throttled = spec.throttle_above is not None and stats.in_flight > spec.throttle_above
            faulted = False
            if not throttled and spec.fault is not None:
                faulted = self._picked(spec, path)
                if faulted:
                    stats.faults += 1
        return Ticket(spec, now, throttled, faulted)

    def _picked(self, spec: HostSpec, path: str) -> bool:
        """Whether this page request gets the fault (see ``HostSpec.fault_attempts``)."""
        if spec.fault_attempts is None:
            self._eligible += 1
            return spec.faulted(self._eligible)
        left = self._faults_left.get(path)
        if left is None:
            if len(self._faults_left) >= MAX_PAGES:
                return False
            self._eligible += 1
            left = spec.fault_attempts if spec.faulted(self._eligible) else 0
        if left:
            self._faults_left[path] = left - 1
            return True
        self._faults_left[path] = 0
        return False

    def served(self, status: int, path: str | None = None) -> None:
        """Count a page request answered with ``status`` as served.

        A page request (for ``path``) is answered with ``status``: its last
        bytes go out next. Counted before they leave, so that a client that
        has read the whole answer finds it counted; it stays in flight until
        :meth:`finish`.
        """
        with self._lock:
            self._count_served(status, path, 1)

    def finish(
        self, status: int | None, path: str | None = None, *, counted: int | None = None
    ) -> None:
        """Count a page request (for ``path``) that left: answered with ``status``, or dropped.

        *counted*: the status :meth:`served` counted it with already, taken back if the answer was
        dropped after all.
        """
        with self._lock:
            stats = self._stats
            stats.in_flight = max(0, stats.in_flight - 1)
            if status is None:
                stats.resets += 1
                if counted is not None:
                    self._count_served(counted, path, -1)
            elif counted is None:
                self._count_served(status, path, 1)

    def _count_served(self, status: int, path: str | None, change: int) -> None:
        stats = self._stats
        stats.served += change
        stats.statuses[status] = stats.statuses.get(status, 0) + change
        if not stats.statuses[status]:
            del stats.statuses[status]
        if path is not None and (path in stats.pages or len(stats.pages) < MAX_PAGES):
            stats.pages[path] = stats.pages.get(path, 0) + change
            if not stats.pages[path]:
                del stats.pages[path]

    def robots_served(self) -> None:
        with self._lock:
            self._stats.robots_served += 1

    def open_retry_after_window(self, end: float) -> None:
        """Open a Retry-After window, which runs until monotonic time ``end``."""
        with self._lock:
            self._window_end = max(self._window_end, end)
