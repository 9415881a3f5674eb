"""``python -m scrapy_hostqueue monitor URL --crawl-id ID``: a shared crawl's page.

It is served from what the crawl's processes publish to Redis alone (see
``scrapy_hostqueue.frontier.redis._monitor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from scrapy_hostqueue.frontier import monitor_board
from scrapy_hostqueue.monitor._crawlwide import merge
from scrapy_hostqueue.monitor._server import MonitorServer, url

logger = logging.getLogger(__name__)

#: Seconds between two heartbeats of a process, and two reads of the reader.
HEARTBEAT = 2.0


async def serve(redis_url: str, crawl_id: str, bind: str, port: int, top: int) -> None:
    """Serve the crawl-wide page of *crawl_id* from Redis alone.

    Until cancelled (Ctrl-C).
    """
    board = monitor_board(redis_url, crawl_id)
    await board.open()
    view: dict[str, Any] = merge([], top, time.time())

    def snapshot(host: str | None) -> dict[str, Any]:
        return view

    server = MonitorServer(snapshot)
    try:
        chosen = await server.start(bind, port)
        print(f"Monitor: {url(bind, chosen, server.token)}", flush=True)
        warned = False
        while True:
            try:
                parts = await board.beat(None)
            except Exception as error:  # any client error: keep serving the last view
                if not warned:
                    logger.warning("Monitor: cannot read the crawl from Redis: %s", error)
                    warned = True
            else:
                view = merge(parts, top, time.time())
                warned = False
            await asyncio.sleep(HEARTBEAT)
    finally:
        await server.stop()
        with contextlib.suppress(Exception):
            await board.close()
