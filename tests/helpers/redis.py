"""Redis servers, clusters and stores for the tests, all real.

The package's launcher of a real ``redis-server`` (:mod:`scrapy_hostqueue.testing._redis_server`),
and a proxy whose connections a test cuts, which also ends TLS in front of a server; a Redis Cluster
of real servers.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from scrapy_hostqueue.frontier import HostState, MemoryStore
from scrapy_hostqueue.frontier.redis._db import crawl_token, partition_prefixes, register
from scrapy_hostqueue.frontier.redis._link import RedisLink
from scrapy_hostqueue.frontier.redis._store import RedisStore
from scrapy_hostqueue.testing._redis_cluster import RedisCluster
from scrapy_hostqueue.testing._redis_server import RedisServer, redis_server

__all__ = [
    "CuttableProxy",
    "RedisClusterServers",
    "RedisServer",
    "StoreProcess",
    "crawl_stats",
    "new_store",
    "redis_server",
    "replication",
    "wait_pushed",
    "wait_replicated",
]


def new_store(
    sync: Any,
    crawl: str,
    *,
    limit: int = 8,
    clock: Callable[[], float] | None = None,
    partitions: int | None = None,
    master_of: Callable[[str], Any] | None = None,
    **options: Any,
) -> RedisStore[str]:
    """Make a Redis store of ``"host/page"`` strings on *crawl*, as a new process.

    A Redis store of ``"host/page"`` strings on *crawl*, registered as a
    new process through the client *sync*; every host starts at *limit*,
    on *clock* if given; a new crawl gets *partitions* (1 by default, dealt
    over the masters *master_of* names). *options* go to
    :class:`RedisStore` (by default ``max_hold=4``, ``finish_grace=0``).
    """
    expiry = int((time.time() + 30) * 1000)
    proc = register(sync, crawl, expiry, partitions=partitions, master_of=master_of)
    memory: MemoryStore[str] = (
        MemoryStore(lambda key: HostState(limit))
        if clock is None
        else MemoryStore(lambda key: HostState(limit), clock=clock)
    )
    return RedisStore(
        memory,
        crawl,
        proc,
        str.encode,
        bytes.decode,
        lambda item: item.encode(),
        **{
            "max_hold": 4,
            "finish_grace": 0.0,
            "token": crawl_token(sync, crawl),
            "prefixes": partition_prefixes(sync, crawl),
            **options,
        },
    )


class StoreProcess:
    """One crawl process as the store tests see it.

    A store and its asyncio Redis client, the store's task stepped by hand (:meth:`step`).
    """

    def __init__(self, store: RedisStore[str], client: Any, errors: tuple[type, ...]) -> None:
        self.store = store
        self.client = client
        self.link = RedisLink(store, client, errors)

    async def step(self, n: int = 1, *, beat: bool = True, totals: bool = True) -> None:
        for _ in range(n):
            # Claim at every step, not after the store's pause between claims.
            self.store._claim_after = 0.0
            await self.link.step(beat=beat, totals=totals)

    def pop_all(self) -> list[str]:
        """Every request the store hands out now."""
        out = []
        while (popped := self.store.pop()) is not None:
            out.append(popped[1])
        return out

    async def aclose(self) -> None:
        await self.client.aclose()


def replication(server: RedisServer) -> dict[str, str]:
    """*server*'s ``INFO replication``.

    ``role``, ``master_link_status``, ``master_repl_offset``, ``slave_repl_offset``...
    """
    lines = str(server.command("INFO replication")).splitlines()
    return dict(line.strip().split(":", 1) for line in lines if ":" in line)


def wait_replicated(master: RedisServer, replica: RedisServer, timeout: float = 10.0) -> None:
    """Wait until *replica* has applied every write *master* made so far.

    Its link up and its offset at the master's offset read now. (``WAIT`` cannot tell: it waits for
    the writes of the connection that sends it, and a new connection has written nothing, so it
    answers at once.)
    """
    written = int(replication(master)["master_repl_offset"])
    deadline = time.monotonic() + timeout
    while True:
        info = replication(replica)
        if (
            info.get("master_link_status") == "up"
            and int(info.get("slave_repl_offset", -1)) >= written
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"port {replica.port} did not reach offset {written}: {info}")
        time.sleep(0.01)


def crawl_stats(sync: Any, crawl: str) -> dict[str, int]:
    """Read the crawl-wide totals *crawl* keeps in Redis: the sums of its partitions'."""
    totals: dict[str, int] = {}
    for p in partition_prefixes(sync, crawl):
        for k, v in sync.hgetall(p + "stats").items():
            totals[k.decode()] = totals.get(k.decode(), 0) + int(v)
    return totals


