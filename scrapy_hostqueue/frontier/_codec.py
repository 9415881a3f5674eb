"""Requests to bytes and back, for the stores that keep them outside this process.

The SQLite file, Redis.
"""

from __future__ import annotations

import logging
import pickle
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.utils.request import request_from_dict

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)


class RequestCodec:
    """Requests to bytes and back, as Scrapy's disk queues store them.

    The dict of ``Request.to_dict``, pickled, which ``request_from_dict`` reads. For a plain
    :class:`~scrapy.Request`, the fields equal to the defaults of its constructor are left out of
    the dict (``request_from_dict`` gives them their defaults again): a request a spider follows has
    a URL and a callback, and the 13 fields cost more than twice the time to write and to read. A
    request that cannot be pickled (a ``meta`` holding a response, a selector) stays in memory only,
    counted in ``scheduler/unserializable``, as with Scrapy's own scheduler (*stats* None: not
    counted).
    """

    def __init__(self, stats: StatsCollector | None, debug: bool) -> None:
        self.spider: Spider | None = None
        self._stats = stats
        self._debug = debug
        self._warned = False
        # The spider's method names by function, as Request.to_dict finds them.
        self._names: dict[Any, str] = {}

    def encode(self, request: Request) -> bytes | None:
        try:
            return pickle.dumps(self._to_dict(request), protocol=4)
        except Exception:
            if self._stats is not None:
                self._stats.inc_value("scheduler/unserializable")
            if self._debug or not self._warned:
                self._warned = True
                logger.warning(
                    "Unable to serialize request %s: it is kept in memory only, and "
                    "lost if the crawl dies (this warning is shown once; "
                    "SCHEDULER_DEBUG=True shows all)",
                    request,
                )
            return None

    def _to_dict(self, request: Request) -> dict[str, Any]:
        """Turn *request* into a dict, its callbacks found by name.

        ``request.to_dict(spider=self.spider)`` (less the defaults of a
        plain Request), with the names of the spider's methods used as
        callbacks remembered: ``to_dict`` finds each by listing the spider's
        members (``inspect.getmembers``) on every call, which cost more than
        the rest of the frontier's work for a request. Anything but a method
        already named goes through ``to_dict`` itself.
        """
        callback, errback = request.callback, request.errback
        try:
            d: dict[str, Any] = {"url": request.url}
            if callback is not None:
                d["callback"] = self._name(callback) if callable(callback) else callback
            if errback is not None:
                d["errback"] = self._name(errback) if callable(errback) else errback
        except KeyError:
            d = request.to_dict(spider=self.spider)
            for func, name in ((callback, d["callback"]), (errback, d["errback"])):
                if callable(func) and isinstance(name, str):
                    self._names[func.__func__] = name  # type: ignore[union-attr]
            return _lean(d) if type(request) is Request else d
        if type(request) is not Request:
            # A subclass's fields and defaults are its own: all of them.
            d["headers"] = dict(request.headers)
            for attr in request.attributes:
                d.setdefault(attr, getattr(request, attr))
            d["_class"] = request.__module__ + "." + request.__class__.__name__
            return d
        if request.method != "GET":
            d["method"] = request.method
        headers = request.headers
        if headers:
            d["headers"] = dict(headers)
        if request.body:
            d["body"] = request.body
        for attr in ("cookies", "meta", "flags", "cb_kwargs"):
            value = getattr(request, attr)
            if value:
                d[attr] = value
        if request.encoding != "utf-8":
            d["encoding"] = request.encoding
        if request.priority:
            d["priority"] = request.priority
        if request.dont_filter:
            d["dont_filter"] = request.dont_filter
        return d

    def _name(self, method: Any) -> str:
        """Return the name of the spider's *method* if known (KeyError if not)."""
        name = self._names[getattr(method, "__func__", None)]
        if getattr(getattr(self.spider, name, None), "__func__", None) is not method.__func__:
            del self._names[method.__func__]  # the spider changed since
            raise KeyError(name)
        return name

    def decode(self, data: bytes) -> Request:
        d = pickle.loads(data)  # our own file
        if "_class" in d:
            return request_from_dict(d, spider=self.spider)
        # request_from_dict for a plain Request, without its pass over the keys.
        spider = self.spider
        if spider is not None:
            for key in ("callback", "errback"):
                name = d.get(key)
                if name:
                    d[key] = _method(spider, name)
        return Request(**d)


#: What ``Request.to_dict`` gives for a plain Request's fields left at their
#: defaults (see RequestCodec._to_dict).
_DEFAULTS: dict[str, Any] = {
    "callback": None,
    "errback": None,
    "method": "GET",
    "headers": {},
    "body": b"",
    "cookies": {},
    "meta": {},
    "encoding": "utf-8",
    "priority": 0,
    "dont_filter": False,
    "flags": [],
    "cb_kwargs": {},
}


def _lean(d: dict[str, Any]) -> dict[str, Any]:
    """*d* (a plain Request's ``to_dict``) without the fields at their defaults."""
    return {
        key: value for key, value in d.items() if key not in _DEFAULTS or value != _DEFAULTS[key]
    }


def _method(spider: Spider, name: Any) -> Any:
    """Return the spider's method *name*, as ``request_from_dict`` finds it."""
    try:
        return getattr(spider, str(name))
    except AttributeError:
        raise ValueError(f"Method {name!r} not found in: {spider}") from None


__all__ = ["RequestCodec"]
