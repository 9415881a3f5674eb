"""The Redis frontier (``HOSTQUEUE_FRONTIER = "redis://..."``) as the scheduler holds it.

This process's part in the shared crawl
(:class:`~scrapy_hostqueue.frontier.redis._glue.RedisFrontier`), the dupefilter in front of the
shared one, and the fingerprints the store dedupes by across processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue.frontier._codec import RequestCodec
from scrapy_hostqueue.frontier._dupefilter import FrontierDupeFilter, dupefilter_on
from scrapy_hostqueue.frontier.redis._glue import RedisFrontier

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from scrapy_hostqueue._config import HostQueueConfig
    from scrapy_hostqueue.frontier import HostState, RequestStore


def shared_fingerprint(
    crawler: Crawler, dupefilter: BaseDupeFilter
) -> Callable[[Request], bytes | None]:
    """Return what the Redis store dedupes a request by across processes.

    Its fingerprint, or None (not filtered) for ``dont_filter`` requests and crawls with a
    dupefilter of their own.
    """
    if not isinstance(dupefilter, FrontierDupeFilter):
        return lambda request: None
    fingerprinter = crawler.request_fingerprinter
    assert fingerprinter is not None

    def fingerprint(request: Request) -> bytes | None:
        return None if request.dont_filter else fingerprinter.fingerprint(request)

    return fingerprint


class SharedFrontier:
    """The Redis frontier.

    The job is the shared crawl in Redis, which this process joins when the spider opens and hands
    back what it holds to when it closes. Each process drops its own duplicates; the push script in
    Redis drops the others' (see :func:`shared_fingerprint`).
    """

    queue = "disk"

    def __init__(self, crawler: Crawler, part: RedisFrontier, *, debug: bool) -> None:
        assert crawler.stats is not None
        self._crawler = crawler
        #: This process's part in the shared crawl.
        self.part = part
        self.codec: RequestCodec | None = RequestCodec(crawler.stats, debug)
        self._joined = False

    @classmethod
    def open(cls, crawler: Crawler, config: HostQueueConfig, *, debug: bool) -> Self:
        """Connect, check the crawl's layout and register this process.

        See :meth:`RedisFrontier.open`.
        """
        return cls(crawler, RedisFrontier.open(crawler, config), debug=debug)

    def dupefilter(self) -> BaseDupeFilter:
        return dupefilter_on(self._crawler, self.part.seen)

    def make_store(
        self,
        dupefilter: BaseDupeFilter,
        state_factory: Callable[[str], HostState],
        **kwargs: Any,
    ) -> RequestStore[Request]:
        assert self.codec is not None
        fingerprint = shared_fingerprint(self._crawler, dupefilter)
        return self.part.make_store(self.codec, fingerprint, state_factory, **kwargs)

    def refusal(self) -> tuple[str, str] | None:
        return None

    def resume(
        self, spider: Spider, push: Callable[[Request], bool], refuse: Callable[[str], None]
    ) -> tuple[int, int]:
        """Join the shared crawl: start the store's task."""
        assert self.codec is not None
        self.codec.spider = spider
        self.part.start(lambda: internals.wake_engine(self._crawler))
        self._joined = True
        return 0, 0

    def stop(self) -> None:
        """Do nothing: the store's task stops at :meth:`close`, once it has handed back."""

    def save(self, given_up: Iterable[tuple[str, Request]]) -> int:
        return 0  # every change is in Redis already

    def close(self, dupefilter: BaseDupeFilter, reason: str) -> Deferred[None] | None:
        if not self._joined:
            return dupefilter.close(reason)  # type: ignore[no-any-return]
        return deferred_from_coro(self._close(dupefilter, reason))

    async def _close(self, dupefilter: BaseDupeFilter, reason: str) -> None:
        await self.part.close(self._crawler.stats)
        closed = dupefilter.close(reason)
        if closed is not None:
            await maybe_deferred_to_future(closed)


__all__ = ["SharedFrontier", "shared_fingerprint"]
