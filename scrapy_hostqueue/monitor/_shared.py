"""``python -m scrapy_hostqueue monitor URL --crawl-id ID``: a shared crawl's page.

It is served from what the crawl's processes publish to Redis alone (see
``scrapy_hostqueue.frontier.redis._monitor``); with ``--controls``, its
controls go to the crawl's processes through Redis (:func:`send_control`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from scrapy_hostqueue.frontier import monitor_board
from scrapy_hostqueue.monitor._controls import BLOCK, HOST_ACTIONS, PAUSE, BadControl, Control
from scrapy_hostqueue.monitor._crawlwide import merge
from scrapy_hostqueue.monitor._server import MonitorServer, url

logger = logging.getLogger(__name__)

#: Seconds between two heartbeats of a process, and two reads of the reader.
HEARTBEAT = 2.0


def shows(parts: list[dict[str, Any]], host: str) -> bool:
    """Whether one of the processes' snapshots *parts* shows *host*."""
    return any(row["host"] == host for part in parts for row in part["hosts"])


async def send_control(board: Any, control: Control, source: str) -> str:
    """Send *control*, given by *source*, to the crawl's processes through Redis.

    A host control to the process that holds the host, a pause or resume to
    every process; returns what it did, in words.
    """
    if control.action not in HOST_ACTIONS:
        await board.set_paused(control.action == PAUSE)
        done = "paused" if control.action == PAUSE else "resumed"
        return (
            f"{done} in every process of the crawl (at its next heartbeat, within {HEARTBEAT:g}s)"
        )
    sent = {**control.as_dict(), "from": source}
    if control.action == BLOCK:
        sent["until"] = time.time() + control.value
    await board.post(sent)
    return (
        "sent to the process that holds the host (applied at its next heartbeat, "
        f"within {HEARTBEAT:g}s)"
    )


async def serve(  # noqa: PLR0917 - the command line's options
    redis_url: str, crawl_id: str, bind: str, port: int, top: int, controls: bool = False
) -> None:
    """Serve the crawl-wide page of *crawl_id* from Redis alone.

    Until cancelled (Ctrl-C). With *controls*, the page's controls go to the
    crawl's processes.
    """
    board = monitor_board(redis_url, crawl_id)
    board.read_controls = controls
    await board.open()
    parts: list[dict[str, Any]] = []
    view: dict[str, Any] = merge([], top, time.time())

    def snapshot(host: str | None) -> dict[str, Any]:
        return {**view, "controls": controls}

    async def control(given: Control, remote: str) -> str:
        if given.action in HOST_ACTIONS and not shows(parts, given.host):
            raise BadControl(f"unknown host {given.host!r}")
        try:
            return await send_control(board, given, f"{remote} on the monitor command")
        except Exception as error:  # any client error
            raise BadControl(f"cannot reach Redis to send it: {error}") from None

    server = MonitorServer(snapshot, control=control if controls else None)
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
                view["crawl"]["paused"] = board.paused if controls else view["crawl"]["paused"]
                warned = False
            await asyncio.sleep(HEARTBEAT)
    finally:
        await server.stop()
        with contextlib.suppress(Exception):
            await board.close()
