"""A Redis Cluster of real ``redis-server`` processes on loopback ports.

For the tests and the benchmark of the shared frontier on a cluster: the
servers are :class:`~scrapy_hostqueue.testing._redis_server.RedisServer`
nodes, made one cluster with the ``redis`` client (which must be installed
to start one; the module imports without it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scrapy_hostqueue.testing._redis_server import CommandStat, RedisServer

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["SLOTS", "RedisCluster"]

#: Hash slots of a Redis Cluster.
SLOTS = 16384


class RedisCluster:
    """A Redis Cluster of *masters* real ``redis-server`` processes on free loopback ports.

    The slots are split evenly between them, each master with *replicas* replicas (none by default):
    :meth:`start` starts the servers, introduces them (``CLUSTER MEET``), hands out the slots
    (``CLUSTER ADDSLOTS``, which Redis 6.2 has), makes the replicas (``CLUSTER REPLICATE``) and
    waits until every node serves and every replica is in sync; :meth:`stop` ends them (``with``
    does both). With *password*, every node asks for it (and a replica gives it to its master). The
    ``redis`` client must be installed.

    :attr:`nodes` are the masters as started and :attr:`replicas` the
    replicas (``replicas[i * replicas + j]`` of ``nodes[i]``); after a
    failover the roles differ: :meth:`serving` says which server serves a slot
    now. For the tests and the benchmark of the Redis frontier on a cluster.
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

    def start(self) -> Self:
        """Start the servers and make them one cluster; returns self."""
        import redis  # noqa: PLC0415 - the package imports without the client

        servers = self.servers
        try:
            for node in servers:
                node.start()
            clients: list[Any] = [
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
        import redis  # noqa: PLC0415 - the package imports without the client

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
        for entry in reply:
            # [start, end, [host, port, id], replicas...]
            assert isinstance(entry, list) and isinstance(entry[2], list)
            if int(str(entry[0])) <= slot <= int(str(entry[1])):
                port = int(str(entry[2][1]))
                return next(server for server in self.servers if server.port == port)
        raise LookupError(f"slot {slot} is not served")

    def flushall(self) -> None:
        for node in self.nodes:
            node.flushall()

    def reset_stats(self) -> None:
        for node in self.nodes:
            node.reset_stats()

    def commandstats(self) -> dict[str, CommandStat]:
        """Sum the calls and time per command over the masters, as one server's."""
        totals: dict[str, CommandStat] = {}
        for node in self.nodes:
            for name, stat in node.commandstats().items():
                seen = totals.get(name, CommandStat(0, 0))
                totals[name] = CommandStat(seen.calls + stat.calls, seen.usec + stat.usec)
        return totals

    def cpu_seconds(self) -> float:
        """Sum the CPU time the masters have used since they started."""
        return sum(node.cpu_seconds() for node in self.nodes)

    def stop(self) -> None:
        for node in self.servers:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
