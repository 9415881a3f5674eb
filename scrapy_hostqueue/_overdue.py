"""The overdue watch: requests in flight far longer than their host usually
takes.

A host that hangs now and then keeps answering most requests fast, so its
limit stays up while its hung requests pile up until their timeout, and with
them the crawl's ``CONCURRENT_REQUESTS`` and active-host places. A request in
flight past its host's overdue time (from the host's own latency history,
see ``AimdTable.overdue_after``) is marked overdue at once: the AIMD rule
backs its host off, the host gives its active place up when it has nothing
else in flight, and the request stops counting against the budget the other
hosts share (up to ``HOSTQUEUE_MAX_OVERDUE`` such requests at once). It
still counts against its own host's limit until it leaves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_hostqueue._requests import RequestRecord, RequestTable
    from scrapy_hostqueue.store import RequestStore

#: Seconds between two looks at the requests in flight.
WATCH_INTERVAL = 0.25


class OverdueWatch:
    """Marks overdue requests (:meth:`check`, called every
    :data:`WATCH_INTERVAL`); *threshold* gives a host's overdue time,
    *on_overdue* hears of each request marked, with the seconds it has been
    in flight."""

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
        """How many requests in the downloader do not count against
        ``CONCURRENT_REQUESTS`` now."""
        return min(self.count, self.max_excused)

    def check(self) -> None:
        """Mark the requests past their host's overdue time (O(requests in
        flight))."""
        now = self.clock()
        thresholds: dict[str, float] = {}
        marked: list[tuple[Request, RequestRecord, float]] = []
        for request, record in self.records.items():
            sent_at = record.sent_at
            if sent_at is None or record.overdue or record.refusing:
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
        """*record*'s request left the downloader."""
        if record.overdue:
            self.count -= 1
