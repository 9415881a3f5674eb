"""The crawl's job: what a crawl resumes from and leaves behind.

The job belongs to the crawl's frontier (:class:`~scrapy_hostqueue.frontier.Frontier`):
with the in-memory store, ``JOBDIR/hostqueue.state`` read at the start and
written at a graceful stop; with the SQLite store, the frontier file,
committed as the crawl goes; with the Redis store, the shared crawl in Redis,
which this process joins at the start and hands back what it holds to at the
stop. This module holds what is the same for every kind: a ``JOBDIR`` this
crawl cannot resume without losing requests is refused, and the crawl closes
before its first request, leaving the job as it was.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import CloseSpider

from scrapy_hostqueue.frontier._jobdir import (
    JOBDIR_OF_SQLITE_FRONTIER,
    JOBDIR_STATE_UNREADABLE,
    scrapy_job_refusal,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred

    from scrapy_hostqueue.frontier import Frontier

logger = logging.getLogger(__name__)

#: The ``finish_reason`` of a crawl that refused its JOBDIR.
JOBDIR_OF_SCRAPY_SCHEDULER = "hostqueue_jobdir_of_scrapy_scheduler"


class Job:
    """Opens, resumes and saves the job of a crawl on *frontier* (in *jobdir* if set)."""

    def __init__(self, crawler: Crawler, frontier: Frontier, jobdir: str | None) -> None:
        self._crawler = crawler
        self._frontier = frontier
        self.jobdir = jobdir
        self._spider: Spider | None = None
        #: The finish reason when the crawl must close before its first
        #: request (a JOBDIR it cannot resume), else None.
        self.refusal: str | None = None

    @property
    def opened(self) -> bool:
        """Whether the crawl was accepted (:meth:`accept`)."""
        return self._spider is not None

    def accept(self, spider: Spider) -> bool:
        """Whether the crawl may go on with this JOBDIR.

        If not, it is refused (see :meth:`refuse`).
        """
        refusal = scrapy_job_refusal(self.jobdir)
        if refusal is not None:
            logger.error(refusal)
            self.refuse(JOBDIR_OF_SCRAPY_SCHEDULER)
            return False
        refused = self._frontier.refusal()
        if refused is not None:
            reason, message = refused
            logger.error(message)
            self.refuse(reason)
            return False
        self._spider = spider
        return True

    def resume(self, push: Callable[[Request], bool]) -> tuple[int, int]:
        """Resume the job: queue what it saved and restore its hosts.

        Queue what the job saved with *push* (its requests, already seen
        by the dupefilter) and restore its host blocks and spacing; start the
        frontier file's commits, or join the shared crawl. Returns the
        requests resumed and the host blocks still in force.
        """
        assert self._spider is not None
        return self._frontier.resume(self._spider, push, self.refuse)

    def refuse(self, reason: str) -> None:
        """Close the crawl with *reason* before its first request.

        Close the crawl with *reason* once every component is open (the
        engine's way for a spider_opened handler that raises CloseSpider),
        before any request; :meth:`save` then leaves the job as it was.
        """
        self.refusal = reason
        self._crawler.signals.connect(self._close_refused, signal=signals.spider_opened)

    def _close_refused(self, spider: Spider) -> None:
        assert self.refusal is not None
        raise CloseSpider(self.refusal)

    def stop(self) -> None:
        """Stop what the frontier runs in the background (its commits)."""
        self._frontier.stop()

    def close(self, dupefilter: BaseDupeFilter, reason: str) -> Deferred[None] | None:
        """Close *dupefilter*, in a shared crawl once this process has handed back what it holds."""
        return self._frontier.close(dupefilter, reason)

    def save(self, given_up: Iterable[tuple[str, Request]]) -> int:
        """Keep what the store holds at the stop.

        At the stop, keep what the store holds (and *given_up*, the
        requests of given-up hosts) where the frontier does not keep every
        change itself. Returns how many requests could not be serialised.
        """
        if self._spider is None or self.refusal is not None:
            return 0  # the job is left as it was
        return self._frontier.save(given_up)


__all__ = [
    "JOBDIR_OF_SCRAPY_SCHEDULER",
    "JOBDIR_OF_SQLITE_FRONTIER",
    "JOBDIR_STATE_UNREADABLE",
    "Job",
]
