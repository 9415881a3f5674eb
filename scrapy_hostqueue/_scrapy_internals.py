"""Every touch of Scrapy internals that may move between releases.

Downloader slots, the downloader's set of active requests and the engine's
wake-up call are not a stable public API (an open Scrapy proposal may replace
download slots altogether), so nothing else in the package reaches into them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)


def _engine(crawler: Crawler) -> Any:
    """The crawler's engine, or None before the crawl starts (Scrapy 2.19's
    ``Crawler.engine`` raises then)."""
    try:
        return crawler.engine
    except RuntimeError:
        return None


def host_key(crawler: Crawler, request: Request) -> str:
    """The key of the host a request belongs to.

    This is the one definition of "host" in the package: the downloader slot
    key, i.e. ``request.meta["download_slot"]`` when set, else the URL's
    hostname (lowercase, no port, IPv6 without brackets, "" for URLs without a
    host such as ``data:``), or its IP address with ``CONCURRENT_REQUESTS_PER_IP``.
    """
    engine = _engine(crawler)
    if engine is not None:
        return str(engine.downloader.get_slot_key(request))
    slot = request.meta.get("download_slot")
    if slot is not None:
        return str(slot)
    return urlparse_cached(request).hostname or ""


def configured_slot(settings: BaseSettings, key: str) -> tuple[int, float, float]:
    """``(concurrency, delay, jitter)`` that Scrapy gives a new slot for *key*."""
    per_slot: dict[str, dict[str, Any]] = settings.getdict("DOWNLOAD_SLOTS")
    slot_settings = per_slot.get(key, {})
    concurrency = int(
        slot_settings.get(
            "concurrency",
            settings.getint("CONCURRENT_REQUESTS_PER_IP")
            or settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"),
        )
    )
    delay = float(slot_settings.get("delay", settings.getfloat("DOWNLOAD_DELAY")))
    if "jitter" in slot_settings:
        jitter = float(slot_settings["jitter"])
    elif "randomize_delay" in slot_settings:
        jitter = 0.5 if slot_settings["randomize_delay"] else 0.0
    else:
        jitter = _default_jitter(settings)
    return concurrency, delay, jitter


def _default_jitter(settings: BaseSettings) -> float:
    """The jitter of slots without their own, as Scrapy 2.19's downloader reads
    it: ``DOWNLOAD_DELAY_JITTER``, unless the deprecated
    ``RANDOMIZE_DOWNLOAD_DELAY`` was set at a higher priority (``True``: the
    historical +/-50 %, ``False``: none)."""
    randomize = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    jitter = settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0
    if randomize > max(SETTINGS_PRIORITIES["default"], jitter):
        return 0.5 if settings.getbool("RANDOMIZE_DOWNLOAD_DELAY") else 0.0
    return settings.getfloat("DOWNLOAD_DELAY_JITTER", 0.5)


def apply_to_slot(
    crawler: Crawler,
    key: str,
    *,
    concurrency: int | None = None,
    delay: float | None = None,
) -> None:
    """Mirror a host's limit (and delay) on its downloader slot, if it exists.

    Slots are garbage-collected when idle and recreated from the settings, so
    callers re-apply on ``request_reached_downloader``, which fires after the
    slot exists and before the downloader decides to send.
    """
    engine = _engine(crawler)
    if engine is None:
        return
    slot = engine.downloader.slots.get(key)
    if slot is None:
        return
    if concurrency is not None:
        slot.concurrency = concurrency
    if delay is not None:
        slot.delay = delay


def hold_slot_concurrency(crawler: Crawler, key: str) -> None:
    """Make the downloader slot *key*, if it exists, hold its concurrency
    exactly (see :class:`_StartingQueue`). Call it before the slot's first
    request is queued (``request_reached_downloader`` fires just before)."""
    engine = _engine(crawler)
    if engine is None:
        return
    slot = engine.downloader.slots.get(key)
    if slot is not None and not isinstance(slot.queue, _StartingQueue):
        slot.queue = _StartingQueue(slot.queue, slot.transferring)


class _StartingQueue(deque):  # type: ignore[type-arg]
    """A downloader slot's queue that counts a request as transferring as
    soon as the downloader takes it off the queue.

    Scrapy 2.19's downloader takes queued requests off while the slot has
    ``free_transfer_slots()``, but adds each to ``slot.transferring`` only
    when its download task first runs, a loop turn later: several taken off
    together all pass the check, and the host gets more than the slot's
    concurrency (on the asyncio reactor, without a download delay). Added
    here at once, the check holds."""

    __slots__ = ("_transferring",)

    def __init__(self, items: Iterable[Any], transferring: set[Any]) -> None:
        super().__init__(items)
        self._transferring = transferring

    def popleft(self) -> Any:
        item = super().popleft()
        self._transferring.add(item[0])
        return item


def on_request_leaving_downloader(
    crawler: Crawler, callback: Callable[[Request], None]
) -> Callable[[], None]:
    """Call *callback* whenever a request leaves the downloader, whatever the
    outcome: response, exception, a middleware short-circuit (cache hit,
    IgnoreRequest, robots.txt), or a redirect/retry returned as a new request.

    ``Downloader.fetch`` adds every request to ``downloader.active`` before the
    downloader middlewares run and removes it in a ``finally`` clause; no
    signal covers all of these cases. Returns a function that undoes the hook.
    """
    engine = _engine(crawler)
    assert engine is not None
    downloader = engine.downloader
    original = downloader.active
    hooked = _LeaveNotifyingSet(original, callback)
    downloader.active = hooked

    def undo() -> None:
        if downloader.active is hooked:
            downloader.active = set(hooked)

    return undo


class _LeaveNotifyingSet(set):  # type: ignore[type-arg]
    __slots__ = ("_callback",)

    def __init__(self, items: Iterable[Any], callback: Callable[[Any], None]) -> None:
        super().__init__(items)
        self._callback = callback

    def remove(self, item: Any) -> None:
        super().remove(item)
        try:
            self._callback(item)
        except Exception:
            logger.exception("Error while releasing %s", item)

    def discard(self, item: Any) -> None:
        if item in self:
            self.remove(item)


def wake_engine(crawler: Crawler) -> None:
    """Ask the engine to pull from the scheduler now.

    The engine otherwise retries a scheduler that returned None only after a
    finished download, a new request, or its 5-second heartbeat.
    """
    engine = _engine(crawler)
    slot = getattr(engine, "_slot", None)
    nextcall = getattr(slot, "nextcall", None)
    if nextcall is not None:
        nextcall.schedule()


def engine_closing(crawler: Crawler) -> bool:
    """Whether the crawl is stopping (or not running): no request should
    start waiting for anything then, since the engine waits for every request
    in progress before it closes."""
    engine = _engine(crawler)
    slot = getattr(engine, "_slot", None)
    return not getattr(engine, "running", False) or getattr(slot, "closing", None) is not None


def current_scheduler(crawler: Crawler) -> Any:
    engine = _engine(crawler)
    return engine.scheduler if engine is not None else None


def slot_delay(crawler: Crawler, key: str) -> float | None:
    """The current delay of *key*'s downloader slot, if the slot exists."""
    engine = _engine(crawler)
    if engine is None:
        return None
    slot = engine.downloader.slots.get(key)
    return None if slot is None else float(slot.delay)
