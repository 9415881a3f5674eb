"""The ``requires_redis`` marker.

A test that needs Redis (the ``redis`` client and a real ``redis-server``) fails where there is
none, saying how to get one, and is skipped only when :data:`SKIP_VARIABLE` asks for it
(docs/testing.rst).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import NoReturn

import pytest

from scrapy_hostqueue.testing._redis_server import RedisServerError, find_redis_server

#: Set to 1 to skip the tests that need Redis where there is none, rather than fail them.
SKIP_VARIABLE = "SCRAPY_HOSTQUEUE_SKIP_REDIS"
#: The fixtures that start or use the session's ``redis-server``.
REDIS_FIXTURES = frozenset({"redis_server", "redis_url", "redis_client"})
NO_CLIENT = "the redis client is not installed: pip install -e '.[test]'"


def redis_missing() -> str | None:
    """Why the tests that need Redis cannot run here, or None when they can."""
    if importlib.util.find_spec("redis") is None:
        return NO_CLIENT
    try:
        find_redis_server()
    except RedisServerError as error:
        return str(error)
    return None


@functools.cache
def redis_missing_here() -> str | None:
    """:func:`redis_missing`, looked for once per test process."""
    return redis_missing()


def no_redis(reason: str, *, module: bool = False) -> NoReturn:
    """Fail the test for want of Redis, or skip it when :data:`SKIP_VARIABLE` is set.

    Fail the test (or the collection of its *module*) for want of Redis, or
    skip it when :data:`SKIP_VARIABLE` is set.
    """
    if os.environ.get(SKIP_VARIABLE, "") not in ("", "0"):
        pytest.skip(f"{reason} ({SKIP_VARIABLE} is set)", allow_module_level=module)
    pytest.fail(
        f"this test needs Redis, and {reason}; or set {SKIP_VARIABLE}=1 to skip the "
        "tests that need Redis (docs/testing.rst)",
        pytrace=False,
    )


def import_redis() -> ModuleType:
    """Import the ``redis`` client module, for a test module that needs it."""
    try:
        return importlib.import_module("redis")
    except ImportError:
        no_redis(NO_CLIENT, module=True)


def redis_server_marks(
    *marks: pytest.MarkDecorator, needs: str = "redis-server"
) -> list[pytest.MarkDecorator]:
    """Return the ``pytestmark`` of a module whose tests run a real ``redis-server``.

    *marks* (``crawl``, say), ``requires_redis``, and a skip on Windows, which lacks what the
    tests *needs*.
    """
    return [
        *marks,
        pytest.mark.requires_redis,
        pytest.mark.skipif(sys.platform == "win32", reason=needs),
    ]


def unmarked(items: Iterable[pytest.Item]) -> list[str]:
    """List the tests among *items* that use a Redis fixture without the marker."""
    return [
        item.nodeid
        for item in items
        if REDIS_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("requires_redis") is None
    ]
