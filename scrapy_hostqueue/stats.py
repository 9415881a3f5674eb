"""Per-host stats and the :class:`HostQueueStats` extension.

A periodic log line and the optional timeline file.

The keys and the recorder live in :mod:`scrapy_hostqueue._recorder`; they are
re-exported here, the module users name.
"""

from __future__ import annotations

import heapq
import logging
import os
import shlex
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.asyncio import create_looping_call

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue._recorder import (
    HOSTS_PREFIX,
    LOG_BUSIEST,
    NO_HOST,
    OTHER_HOSTS,
    PREFIX,
    HostCounters,
    HostStatsRecorder,
    LatencyHistogram,
    get_recorder,
    host_stat_key,
    stat_key,
)
from scrapy_hostqueue._timeline import HostSample, TimelineWriter
from scrapy_hostqueue.exceptions import HostQueueSettingsError
from scrapy_hostqueue.monitor._snapshot import BLOCKED_STATES

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.utils.asyncio import AsyncioLoopingCall
    from twisted.internet.task import LoopingCall
    from typing_extensions import Self

    from scrapy_hostqueue._contracts import HostView

__all__ = [
    "HOSTS_PREFIX",
    "NO_HOST",
    "OTHER_HOSTS",
    "PREFIX",
    "HostCounters",
    "HostQueueStats",
    "HostStatsRecorder",
    "LatencyHistogram",
    "get_recorder",
    "host_stat_key",
    "stat_key",
]

logger = logging.getLogger(__name__)


# -- the extension ----------------------------------------------------------

#: Timeline files (real paths) that a crawl of this process is writing.
_timelines_written: set[str] = set()


def _timeline_path(template: str, crawler: Crawler) -> str:
    """Fill in the name and the time in HOSTQUEUE_TIMELINE_FILE.

    HOSTQUEUE_TIMELINE_FILE with ``%(name)s`` (the spider's name) and
    ``%(time)s`` (the start time, UTC, as in Scrapy's feed URIs) filled in.
    """
    if "%" not in template:
        return template
    now = datetime.now(tz=timezone.utc).replace(microsecond=0, tzinfo=None)
    values = {"name": crawler.spidercls.name, "time": now.isoformat().replace(":", "-")}
    try:
        return template % values
    except (KeyError, ValueError, TypeError) as error:
        raise HostQueueSettingsError(
            f"HOSTQUEUE_TIMELINE_FILE: {template!r} cannot be filled in ({error!r}); "
            "its placeholders are %(name)s and %(time)s, and a % of its own is written %%"
        ) from None


def _host_text(  # noqa: PLR0917 - one host's figures, as the line shows them
    host: str,
    in_flight: int,
    cap: int,
    limit: int,
    overdue: int,
    blocked_left: float,
    block_reason: str | None,
    interval: float,
) -> str:
    """Say how one of the busiest hosts stands, for the host log line."""
    text = f"{host} {in_flight}/{cap}"
    if overdue:
        # Why a host with room sends nothing: its requests hang.
        text += f" ({overdue} overdue)"
    if blocked_left > 0:
        text += f" (blocked {blocked_left:.1f}s: {block_reason})"
    elif cap < limit:
        # Why a host with work and a limit of 4 has one in flight.
        text += f" (silent, {cap} at a time until it answers; limit {limit})"
    elif interval:
        # Why a host with room and work is slow: one request per interval.
        text += f" (delay {interval:g}s)"
    return text


def _figures_of(
    snapshot: dict[str, Any],
) -> tuple[int, int, int, int, list[str], str | None]:
    """Return the host log line's figures, read from the monitor's *snapshot*.

    Blocked: the hosts in a blocked state; the busiest: among its top hosts.
    """
    crawl = snapshot["crawl"]
    working = [host for host in snapshot["hosts"] if host["in_flight"] or host["queued"]]
    busiest = heapq.nlargest(
        LOG_BUSIEST, working, key=lambda host: (host["in_flight"], host["queued"])
    )
    shown = [
        _host_text(
            host["host"],
            host["in_flight"],
            host["cap"],
            host["limit"],
            host["overdue"],
            host["block_left"],
            host["block_reason"],
            host["interval"],
        )
        for host in busiest
    ]
    blocked = sum(crawl["states"][state] for state in BLOCKED_STATES)
    why = crawl["why"]["text"]
    return crawl["active_hosts"], blocked, crawl["live_hosts"], crawl["queued"], shown, why


def _log_hosts(  # noqa: PLR0917 - the line's figures
    active: int, blocked: int, with_work: int, queued: int, shown: list[str], why: str | None
) -> None:
    """Log the host log line; with the monitor, its answer to "why not faster?"."""
    logger.info(
        "Hosts: %d active, %d blocked, %d with work; %d requests queued; "
        "busiest (in flight/limit): %s%s",
        active,
        blocked,
        with_work,
        queued,
        ", ".join(shown) or "none",
        f"; why not faster? {why}" if why else "",
    )


