"""The send gate: the per-host on-the-wire limit the download handler keeps.

With ``HOSTQUEUE_PREFETCH`` the scheduler hands a host up to that many
requests beyond its limit, so that the next one already waits next to the
connection pool when a response completes, instead of crossing the engine
first. The download handler asks the gate (:meth:`SendGate.acquire`) just
before sending; the gate lets a request through when its host has fewer
requests on the wire than it may have, its block is over and its interval
since the last send has passed. It frees the place when the handler has read
the response (:meth:`SendGate.body_read`), or, for a back-off status or an
error, when the request leaves the downloader: by then the AIMD middleware has
blocked the host for its Retry-After, before the next request may go.

The handler finds the gate of its crawler with :func:`gate_of` and talks to it
through :class:`GateClient`; it never sees the scheduler.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Protocol

from scrapy.utils.asyncio import call_later
from scrapy.utils.misc import load_object

from scrapy_hostqueue._requests import RequestTable, count_down
from scrapy_hostqueue.exceptions import HostBlocked

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.utils.asyncio import CallLaterResult

    from scrapy_hostqueue._recorder import HostStatsRecorder
    from scrapy_hostqueue.frontier import HostState, RequestStore


class UsesSendGate:
    """Marks a download handler that asks the send gate before it sends (:func:`gate_of`).

    The scheduler hands such a handler's hosts ``HOSTQUEUE_PREFETCH`` requests beyond their limit.
    """


class GateClient(Protocol):
    """What the download handler needs of the send gate."""

    async def acquire(self, request: Request) -> None:
        """Wait until *request*'s host may have one more request on the wire."""

    def headers_sent(self, request: Request) -> None:
        """Hear that the handler writes *request*'s headers to the host now."""

    def status_read(self, request: Request, status: int) -> None:
        """Hear that the handler has read *request*'s status line."""

    def body_read(self, request: Request, status: int) -> None:
        """Hear that the handler has read *request*'s whole response."""

    def host_busy(self, host: str) -> bool:
        """Whether *host* has requests in flight (keep its idle connections)."""


def handlers_gate_sends(crawler: Crawler) -> bool:
    """Whether the http and https handlers ask the send gate before sending.

    Such a handler is a :class:`~scrapy_hostqueue._sendgate.UsesSendGate` (this project's handler
    is); prefetch needs one to hold the limit.
    """
    handlers = crawler.settings.getwithbase("DOWNLOAD_HANDLERS")
    for scheme in ("http", "https"):
        path = handlers.get(scheme)
        if not path:
            return False
        try:
            cls = load_object(path) if isinstance(path, str) else path
        except (ImportError, NameError, ValueError):
            return False
        if not (isinstance(cls, type) and issubclass(cls, UsesSendGate)):
            return False
    return True


_gates: weakref.WeakKeyDictionary[Crawler, SendGate] = weakref.WeakKeyDictionary()


def gate_of(crawler: Crawler) -> GateClient | None:
    """Return the send gate of *crawler*'s scheduler, or None.

    The send gate of *crawler*'s scheduler, or None if it has none (another
    scheduler, or not open yet).
    """
    return _gates.get(crawler)


def gate_opens_at(state: HostState) -> float:
    """When the gate may let the host's next request onto the wire.

    Not before its block ends, nor before the shortest gap its interval allows
    (``DOWNLOAD_DELAY``, Crawl-delay; the jitter's low end) since the last
    request it let through. A request handed out on time may have had to wait
    for room on the wire, so the gap between hand-outs is not enough.
    """
    gap = state.interval * max(0.0, 1.0 - state.jitter) if state.interval else 0.0
    return max(state.blocked_until, state.last_sent + gap)


