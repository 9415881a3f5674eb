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

With the monitor's controls on (``HOSTQUEUE_MONITOR_CONTROLS``), two keys
more, read in the same round trip as the snapshots (nothing more when no
control is pending):

* ``hq:{CRAWL}:controls``: list of the host controls given on a page, JSON
  each, for the process that holds the host: it applies one and takes it
  out; one no process took within :data:`CONTROL_TTL` seconds is dropped;
* ``hq:{CRAWL}:paused``: ``1`` while the crawl is paused (every process
  hands out nothing), absent otherwise.
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
#: Seconds a host control waits for the process that holds the host; and the
#: most controls kept pending.
CONTROL_TTL = 60.0
MAX_CONTROLS = 100


class MonitorBoard:
    """The snapshots of the processes of the crawl *crawl_id* at *url*."""

    def __init__(self, url: str, crawl_id: str) -> None:
        self.url = url
        self.index = prefix(crawl_id) + "monitor"
        self.controls_key = prefix(crawl_id) + "controls"
        self.paused_key = prefix(crawl_id) + "paused"
        #: Read the controls at each :meth:`beat` (the controls are on).
        self.read_controls = False
        #: What the last :meth:`beat` read: the pending host controls (their
        #: raw form, for :meth:`done`, and their JSON), and whether the crawl
        #: is paused.
        self.controls: list[tuple[bytes, dict[str, Any]]] = []
        self.paused = False
        self._pauses = 0  # set_paused calls, so that a beat under way does not undo one
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
        if self.read_controls:
            pipe.lrange(self.controls_key, 0, -1)
            pipe.get(self.paused_key)
            pauses = self._pauses
            *_, members, pending, paused = await pipe.execute()
            # A pause set meanwhile (this process's page) is newer than what was read.
            self._read_controls(pending, paused if pauses == self._pauses else self.paused)
        else:
            members = (await pipe.execute())[-1]
        if not members:
            return []
        values = await client.mget([f"{self.index}:{member.decode()}" for member in members])
        return [json.loads(value) for value in values if value is not None]

    def _read_controls(self, pending: list[bytes], paused: Any) -> None:
        self.paused = bool(paused)
        self.controls = []
        oldest = time.time() - CONTROL_TTL
        for raw in pending:
            try:
                control = json.loads(raw)
            except ValueError:
                continue
            if isinstance(control, dict) and control.get("at", 0) >= oldest:
                self.controls.append((raw, control))

    async def post(self, control: dict[str, Any]) -> None:
        """Leave a host control for the process that holds the host."""
        pipe = self._client.pipeline(transaction=False)
        pipe.rpush(self.controls_key, json.dumps({**control, "at": time.time()}))
        pipe.ltrim(self.controls_key, -MAX_CONTROLS, -1)
        pipe.pexpire(self.controls_key, int(CONTROL_TTL * 1000))
        await pipe.execute()

    async def done(self, raw: bytes) -> bool:
        """Take the control *raw* out, applied; False if another process took it first."""
        return bool(await self._client.lrem(self.controls_key, 1, raw))

    async def set_paused(self, paused: bool) -> None:
        """Pause or resume every process of the crawl (at its next heartbeat)."""
        self._pauses += 1
        if paused:
            await self._client.set(self.paused_key, b"1")
        else:
            await self._client.delete(self.paused_key)
        self.paused = paused

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
