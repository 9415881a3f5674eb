"""``Addon``: one ``ADDONS`` line wires the whole package."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue.exceptions import HostQueueSettingsError
from scrapy_hostqueue.middleware import _is_hostqueue_scheduler as _is_hostqueue_class

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
SCHEDULER = "scrapy_hostqueue.HostQueueScheduler"
MIDDLEWARE = "scrapy_hostqueue.AIMDMiddleware"
HANDLER = "scrapy_hostqueue.AiohttpDownloadHandler"
EXTENSION = "scrapy_hostqueue.stats.HostQueueStats"
GC_EXTENSION = "scrapy_hostqueue.GcTuning"
MONITOR_EXTENSION = "scrapy_hostqueue.monitor.extension.HostQueueMonitor"
START_MIDDLEWARE = "scrapy_hostqueue.StartRequestsMiddleware"
#: Nearest the engine of Scrapy's spider middlewares (StartSpiderMiddleware is
#: at 25), so that its time slice covers the whole start chain.
START_MIDDLEWARE_ORDER = 10
#: Above RetryMiddleware (550): process_exception runs from high to low
#: orders, so the middleware sees connection errors before they are turned
#: into retries (responses it learns from as they are downloaded).
MIDDLEWARE_ORDER = 560
#: Scrapy 2.19 starts ``CONCURRENT_ITEMS`` tasks for the output of every
#: response, however little it yields. At Scrapy's default of 100 that cost
#: about 1 ms of CPU per response in a link-following crawl on 2 cores (a
#: fifth of the crawl's CPU); at 16 a response's items still go through the
#: item pipelines 16 at a time.
CONCURRENT_ITEMS = 16


def require_asyncio_reactor(settings: BaseSettings, component: str) -> None:
    """Refuse to start, naming *component*, unless the crawl runs on asyncio.

    The asyncio reactor, or no Twisted reactor at all (``TWISTED_REACTOR_ENABLED = False``).
    """
    if not settings.getbool("TWISTED_REACTOR_ENABLED", True):
        return
    reactor = settings.get("TWISTED_REACTOR")
    if reactor != ASYNCIO_REACTOR:
        raise HostQueueSettingsError(
            f"{component} needs the asyncio reactor: set TWISTED_REACTOR = "
            f"{ASYNCIO_REACTOR!r} (got {reactor!r})"
        )


def _import_path(key: Any) -> str:
    """Return the import path a component key stands for.

    Scrapy takes classes as keys as well as strings.
    """
    if isinstance(key, str):
        return key
    return f"{getattr(key, '__module__', '')}.{getattr(key, '__qualname__', '')}"


def _enable(components: BaseSettings, order: int, path: str, module_path: str) -> None:
    """Add *path* to a component dict unless the user placed it.

    Add *path* to a component dict at add-on priority unless the user placed
    it (or disabled it with ``None``) under either of its import paths, or as
    the class itself.
    """
    if not any(_import_path(key) in (path, module_path) for key in components):
        components.set(path, order, priority="addon")


def _is_hostqueue_scheduler(value: Any) -> bool:
    """Whether a ``SCHEDULER`` value is this project's scheduler or a subclass."""
    try:
        cls = load_object(value) if isinstance(value, str) else value
    except (ImportError, NameError, ValueError, AttributeError):
        return False  # Scrapy reports a bad path when it loads the scheduler
    return _is_hostqueue_class(cls)


class Addon:
    """Wires every component of scrapy-hostqueue in with one line.

    Wires :class:`~scrapy_hostqueue.HostQueueScheduler`,
    :class:`~scrapy_hostqueue.AIMDMiddleware`,
    :class:`~scrapy_hostqueue.AiohttpDownloadHandler` (``http`` and ``https``),
    :class:`~scrapy_hostqueue.StartRequestsMiddleware`, the
    ``HostQueueStats`` extension (periodic log line, timeline), the
    :class:`~scrapy_hostqueue.GcTuning` extension (off with
    ``HOSTQUEUE_GC_FREEZE = False`` and ``HOSTQUEUE_GC_YOUNG_THRESHOLD = 0``)
    and the live monitor (``HostQueueMonitor``, off with
    ``HOSTQUEUE_MONITOR = False``),
    and sets ``CONCURRENT_ITEMS`` to 16, at add-on priority. A value the user set
    (another ``SCHEDULER``, a middleware disabled with ``None``, another
    handler for a scheme, ``CONCURRENT_ITEMS``) is kept, whether a component
    is named by its import path or given as a class. Refuses to run without
    asyncio (the asyncio reactor, or ``TWISTED_REACTOR_ENABLED = False``).

    Usage: ``ADDONS = {"scrapy_hostqueue.Addon": 0}``.
    """

    @internals.refuses_at_start_up
    def update_settings(self, settings: BaseSettings) -> None:
        require_asyncio_reactor(settings, "scrapy_hostqueue.Addon")
        # Fail at start-up, not at the first request, on bad HOSTQUEUE_* values.
        HostQueueConfig.from_settings(settings)

        settings.set("SCHEDULER", SCHEDULER, priority="addon")
        if _is_hostqueue_scheduler(settings["SCHEDULER"]):
            _enable(
                settings["DOWNLOADER_MIDDLEWARES"],
                MIDDLEWARE_ORDER,
                MIDDLEWARE,
                "scrapy_hostqueue.middleware.AIMDMiddleware",
            )
        else:
            # The middleware holds hosts back through HostQueueScheduler: with
            # another scheduler it would refuse to run, and the crawl with it.
            logger.warning(
                "SCHEDULER is set to %s: scrapy_hostqueue.Addon leaves it and does not "
                "enable the AIMD middleware, which needs HostQueueScheduler",
                settings["SCHEDULER"],
            )
        _enable(
            settings["SPIDER_MIDDLEWARES"],
            START_MIDDLEWARE_ORDER,
            START_MIDDLEWARE,
            "scrapy_hostqueue.start.StartRequestsMiddleware",
        )

        _enable(settings["EXTENSIONS"], 0, EXTENSION, EXTENSION)
        # Off (NotConfigured) with HOSTQUEUE_GC_FREEZE = False and
        # HOSTQUEUE_GC_YOUNG_THRESHOLD = 0.
        _enable(settings["EXTENSIONS"], 0, GC_EXTENSION, "scrapy_hostqueue.gc_tuning.GcTuning")
        # Off (NotConfigured) with HOSTQUEUE_MONITOR = False.
        _enable(settings["EXTENSIONS"], 0, MONITOR_EXTENSION, MONITOR_EXTENSION)

        settings.set("CONCURRENT_ITEMS", CONCURRENT_ITEMS, priority="addon")

        handlers = settings["DOWNLOAD_HANDLERS"]
        for scheme in ("http", "https"):
            if scheme not in handlers:
                handlers.set(scheme, HANDLER, priority="addon")
