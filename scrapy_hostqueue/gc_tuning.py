"""``GcTuning``.

An extension that keeps a crawl's start-up heap out of Python's full garbage collections and
collects the young generation less often.

A crawl allocates fast, and every object that outlives two young collections
(a request in flight, a queued request, a response being parsed) is promoted
to the oldest generation. Python runs a full collection whenever the promoted
objects reach a quarter of that generation, and a full collection walks every
tracked object: the modules, classes and functions of Scrapy, Twisted, lxml
and the project, which stay alive for the whole crawl anyway. On a crawl of a
few hundred pages a second that is a 50-100 ms pause more than once a second.

Moving the objects alive when the crawl starts into the permanent generation
(:func:`gc.freeze`) takes them out of those walks. Reference counting still
frees them; only a reference cycle among them that became garbage later would
stay, and :func:`gc.collect` runs first so that no garbage is frozen. Every
crawl in a process freezes what is alive when it opens; the last one to close
undoes the freeze.

The young generation is collected every 700 allocations (net of frees) by
default, a few hundred times in a crawl of 1,200 pages, and every tenth of
those collections also walks the middle generation. Reference counting
already frees almost everything a response leaves behind, so most of those
walks find nothing. :func:`raise_young_threshold` spaces them out while
crawls run; the last crawl to close restores the thresholds, unless something
else changed them meanwhile.

This is the only module of the package that touches the interpreter's
garbage collector; ``scrapy_hostqueue.Addon`` enables the extension.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import NotConfigured

from scrapy_hostqueue._config import HostQueueConfig

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

__all__ = ["GcTuning"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_holders = 0
#: Whether the freeze in force is this module's to undo (not when the process
#: had frozen objects before the first crawl, e.g. a pre-fork server).
_owned = False
#: Objects the interpreter itself keeps in the permanent generation. CPython
#: 3.12 moves immortal objects there at every full collection (a few hundred
#: from start-up on), so on 3.12 a freeze count above 0 does not mean that
#: anyone called :func:`gc.freeze`; other versions keep none there.
_INTERPRETER_FROZEN = gc.get_freeze_count() if sys.version_info[:2] == (3, 12) else 0


def hold() -> int:
    """Freeze the heap for one more crawl; returns the number of frozen objects."""
    global _holders, _owned
    with _lock:
        if not _holders:
            _owned = gc.get_freeze_count() <= _INTERPRETER_FROZEN
        _holders += 1
        gc.collect()
        gc.freeze()
        return gc.get_freeze_count()


def release() -> None:
    """One crawl no longer needs the freeze; the last one undoes it."""
    global _holders
    with _lock:
        if not _holders:
            return
        _holders -= 1
        if not _holders and _owned:
            gc.unfreeze()


def holders() -> int:
    """How many crawls hold the freeze now."""
    return _holders


_young_holders = 0
#: The thresholds before the first crawl raised them, and the young one it set.
_saved_thresholds: tuple[int, ...] | None = None
_raised_to = 0


def raise_young_threshold(young: int) -> int:
    """Collect the young generation at most every *young* allocations while this crawl runs.

    Returns the threshold in force. A higher threshold, or 0 (automatic collection off), is left as
    it is.
    """
    global _young_holders, _saved_thresholds, _raised_to
    with _lock:
        current = gc.get_threshold()
        if not _young_holders:
            _saved_thresholds = current
        _young_holders += 1
        if current[0] and young > current[0]:
            gc.set_threshold(young, *current[1:])
        _raised_to = gc.get_threshold()[0]
        return _raised_to


def restore_young_threshold() -> None:
    """Give back the raised threshold, which this crawl no longer needs.

    The last one restores the thresholds, unless they were changed since it raised them.
    """
    global _young_holders, _saved_thresholds
    with _lock:
        if not _young_holders:
            return
        _young_holders -= 1
        if _young_holders or _saved_thresholds is None:
            return
        if gc.get_threshold()[0] == _raised_to:
            gc.set_threshold(*_saved_thresholds)
        _saved_thresholds = None


class GcTuning:
    """Keeps the start-up heap out of full garbage collections while the crawl runs.

    Freezes the heap alive when the spider opens (``HOSTQUEUE_GC_FREEZE``)
    and raises the young generation's threshold (``HOSTQUEUE_GC_YOUNG_THRESHOLD``)
    while the crawl runs; both are undone when the spider closes. Not
    configured when both settings are off.

    Enabled by ``scrapy_hostqueue.Addon``; without the add-on:
    ``EXTENSIONS = {"scrapy_hostqueue.GcTuning": 0}``.
    """

    def __init__(self, freeze: bool, young_threshold: int) -> None:
        self.freeze = freeze
        self.young_threshold = young_threshold
        self._held = False
        self._raised = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = HostQueueConfig.from_settings(crawler.settings)
        if not config.gc_freeze and not config.gc_young_threshold:
            raise NotConfigured("HOSTQUEUE_GC_FREEZE and HOSTQUEUE_GC_YOUNG_THRESHOLD are off")
        extension = cls(config.gc_freeze, config.gc_young_threshold)
        # spider_opened: in Scrapy 2.19 no signal comes between the engine
        # being built and the scheduler opening; this one comes once every
        # component is open and before the first start request is read
        # (engine_started comes later, and also in a shell without a spider).
        crawler.signals.connect(extension.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(extension.spider_closed, signal=signals.spider_closed)
        return extension

    def spider_opened(self, spider: Spider) -> None:
        done = []
        if self.freeze and not self._held:
            self._held = True
            done.append(f"{hold():,} start-up objects frozen out of full GC passes")
        if self.young_threshold and not self._raised:
            self._raised = True
            young = raise_young_threshold(self.young_threshold)
            done.append(
                f"young GC generation collected every {young:,} allocations"
                if young
                else "automatic GC off, left off"
            )
        if done:
            logger.info("GcTuning: %s", "; ".join(done))

    def spider_closed(self, spider: Spider) -> None:
        if self._held:
            self._held = False
            release()
        if self._raised:
            self._raised = False
            restore_young_threshold()
