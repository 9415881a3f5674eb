"""``AIMDMiddleware``.

Adaptive per-host concurrency, Retry-After, Crawl-delay and an error budget, applied through
:class:`~scrapy_hostqueue.HostQueueScheduler`.

The rule itself is pure and lives in :mod:`scrapy_hostqueue._aimd`; this
module turns Scrapy events into its inputs and its adjustments into scheduler
calls. Nothing here sleeps: a host that must wait is blocked in the scheduler,
so its requests hold no part of the global limit meanwhile.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    IgnoreRequest,
    ResponseDataLossError,
)
from scrapy.utils.asyncio import sleep
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object
from twisted.internet.error import ConnectError, ConnectionLost, DNSLookupError
from twisted.internet.error import TimeoutError as TxTimeoutError
from twisted.web.client import ResponseFailed

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._aimd import Adjustment, AimdSettings, AimdTable
from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue._contracts import HostControl
from scrapy_hostqueue._crawl_delay import (
    CRAWL_DELAY_MARGIN,
    CRAWL_DELAY_REASON,
    CrawlDelays,
    asked_delay,
    interval_for,
)
from scrapy_hostqueue._requests import MAX_REQUEUES
from scrapy_hostqueue._retry_after import parse_retry_after
from scrapy_hostqueue.exceptions import HostQueueSettingsError
from scrapy_hostqueue.scheduler import (
    HostBlocked,
    HostGivenUp,
    HostQueueScheduler,
)
from scrapy_hostqueue.stats import get_recorder, stat_key

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from scrapy_hostqueue._crawl_delay import RobotRules

__all__ = ["CONNECTION_ERRORS", "CRAWL_DELAY_MARGIN", "AIMDMiddleware"]

logger = logging.getLogger(__name__)

#: How often a request that did not come from the scheduler, held back for its
#: host, checks whether the crawl is closing (seconds).
_DIRECT_WAIT_SLICE = 0.5
#: How long such a request waits for a place under its host's limit while no
#: request of the host finishes, before it goes anyway (seconds).
_DIRECT_PATIENCE = 10.0

#: Exceptions that mean "the host could not be reached or did not answer in
#: time": each one is a decrease and counts toward the error budget. The
#: Scrapy types are what its handlers (HTTP/1.1, HTTP/2, aiohttp, httpx) raise
#: in 2.19; the Twisted and built-in types cover older handlers and third-party
#: ones. Generic ``OSError`` is left out on purpose: RetryMiddleware retries it
#: because HttpCompressionMiddleware raises it for an empty body, which says
#: nothing about the host's health.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    CannotResolveHostError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    ResponseDataLossError,
    ConnectError,  # ConnectionRefusedError, TCPTimedOutError, ...
    DNSLookupError,  # an IOError in Twisted, not a ConnectError
    ConnectionLost,
    TxTimeoutError,
    ResponseFailed,  # and ResponseNeverReceived
    ConnectionError,
    TimeoutError,
    socket.gaierror,
)


def _malformed_answer(exception: BaseException) -> bool:
    """Whether the host did answer, in something aiohttp's HTTP parser refused.

    The parser refused, for instance, a header line without a colon, two Content-Length headers or a
    bad chunk size: the host is up, so this is no connection failure. Scrapy's aiohttp handler
    raises DownloadFailedError for it, as for a reset connection.
    """
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(exception.__cause__, aiohttp.ClientResponseError)


#: ``request.meta`` key: ``time.monotonic()`` when the request passed this
#: middleware on its way to the download handler.
META_START = "hostqueue_start"

_DOWNLOAD_SLOT = "download_slot"


def _is_hostqueue_scheduler(cls: object) -> bool:
    # Not issubclass(): Scrapy's BaseSchedulerMeta makes it duck-typed, so any
    # scheduler class would pass.
    return isinstance(cls, type) and HostQueueScheduler in cls.__mro__


def _longest_retry_after(response: Response) -> float | None:
    """Return the longest wait the response's ``Retry-After`` headers ask for.

    The longest wait the response's ``Retry-After`` headers ask for (a
    response may carry several), or None if none is usable.
    """
    now = time.time()
    waits = [
        seconds
        for value in response.headers.getlist(b"Retry-After")
        if (seconds := parse_retry_after(value, now)) is not None
    ]
    return max(waits) if waits else None


#: A Retry-After beyond this many seconds (a year) is not quoted in the log.
_SHOWN_WAIT_MAX = 365 * 86_400.0


def _header_text(response: Response) -> str:
    """Return the response's first ``Retry-After`` value as text, cut short."""
    value = response.headers.get(b"Retry-After") or b""
    return value[:40].decode("latin-1")


