"""``StartRequestsMiddleware``: start requests take turns with responses.

Scrapy 2.19's engine reads ``Spider.start()`` in a loop that hands the event
loop back only while the downloader has room. Once it is full (the usual case
a moment after the crawl starts), the loop goes on reading start requests and
scheduling them without ever letting anything else run, as long as the
spider's ``start()`` (and the spider middlewares around it) do not await
anything that suspends, which a list of URLs does not. Until the last start
request is scheduled, no response is read, parsed or counted, and no new
request is sent, although the first requests' answers are waiting on their
sockets. Measured with ``python -m bench.start_stall`` (20,000 start URLs over
500 local hosts answering in 100 ms, 2 cores): the first response reached the
engine 2.5 to 3.2 s after the first request left.

This spider middleware hands the event loop back whenever the reading of
start requests has held it for :data:`SLICE` seconds. Nothing else changes:
Scrapy still reads start requests without waiting for room in the
downloader, in the same order, and items yielded by ``start()`` pass through
as they are; the rest of the crawl runs between the slices.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scrapy.utils.asyncio import sleep

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from scrapy.crawler import Crawler
    from typing_extensions import Self

__all__ = ["SLICE", "StartRequestsMiddleware"]

#: How long, in seconds, the reading of start requests may hold the event loop
#: before it lets responses and requests in flight move on.
SLICE = 0.005


class StartRequestsMiddleware:
    """Spider middleware that lets responses in while start requests are read.

    Spider middleware that makes the reading of ``Spider.start()`` hand the
    event loop back every :data:`SLICE` seconds, so that responses are handled
    while a long list of start requests is being scheduled.

    The ``scrapy_hostqueue.Addon`` enables it; without the add-on, add
    ``"scrapy_hostqueue.StartRequestsMiddleware": 10`` to
    ``SPIDER_MIDDLEWARES``. It works with any scheduler.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls()

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        clock = self._clock
        deadline = clock() + SLICE
        async for item_or_request in start:
            yield item_or_request
            if clock() >= deadline:
                # One turn of the event loop: the I/O that is ready and the
                # callbacks waiting for it run before the next start request.
                await sleep(0)
                deadline = clock() + SLICE