class CuttableProxy:
    """A TCP forwarder to a Redis server whose connections a test cuts.

    A TCP forwarder to a Redis server, in a thread of its own, whose
    connections a test cuts (:meth:`cut`): the network between a crawl and
    Redis lost for a while, Redis and its data untouched.

    With *tls*, a server context, it ends TLS for the server behind it
    (clients connect with ``rediss://``), as a Redis built with TLS or a
    TLS-terminating proxy of a managed Redis does.
    """

    def __init__(self, target_port: int, *, tls: ssl.SSLContext | None = None) -> None:
        self.target_port = target_port
        self.tls = tls
        self.port = 0
        self.refusing = False
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``, ``rediss://`` with TLS."""
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def start(self) -> CuttableProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
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
        """Drop every connection now and refuse new ones for *seconds* (returns at once)."""
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

    def __enter__(self) -> CuttableProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RedisClusterServers(RedisCluster):
    """A :class:`RedisCluster` that the tests also fail over, cut and reshard.

    What the failover tests do to it: fail a master over to a replica (:meth:`failover`), cut a
    replica off (:meth:`cut_replication`), move a slot (:meth:`move_slot`).
    """

    def replica_of(self, master: RedisServer) -> RedisServer:
        """Return a replica of *master*, as *master* sees them."""
        master_id = self.node_id(master)
        ports = [
            line["port"]
            for line in self.cluster_nodes(master)
            if line["master"] == master_id and "fail" not in line["flags"]
        ]
        return next(server for server in self.servers if server.port in ports)

    def failover(self, replica: RedisServer, option: str = "") -> None:
        """Fail a master over to *replica*, then wait until the cluster serves again.

        ``CLUSTER FAILOVER [FORCE|TAKEOVER]`` sent to *replica*, then wait
        until every running node sees it serve its master's slots and the
        cluster serving. Without *option* the master hands over once the
        replica has every write it acknowledged, and becomes its replica.
        """
        reply = replica.command(f"CLUSTER FAILOVER {option}".strip())
        assert reply == "OK", reply
        replica_id = self.node_id(replica)
        deadline = time.monotonic() + self.start_timeout
        while True:
            running = [server for server in self.servers if server.running]
            views = [self.cluster_nodes(server) for server in running]
            if all(
                any(line["id"] == replica_id and "master" in line["flags"] for line in view)
                for view in views
            ) and all(self.cluster_info(server).get("cluster_state") == "ok" for server in running):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the failover to port {replica.port} did not finish: {views}")
            time.sleep(0.02)

    def cut_replication(self, master: RedisServer, replica: RedisServer) -> None:
        """Stop *replica* copying *master*'s writes from now on.

        *replica* stops copying *master*'s writes from now on (*master*
        first has every replica acknowledge what it wrote so far): the lag of
        asynchronous replication, made as long as a test needs. The replica
        fails to authenticate when it reconnects, and stays behind.
        """
        wait_replicated(master, replica)
        replica.command("CONFIG SET masteruser nobody")
        replica.command("CONFIG SET masterauth wrong")
        assert master.command("CLIENT KILL TYPE replica") == 1

    def node_keys(self, pattern: str = "*") -> list[list[str]]:
        """Return the keys matching *pattern* on each node, in node order."""
        out = []
        for node in self.nodes:
            reply = node.command(f"KEYS {pattern}")
            assert isinstance(reply, list)
            out.append(sorted(str(key) for key in reply))
        return out

    def move_slot(self, slot: int, source: int, target: int) -> None:
        """Move *slot* with its keys from node *source* to node *target*.

        Nodes are given by index. This is what a resharding does: importing and migrating,
        ``MIGRATE`` of its keys, then every node told the new owner.
        """
        import redis  # here: the tests that use a cluster skip without it

        clients = [
            redis.Redis(host="127.0.0.1", port=node.port, password=self.password)
            for node in self.nodes
        ]
        try:
            src, dst = clients[source], clients[target]
            src_id = src.execute_command("CLUSTER", "MYID").decode()
            dst_id = dst.execute_command("CLUSTER", "MYID").decode()
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                port = self.nodes[target].port
                src.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
            for client in (dst, src, *clients):
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        finally:
            for client in clients:
                client.close()


async def wait_pushed(sync: Any, crawl: str, count: int, timeout: float = 10.0) -> None:
    """Wait until the crawl *crawl* counts *count* requests pushed.

    The count is read with the client *sync*, for at most *timeout* seconds.
    """
    deadline = time.monotonic() + timeout
    while crawl_stats(sync, crawl).get("pushed", 0) < count:
        assert time.monotonic() < deadline, crawl_stats(sync, crawl)
        await asyncio.sleep(0.01)
