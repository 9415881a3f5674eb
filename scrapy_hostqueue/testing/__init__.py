"""Local multi-host HTTP/1.1 test server: many hosts, each on its own loopback address.

Scrapy keys per-host slots by hostname without the port, so every host gets its own
address: host ``i`` listens on ``127.0.0.{i+1}`` (``127.0.1.1`` ... after 254 hosts)
on a port of its own. The server counts, per host and from the server side, what a
polite crawler must respect: requests in flight, status codes, requests sent inside
a ``Retry-After`` window, gaps between arrivals. Scrapy is not imported here.

Python::

    from scrapy_hostqueue.testing import HostSpec, LocalHosts

    with LocalHosts([HostSpec(latency=0.01), HostSpec(latency=0.2)]) as hosts:
        hosts.start_urls(0, 3)        # ["http://127.0.0.1:PORT/page/0", ...]
        ...                           # crawl
        hosts.stats(1).max_in_flight

Command line::

    python -m scrapy_hostqueue.testing serve --hosts "3x latency=10ms; latency=1s"
    python -m scrapy_hostqueue.testing stats http://127.0.0.2:PORT/
    python -m scrapy_hostqueue.testing reset http://127.0.0.2:PORT/

Host spec mini-language
-----------------------
A spec string lists host groups separated by ``;``. A group is an optional count
``Nx`` followed by comma-separated ``key=value`` items; omitted keys keep their
defaults, so ``"2x"`` is two default hosts::

    3x latency=10ms,links=3; latency=200ms,throttle=429>3,retry-after=2

Keys (values: durations as ``10ms``, ``0.5s`` or plain seconds ``2``; sizes as
``512``, ``4k``, ``1m``; booleans as ``yes``/``no``; a bare ``gzip`` or ``refuse``
means yes; ``none`` resets an optional value; quote a value holding ``,`` or ``;``
with double quotes)::

    latency=DURATION      wait before the response headers (default 10ms)
    links=N               child links per page on the same host (default 3)
    pages=N|inf           finite site of N pages, ids 0..N-1 (default inf)
    cross-links=N         links per page to the next N hosts (default 0)
    throttle=STATUS>K     answer STATUS (429 or 503) at once while more than K
                          page requests are in flight, this one included
    throttle-above=K, throttle-status=STATUS   the same, one part at a time
    retry-after=VALUE     Retry-After on every 429/503: N (seconds), date:N (an
                          HTTP-date N seconds ahead) or any text, sent verbatim
    crawl-delay=DURATION  robots.txt carries "Crawl-delay: x" (robots.txt is
                          always served, allowing everything)
    fault=KIND            reset | hang | truncate | slow-body | malformed | throttle
                          (for page requests; malformed: a header line without a
                          colon; throttle: the throttle status at once)
    fault-rate=FRACTION   share of page requests that get the fault, spread
                          evenly: 0.25 or 25% faults every 4th (default 1)
    fault-attempts=N      transient faults: fault-rate picks pages, not requests,
                          and a picked page gets the fault on its first N
                          requests only, then answers as usual (default none)
    trickle=DURATION      how long a slow-body body takes (default 1s)
    status=CODE           fixed status of the pages (default 200)
    body-size=SIZE        padding bytes in each page (default 512)
    gzip                  gzip the pages (Content-Encoding: gzip)
    refuse                the host does not listen: connection refused

Paths: ``/page/{n}`` pages (``/`` = page 0), ``/robots.txt``, and the control
paths ``/_hostqueue/stats`` (GET; ``?host=N|all``, ``?arrivals=0``),
``/_hostqueue/reset`` (POST), ``/_hostqueue/spec`` (GET, POST a HostSpec dict as
JSON), ``/_hostqueue/hosts`` (GET). Control requests are not counted.
"""

from __future__ import annotations

from scrapy_hostqueue.testing._hosts import ControlError, LocalHosts, control_request
from scrapy_hostqueue.testing._report import crawl_report
from scrapy_hostqueue.testing._spec import (
    HostSpec,
    SpecError,
    format_spec,
    parse_spec,
    parse_specs,
)
from scrapy_hostqueue.testing._state import HostStats, host_address

#: Environment variables that make HTTP clients (aiohttp, urllib, Scrapy's
#: HttpProxyMiddleware) use a proxy; everything that talks to local hosts
#: clears them.
PROXY_VARIABLES = (
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
)

__all__ = [
    "PROXY_VARIABLES",
    "ControlError",
    "HostSpec",
    "HostStats",
    "LocalHosts",
    "SpecError",
    "control_request",
    "crawl_report",
    "format_spec",
    "host_address",
    "parse_spec",
    "parse_specs",
]
