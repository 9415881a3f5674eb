"""The overdue watch: requests in flight far longer than their host usually takes.

A host that hangs now and then keeps answering most requests fast, so its
limit stays up while its hung requests pile up until their timeout, and with
them the crawl's ``CONCURRENT_REQUESTS`` and active-host places. A request in
flight past its host's overdue time (from the host's own latency history,
see ``AimdTable.overdue_after``) is marked overdue at once: the AIMD rule
backs its host off, the host gives its active place up when it has nothing
else in flight, and the request stops counting against the global limit the other
hosts share (up to ``HOSTQUEUE_MAX_OVERDUE`` such requests at once). It
still counts against its own host's limit until it leaves.

:class:`OverdueWatch` is the watch itself, with an injectable clock;
:class:`OverdueRequests` runs it in a crawl and acts on what it marks.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import create_looping_call

from scrapy_hostqueue import _scrapy_internals as internals

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_hostqueue._contracts import PolicyHook
    from scrapy_hostqueue._recorder import HostStatsRecorder
    from scrapy_hostqueue._requests import RequestRecord, RequestTable
    from scrapy_hostqueue._sendgate import SendGate
    from scrapy_hostqueue.frontier import RequestStore

logger = logging.getLogger(__name__)

#: Seconds between two looks at the requests in flight.
WATCH_INTERVAL = 0.25


class OverdueWatch:
    """Marks overdue requests.

    :meth:`check` runs every :data:`WATCH_INTERVAL`; *threshold* gives a host's overdue time,
    *on_overdue* hears of each request marked, with the seconds it has been in flight.
    """

    def __init__(
        self,
        records: RequestTable,
        store: RequestStore[Request],
        threshold: Callable[[str], float],
        on_overdue: Callable[[Request, RequestRecord, float], None],
        *,
        max_excused: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.records = records
        self.store = store
        self.threshold = threshold
        self.on_overdue = on_overdue
        self.max_excused = max_excused
        self.clock = clock
        #: Requests in the downloader marked overdue.
        self.count = 0

    def excused(self) -> int:
        """How many requests in the downloader do not count against ``CONCURRENT_REQUESTS`` now."""
        return min(self.count, self.max_excused)

    def check(self) -> None:
        """Mark the requests past their host's overdue time (O(requests in flight))."""
        now = self.clock()
        thresholds: dict[str, float] = {}
        marked: list[tuple[Request, RequestRecord, float]] = []
        for request, record in self.records.items():
            sent_at = record.sent_at
            if sent_at is None or record.overdue or record.given_up:
                continue
            host = record.host
            after = thresholds.get(host)
            if after is None:
                after = thresholds[host] = self.threshold(host)
            if now - sent_at > after:
                record.overdue = True
                self.count += 1
                self.store.set_overdue(host)
                marked.append((request, record, now - sent_at))
        # After the walk: what hears of them may change the records.
        for request, record, seconds in marked:
            self.on_overdue(request, record, seconds)

    def left(self, record: RequestRecord) -> None:
        """Stop watching *record*'s request, which left the downloader."""
        if record.overdue:
            self.count -= 1


class OverdueRequests:
    """The overdue watch in a crawl.

    It runs with the AIMD middleware only (:meth:`start`), whose hosts'
    latency gives the overdue times; an answer stops counting as overdue at
    its headers. Each request marked backs its host off (the policy hook
    hears of it), sends the requests waiting at a full send gate back to the
    queue, and wakes the engine: the host's place and a share of the global
    limit are free for other hosts.
    """

    def __init__(
        self,
        crawler: Crawler,
        records: RequestTable,
        store: RequestStore[Request],
        gate: SendGate,
        recorder: HostStatsRecorder,
        *,
        gated: bool,
        max_excused: int,
        debug: bool,
    ) -> None:
        self._crawler = crawler
        self._gate = gate
        self._gated = gated
        self._recorder = recorder
        self._debug = debug
        self._hook: PolicyHook | None = None
        self._loop: Any = None
        self.watch = OverdueWatch(
            records, store, self._after, self._became_overdue, max_excused=max_excused
        )

    def excused(self) -> int:
        return self.watch.excused()

    def left(self, record: RequestRecord) -> None:
        self.watch.left(record)

    def start(self, hook: PolicyHook) -> None:
        """Look for overdue requests from now on, with the hosts' latency *hook* learns."""
        self._hook = hook
        self._loop = create_looping_call(self.watch.check)
        self._loop.start(WATCH_INTERVAL, now=False)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def _after(self, host: str) -> float:
        assert self._hook is not None  # the watch runs with it only
        return self._hook.overdue_after(host)

    def _became_overdue(self, request: Request, record: RequestRecord, seconds: float) -> None:
        host = record.host
        self._recorder.overdue(host, self.watch.count)
        if self._debug:
            logger.debug("%s overdue after %.1fs (host %s)", request, seconds, host)
        assert self._hook is not None
        self._hook.overdue(request, host, seconds)
        if self._gated and not self._gate.may_send(host):
            # Requests waiting at the gate behind overdue ones would wait for
            # them to time out, holding part of the global limit: back to the queue.
            self._gate.blocked(host, math.inf, "overdue")
        # Its place and a share of the global limit are free for other hosts.
        internals.wake_engine(self._crawler)
