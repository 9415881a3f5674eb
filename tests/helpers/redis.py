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


#: Hash slots of a Redis Cluster.
SLOTS = 16384


class RedisClusterServers:
    """A Redis Cluster of *masters* real ``redis-server`` processes on free loopback ports.

    The slots are split evenly between them, each master with *replicas* replicas (none by default):
    :meth:`start` starts the servers, introduces them (``CLUSTER MEET``), hands out the slots
    (``CLUSTER ADDSLOTS``, which Redis 6.2 has), makes the replicas (``CLUSTER REPLICATE``) and
    waits until every node serves and every replica is in sync; :meth:`stop` ends them (``with``
    does both). With *password*, every node asks for it (and a replica gives it to its master). The
    ``redis`` client must be installed.

    :attr:`nodes` are the masters as started and :attr:`replicas` the
    replicas (``replicas[i * replicas + j]`` of ``nodes[i]``); after a
    failover (:meth:`failover`) the roles differ: :meth:`serving` says which
    server serves a slot now.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        start_timeout: float = 20.0,
        password: str | None = None,
    ) -> None:
        self.nodes = [RedisServer(cluster=True, password=password) for _ in range(masters)]
        self.replicas = [
            RedisServer(cluster=True, password=password) for _ in range(masters * replicas)
        ]
        self.replicas_per_master = replicas
        self.start_timeout = start_timeout
        self.password = password

    @property
    def servers(self) -> list[RedisServer]:
        """Every server of the cluster: the masters as started, then the replicas."""
        return [*self.nodes, *self.replicas]

    @property
    def url(self) -> str:
        """The first node's ``redis://127.0.0.1:PORT/0``.

        A client finds the others from any of them.
        """
        return self.nodes[0].url

    def start(self) -> RedisClusterServers:
        import redis  # here: the tests that use a cluster skip without it

        servers = self.servers
        try:
            for node in servers:
                node.start()
            clients = [
                redis.Redis(host="127.0.0.1", port=node.port, password=self.password)
                for node in servers
            ]
            try:
                # Distinct config epochs at once, as redis-cli --cluster create
                # gives them, so that the nodes agree without a vote.
                for epoch, client in enumerate(clients, 1):
                    client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
                for node in servers[1:]:
                    clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
                share = -(-SLOTS // len(self.nodes))
                for n, client in enumerate(clients[: len(self.nodes)]):
                    slots = range(n * share, min(SLOTS, (n + 1) * share))
                    client.execute_command("CLUSTER", "ADDSLOTS", *slots)
                if self.replicas:
                    self._replicate(clients)
            finally:
                for client in clients:
                    client.close()
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _replicate(self, clients: list[Any]) -> None:
        """Make each replica replicate its master, once it has heard of it."""
        import redis  # here: the tests that use a cluster skip without it

        masters = clients[: len(self.nodes)]
        ids = [client.execute_command("CLUSTER", "MYID").decode() for client in masters]
        for client in masters:
            # A replica's first sync at once (Redis 7 waits 5 s by default
            # before a diskless one).
            client.config_set("repl-diskless-sync-delay", 0)
        deadline = time.monotonic() + self.start_timeout
        for n, client in enumerate(clients[len(self.nodes) :]):
            if self.password is not None:
                client.config_set("masterauth", self.password)
            master = ids[n // self.replicas_per_master]
            while True:
                try:
                    client.execute_command("CLUSTER", "REPLICATE", master)
                    break
                except redis.ResponseError as error:  # the master not met yet
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"CLUSTER REPLICATE {master}: {error}") from None
                    time.sleep(0.05)

    def cluster_info(self, node: RedisServer) -> dict[str, str]:
        text = str(node.command("CLUSTER INFO"))
        return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)

    def wait_ok(self) -> None:
        """Wait until the cluster is whole and every replica in sync.

        Wait until every node sees every node and every slot served, and
        every replica is in sync with its master and seen as its replica by
        every node.
        """
        servers = self.servers
        deadline = time.monotonic() + self.start_timeout
        while True:
            infos = [self.cluster_info(node) for node in servers]
            views = [self.cluster_nodes(node) for node in servers]
            if (
                all(
                    info.get("cluster_state") == "ok"
                    and info.get("cluster_known_nodes") == str(len(servers))
                    and info.get("cluster_slots_assigned") == str(SLOTS)
                    for info in infos
                )
                and all(self._in_sync(replica) for replica in self.replicas)
                and all(
                    sum("slave" in line["flags"] for line in view) == len(self.replicas)
                    for view in views
                )
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Redis Cluster did not come up: {infos}")
            time.sleep(0.05)

    @staticmethod
    def _in_sync(replica: RedisServer) -> bool:
        text = str(replica.command("INFO replication"))
        return "role:slave" in text and "master_link_status:up" in text

    def cluster_nodes(self, node: RedisServer) -> list[dict[str, Any]]:
        """*node*'s view of the cluster (``CLUSTER NODES``).

        Per node its ``id``, ``port``, ``flags`` (a set: ``master``, ``slave``, ``myself``,
        ``fail``...) and ``master`` (the id a replica replicates, else ``-``).
        """
        out = []
        for line in str(node.command("CLUSTER NODES")).splitlines():
            fields = line.split()
            address = fields[1].split("@")[0]
            out.append(
                {
                    "id": fields[0],
                    "port": int(address.rsplit(":", 1)[1]),
                    "flags": set(fields[2].split(",")),
                    "master": fields[3],
                }
            )
        return out

    def node_id(self, node: RedisServer) -> str:
        return str(node.command("CLUSTER MYID"))

    def serving(self, slot: int) -> RedisServer:
        """Return the server that serves *slot* now.

        The server that serves *slot* now, as the first running server
        sees it (``CLUSTER SLOTS``).
        """
        asked = next(server for server in self.servers if server.running)
        reply = asked.command("CLUSTER SLOTS")
        assert isinstance(reply, list)
        for start, end, master, *_replicas in reply:  # type: ignore[misc]
            if int(start) <= slot <= int(end):
                port = int(master[1])
                return next(server for server in self.servers if server.port == port)
        raise LookupError(f"slot {slot} is not served")

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

    def flushall(self) -> None:
        for node in self.nodes:
            node.flushall()

    def reset_stats(self) -> None:
        for node in self.nodes:
            node.reset_stats()

    def commandstats(self) -> dict[str, int]:
        """Sum the calls per command over the nodes."""
        calls: dict[str, int] = {}
        for node in self.nodes:
            for name, stat in node.commandstats().items():
                calls[name] = calls.get(name, 0) + stat.calls
        return calls

    def stop(self) -> None:
        for node in self.servers:
            node.stop()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


async def wait_pushed(sync: Any, crawl: str, count: int, timeout: float = 10.0) -> None:
    """Wait until the crawl *crawl* counts *count* requests pushed.

    The count is read with the client *sync*, for at most *timeout* seconds.
    """
    deadline = time.monotonic() + timeout
    while crawl_stats(sync, crawl).get("pushed", 0) < count:
        assert time.monotonic() < deadline, crawl_stats(sync, crawl)
        await asyncio.sleep(0.01)
