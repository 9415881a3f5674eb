"""Every error scrapy-hostqueue raises for its users to see.

Under one base, :class:`HostQueueError`.

What errbacks and downloader middlewares of a crawl may see
(:class:`HostBlocked`, :class:`HostGivenUp`, both Scrapy's ``IgnoreRequest``
too); what a crawl refuses to start with, as one ERROR line
(:class:`HostQueueSettingsError`, :class:`UnsupportedDependencyError`,
:class:`FrontierFileError`, :class:`RedisFrontierError`); what stops a
shared crawl whose Redis lost it (:class:`RedisFrontierLost`); what the
command line reports (:class:`TimelineError`, :class:`PlotError`, and the
frontier errors).
"""

from __future__ import annotations

from scrapy.exceptions import IgnoreRequest

from scrapy_hostqueue import _errors
from scrapy_hostqueue._errors import *  # noqa: F403 (the errors that need no Scrapy)
from scrapy_hostqueue._errors import HostQueueError

__all__ = ["HostBlocked", "HostGivenUp"]
__all__ += _errors.__all__


class HostBlocked(HostQueueError, IgnoreRequest):
    """A request's host got blocked while the request waited at the send gate.

    Raised at the send gate for a request whose host got blocked (a
    Retry-After, a back-off) while the request waited there; the AIMD
    middleware sends it back to the scheduler, which holds it until the block
    ends.

    Downloader middlewares ordered above the AIMD middleware see it in their
    ``process_exception`` first. It is not a failure of the host or of a
    proxy: a subclass of Scrapy's ``IgnoreRequest``, which middlewares that
    handle download failures (retries, proxy bans) leave alone. Such a
    middleware must return None for it, so that the request reaches the AIMD
    middleware and goes back to the queue.
    """

    def __init__(self, host: str, reason: str | None) -> None:
        super().__init__(f"host {host} is blocked ({reason}): the request goes back to the queue")
        self.host = host
        self.reason = reason


class HostGivenUp(HostQueueError, IgnoreRequest):
    """What the errback of a request gets when its host was given up.

    The host had too many connection failures in a row (``HOSTQUEUE_ERROR_MAX_COOLDOWNS``), or
    was given up from the monitor's controls. The request was queued when that happened, or came
    later. A subclass of Scrapy's ``IgnoreRequest``,
    as for requests robots.txt forbids.

    ``last_error`` names the host's last failure
    (``"DownloadConnectionRefusedError: ..."``, ``"HTTP 503"``), or is None if
    it is no longer known (or the monitor gave the host up).
    """

    def __init__(self, host: str, last_error: str | None = None) -> None:
        message = f"host {host} was given up"
        if last_error:
            message += f" after repeated connection failures (last: {last_error})"
        super().__init__(message)
        self.host = host
        self.last_error = last_error