class AIMDMiddleware:
    """A downloader middleware that learns how much concurrency each host tolerates.

    A downloader middleware that learns how much concurrency each host
    tolerates and holds hosts back when they ask for it.

    * AIMD: a host starts at ``HOSTQUEUE_AIMD_START`` requests in flight,
      gains one after a run of fast responses given while its limit was
      filled (a host that never fills it keeps it) and is halved (never below
      ``HOSTQUEUE_AIMD_FLOOR``) on a back-off status, a slow response or a
      connection failure, at most once per burst.
    * ``Retry-After`` on a back-off status blocks the host in the scheduler
      (capped by ``HOSTQUEUE_RETRY_AFTER_MAX``); without a usable one the host
      gets a bounded exponential back-off with jitter.
    * A robots.txt ``Crawl-delay`` (with ``ROBOTSTXT_OBEY``) becomes the
      host's minimum interval between request starts.
    * ``HOSTQUEUE_ERROR_BUDGET`` connection failures in a row park the host
      for a growing cool-down; after ``HOSTQUEUE_ERROR_MAX_COOLDOWNS`` of them
      its queued requests are dropped.
    * Requests that skip the scheduler (``engine.download_async``: media
      pipelines) wait here for their host's block, delay and a place under
      its limit, then count for the host; robots.txt waits for a block.

    Needs :class:`~scrapy_hostqueue.HostQueueScheduler` and refuses to run
    beside AutoThrottle. Order it above ``RetryMiddleware`` (550), e.g. 560,
    so that it sees connection errors before they are retried; responses it
    learns from as they are downloaded, whatever its order.
    """

    def __init__(self, crawler: Crawler, config: HostQueueConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.table = AimdTable(
            AimdSettings(
                start=config.aimd_start,
                floor=config.aimd_floor,
                ceiling=config.aimd_ceiling,
                fast_latency=config.aimd_fast_latency,
                slow_latency=config.aimd_slow_latency,
                retry_after_max=config.retry_after_max,
                backoff_base=config.backoff_base,
                backoff_max=config.backoff_max,
                error_budget=config.error_budget,
                error_cooldown=config.error_cooldown,
                error_max_cooldowns=config.error_max_cooldowns,
            ),
            # Kept as long as the scheduler keeps the host (forget_host).
            max_hosts=None,
        )
        self.clock = self.table.clock
        self.recorder = get_recorder(crawler)
        #: The scheduler's hosts, from spider_opened: what this middleware
        #: asks of and tells the scheduler.
        self.hosts: HostControl | None = None
        settings = crawler.settings
        #: Hosts whose DOWNLOAD_SLOTS entry gives a concurrency: their ceiling.
        self._slot_ceilings = frozenset(
            key
            for key, slot in settings.getdict("DOWNLOAD_SLOTS").items()
            if isinstance(slot, dict) and "concurrency" in slot
        )
        self._per_ip = settings.getint("CONCURRENT_REQUESTS_PER_IP") > 0
        self._robots_user_agent: str | None = settings.get("ROBOTSTXT_USER_AGENT") or None
        self._default_user_agent: str = settings.get("USER_AGENT") or ""
        self._crawl_delays = CrawlDelays()
        #: The last failure of each given-up host, for HostGivenUp.
        self._last_errors: dict[str, str] = {}
        self._warned_no_room: set[str] = set()
        self._warned_slot_set_late = False
        #: Hosts whose learned state a resumed crawl gave back (relearn).
        self._relearned = 0

    @classmethod
    @internals.refuses_at_start_up
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        config = HostQueueConfig.from_settings(settings)
        if settings.getbool("AUTOTHROTTLE_ENABLED"):
            raise HostQueueSettingsError(
                "scrapy_hostqueue.AIMDMiddleware refuses to run with AUTOTHROTTLE_ENABLED=True: "
                "both would set the pace of the same hosts (AutoThrottle through the "
                "downloader slot delay, this middleware through per-host concurrency and "
                "blocks) and would work against each other. Set AUTOTHROTTLE_ENABLED=False, "
                "or disable the middleware with DOWNLOADER_MIDDLEWARES = "
                "{'scrapy_hostqueue.AIMDMiddleware': None} to keep AutoThrottle "
                "(HostQueueScheduler then follows AutoThrottle's delays)."
            )
        scheduler_cls = load_object(settings["SCHEDULER"])
        if not _is_hostqueue_scheduler(scheduler_cls):
            raise HostQueueSettingsError(
                "scrapy_hostqueue.AIMDMiddleware needs SCHEDULER = "
                f"'scrapy_hostqueue.HostQueueScheduler' (or a subclass), got "
                f"{settings['SCHEDULER']!r}: it holds hosts back through that scheduler"
            )
        middleware = cls(crawler, config)
        crawler.signals.connect(middleware.spider_opened, signal=signals.spider_opened)
        if config.crawl_delay_enabled and settings.getbool("ROBOTSTXT_OBEY"):
            crawler.signals.connect(middleware._robots_parsed, signal=signals.robots_parsed)
        return middleware

    # -- start-up ----------------------------------------------------------

    def spider_opened(self, spider: Spider) -> None:
        scheduler = internals.current_scheduler(self.crawler)
        if not _is_hostqueue_scheduler(type(scheduler)):
            raise HostQueueSettingsError(
                "scrapy_hostqueue.AIMDMiddleware needs HostQueueScheduler as the "
                f"scheduler, the engine runs {type(scheduler).__name__}"
            )
        hosts: HostControl = scheduler.hosts
        self.hosts = hosts
        hosts.attach_policy(self)
        cfg = self.config
        logger.info(
            "AIMDMiddleware: per-host limit %d..%d starting at %d; fast below %gs, "
            "slow above %gs; back-off on HTTP %s (Retry-After capped at %gs, else "
            "%g..%gs); Crawl-delay %s; error budget %d failures, %d cool-down(s) from %gs%s",
            cfg.aimd_floor,
            cfg.aimd_ceiling,
            cfg.aimd_start,
            cfg.aimd_fast_latency,
            cfg.aimd_slow_latency,
            ",".join(str(code) for code in sorted(cfg.aimd_backoff_http_codes)) or "none",
            cfg.retry_after_max,
            cfg.backoff_base,
            cfg.backoff_max,
            f"obeyed up to {cfg.crawl_delay_max:g}s"
            if cfg.crawl_delay_enabled and self.crawler.settings.getbool("ROBOTSTXT_OBEY")
            else "ignored",
            cfg.error_budget,
            cfg.error_max_cooldowns,
            cfg.error_cooldown,
            f"; resumed what was learned about {self._relearned:,} host(s) from JOBDIR"
            if self._relearned
            else "",
        )

    def initial_limit(self, host: str, configured: int) -> int:
        """Return the limit of a host the scheduler meets (the policy hook).

        ``HOSTQUEUE_AIMD_START``, or what was learnt if the host is still
        remembered. A ``DOWNLOAD_SLOTS`` concurrency is the host's ceiling,
        above or below ``HOSTQUEUE_AIMD_CEILING``; a lower
        ``CONCURRENT_REQUESTS_PER_IP`` lowers it.
        """
        limit = self.table.host(host, self._ceiling(host, configured)).limit
        self.recorder.limit_changed(host, limit)
        return limit

    def _ceiling(self, host: str, configured: int) -> int | None:
        """Return the ceiling of *host* when it is not ``HOSTQUEUE_AIMD_CEILING``."""
        if host in self._slot_ceilings:
            return configured
        if self._per_ip:
            return min(configured, self.config.aimd_ceiling)
        return None

    def learned(self, host: str) -> dict[str, float] | None:
        """Return what was learned about *host* (the policy hook), for a frontier file to keep.

        Its limit, smoothed latency, error budget spent.
        """
        return self.table.export(host)

    def relearn(self, host: str, data: dict[str, float]) -> None:
        """Take back what :meth:`learned` gave for *host* in the run before.

        The policy hook, in a resumed crawl: the host goes on from there instead of from
        ``HOSTQUEUE_AIMD_START``.
        """
        configured = internals.configured_slot(self.crawler.settings, host)[0]
        self.table.restore(host, data, self._ceiling(host, configured))
        self._relearned += 1

    def set_ceiling(self, host: str, ceiling: int) -> int:
        """Set the ceiling of *host* (the policy hook, for the monitor's controls).

        Its limit comes down to the ceiling if above, and climbs no higher
        from then on. Returns the limit.
        """
        return self.table.set_ceiling(host, ceiling).limit

    def forget_host(self, host: str) -> None:
        """Forget *host*, which the scheduler forgot (idle, beyond ``HOSTQUEUE_REMEMBER_HOSTS``).

        Forget what was learned about it too (the policy hook).
        """
        self.table.forget(host)
        self._last_errors.pop(host, None)
        self._warned_no_room.discard(host)

    @staticmethod
    def _known_host(hosts: HostControl, request: Request) -> str:
        """Return the host of *request*, made known to the scheduler if it is not.

        The host of *request*, made known to the scheduler if it is not (a
        robots.txt of a site whose requests share a ``download_slot``), so that
        what the table learns about it is forgotten when the scheduler
        forgets the host.
        """
        host = hosts.host_of(request)
        hosts.host_state(host)
        return host

    def _hosts(self) -> HostControl:
        if self.hosts is None:
            raise HostQueueSettingsError(
                "scrapy_hostqueue.AIMDMiddleware was used before spider_opened or "
                "without HostQueueScheduler (set SCHEDULER = "
                "'scrapy_hostqueue.HostQueueScheduler')"
            )
        return self.hosts

    # -- downloader middleware interface -----------------------------------

    def process_request(
        self, request: Request
    ) -> Request | Coroutine[Any, Any, Request | None] | None:
        hosts = self._hosts()
        given_up = hosts.given_up_host(request)
        if given_up is not None:
            raise HostGivenUp(given_up, self._last_errors.get(given_up))
        host = hosts.host_of(request)
        now = self.clock()
        handed_out_for = hosts.handed_out_for(request)
        if handed_out_for is None:
            # Not from the scheduler (engine.download_async: media pipelines,
            # robots.txt, a spider's own downloads): it waits here for the
            # host's block, delay and a free place under its limit instead,
            # then counts for the host until it leaves. Not robots.txt, which
            # the host's first requests wait for, beyond the block.
            if hosts.host_state(host).given_up:
                raise HostGivenUp(host, self._last_errors.get(host))
            counted = urlparse_cached(request).path != "/robots.txt"
            if self._direct_delay(hosts, host, now, counted) > 0 or (
                counted and not hosts.direct.has_room(host)
            ):
                # A coroutine: Scrapy awaits what process_request returns.
                return self._wait_for_host(hosts, request, host, counted)
            if counted:
                hosts.direct.adopt(request, host, now)
        elif hosts.requeues(request) < MAX_REQUEUES:
            if _DOWNLOAD_SLOT in request.meta and host != handed_out_for:
                # A downloader middleware before this one set the slot after
                # the request was queued under another host: it goes back, to
                # be queued, limited and blocked under its slot.
                return self._requeue_under_slot(request, host)
            # Requests handed out before the host got blocked (a 429 that
            # arrived meanwhile, a robots.txt Crawl-delay learnt while they
            # waited for robots.txt) go back to the scheduler, which holds them.
            # Only those: one from engine.download_async would loop.
            state = hosts.host_state(host)
            if state.blocked_until > now:
                return self._requeue(request, host, state.block_reason)
            delay = self._crawl_delays.delay(host) if self._crawl_delays else None
            if delay is not None:
                if state.interval < delay:
                    # The scheduler forgot the host (idle, beyond its memory).
                    self._apply_crawl_delay(hosts, host, delay)
                if self._crawl_delays.wait(host, now) > 0:
                    # Too soon after the last one. No block: that would also
                    # hold, at the scheduler's send gate, a request that passed
                    # here earlier and is not on the wire yet. The scheduler
                    # spaces its hand-outs by the interval.
                    return self._requeue(request, host, CRAWL_DELAY_REASON)
        if self._crawl_delays:
            self._crawl_delays.sent(host, now)
        request.meta[META_START] = now
        # The store noted when a hand-out filled the host's limit; requests
        # handed out together pass here a moment later, each one after that
        # note: noted again, each counts as sent while the limit was filled
        # (see HostControl.held_back_since).
        hosts.note_full(host, now)
        return None

    def _direct_delay(self, hosts: HostControl, host: str, now: float, spacing: bool) -> float:
        wait = hosts.direct.delay(host, now, spacing=spacing)
        if spacing and self._crawl_delays:
            wait = max(wait, self._crawl_delays.wait(host, now))
        return wait

    async def _wait_for_host(
        self,
        hosts: HostControl,
        request: Request,
        host: str,
        counted: bool,
    ) -> None:
        """Hold a request that did not come from the scheduler until its host may take it.

        Given up when the crawl starts closing, since the engine waits for it (a Retry-After block
        may be minutes long). Sent beyond the limit if no request of the host leaves for
        ``_DIRECT_PATIENCE`` seconds: a downloader middleware may be downloading it while one of the
        host's requests, which fill the limit, waits for the answer.
        """
        waited_for_room = 0.0
        while True:
            if hosts.host_state(host).given_up:
                raise HostGivenUp(host, self._last_errors.get(host))
            now = self.clock()
            wait = self._direct_delay(hosts, host, now, counted)
            if wait <= 0 and (not counted or hosts.direct.has_room(host)):
                break
            if internals.engine_closing(self.crawler):
                raise IgnoreRequest(f"the crawl closed while host {host} was held back")
            if wait > 0:
                await sleep(min(wait, _DIRECT_WAIT_SLICE))
                continue
            if waited_for_room >= _DIRECT_PATIENCE:
                self._warn_no_room(hosts, host)
                break
            began = self.clock()
            if await hosts.direct.wait_for_room(host, _DIRECT_WAIT_SLICE):
                # A request of the host left: the patience starts anew.
                waited_for_room = 0.0
            else:
                waited_for_room += self.clock() - began
        if counted:
            hosts.direct.adopt(request, host, now)
        if self._crawl_delays:
            self._crawl_delays.sent(host, now)
        request.meta[META_START] = now

    def _warn_no_room(self, hosts: HostControl, host: str) -> None:
        if host in self._warned_no_room:
            return
        self._warned_no_room.add(host)
        if hosts.held_below_limit(host):
            # Without the send gate the host's limit may also be filled by
            # requests still in downloader middlewares (see
            # DirectDownloads.has_room): the other message then.
            logger.warning(
                "Host %s: a request that skips the scheduler (engine.download_async) "
                "waited %gs while the host, silent (not heard from yet, or its last "
                "request failed to connect or timed out), had its one request at a "
                "time on the wire, and goes as one more, within the limit of %d.",
                host,
                _DIRECT_PATIENCE,
                hosts.host_state(host).limit,
            )
            return
        logger.warning(
            "Host %s: a request that skips the scheduler (engine.download_async) "
            "waited %gs for a place under the host's limit while none of its "
            "requests finished, and goes beyond the limit. A downloader middleware "
            "that downloads from a host while one of that host's requests waits for "
            "it needs a limit of 2 or more.",
            host,
            _DIRECT_PATIENCE,
        )

    def process_response(self, request: Request, response: Response) -> Response:
        if "cached" in response.flags and META_START in request.meta:
            # An HTTP cache hit says nothing about the host's pace (a latency
            # of 0 read as a fast answer), but a crawl replayed from the cache
            # must not go one request at a time, as for a host not heard from.
            # Downloaded responses were learnt from as they came in
            # (response_downloaded); one a downloader middleware after this one
            # made up (a stand-in, an error turned into a response) says
            # nothing of the host.
            self._hosts().answered(request)
        return response

    def learn(self, request: Request, response: Response) -> None:
        """Learn from *response*, which the download handler brought.

        The download handler brought *response* (the scheduler calls this
        on ``response_downloaded``, before the host counts as answered). It is
        learnt from here, not in process_response: a downloader middleware
        above this one may turn it into a new request first (RedirectMiddleware
        a 3xx, MetaRefreshMiddleware a refresh page, a ban middleware a 429),
        and the host would keep its limit whatever its pace.
        """
        started = request.meta.get(META_START)
        if started is None:
            return  # not sent through this middleware
        self._learn_from(self._hosts(), request, response, started)

    def _learn_from(
        self, hosts: HostControl, request: Request, response: Response, started: float
    ) -> None:
        """Adjust the host's limit and blocks to a downloaded *response*.

        Adjust the host's limit and blocks to a downloaded *response* to a
        request that passed here at *started*.
        """
        host = self._known_host(hosts, request)
        now = self.clock()
        latency = request.meta.get("download_latency")
        if latency is None:
            latency = now - started
        detail = f"HTTP {response.status}"
        if response.status in self.config.aimd_backoff_http_codes:
            retry_after = _longest_retry_after(response)
            adjustment = self.table.on_backoff(host, started, retry_after)
            if retry_after is not None:
                cap = self.config.retry_after_max
                if retry_after <= cap:
                    detail += f", Retry-After {retry_after:g}s"
                else:
                    # What the server asked for, unless past any sense.
                    asked = f" {retry_after:.0f}s" if retry_after < _SHOWN_WAIT_MAX else ""
                    detail += f", Retry-After{asked} over HOSTQUEUE_RETRY_AFTER_MAX={cap:g}s"
            elif b"Retry-After" in response.headers:
                # Said, so that a user does not wonder why the host did not
                # wait as long as its header seemed to ask.
                detail += f", Retry-After {_header_text(response)!r} unreadable"
        else:
            # Only a host whose limit held it back while the request was in
            # flight may have its limit raised by a run of fast answers: one
            # held back by its delay, or with too few URLs queued, would climb
            # to the ceiling on answers to one request at a time, and meet the
            # next burst of its URLs with the whole ceiling at once.
            adjustment = self.table.on_success(
                host, started, latency, hosts.held_back_since(host, started)
            )
        if adjustment is not None:
            self._apply(hosts, adjustment, now, latency, detail)
        self._keep_only_known(hosts, host)

    def overdue_after(self, host: str) -> float:
        """Return the seconds after which a request of *host* in flight is overdue.

        Seconds after which a request of *host* in flight is overdue (the
        policy hook; see ``AimdTable.overdue_after``).
        """
        return self.table.overdue_after(host)

    def overdue(self, request: Request, host: str, seconds: float) -> None:
        """Back the host of *request*, overdue after *seconds*, off now.

        *request* has been in flight *seconds*, past its host's overdue
        time (the policy hook): the host backs off now, not at the timeout.
        """
        started = request.meta.get(META_START)
        if started is None:
            return  # not sent through this middleware
        adjustment = self.table.on_overdue(host, started)
        if adjustment is not None:
            detail = f"no answer after {seconds:.1f}s (overdue)"
            self._apply(self._hosts(), adjustment, self.clock(), seconds, detail)

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        if isinstance(exception, HostBlocked):
            # Held at the send gate when its host got blocked: not a failure
            # of the host.
            return self._requeue(request, exception.host, exception.reason)
        if isinstance(exception, HostGivenUp):
            return None  # raised here, for the errback
        started = request.meta.get(META_START)
        if started is None:
            return None
        hosts = self._hosts()
        host = self._known_host(hosts, request)
        self.recorder.exception(host, type(exception).__name__)
        if not isinstance(exception, CONNECTION_ERRORS) or _malformed_answer(exception):
            return None
        hosts.host_silent(host)
        now = self.clock()
        adjustment = self.table.on_failure(host, started)
        if adjustment is not None:
            name = type(exception).__name__
            detail = f"{name}: {exception}" if str(exception) else name
            self._apply(hosts, adjustment, now, now - started, detail)
        self._keep_only_known(hosts, host)
        return None

    def _keep_only_known(self, hosts: HostControl, host: str) -> None:
        """Forget *host* if the scheduler no longer knows it.

        With ``HOSTQUEUE_REMEMBER_HOSTS = 0`` the scheduler forgets an idle host at once, before the
        answer to a request it did not hand out (a robots.txt) reaches this middleware: what was
        learned from that answer would stay in the table, which only the scheduler's forgetting
        empties, for the rest of the crawl.
        """
        if hosts.known_state(host) is None:
            self.forget_host(host)

    # -- applying the rule --------------------------------------------------

    def _apply(
        self,
        hosts: HostControl,
        adj: Adjustment,
        now: float,
        latency: float,
        detail: str,
    ) -> None:
        host = adj.host
        debug = self.config.aimd_debug
        dropped = hosts.adjust(adj, now)
        if adj.decreased:
            self.recorder.backoff(host, adj.reason)
        if debug and (adj.limit_changed or adj.decreased):
            logger.info(
                "AIMD %s: limit %d -> %d (%s: %s, latency %.3fs)",
                host,
                adj.old_limit,
                adj.new_limit,
                adj.reason,
                detail,
                latency,
            )
        if adj.first_backoff:
            logger.warning(
                "Host %s asked to back off (%s): limit %d -> %d%s; further back-offs of "
                "this host are logged with HOSTQUEUE_AIMD_DEBUG=True",
                host,
                detail,
                adj.old_limit,
                adj.new_limit,
                f", paused {adj.block:.1f}s" if adj.block else "",
            )
        if debug and adj.block is not None and adj.block > 0 and adj.block_reason is not None:
            logger.info("AIMD %s: blocked for %.2fs (%s)", host, adj.block, adj.block_reason)
        if adj.parked:
            self.recorder.host_parked(host)
            logger.info(
                "Host %s failed %d times in a row (last: %s): parked for %.1fs",
                host,
                self.config.error_budget,
                detail,
                adj.block or 0.0,
            )
        if adj.give_up:
            self._last_errors[host] = detail
            # ERROR, as Scrapy's RetryMiddleware logs each request it gives up:
            # the host's pages are lost.
            logger.error(
                "Giving up host %s: %d failures in a row after %d cool-down(s) (last: %s); "
                "its %d queued request(s), and any new one, go to their errbacks with "
                "HostGivenUp (an IgnoreRequest)",
                host,
                self.config.error_budget,
                self.config.error_max_cooldowns,
                detail,
                dropped,
            )

    def _requeue_under_slot(self, request: Request, slot: str) -> Request:
        if not self._warned_slot_set_late:
            self._warned_slot_set_late = True
            logger.warning(
                "A downloader middleware set meta['download_slot'] (%r for %s) after "
                "HostQueueScheduler had queued the request under another host. Such "
                "requests go back to the scheduler once, to be queued, limited and "
                "blocked under their slot; set download_slot in the spider or a "
                "spider middleware to spare them that round trip.",
                slot,
                request,
            )
        return self._requeue(request, slot, "download_slot set after scheduling")

    def _requeue(self, request: Request, host: str, reason: str | None) -> Request:
        meta = dict(request.meta)
        meta.pop(META_START, None)
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value(stat_key("requeued_count"))
        logger.debug("%s goes back to the scheduler (host %s: %s)", request, host, reason)
        # dont_filter: the dupefilter has seen this request already.
        requeued = request.replace(meta=meta, dont_filter=True)
        self._hosts().requeued(request, requeued)
        return requeued

    # -- signals -------------------------------------------------------------

    def _robots_parsed(self, robotparser: RobotRules, request: Request) -> None:
        user_agent: str | bytes | None = self._robots_user_agent
        if not user_agent:
            user_agent = request.headers.get(b"User-Agent") or self._default_user_agent
        asked = asked_delay(robotparser, user_agent)
        if asked is None:
            return
        seconds = min(asked, self.config.crawl_delay_max)
        if not seconds > 0:
            return
        hosts = self._hosts()
        host = hosts.host_of(request)
        now = self.clock()
        delay, new = self._crawl_delays.learn(host, seconds, now)
        if new and self.crawler.stats is not None:
            self.crawler.stats.inc_value(stat_key("crawl_delay_host_count"))
        self._apply_crawl_delay(hosts, host, delay)
        # Page requests handed out before the delay was known are waiting for
        # robots.txt right now, past the scheduler: blocking the host sends
        # them all back to it (process_request), to be handed out spaced.
        hosts.block_until(host, now + delay + CRAWL_DELAY_MARGIN, CRAWL_DELAY_REASON)
        capped = f" (it asks {asked:g}s; HOSTQUEUE_CRAWL_DELAY_MAX)" if asked > seconds else ""
        logger.info("Host %s: robots.txt Crawl-delay %gs is obeyed%s", host, delay, capped)

    @staticmethod
    def _apply_crawl_delay(hosts: HostControl, host: str, delay: float) -> None:
        state = hosts.host_state(host)
        interval = interval_for(delay, state.interval, state.jitter)
        if interval is not None:
            # Without the DOWNLOAD_DELAY_JITTER (default 0.5) that would start
            # some requests at half the delay.
            hosts.set_interval(host, interval)

    def __repr__(self) -> str:
        return f"<AIMDMiddleware hosts={len(self.table)}>"
