"""The dupefilter of the stores that keep the seen fingerprints themselves.

Those are the SQLite file and Redis; the filter takes the place of Scrapy's ``requests.seen``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.dupefilters import BaseDupeFilter, RFPDupeFilter
from scrapy.utils.misc import build_from_crawler, load_object

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


def scrapy_dupefilter(crawler: Crawler) -> BaseDupeFilter:
    """Make the dupefilter ``DUPEFILTER_CLASS`` names."""
    dupefilter_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
    return build_from_crawler(dupefilter_cls, crawler)  # type: ignore[no-any-return]


def dupefilter_on(crawler: Crawler, seen: Callable[[bytes], bool]) -> BaseDupeFilter:
    """Make the crawl's dupefilter on *seen* in place of Scrapy's own.

    In place of Scrapy's own dupefilter, the same filter on *seen* (the
    store's set of fingerprints); any other ``DUPEFILTER_CLASS`` as it is.
    """
    if uses_scrapy_dupefilter(crawler):
        return FrontierDupeFilter(crawler, seen)
    return scrapy_dupefilter(crawler)


def uses_scrapy_dupefilter(crawler: Crawler) -> bool:
    """Whether the crawl uses Scrapy's own dupefilter.

    Whose ``requests.seen`` the frontier file replaces.
    """
    return load_object(crawler.settings["DUPEFILTER_CLASS"]) is RFPDupeFilter


class FrontierDupeFilter(BaseDupeFilter):
    """Scrapy's ``RFPDupeFilter`` on the frontier file instead of ``requests.seen``.

    A fingerprint becomes durable in the same commit as its request, and the seen set stays on disk.
    """

    def __init__(self, crawler: Crawler, seen: Callable[[bytes], bool]) -> None:
        assert crawler.request_fingerprinter is not None
        self._fingerprinter = crawler.request_fingerprinter
        self._seen = seen
        self._stats = crawler.stats
        self.debug = crawler.settings.getbool("DUPEFILTER_DEBUG")
        self._logdupes = True

    def request_seen(self, request: Request) -> bool:
        return self._seen(self._fingerprinter.fingerprint(request))

    def log(self, request: Request, spider: Spider) -> None:
        if self.debug or self._logdupes:
            logger.debug(
                "Filtered duplicate request: %s%s",
                request,
                ""
                if self.debug
                else " - no more duplicates will be shown "
                "(see DUPEFILTER_DEBUG to show all duplicates)",
            )
            self._logdupes = False
        if self._stats is not None:
            self._stats.inc_value("dupefilter/filtered")


__all__ = ["FrontierDupeFilter", "dupefilter_on", "scrapy_dupefilter", "uses_scrapy_dupefilter"]