class HostQueueStats:
    """Scrapy extension.

    A periodic log line about hosts (``HOSTQUEUE_LOG_INTERVAL`` seconds, 0 disables) that also
    refreshes the per-host stats, and the optional timeline file (``HOSTQUEUE_TIMELINE_FILE``, one
    row per ``HOSTQUEUE_TIMELINE_INTERVAL`` and host).

    Under :class:`~scrapy_hostqueue.HostQueueScheduler` the log line and the
    timeline show each host's queue, limit and blocks. Under any other
    scheduler they show what public signals tell: requests of each host inside
    Scrapy's downloader and responses per host, which is enough to compare a
    stock crawl with this project's.
    """

    def __init__(
        self, crawler: Crawler, config: HostQueueConfig, timeline_path: str | None = None
    ) -> None:
        self.crawler = crawler
        self.config = config
        self.recorder = get_recorder(crawler)
        #: The scheduler's view of its hosts (None under another scheduler).
        self.hosts: HostView | None = None
        self.timeline: TimelineWriter | None = None
        #: HOSTQUEUE_TIMELINE_FILE with its placeholders filled in, or None.
        self.timeline_path = timeline_path
        self._tasks: list[AsyncioLoopingCall | LoopingCall] = []
        # Requests of each host between request_reached_downloader and
        # request_left_downloader: at most CONCURRENT_REQUESTS entries.
        self._in_downloader: dict[str, int] = {}
        # Responses per host since the last timeline row (only with a timeline).
        self._fetched: dict[str, int] = {}
        # Downloads that ended without a response, per host, since the last
        # row, and the requests in the downloader not answered yet (at most
        # CONCURRENT_REQUESTS; only with a timeline).
        self._failed: dict[str, int] = {}
        self._unanswered: set[Request] = set()
        self._started = self._last_tick = 0.0

    @classmethod
    @internals.refuses_at_start_up
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = HostQueueConfig.from_settings(crawler.settings)
        if not config.log_interval and not config.timeline_file:
            # Switched off on purpose: no warning (Scrapy logs NotConfigured's message).
            raise NotConfigured
        timeline_path = None
        if config.timeline_file:
            timeline_path = _timeline_path(config.timeline_file, crawler)
            if os.path.isdir(timeline_path):
                raise HostQueueSettingsError(
                    f"HOSTQUEUE_TIMELINE_FILE must be a file path, got the directory "
                    f"{timeline_path!r}"
                )
            directory = os.path.dirname(os.path.abspath(timeline_path))
            if not os.path.isdir(directory):
                raise HostQueueSettingsError(
                    f"HOSTQUEUE_TIMELINE_FILE: directory {directory!r} does not exist "
                    f"(got {timeline_path!r})"
                )
        extension = cls(crawler, config, timeline_path)
        connect = crawler.signals.connect
        connect(extension.spider_opened, signal=signals.spider_opened)
        connect(extension.spider_closed, signal=signals.spider_closed)
        return extension

    # -- signals ---------------------------------------------------------------

    def _host(self, request: Request) -> str:
        return internals.host_key(self.crawler, request) or NO_HOST

    def request_reached_downloader(self, request: Request) -> None:
        host = self._host(request)
        self._in_downloader[host] = self._in_downloader.get(host, 0) + 1
        if self.timeline is not None:
            self._unanswered.add(request)

    def request_left_downloader(self, request: Request) -> None:
        host = self._host(request)
        count = self._in_downloader.get(host, 0) - 1
        if count > 0:
            self._in_downloader[host] = count
        else:
            self._in_downloader.pop(host, None)
        if self._unanswered and request in self._unanswered:
            # It left the download handler with an exception (a connection
            # refused, a DNS failure, a timeout): a dead or hanging host.
            # Not one the send gate sent back to wait out its host's block.
            self._unanswered.discard(request)
            sent_back = self.hosts is not None and self.hosts.sent_back_from_gate(request)
            if self.timeline is not None and not sent_back:
                self._failed[host] = self._failed.get(host, 0) + 1

    def response_downloaded(self, request: Request) -> None:
        self._unanswered.discard(request)
        if self.timeline is not None:
            host = self._host(request)
            self._fetched[host] = self._fetched.get(host, 0) + 1

    def spider_opened(self, spider: Spider) -> None:
        self.hosts = self.recorder.host_view
        if self.hosts is None:
            scheduler = internals.current_scheduler(self.crawler)
            logger.info(
                "HostQueueStats: the scheduler is %s, not HostQueueScheduler: host "
                "queues, limits and blocks are unknown; showing requests in the "
                "downloader and responses per host",
                type(scheduler).__name__,
            )
        # Per-request receivers only where their counts are read: every
        # receiver costs each request a few microseconds in Scrapy's dispatch.
        connect = self.crawler.signals.connect
        if self.hosts is None or self.config.timeline_file:
            connect(self.request_reached_downloader, signal=signals.request_reached_downloader)
            connect(self.request_left_downloader, signal=signals.request_left_downloader)
        if self.config.timeline_file:
            connect(self.response_downloaded, signal=signals.response_downloaded)
        self._started = self._last_tick = time.monotonic()
        path = self.timeline_path
        if path is not None:
            held = os.path.realpath(path)
            if held in _timelines_written:
                logger.error(
                    "HOSTQUEUE_TIMELINE_FILE: %s is being written by another crawl of this "
                    "process; this crawl writes no timeline. Give each crawl its own file, "
                    "e.g. with %%(name)s in the path for the spider's name.",
                    path,
                )
                path = None
        if path is not None:
            try:
                self.timeline = TimelineWriter(
                    path, self.config.stats_max_hosts, queues_known=self.hosts is not None
                )
            except OSError as error:
                logger.error("HOSTQUEUE_TIMELINE_FILE: cannot write %s: %s", path, error)
            else:
                _timelines_written.add(held)
                self._start(self.sample, self.config.timeline_interval)
                logger.info(
                    "Writing the host timeline to %s every %gs", path, self.config.timeline_interval
                )
        if self.config.log_interval:
            self._start(self.log, self.config.log_interval)

    def _start(self, function: Callable[[], None], interval: float) -> None:
        task = create_looping_call(function)
        task.start(interval, now=False)
        self._tasks.append(task)

    def spider_closed(self, spider: Spider, reason: str) -> None:
        for task in self._tasks:
            if task.running:
                task.stop()
        self._tasks.clear()
        if self.timeline is not None:
            self.sample()
        timeline = self.timeline
        if timeline is not None:
            self._close_timeline()
            path = timeline.path
            chart = os.path.splitext(path)[0] + ".html"
            if chart == path:  # a timeline named .html: the chart goes beside it
                chart = path + ".html"
            logger.info(
                "Host timeline: %d rows in %s (draw it: python -m scrapy_hostqueue plot %s -o %s)",
                timeline.rows,
                path,
                shlex.quote(path),
                shlex.quote(chart),
            )

    def _close_timeline(self) -> None:
        timeline = self.timeline
        if timeline is None:
            return
        self.timeline = None
        timeline.close()
        _timelines_written.discard(os.path.realpath(timeline.path))

    # -- periodic work -----------------------------------------------------------

    def log(self) -> None:
        """Log one line about the hosts and refresh the per-host stats."""
        self.recorder.flush()
        view = self.hosts
        if view is None:
            in_downloader = self._in_downloader
            top = heapq.nlargest(LOG_BUSIEST, in_downloader.items(), key=lambda item: item[1])
            logger.info(
                "Hosts: %d with requests in the downloader (%d requests); busiest: %s",
                len(in_downloader),
                sum(in_downloader.values()),
                ", ".join(f"{host} {count}" for host, count in top) or "none",
            )
            return
        snapshot = self.recorder.snapshot
        if snapshot is not None:
            # The live monitor runs: the line says what its page says.
            _log_hosts(*_figures_of(snapshot()))
            return
        now = time.monotonic()
        hosts = list(view.hosts())
        busiest = heapq.nlargest(LOG_BUSIEST, hosts, key=lambda item: (item[2], item[1]))
        _log_hosts(
            view.active_hosts,
            sum(1 for *_, state in hosts if state.blocked_until > now),
            len(hosts),
            view.queued_requests,
            [
                _host_text(
                    key or NO_HOST,
                    view.on_wire(key),
                    view.in_flight_cap(state),
                    state.limit,
                    view.overdue(key),
                    max(0.0, state.blocked_until - now),
                    state.block_reason,
                    state.interval,
                )
                for key, _queued, _in_flight, state in busiest
            ],
            None,
        )

    def _samples(self, now: float, fetched: dict[str, int]) -> list[HostSample]:
        in_downloader = self._in_downloader
        samples: dict[str, HostSample] = {}
        view = self.hosts
        if view is not None:
            for key, queued, _in_flight, state in view.hosts():
                host = key or NO_HOST
                samples[host] = HostSample(
                    host,
                    # With prefetch, a request in the downloader may still
                    # wait at the send gate: count what was sent.
                    view.on_wire(key),
                    queued,
                    # What it may have in flight: 1 while silent.
                    view.in_flight_cap(state),
                    max(0.0, state.blocked_until - now),
                    state.block_reason,
                    view.overdue(key),
                )
        # Hosts that left the store (or, under another scheduler, any host)
        # but had requests in the downloader, responses or failures in the
        # interval.
        for host in [*in_downloader, *fetched, *self._failed]:
            if host not in samples:
                if view is None:
                    samples[host] = HostSample(host, in_downloader.get(host, 0), None, None)
                    continue
                known = view.known_state(host)
                samples[host] = HostSample(
                    host,
                    in_downloader.get(host, 0),
                    0,
                    view.in_flight_cap(known) if known is not None else None,
                )
        return list(samples.values())

    def sample(self) -> None:
        """Write one interval of the timeline."""
        timeline = self.timeline
        if timeline is None:
            return
        now = time.monotonic()
        fetched, self._fetched = self._fetched, {}
        samples = self._samples(now, fetched)
        failed, self._failed = self._failed, {}
        try:
            timeline.write(now - self._started, now - self._last_tick, samples, fetched, failed)
        except OSError as error:
            logger.error("HOSTQUEUE_TIMELINE_FILE: cannot write %s: %s", timeline.path, error)
            self._close_timeline()
        self._last_tick = now
