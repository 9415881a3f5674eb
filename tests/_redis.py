"""Redis for the tests: the package's launcher of a real ``redis-server``
(:mod:`scrapy_hostqueue._redis_server`), and a proxy whose connections a test
cuts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from scrapy_hostqueue._redis_server import RedisServer, redis_server

__all__ = ["CuttableProxy", "RedisServer", "redis_server"]


class CuttableProxy:
    """A TCP forwarder to a Redis server, in a thread of its own, whose
    connections a test cuts (:meth:`cut`): the network between a crawl and
    Redis lost for a while, Redis and its data untouched."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.refusing = False
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self._thread.start()
        self._call(self._start())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self, seconds: float) -> None:
        """Drop every connection now and refuse new ones for *seconds*
        (returns at once)."""
        self.cuts += 1
        self._loop.call_soon_threadsafe(self._cut, seconds)

    def _cut(self, seconds: float) -> None:
        self.refusing = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._loop.call_later(seconds, setattr, self, "refusing", False)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                for writer in list(self._writers):
                    writer.transport.abort()

        self._call(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
