"""What a Redis server does with a crawl's keys when it is full or restarts.

Read once at start-up, and shown by the ``frontier`` command.

Pure: no Scrapy or Twisted import, and the ``redis`` client is passed in.
A crawl's keys have no TTL, so only the ``allkeys-*`` policies can evict
them; under a ``volatile-*`` policy (or ``noeviction``) a full Redis refuses
writes instead, which the crawl survives (see
:mod:`scrapy_hostqueue.frontier.redis._capacity`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "ServerSettings",
    "bloom_refusal",
    "describe",
    "eviction_refusal",
    "lost_cause",
    "persistence_warning",
    "read",
]


@dataclass(frozen=True)
class ServerSettings:
    """What a Redis server said of its memory and persistence."""

    used: int
    maxmemory: int  # 0: no limit
    policy: str
    aof: bool
    #: The RDB snapshot schedule ("" for none), None when ``CONFIG`` is
    #: refused (a managed Redis) and it could not be read.
    save: str | None
    #: Why ``CONFIG GET`` was refused, if it was.
    config_refused: str = ""
    #: The server's ``run_id``: another one after each restart.
    run_id: str = ""


def read(client: Any, **node: Any) -> ServerSettings:
    """Read *client*'s server (``INFO``, ``CONFIG GET``).

    *node* names the node of a Redis Cluster (``target_nodes=``).
    """
    memory = client.info("memory", **node)
    persistence = client.info("persistence", **node)
    server = client.info("server", **node)
    save: str | None
    refused = ""
    try:
        config = client.config_get("save", **node)
        save = str(config.get("save", ""))
    except Exception as error:  # CONFIG renamed or not allowed
        if type(error).__name__ not in ("ResponseError", "NoPermissionError"):
            raise
        save, refused = None, str(error).strip()
    return ServerSettings(
        used=int(memory.get("used_memory", 0)),
        maxmemory=int(memory.get("maxmemory", 0)),
        policy=str(memory.get("maxmemory_policy", "noeviction")),
        aof=bool(int(persistence.get("aof_enabled", 0))),
        save=save,
        config_refused=refused,
        run_id=str(server.get("run_id", "")),
    )


def eviction_refusal(server: ServerSettings, where: str) -> str | None:
    """Why a crawl must not run on *server*, or None.

    A policy that evicts keys without a TTL deletes queues, leases and fingerprints silently.
    """
    if not server.policy.startswith("allkeys-"):
        return None
    return (
        f"Redis at {where} has maxmemory-policy {server.policy}, which deletes keys when "
        "it is full: it would drop the crawl's queues, leases and fingerprints without a "
        "word. Set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, "
        "and in redis.conf), or give the crawl a Redis of its own"
    )


def persistence_warning(server: ServerSettings, where: str) -> str | None:
    """Return a log line when *server* keeps nothing on disk, or when that is unknown.

    None when it persists.
    """
    if server.aof or server.save:
        return None
    if server.save is None:
        return (
            f"Could not check whether Redis at {where} keeps the crawl on disk (CONFIG "
            f"GET refused: {server.config_refused}); without persistence a restart of this "
            "Redis loses the crawl"
        )
    return (
        f"Redis at {where} keeps nothing on disk (save '', appendonly no): a restart of "
        "this Redis loses the crawl. Turn persistence on (appendonly yes) if the crawl "
        "must survive one"
    )


def lost_cause(run_id: str, now_run_id: str, uptime: float, since: float) -> str:
    """Why Redis no longer holds a crawl, in words.

    It had *run_id* when this process joined it *since* seconds ago, and has *now_run_id* and has
    run for *uptime* seconds now.
    """
    if run_id and now_run_id == run_id:
        return "this Redis was flushed (FLUSHDB, FLUSHALL) or the crawl's keys deleted"
    if uptime < since:
        return (
            f"this Redis restarted {uptime:.0f} s ago without the crawl's data (it keeps "
            "nothing on disk, or its file is older than the crawl)"
        )
    return "the URL now names another Redis server, which does not hold the crawl"


def _size(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def describe(server: ServerSettings) -> str:
    """One line: used and maximum memory, the policy, the persistence."""
    if server.maxmemory:
        memory = (
            f"{_size(server.used)} used of maxmemory {_size(server.maxmemory)} "
            f"({server.used * 100 // server.maxmemory} %)"
        )
    else:
        memory = f"{_size(server.used)} used, no maxmemory"
    kept = []
    if server.aof:
        kept.append("appendonly yes")
    if server.save:
        kept.append(f"save '{server.save}'")
    if server.save is None and not server.aof:
        persistence = "persistence unknown (CONFIG refused)"
    else:
        persistence = "persistence: " + (", ".join(kept) or "none")
    return f"{memory}, maxmemory-policy {server.policy}, {persistence}"


def bloom_refusal(client: Any, where: str, key: str, **node: Any) -> str | None:
    """Say why a crawl cannot have the Bloom filter it asks for, or None.

    *client*'s server has no ``BF.*`` commands: ``BF.EXISTS`` of *key*, a
    key of the crawl, is refused as unknown.
    """
    try:
        client.execute_command("BF.EXISTS", key, "-", **node)
    except Exception as error:
        if "unknown command" not in str(error).lower():
            raise
    else:
        return None
    return (
        f"HOSTQUEUE_REDIS_BLOOM_ERROR_RATE asks for a Bloom filter, and the Redis at {where} "
        "has no BF.* commands (Redis 8 has them built in, Redis Stack too, Valkey with its "
        "bloom module): use such a server, or set HOSTQUEUE_REDIS_BLOOM_ERROR_RATE = 0 "
        "for exact fingerprints"
    )