class SendGate:
    """Per-host room on the wire, when prefetch is on.

    For the requests :class:`HostQueueScheduler` handed out (or counted, see
    ``adopt``).

    *may_send_back* says whether a request held at the gate by a block may go
    back to the scheduler (:class:`HostBlocked`) instead of waiting there;
    *room_changed* is called when a host's room may have grown.
    """

    def __init__(
        self,
        store: RequestStore[Request],
        records: RequestTable,
        recorder: HostStatsRecorder,
        *,
        enabled: bool,
        backoff_codes: Collection[int],
        may_send_back: Callable[[Request], bool],
        room_changed: Callable[[str], None],
        notes_status: bool = False,
    ) -> None:
        self.store = store
        self.records = records
        self.recorder = recorder
        self.enabled = enabled
        self.backoff_codes = backoff_codes
        self.may_send_back = may_send_back
        self.room_changed = room_changed
        #: Whether to remember the last status read (see take_status_read).
        self.notes_status = notes_status
        self._sending: dict[str, int] = {}
        # Hosts with requests whose back-off status (429, 503) the handler
        # has read and which have not left the downloader yet, and how many:
        # such a host sends nothing more until the AIMD middleware blocked it.
        self._backing_off_hosts: dict[str, int] = {}
        self._waiters: dict[str, deque[tuple[asyncio.Future[None], Request]]] = {}
        self._timers: dict[str, CallLaterResult] = {}
        # The request whose status the handler read last and whether it asks
        # to back off, for the headers_received signal it sends next.
        self._status_read: tuple[Request, bool] | None = None

    def register(self, crawler: Crawler) -> None:
        _gates[crawler] = self

    def unregister(self, crawler: Crawler) -> None:
        if _gates.get(crawler) is self:
            del _gates[crawler]
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    # -- GateClient ------------------------------------------------------

    async def acquire(self, request: Request) -> None:
        if not self.enabled:
            return
        record = self.records.handed_out(request)
        if record is None or record.on_wire:
            return
        host = record.host
        waiters = self._waiters.get(host)
        if not waiters and self.may_send(host):
            self.take(host, request)
            return
        state = self.store.host_state(host)
        if state.blocked_until > time.monotonic() and self.may_send_back(request):
            raise self._send_back(request, host, state.block_reason)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if waiters is None:
            waiters = self._waiters[host] = deque()
        waiters.append((future, request))
        self.open(host)
        await future

    def headers_sent(self, request: Request) -> None:
        """Count the host's interval from now, when *request* really goes out.

        The gate let it through a moment earlier; opening a connection (a round
        trip, more with TLS) or a busy event loop may come in between, and
        counted from the gate the next request would reach the host that much
        less than the interval after this one.
        """
        record = self.records.get(request)
        if record is None or not record.on_wire:
            return
        state = self.store.host_state(record.host)
        state.last_sent = max(state.last_sent, time.monotonic())

    def status_read(self, request: Request, status: int) -> None:
        """Close the host's gate at once on a status that asks it to back off (429, 503).

        A silent host gets its limit at its first headers, and a slow or large body must not let its
        limit through before the AIMD middleware has blocked the host.
        """
        backoff = status in self.backoff_codes
        if self.notes_status:
            self._status_read = (request, backoff)
        record = self.records.get(request)
        if record is None:
            return
        # Answered: a long body is not a hung request.
        record.sent_at = None
        if backoff and record.on_wire:
            self._hold_back(request)

    def body_read(self, request: Request, status: int) -> None:
        """Take the request off the wire now, unless its status asks the host to back off.

        This happens before the response crosses the downloader middlewares. A
        host asked to back off sends nothing until that request leaves the
        downloader.
        """
        record = self.records.get(request)
        if record is None or not record.on_wire or record.backing_off:
            return
        if status in self.backoff_codes:
            self._hold_back(request)
        else:
            self.off_the_wire(request)

    def host_busy(self, host: str) -> bool:
        return self.store.in_flight(host) > 0

    # -- the scheduler's side --------------------------------------------

    def take_status_read(self, request: Request) -> bool | None:
        """Whether *request*'s status, read last by the handler, asks to back off.

        None if the handler did not read it last.
        """
        read = self._status_read
        if read is None or read[0] is not request:
            return None
        self._status_read = None
        return read[1]

    def forget_status(self, request: Request) -> None:
        """*request* left without its headers_received (a body over ``DOWNLOAD_MAXSIZE``)."""
        if self._status_read is not None and self._status_read[0] is request:
            self._status_read = None

    def on_wire(self, host: str) -> int:
        return self._sending.get(host, 0)

    def holding(self) -> Iterator[tuple[str, int, int]]:
        """List the hosts with requests waiting here or on the wire.

        ``(host, waiting, on the wire)`` of every host with requests
        waiting here or past the gate and not done (O(hosts): for a crawl's
        close).
        """
        for host in self._waiters.keys() | self._sending.keys():
            waiters = self._waiters.get(host, ())
            waiting = sum(not future.done() for future, _ in waiters)
            yield host, waiting, self._sending.get(host, 0)

    def may_send(self, host: str) -> bool:
        state = self.store.host_state(host)
        return (
            self._sending.get(host, 0) < self.store.in_flight_cap(state)
            and gate_opens_at(state) <= time.monotonic()
            and host not in self._backing_off_hosts
        )

    def take(self, host: str, request: Request) -> None:
        self._sending[host] = self._sending.get(host, 0) + 1
        now = time.monotonic()
        self.records.put_on_wire(request, now)
        self.store.host_state(host).last_sent = now

    def off_the_wire(self, request: Request) -> None:
        """Take *request* off the wire (answered, or gone): its host has room for another."""
        record = self.records.get(request)
        if record is None or not record.on_wire:
            return
        host = record.host
        record.on_wire = False
        if record.backing_off:
            record.backing_off = False
            count_down(self._backing_off_hosts, host)
        self.recorder.in_flight_seen(host, self.on_wire(host))
        count_down(self._sending, host)
        self.room_changed(host)

    def open(self, host: str) -> None:
        """Let through the waiters of *host* it may send now.

        Come back when its block or interval ends.
        """
        waiters = self._waiters.get(host)
        while waiters and self.may_send(host):
            future, request = waiters.popleft()
            if not future.done():  # a cancelled download gave up its turn
                self.take(host, request)
                future.set_result(None)
        if not waiters:
            self._waiters.pop(host, None)
            return
        opens_at = gate_opens_at(self.store.host_state(host))
        if opens_at > time.monotonic() and host not in self._timers:
            self._timers[host] = call_later(opens_at - time.monotonic(), self._timer, host)

    def blocked(self, host: str, when: float, reason: str) -> None:
        """Send *host*'s waiting requests back: it got blocked until *when*.

        They go back to the scheduler (see :class:`HostBlocked`) rather than wait
        for the block's end, holding part of the global limit and keeping the
        crawl open.
        """
        waiters = self._waiters.get(host)
        if not waiters or when <= time.monotonic():
            return
        staying: deque[tuple[asyncio.Future[None], Request]] = deque()
        for future, request in waiters:
            if future.done():  # a cancelled download
                continue
            if self.may_send_back(request):
                future.set_exception(self._send_back(request, host, reason))
            else:
                staying.append((future, request))
        if staying:
            self._waiters[host] = staying
        else:
            del self._waiters[host]

    # -- internals ---------------------------------------------------------

    def _timer(self, host: str) -> None:
        self._timers.pop(host, None)
        self.open(host)

    def _hold_back(self, request: Request) -> None:
        record = self.records.get(request)
        if record is None or record.backing_off:
            return  # its status read again (a download sent once more)
        record.backing_off = True
        host = record.host
        self._backing_off_hosts[host] = self._backing_off_hosts.get(host, 0) + 1

    def _send_back(self, request: Request, host: str, reason: str | None) -> HostBlocked:
        self.records.sent_back.add(request)
        return HostBlocked(host, reason)
