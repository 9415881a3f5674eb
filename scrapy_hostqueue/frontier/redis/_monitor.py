"""Where the processes of a shared crawl publish their live monitor's snapshots.

The snapshots are ``scrapy_hostqueue.monitor``'s. Every process writes its
snapshot every few seconds under a key of its own that expires after
:data:`TTL` seconds, and lists it in a sorted set by its expiry; it reads the
others' in the same round trip. The keys are the
monitor's own, beside the crawl's own keys (its version, its partitions)
under the crawl's home prefix and its hash tag, so that one Redis Cluster
node holds them all (the partitions of the frontier have tags of their own):

* ``hq:{CRAWL}:monitor``: sorted set, process key -> expiry (ms since the
  epoch);
* ``hq:{CRAWL}:monitor:PROCESS``: that process's snapshot, JSON.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from scrapy_hostqueue.exceptions import RedisFrontierError
from scrapy_hostqueue.frontier.redis._db import prefix
from scrapy_hostqueue.frontier.redis._glue import (
    async_client,
    connect,
    connect_problem,
    redis_client_module,
    shown_url,
)

#: Seconds a process's snapshot outlives its last heartbeat.
TTL = 10.0


class MonitorBoard:
    """The snapshots of the processes of the crawl *crawl_id* at *url*."""

    def __init__(self, url: str, crawl_id: str) -> None:
        self.url = url
        self.index = prefix(crawl_id) + "monitor"
        self._client: Any = None

    async def open(self) -> None:
        """Connect (raises :class:`RedisFrontierError` when Redis is away)."""
        redis = redis_client_module()

        def probe() -> bool:
            client, cluster = connect(redis, self.url)
            client.close()
            return bool(cluster)

        try:
            cluster = await asyncio.get_running_loop().run_in_executor(None, probe)
        except (redis.RedisError, redis.exceptions.RedisClusterException) as error:
            raise RedisFrontierError(
                f"cannot reach Redis at {shown_url(self.url)}: "
                f"{connect_problem(redis, self.url, error)}"
            ) from None
        self._client = async_client(redis, self.url, cluster=cluster)

    async def beat(self, snapshot: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Write *snapshot* and return the snapshots of every live process.

        *snapshot* is a process's, written under its ``process.key``; None
        only reads.
        """
        client = self._client
        now_ms = int(time.time() * 1000)
        ttl_ms = int(TTL * 1000)
        pipe = client.pipeline(transaction=False)
        if snapshot is not None:
            key = snapshot["process"]["key"]
            pipe.set(f"{self.index}:{key}", json.dumps(snapshot), px=ttl_ms)
            pipe.zadd(self.index, {key: now_ms + ttl_ms})
        # Expired a whole TTL ago: a process's clock may be a little ahead.
        pipe.zremrangebyscore(self.index, "-inf", now_ms - ttl_ms)
        pipe.zrange(self.index, 0, -1)
        members = (await pipe.execute())[-1]
        if not members:
            return []
        values = await client.mget([f"{self.index}:{member.decode()}" for member in members])
        return [json.loads(value) for value in values if value is not None]

    async def withdraw(self, key: str) -> None:
        """Take the snapshot of the process *key* out (it ends)."""
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(f"{self.index}:{key}")
        pipe.zrem(self.index, key)
        await pipe.execute()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
