"""The errors of :mod:`scrapy_hostqueue.exceptions` that need no Scrapy.

Pure: no Scrapy or Twisted import. Defined here, where the pure modules (the
SQLite frontier file, the Redis keys and scripts) can raise them without
importing Scrapy; users import them from :mod:`scrapy_hostqueue.exceptions`,
whose name they carry.
"""

from __future__ import annotations

__all__ = [
    "FrontierFileError",
    "HostQueueError",
    "HostQueueSettingsError",
    "PlotError",
    "RedisFrontierError",
    "RedisFrontierLost",
    "TimelineError",
    "UnsupportedDependencyError",
]


class HostQueueError(Exception):
    """The base of every error scrapy-hostqueue raises for its users to see."""


class HostQueueSettingsError(HostQueueError, ValueError):
    """A ``HOSTQUEUE_*`` (or related Scrapy) setting has a value that cannot work."""


class UnsupportedDependencyError(HostQueueError, ImportError):
    """The installed Scrapy or aiohttp cannot be used.

    The installed Scrapy or aiohttp is older than this package's floors,
    or lacks a private name it uses.
    """


class FrontierFileError(HostQueueError):
    """A frontier file cannot be used.

    Damaged, foreign, of another version, locked by another crawl, not writable, a full disk. The
    message is one line naming the file and what to do.
    """


class RedisFrontierError(HostQueueError):
    """The shared frontier cannot be used.

    Redis unreachable, a crawl id of another layout, the client missing. The message is one line
    saying what to do.
    """


class RedisFrontierLost(RedisFrontierError):
    """Redis no longer holds the crawl this process joined.

    Restarted without its data, flushed, or the URL names another server.
    """


class TimelineError(HostQueueError, ValueError):
    """A timeline file cannot be read; the message names the file and line."""


class PlotError(HostQueueError):
    """The plot cannot be made; the message is shown as is."""


for _name in __all__:
    # Where users import them from, as tracebacks and the docs show them.
    globals()[_name].__module__ = "scrapy_hostqueue.exceptions"
del _name
