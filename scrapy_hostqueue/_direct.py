"""Direct downloads: requests that reach the downloader without the scheduler.

``engine.download_async`` requests (media pipelines, robots.txt, a spider's
own downloads) never pass ``next_request``. The AIMD middleware holds them
until their host may take one more (:meth:`DirectDownloads.delay`,
:meth:`~DirectDownloads.has_room`, :meth:`~DirectDownloads.wait_for_room`);
then they count for the host like a handed-out request
(:meth:`~DirectDownloads.adopt`) until they leave the downloader. The
scheduler's hosts (``_hosts``) offer it as ``HostControl.direct``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from scrapy_hostqueue._sendgate import gate_opens_at

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_hostqueue._requests import RequestTable
    from scrapy_hostqueue._sendgate import SendGate
    from scrapy_hostqueue.frontier import RequestStore


class DirectDownloads:
    """Room for direct downloads on each host.

    *gated* when the send gate holds the on-the-wire limit (prefetch on).
    """

    def __init__(
        self,
        store: RequestStore[Request],
        records: RequestTable,
        gate: SendGate,
        *,
        gated: bool,
    ) -> None:
        self._store = store
        self._records = records
        self._gate = gate
        self._gated = gated
        self._room_waiters: dict[str, deque[asyncio.Future[None]]] = {}

    def delay(self, host: str, now: float, *, spacing: bool = True) -> float:
        """Seconds such a request must wait before it starts on *host*.

        Until the host's block ends and, with *spacing*, its interval since the last start has
        passed.
        """
        state = self._store.host_state(host)
        when = state.ready_at() if spacing else state.blocked_until
        if spacing and self._gated:
            when = max(when, gate_opens_at(state))
        return when - now if when > now else 0.0

    def has_room(self, host: str) -> bool:
        """Whether *host* may have one more request on the wire now.

        With the send gate, against the requests past it. Without, against
        the host's limit, every request handed out and not back counted, and
        a silent host's one request at a time against those that reached the
        download handler (or were adopted) only: a handed-out request may
        still be in a downloader middleware, perhaps waiting for this very
        download (a login or token middleware), and a host not heard from yet
        would keep such a download waiting for its first answer, which waits
        for the download.
        """
        if self._gated:
            return self._gate.may_send(host)
        store = self._store
        state = store.host_state(host)
        reached = self._records.reached_per_host.get(host, 0)
        return store.in_flight(host) < state.limit and reached < store.in_flight_cap(state)

    async def wait_for_room(self, host: str, timeout: float) -> bool:
        """Wait until *host* may have room, or *timeout* seconds.

        Wait until a request of *host* leaves the downloader or its limit
        changes (True, see :meth:`wake`), or *timeout* seconds (False).
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._room_waiters.get(host)
        if waiters is None:
            waiters = self._room_waiters[host] = deque()
        waiters.append(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            if not future.done():
                future.cancel()
                # Not woken: leave no stale entry behind.
                waiters.remove(future)
                if not waiters and self._room_waiters.get(host) is waiters:
                    del self._room_waiters[host]
        return True

    def adopt(self, request: Request, host: str, now: float) -> None:
        """Count *request* for *host* until it leaves the downloader.

        Count *request*, which did not come from next_request, for *host*
        from now until it leaves the downloader.
        """
        self._store.adopt(host, now)
        record = self._records.adopt(request, host)
        if self._gated:
            self._gate.take(host, request)
        else:
            # From now: several let through at once would not all reach the
            # download handler before the next asks (an async middleware).
            self._records.count_on_the_way(record)
            record.sent_at = now

    def wake(self, host: str) -> None:
        """End the waits of :meth:`wait_for_room` for *host*, which may have room now.

        *host* may have room now (a request of it left the downloader, its
        limit grew, it answered): end the waits of :meth:`wait_for_room`.
        """
        waiters = self._room_waiters.pop(host, None)
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)


__all__ = ["DirectDownloads"]
