from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from scrapy_hostqueue.testing import HostSpec, LocalHosts

_PROXY_VARIABLES = (
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
)


@pytest.fixture(autouse=True)
def _no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp and Scrapy's HttpProxyMiddleware read proxies from the environment;
    tests talk to loopback servers only."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def local_hosts() -> Iterator[Callable[..., LocalHosts]]:
    """Factory of started :class:`LocalHosts`, all stopped at teardown.

    ``hosts = local_hosts([HostSpec(...), ...])`` or ``local_hosts("3x latency=10ms")``;
    keyword arguments go to ``LocalHosts`` (``process=True``, ``offset=...``).
    """
    started: list[LocalHosts] = []

    def start(specs: Iterable[HostSpec] | str, **kwargs: Any) -> LocalHosts:
        hosts = LocalHosts(specs, **kwargs)
        hosts.start()
        started.append(hosts)
        return hosts

    yield start
    for hosts in reversed(started):
        hosts.stop()
