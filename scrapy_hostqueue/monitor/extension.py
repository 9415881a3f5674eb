"""The live monitor's Scrapy extension.

:class:`HostQueueMonitor` is a Scrapy extension (the add-on enables it) that
serves, with aiohttp on the crawl's asyncio loop, the page ``/``, the
snapshot ``/hosts.json`` and, with ``prometheus_client``, ``/metrics``. The
snapshot is made at most once per ``HOSTQUEUE_MONITOR_INTERVAL`` from what the
scheduler's hosts and the stats recorder already hold (see ``_snapshot``);
nothing is added to a request's path. With ``HOSTQUEUE_MONITOR_CONTROLS`` it
takes the page's controls (see ``_controls``), and on the Redis frontier
those given on any process's page for the hosts it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue import frontier
from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue._recorder import NO_HOST, get_recorder, stat_key
from scrapy_hostqueue.monitor._controls import (
    HOST_ACTIONS,
    PAUSE,
    RESUME,
    BadControl,
    Control,
    Controller,
    parse_control,
)
from scrapy_hostqueue.monitor._crawlwide import merge
from scrapy_hostqueue.monitor._metrics import metrics_maker
from scrapy_hostqueue.monitor._server import MonitorServer, is_loopback, url
from scrapy_hostqueue.monitor._shared import HEARTBEAT, send_control, shows
from scrapy_hostqueue.monitor._snapshot import CrawlFigures, HostDetail, HostRow, Snapshots
from scrapy_hostqueue.scheduler import HostQueueScheduler

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from scrapy_hostqueue._contracts import HostCommands, HostView
    from scrapy_hostqueue.frontier import HostState

__all__ = ["HostQueueMonitor"]

logger = logging.getLogger(__name__)

_STATUS_PREFIX = "downloader/response_status_count/"
_HOST_STATUS_PREFIX = "status_count/"


class HostQueueMonitor:
    """Scrapy extension: the live monitor.

    ``HOSTQUEUE_MONITOR``, on by default with the add-on. At start it logs
    one INFO line with the page's URL, which carries a random token; the
    server listens on ``HOSTQUEUE_MONITOR_BIND`` (loopback by default) and
    ``HOSTQUEUE_MONITOR_PORT`` (a free port by default).
    """

    def __init__(self, crawler: Crawler, config: HostQueueConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.recorder = get_recorder(crawler)
        self.snapshots = Snapshots(config.monitor_hosts)
        # The host log line reads the same snapshot.
        self.recorder.snapshot = self.local_snapshot
        # /metrics: this process's figures (Prometheus scrapes every process).
        self.server = MonitorServer(
            self.snapshot,
            metrics_maker(self.local_snapshot),
            control=self.control if config.monitor_controls else None,
        )
        #: Applies the controls to this process's hosts (from spider_opened,
        #: with HostQueueScheduler and the controls on).
        self.controller: Controller | None = None
        self.url: str | None = None
        self._started = time.monotonic()
        self._cached: dict[str, Any] | None = None
        self._cached_at = float("-inf")
        self._process: dict[str, Any] = {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "key": f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}",
        }
        #: On the Redis frontier: the other processes' last snapshots.
        self._others: list[dict[str, Any]] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        #: The shared crawl's board, once open (the Redis frontier).
        self._board: Any = None

    @classmethod
    @internals.refuses_at_start_up
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = HostQueueConfig.from_settings(crawler.settings)
        if not config.monitor:
            raise NotConfigured
        extension = cls(crawler, config)
        crawler.signals.connect(extension.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(extension.spider_closed, signal=signals.spider_closed)
        return extension

    async def spider_opened(self, spider: Spider) -> None:
        if self.config.monitor_controls:
            scheduler = internals.current_scheduler(self.crawler)
            # Not isinstance(): Scrapy's BaseSchedulerMeta makes any scheduler pass.
            if HostQueueScheduler in type(scheduler).__mro__:
                hosts: HostCommands = scheduler.hosts
                self.controller = Controller(hosts, self.recorder)
        address = self.config.monitor_bind
        try:
            port = await self.server.start(address, self.config.monitor_port)
        except OSError as error:
            logger.error(
                "Monitor: cannot listen on %s port %d: %s; the crawl goes on without it",
                address,
                self.config.monitor_port,
                error,
            )
            return
        self._started = time.monotonic()
        self.url = url(address, port, self.server.token)
        logger.info("Monitor: %s", self.url)
        if not is_loopback(address):
            logger.warning(
                "Monitor: listening on %s (HOSTQUEUE_MONITOR_BIND), beyond this machine; "
                "anyone who can reach it and has the URL's token sees the crawl",
                address,
            )
        if self.config.frontier_url:
            crawl_id = self.config.crawl_id or spider.name
            self._others = []
            self._heartbeat = asyncio.ensure_future(self._beat(self.config.frontier_url, crawl_id))

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        await self.server.stop()

    async def _beat(self, redis_url: str, crawl_id: str) -> None:
        """Publish this process's snapshot to the shared crawl, read the others'.

        Every ``_shared.HEARTBEAT`` seconds; at the end, withdraw it.
        """
        # Redis away (at start or later) is the shared frontier's to report,
        # once per outage; the monitor says it at DEBUG and tries again.
        board = frontier.monitor_board(redis_url, crawl_id)
        board.read_controls = self.controller is not None
        while True:
            try:
                await board.open()
                self._board = board
                break
            except Exception as error:  # the page shows this process meanwhile
                logger.debug("Monitor: no crawl-wide view yet: %s", error)
                await asyncio.sleep(HEARTBEAT)
        away = False
        key = self._process["key"]
        try:
            while True:
                try:
                    parts = await board.beat(self.local_snapshot())
                except Exception as error:
                    if not away:
                        logger.debug("Monitor: cannot publish to Redis: %s", error)
                        away = True
                else:
                    away = False
                    self._others = [part for part in parts if part["process"]["key"] != key]
                    if board.read_controls:
                        try:
                            await self._controls_from(board)
                        except Exception as error:  # Redis away: the next beat tries again
                            logger.debug("Monitor: cannot take the crawl's controls: %s", error)
                await asyncio.sleep(HEARTBEAT)
        finally:
            self._board = None
            with contextlib.suppress(Exception):
                await board.withdraw(key)
            with contextlib.suppress(Exception):
                await board.close()

    # -- the controls ------------------------------------------------------------

    async def control(self, control: Control, remote: str) -> str:
        """Apply *control*, given on this process's page from the address *remote*.

        A host this process holds, or any without Redis, here; on the Redis
        frontier a host held by another process through Redis, and a pause
        or a resume here and in every other process.
        """
        controller = self.controller
        if controller is None:
            raise BadControl("the controls need HostQueueScheduler as the scheduler")
        board = self._board
        if control.action not in HOST_ACTIONS:
            result = controller.apply(control)
            if board is not None:
                try:
                    await board.set_paused(control.action == PAUSE)
                except Exception as error:  # any client error: this process only
                    return f"{result} in this process only: cannot reach Redis ({error})"
                result += ", in every process of the crawl"
            return result
        host = control.host
        if board is None or controller.hosts.holds(host):
            return controller.apply(control)
        if controller.hosts.known_state(host) is None and not shows(self._others or [], host):
            raise BadControl(f"unknown host {host!r}")
        try:
            return await send_control(board, control, f"{remote} on {self._process['key']}")
        except Exception as error:  # any client error
            raise BadControl(
                f"host {host!r} is held by another process, and Redis cannot be reached to "
                f"tell it: {error}"
            ) from None

    async def _controls_from(self, board: Any) -> None:
        """Apply what other processes' pages asked of this one (the Redis frontier)."""
        controller = self.controller
        assert controller is not None
        hosts = controller.hosts
        if board.paused != hosts.paused:
            controller.apply(Control(PAUSE if board.paused else RESUME))
            logger.info(
                "Monitor control from the shared crawl: the crawl %s",
                "is paused" if board.paused else "resumed",
            )
        for raw, sent in board.controls:
            try:
                control = parse_control(sent)
            except BadControl:
                continue
            if not hosts.holds(control.host) or not await board.done(raw):
                continue  # another process holds it, or took it first
            try:
                result = controller.apply(control, until=sent.get("until"))
            except BadControl as error:
                result = str(error)
            logger.info(
                "Monitor control from %s: %s: %s",
                sent.get("from", "?"),
                control.describe(),
                result,
            )

    # -- the snapshot ------------------------------------------------------------

    def local_snapshot(self) -> dict[str, Any]:
        """Return this process's snapshot.

        It is made again once it is older than ``HOSTQUEUE_MONITOR_INTERVAL``.
        """
        now = time.monotonic()
        if self._cached is None or now - self._cached_at >= self.config.monitor_interval:
            self._cached = self._take(now)
            self._cached_at = now
        return self._cached

    def snapshot(self, host: str | None = None) -> dict[str, Any]:
        """Return what ``/hosts.json`` serves.

        This process's snapshot, or on the Redis frontier the whole crawl's;
        with *host*'s history if given.
        """
        snap = self.local_snapshot()
        if self._others is not None:
            snap = merge([snap, *self._others], self.config.monitor_hosts, time.time())
            snap["process"] = self._process
        # What this page may do: another process's page may have them off.
        snap = {**snap, "controls": self.controller is not None}
        if host is None:
            return snap
        now = time.monotonic()
        return self.snapshots.with_detail(snap, host, now, self._detail(host, now))

    def _take(self, now: float) -> dict[str, Any]:
        view = self.recorder.host_view
        stats = self.crawler.stats
        values: dict[str, Any] = stats.get_stats() if stats is not None else {}
        crawl = CrawlFigures(
            time=time.time(),
            uptime=now - self._started,
            concurrent_requests=self.config.global_concurrency,
            max_active_hosts=self.config.max_active_hosts,
            active_hosts=view.active_hosts if view is not None else 0,
            queued=view.queued_requests if view is not None else 0,
            responses=int(values.get("response_received_count", 0)),
            statuses=_by_prefix(values, _STATUS_PREFIX),
            given_up_hosts=int(values.get(stat_key("hosts_given_up_count"), 0)),
            scheduler=view is not None,
            redis=view.redis_figures() if view is not None else None,
            process=self._process,
            paused=self.controller is not None and self.controller.hosts.paused,
        )
        rows = [] if view is None else self._rows(view, now)
        crawl.live_hosts = sum(1 for row in rows if row.live)
        return self.snapshots.take(now, crawl, rows, lambda host: self._detail(host, now))

    def _rows(self, view: HostView, now: float) -> list[HostRow]:
        """Return one row per live host, and per busy host no longer live.

        A given-up host is one; O(live hosts + HOSTQUEUE_STATS_MAX_HOSTS).
        """
        rows: dict[str, HostRow] = {}
        recorder = self.recorder
        for key, queued, _handed_out, state in view.hosts():
            entry = recorder.entry(key)
            rank = entry.priority if entry is not None else 0
            rows[key or NO_HOST] = _row(view, key, state, now, rank, queued=queued, live=True)
        for host in recorder.named_hosts():
            if host in rows:
                continue
            known = view.known_state(host)
            entry = recorder.entry(host)
            if known is not None and entry is not None:
                rows[host] = _row(view, host, known, now, entry.priority)
        return list(rows.values())

    def _detail(self, host: str, now: float) -> HostDetail:
        entry = self.recorder.entry(host)
        if entry is None:
            return HostDetail()
        counts = entry.counts
        return HostDetail(
            responses=int(counts.get("response_count", 0)),
            statuses=_by_prefix(counts, _HOST_STATUS_PREFIX),
            latency_p50=entry.latency.quantile(0.5),
            latency_p95=entry.latency.quantile(0.95),
            events=[
                (now - at, kind, reason, before, after)
                for at, kind, reason, before, after in entry.events or ()
            ],
        )


def _by_prefix(values: Mapping[str, Any], prefix: str) -> dict[str, int]:
    """Return the counts of *values* whose name starts with *prefix*, by the rest of the name."""
    return {
        name[len(prefix) :]: int(value) for name, value in values.items() if name.startswith(prefix)
    }


def _row(
    view: HostView,
    host: str,
    state: HostState,
    now: float,
    rank: int,
    *,
    queued: int = 0,
    live: bool = False,
) -> HostRow:
    """Return *host*'s row: its state at *now*; spacing and overdue requests if it is live."""
    return HostRow(
        host=host or NO_HOST,
        queued=queued,
        in_flight=view.on_wire(host),
        cap=view.in_flight_cap(state),
        limit=state.limit,
        rank=rank,
        blocked_left=max(0.0, state.blocked_until - now),
        block_reason=state.block_reason,
        interval=state.interval,
        spaced_left=max(0.0, state.spaced_until() - now) if live else 0.0,
        given_up=state.given_up,
        overdue=view.overdue(host) if live else 0,
        live=live,
    )
