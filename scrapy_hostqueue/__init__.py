"""Per-host queues, adaptive per-host concurrency and a connection pool sized to match.

Scrapy crawls that are polite per site and fast overall.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "AIMDMiddleware",
    "Addon",
    "AiohttpDownloadHandler",
    "GcTuning",
    "HostBlocked",
    "HostGivenUp",
    "HostQueueError",
    "HostQueueScheduler",
    "HostQueueSettingsError",
    "StartRequestsMiddleware",
    "__version__",
]

# Public names are imported lazily so that ``scrapy_hostqueue.testing`` (the
# local test hosts) can run without importing Scrapy.
_LAZY = {
    "AIMDMiddleware": "scrapy_hostqueue.middleware",
    "Addon": "scrapy_hostqueue.addon",
    "AiohttpDownloadHandler": "scrapy_hostqueue.handler",
    "GcTuning": "scrapy_hostqueue.gc_tuning",
    "HostBlocked": "scrapy_hostqueue.exceptions",
    "HostGivenUp": "scrapy_hostqueue.exceptions",
    "HostQueueError": "scrapy_hostqueue.exceptions",
    "HostQueueScheduler": "scrapy_hostqueue.scheduler",
    "HostQueueSettingsError": "scrapy_hostqueue.exceptions",
    "StartRequestsMiddleware": "scrapy_hostqueue.start",
}

if TYPE_CHECKING:
    from scrapy_hostqueue.addon import Addon
    from scrapy_hostqueue.exceptions import (
        HostBlocked,
        HostGivenUp,
        HostQueueError,
        HostQueueSettingsError,
    )
    from scrapy_hostqueue.gc_tuning import GcTuning
    from scrapy_hostqueue.handler import AiohttpDownloadHandler
    from scrapy_hostqueue.middleware import AIMDMiddleware
    from scrapy_hostqueue.scheduler import HostQueueScheduler
    from scrapy_hostqueue.start import StartRequestsMiddleware


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scrapy_hostqueue' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
