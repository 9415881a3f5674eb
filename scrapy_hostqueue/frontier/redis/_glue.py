"""Scrapy glue of the Redis store (``HOSTQUEUE_FRONTIER = "redis://..."``).

Checking Redis at start-up, the store's codec and fingerprints, the dupefilter in front of the
shared one, the store's task, and the graceful hand-back at close.

The ``redis`` client is imported here, lazily: the package imports and runs
without it for the memory and SQLite stores.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._errors import RedisFrontierError, RedisFrontierLost
from scrapy_hostqueue._recorder import stat_key
from scrapy_hostqueue.frontier.memory import MemoryStore
from scrapy_hostqueue.frontier.redis import _check
from scrapy_hostqueue.frontier.redis._capacity import HeldRequest, is_oom, write_held
from scrapy_hostqueue.frontier.redis._db import (
    crawl_token,
    partition_prefixes,
    prefix,
    register,
    stored_partitions,
)
from scrapy_hostqueue.frontier.redis._link import RedisLink
from scrapy_hostqueue.frontier.redis._store import RedisStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_hostqueue._config import HostQueueConfig
    from scrapy_hostqueue.frontier import HostState
    from scrapy_hostqueue.frontier._codec import RequestCodec

logger = logging.getLogger(__name__)

#: Seconds connecting to Redis may take at start-up.
CONNECT_TIMEOUT = 5.0
#: Fingerprints this process remembers having pushed (its own duplicates are
#: dropped here, without a trip to Redis); past this the memory starts over.
LOCAL_SEEN = 100_000
#: Partitions of a new crawl per master of a Redis Cluster (by default): a
#: cluster grown to that many times its masters can still give each master a
#: part of the crawl by moving slots.
PARTITIONS_PER_MASTER = 4
#: The finish reason of a crawl whose Redis no longer holds it.
FRONTIER_LOST = "hostqueue_frontier_lost"
#: The finish reason of a crawl whose Redis stays full with nothing in the
#: crawl that could free memory.
REDIS_FULL = "hostqueue_redis_full"


def redis_client_module() -> Any:
    """Import the ``redis`` package, or fail with one line saying how to install it."""
    try:
        # Lazily: the package works without the client for the other stores.
        import redis  # noqa: PLC0415
        import redis.asyncio  # noqa: PLC0415
        import redis.asyncio.cluster  # noqa: PLC0415
        import redis.asyncio.retry  # noqa: PLC0415
        import redis.backoff  # noqa: PLC0415
        import redis.cluster  # noqa: PLC0415
    except ImportError:
        raise RedisFrontierError(
            "HOSTQUEUE_FRONTIER names a Redis server, and the redis client is not "
            "installed: pip install 'scrapy-hostqueue[redis]'"
        ) from None
    return redis


#: Options of a Redis URL's query whose values are secrets.
SECRET_OPTIONS = frozenset({"password", "ssl_password"})
#: Options of a Redis URL's query that name a file or directory the client
#: reads when it connects.
FILE_OPTIONS = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")


def shown_url(url: str) -> str:
    """Return *url* without its secrets, for log lines and messages.

    *url* without its secrets, for log lines and messages: the password
    (``redis://:***@host``, ``redis://user:***@host``) and the values of
    :data:`SECRET_OPTIONS` in its query.
    """
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, colon, _password = userinfo.partition(":")
        if colon:
            netloc = f"{user}:***@{host}"
    query = "&".join(
        f"{name}=***" if unquote(name) in SECRET_OPTIONS else f"{name}{sep}{value}"
        for name, sep, value in (item.partition("=") for item in parts.query.split("&"))
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _unknown_option(error: TypeError) -> str:
    """Return the option a client's constructor refused (*error*), as it names it."""
    found = re.search(r"keyword argument '(\w+)'", str(error))
    return found.group(1) if found else str(error)


def check_url(redis: Any, url: str) -> None:
    """Refuse, without connecting, a Redis URL the client cannot use, with one line saying why.

    A malformed URL, an option it does not take, a TLS option without ``rediss://``, a certificate
    file that is not there.
    """
    shown = shown_url(url)
    try:
        options = redis.connection.parse_url(url)
    except ValueError as error:
        raise RedisFrontierError(f"the Redis URL {shown} is malformed: {error}") from None
    kind = options.pop("connection_class", redis.Connection)
    if kind is not redis.SSLConnection:
        tls = sorted(name for name in options if name.startswith("ssl_"))
        if tls:
            raise RedisFrontierError(
                f"the Redis URL {shown} has TLS options ({', '.join(tls)}) and does not "
                "use TLS: write rediss:// for TLS, or leave them out"
            )
    for name in FILE_OPTIONS:
        path = options.get(name)
        if path and not os.path.exists(path):
            raise RedisFrontierError(f"the Redis URL {shown} names {name}={path}: not found")
    try:
        # Built, not connected: the client takes every keyword of the URL's
        # query, and only its connection classes tell an unknown one, the
        # synchronous one of the start-up and the asyncio one of the crawl.
        kind(**options)
        options = redis.asyncio.connection.parse_url(url)
        options.pop("connection_class", redis.asyncio.Connection)(**options)
    except TypeError as error:
        raise RedisFrontierError(
            f"the Redis URL {shown} has an option the redis client does not take: "
            f"{_unknown_option(error)}"
        ) from None
    except redis.RedisError as error:  # a value it refuses, e.g. ssl_cert_reqs
        raise RedisFrontierError(f"the Redis URL {shown}: {error}") from None


def check_cluster_options(redis: Any, url: str) -> None:
    """Refuse an option of *url* that the asyncio cluster client does not take.

    Refuse, in one line, an option of *url* that the asyncio client of a
    Redis Cluster does not take (it takes fewer than the synchronous one,
    e.g. no ``ssl_password``): built here, not connected, rather than fail
    with a traceback when the crawl's task starts.
    """
    try:
        redis.asyncio.cluster.RedisCluster.from_url(url)
    except TypeError as error:
        raise RedisFrontierError(
            f"HOSTQUEUE_FRONTIER: {shown_url(url)} is a node of a Redis Cluster, whose "
            f"asyncio client does not take the option {_unknown_option(error)}: leave it out"
        ) from None


def connect_problem(redis: Any, url: str, error: BaseException, where: str = "the URL") -> str:
    """Say what the client's *error* connecting to *url* means, in one line.

    What the client's *error* connecting to *url* means, and what to do
    about it *where* the URL is given, in words for one line.
    """
    text = str(error).strip().rstrip(".")
    if isinstance(error, redis.exceptions.AuthenticationError):
        if "password" in redis.connection.parse_url(url):
            return f"Redis refused the password ({text}): give the right one in {where}"
        scheme = urlsplit(url).scheme
        return (
            f"Redis asks for a password, and {where} gives none: write it as "
            f"{scheme}://:PASSWORD@host:port/db"
        )
    if is_oom(error):
        return (
            f"Redis is full ({text}) and cannot hold a new crawl: raise its maxmemory, "
            "or give the crawl a Redis of its own"
        )
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            f"the server's TLS certificate is not trusted ({text}): name the CA that "
            f"signed it in {where}, as ?ssl_ca_certs=/path/to/ca.pem"
        )
    tls = urlsplit(url).scheme == "rediss"
    if "closed by server" in text:
        # What a TLS server does to a plain client, and a server asking for
        # a client certificate to a client without one.
        if tls:
            return (
                f"{text}: if the server asks for a client certificate, name it in {where} "
                "as ssl_certfile=/path/to/cert.pem&ssl_keyfile=/path/to/key.pem"
            )
        return f"{text}: if the server speaks TLS, write rediss:// in {where}"
    if tls and isinstance(error, redis.exceptions.TimeoutError):
        # What a plain server does to a TLS client: waits for a command.
        return f"{text}: start Redis there; if it does not speak TLS, write redis:// in {where}"
    return f"{text}: start Redis there, or fix {where}"


def redis_errors(redis: Any) -> tuple[type[BaseException], ...]:
    """Return the client's errors that mean Redis is away for now.

    The client's errors that mean Redis is away, or restarted, or was
    made a replica by a failover (``READONLY``: it takes writes again once
    it is a master again, or its clients reach the new master); on a Redis
    Cluster also that a partition's slot is not served for now (a node down, a
    failover, a slot moving).
    """
    exceptions = redis.exceptions
    cluster = (
        exceptions.ClusterError,  # CLUSTERDOWN, MASTERDOWN, retries used up
        exceptions.TryAgainError,
        exceptions.SlotNotCoveredError,
        # No node of the cluster answers (redis >= 8).
        getattr(exceptions, "RedisClusterUnreachableError", exceptions.SlotNotCoveredError),
    )
    return (
        exceptions.ConnectionError,
        exceptions.TimeoutError,
        exceptions.NoScriptError,
        exceptions.ReadOnlyError,
        *cluster,
        OSError,
    )


def _cluster_node(redis: Any, url: str, options: dict[str, Any]) -> bool:
    """Whether the server at *url* is a node of a Redis Cluster.

    Asked in database 0 whatever database *url* names.
    """
    pool = redis.ConnectionPool.from_url(url, **options)
    pool.connection_kwargs["db"] = 0
    try:
        info = redis.Redis(connection_pool=pool).info("cluster")
        return int(info.get("cluster_enabled", 0)) == 1
    except redis.RedisError:
        return False
    finally:
        pool.disconnect()


def connect(redis: Any, url: str, *, timeout: float = CONNECT_TIMEOUT) -> tuple[Any, bool]:
    """Return a synchronous client of the Redis at *url*, a cluster client if need be.

    A synchronous client of the Redis at *url*, and whether it talks to a
    Redis Cluster: when the server at *url* is a node of one (``INFO
    cluster`` says ``cluster_enabled:1``), a cluster client, which finds the
    other nodes from it. Raises the client's errors when Redis is away, and
    :class:`RedisFrontierError` when the cluster does not serve all its slots
    or *url* names a database other than 0, or is one :func:`check_url`
    refuses.
    """
    check_url(redis, url)
    options = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
    plain = redis.Redis.from_url(url, **options)
    try:
        try:
            enabled = int(plain.info("cluster").get("cluster_enabled", 0))
        except redis.ResponseError:
            # A node of a cluster refuses SELECT, which a database in the
            # URL sends first (Redis: "not allowed in cluster mode", Valkey:
            # "DB index is out of range").
            if plain.connection_pool.connection_kwargs.get("db") and _cluster_node(
                redis, url, options
            ):
                raise RedisFrontierError(
                    f"{shown_url(url)} is a node of a Redis Cluster, which has only "
                    "database 0: leave the database out of HOSTQUEUE_FRONTIER (or write /0)"
                ) from None
            enabled = 0  # INFO refused: used as one server
        if not enabled:
            return plain, False
        info = plain.execute_command("CLUSTER INFO")
    except BaseException:
        plain.close()
        raise
    plain.close()
    state = info.get("cluster_state", "unknown")
    if state != "ok":
        raise RedisFrontierError(
            f"the Redis Cluster at {shown_url(url)} is not serving "
            f"(cluster_state:{state}, {info.get('cluster_slots_ok', 0)} of 16384 slots "
            "served): wait until every slot is served, or fix HOSTQUEUE_FRONTIER"
        )
    try:
        return redis.cluster.RedisCluster.from_url(url, **options), True
    except redis.exceptions.RedisClusterException as error:
        raise RedisFrontierError(
            f"cannot use the Redis Cluster at {shown_url(url)}: {error}"
        ) from None


def async_client(redis: Any, url: str, *, cluster: bool) -> Any:
    """Make the asyncio client of the store's task.

    Of a Redis Cluster if *cluster* (what :func:`connect` found).
    """
    kind = redis.asyncio.cluster.RedisCluster if cluster else redis.asyncio.Redis
    # No retries inside the client: the store's task retries, with its
    # back-off and its log lines, and sends a failed batch again whole.
    return kind.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=CONNECT_TIMEOUT,
        retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0),
    )


def _fullness(info: dict[str, Any]) -> tuple[float, int]:
    """Order ``INFO memory`` answers by how full their server is."""
    used, maxmemory = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    return (used / maxmemory if maxmemory else 0.0), used


def default_partitions(client: Any) -> tuple[int, Callable[[str], str] | None]:
    """Return how many partitions a new crawl gets on *client*'s Redis, and their masters.

    1 on one server; :data:`PARTITIONS_PER_MASTER` per master on a Redis
    Cluster, with what names the master serving a key (to deal the
    partitions evenly over the masters: see ``_db.suffixes_for``).
    """
    if not hasattr(client, "get_primaries"):
        return 1, None
    return PARTITIONS_PER_MASTER * len(client.get_primaries()), (
        lambda key: str(client.get_node_from_key(key).name)
    )


def _partitions(client: Any, crawl_id: str, config: HostQueueConfig) -> int:
    """Return the partitions of the crawl: those it has, else those to make it with.

    ``HOSTQUEUE_REDIS_PARTITIONS``, or by default 1 on one server and
    :data:`PARTITIONS_PER_MASTER` per master of a Redis Cluster (*masters*,
    0 on one server). A process set to another number than the crawl has
    joins it with the crawl's, and says so.
    """
    stored = stored_partitions(client, crawl_id)
    wanted = config.redis_partitions
    if stored is not None:
        if wanted and wanted != stored:
            logger.warning(
                "HOSTQUEUE_REDIS_PARTITIONS is %d, and crawl %r was made with %d "
                "partitions: this process joins it with %d (a crawl keeps the partitions "
                "it was made with; choose another HOSTQUEUE_CRAWL_ID for %d)",
                wanted,
                crawl_id,
                stored,
                stored,
                wanted,
            )
        return stored
    return wanted or default_partitions(client)[0]


class LocalSeen:
    """The fingerprints this process pushed, as the dupefilter's first, local, answer.

    A request seen here is a duplicate; one not seen here is pushed, and the shared seen set in
    Redis decides.
    """

    def __init__(self, limit: int = LOCAL_SEEN) -> None:
        self._seen: set[bytes] = set()
        self._limit = limit

    def __call__(self, fingerprint: bytes) -> bool:
        if fingerprint in self._seen:
            return True
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(fingerprint)
        return False

    def clear(self) -> None:
        """Forget every fingerprint.

        Redis may have lost some of them (a failover to a replica that missed the last writes).
        """
        self._seen.clear()


class RedisFrontier:
    """One process's part in a shared crawl.

    Registered with Redis at start-up (:meth:`open`), then its store's task (:meth:`start`) until
    the graceful hand-back (:meth:`close`).
    """

    def __init__(  # noqa: PLR0917 - what open() found
        self,
        url: str,
        crawl_id: str,
        proc: str,
        config: HostQueueConfig,
        token: str = "",
        crawler: Crawler | None = None,
    ) -> None:
        self.url = url
        self.crawl_id = crawl_id
        self.proc = proc
        self.config = config
        #: The crawl's identity in Redis (see ``_db``).
        self.token = token
        self.crawler = crawler
        #: Whether Redis is a Redis Cluster (found at :meth:`open`).
        self.cluster = False
        #: The key prefixes of the crawl's partitions (found at :meth:`open`).
        self.prefixes: list[str] | None = None
        #: What the server said of its memory and persistence at start-up.
        self.server: _check.ServerSettings | None = None
        #: The task of the crawl (``scrapy crawl``), to end it with an error.
        self.task = internals.crawl_task()
        self.lost: RedisFrontierLost | None = None
        #: The fingerprints this process pushed (the dupefilter's first answer).
        self.seen = LocalSeen()
        self.store: RedisStore[Request] | None = None
        self._client: Any = None
        self._link: RedisLink | None = None
        self._codec: RequestCodec | None = None

    @classmethod
    def open(cls, crawler: Crawler, config: HostQueueConfig) -> RedisFrontier:
        """Connect, check the crawl's layout and register this process.

        Raises a :class:`RedisFrontierError` with one line if Redis cannot be used.

        A synchronous client, once, before the crawl runs: the component is
        being built and nothing else runs on the loop yet.
        """
        assert config.frontier_url is not None
        redis = redis_client_module()
        url = config.frontier_url
        crawl_id = config.crawl_id or crawler.spidercls.name
        try:
            check_url(redis, url)
        except RedisFrontierError as error:
            raise RedisFrontierError(f"HOSTQUEUE_FRONTIER: {error}") from None
        client = None
        try:
            client, cluster = connect(redis, url)
            node = {"target_nodes": client.get_node_from_key(prefix(crawl_id))} if cluster else {}
            # Every master on a cluster: the crawl's partitions are spread over them.
            servers = (
                [_check.read(client, target_nodes=master) for master in client.get_primaries()]
                if cluster
                else [_check.read(client)]
            )
            server = servers[0]
            refusals = [_check.eviction_refusal(each, shown_url(url)) for each in servers]
            refusal = next((each for each in refusals if each is not None), None)
            if refusal is None and config.redis_bloom:
                bloom_key = prefix(crawl_id) + "bloom"
                refusal = _check.bloom_refusal(client, shown_url(url), bloom_key, **node)
            if refusal is not None:
                raise RedisFrontierError(refusal)
            partitions = _partitions(client, crawl_id, config)
            expiry = int((time.time() + config.lease_timeout) * 1000)
            proc = register(
                client,
                crawl_id,
                expiry,
                config.redis_bloom,
                partitions=partitions,
                master_of=default_partitions(client)[1],
            )
            token = crawl_token(client, crawl_id)
            prefixes = partition_prefixes(client, crawl_id)
        except (redis.RedisError, redis.exceptions.RedisClusterException) as error:
            raise RedisFrontierError(
                f"cannot use the shared frontier at {shown_url(url)}: "
                f"{connect_problem(redis, url, error, 'HOSTQUEUE_FRONTIER')}"
            ) from None
        finally:
            if client is not None:
                client.close()
        if cluster:
            check_cluster_options(redis, url)
        warnings = [_check.persistence_warning(each, shown_url(url)) for each in servers]
        warning = next((each for each in warnings if each is not None), None)
        if warning is not None:
            logger.warning(warning)
        frontier = cls(url, crawl_id, proc, config, token, crawler)
        frontier.cluster = cluster
        frontier.server = server
        frontier.prefixes = prefixes
        return frontier

    def make_store(
        self,
        codec: RequestCodec,
        fingerprint: Callable[[Request], bytes | None],
        state_factory: Callable[[str], HostState],
        **kwargs: Any,
    ) -> RedisStore[Request]:
        cfg = self.config
        self.store = RedisStore(
            MemoryStore(state_factory, **kwargs),
            self.crawl_id,
            self.proc,
            codec.encode,
            codec.decode,
            fingerprint,
            max_hold=cfg.max_active_hosts or cfg.global_concurrency or 16,
            lease_timeout=cfg.lease_timeout,
            finish_grace=cfg.redis_finish_grace,
            wait_for_urls=cfg.redis_wait_for_urls,
            share_hosts=cfg.redis_share_hosts,
            token=self.token,
            backlog=cfg.redis_backlog,
            spill_dir=cfg.redis_spill_dir,
            where=shown_url(self.url),
            prefixes=self.prefixes,
        )
        self._codec = codec
        return self.store

    def start(self, wake: Callable[[], None]) -> None:
        """Start the store's task on the running loop.

        *wake* is called when Redis gave this process work, or the crawl finished.
        """
        assert self.store is not None
        redis = redis_client_module()
        self._client = async_client(redis, self.url, cluster=self.cluster)
        self.store.on_work = wake
        # After an outage Redis may lack requests this process pushed (a
        # failover lost them): their links, found again, are pushed again.
        self.store.on_back = self.seen.clear
        self.store.on_lost = self._on_lost
        client = self._client
        info = None
        if self.cluster:

            async def info(section: str) -> dict[str, Any]:
                # The nodes of the partitions: the fullest one's memory.
                assert self.store is not None
                nodes = {client.get_node_from_key(p).name: p for p in self.store.prefixes}
                answers = [
                    await client.info(section, target_nodes=client.get_node_from_key(p))
                    for p in nodes.values()
                ]
                return max(answers, key=_fullness)  # type: ignore[no-any-return]

        run_id = self.server.run_id if self.server is not None else ""
        self._link = RedisLink(
            self.store, client, redis_errors(redis), info, run_id, cluster=self.cluster
        )
        self._link.start()
        logger.info(
            "HostQueueScheduler: shared frontier at %s%s, crawl id %r in %d partitions, "
            "this process %s, at most %d hosts held at once, leases expire %g s after a "
            "process stops; Redis: %s",
            shown_url(self.url),
            " (a Redis Cluster)" if self.cluster else "",
            self.crawl_id,
            len(self.store.prefixes),
            self.proc,
            self.store.max_hold,
            self.config.lease_timeout,
            _check.describe(self.server) if self.server is not None else "not read",
        )

    def _on_lost(self, kind: str) -> None:
        """Close the crawl because Redis lost it or stays full.

        Redis no longer holds the crawl (*kind* ``"lost"``), or stays
        full with nothing that could free memory (``"full"``): one ERROR,
        and the crawl closes (its finish reason :data:`FRONTIER_LOST` or
        :data:`REDIS_FULL`, then an error for ``scrapy crawl``'s exit
        status).
        """
        assert self.store is not None
        path = self.store.file_path("held")
        shown = shown_url(self.url)
        again = (
            f"python -m scrapy_hostqueue push {shown} --crawl-id {self.crawl_id} --requests {path}"
        )
        if kind == "lost":
            cause = self.store.lost_cause or (
                "Redis restarted without its data, was flushed, or the URL now names another server"
            )
            self.lost = RedisFrontierLost(
                f"the shared frontier at {shown} no longer holds crawl {self.crawl_id!r}: "
                f"{cause}. This process stops and writes the requests it holds to {path}; "
                f"start the crawl again, then queue them with: {again}"
            )
            reason = FRONTIER_LOST
        else:
            self.lost = RedisFrontierLost(
                f"Redis at {shown} stays full (maxmemory) and nothing the crawl holds can free "
                f"memory: this process stops and writes the {len(self.store.capacity.backlog)} "
                f"new requests Redis refused to {path}. Raise maxmemory, then queue them "
                f"with: {again}"
            )
            reason = REDIS_FULL
        logger.error("The crawl stops: %s", self.lost)
        if self.crawler is None:
            return
        internals.fail_crawl(self.crawler, self.lost, self.task)
        engine = self.crawler.engine
        closing = asyncio.ensure_future(engine.close_spider_async(reason=reason))
        closing.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _write_held(self, requests: Iterable[tuple[HeldRequest, Request | None]]) -> int:
        """Write *requests* to this process's file of held requests."""
        assert self.store is not None
        codec = self._codec

        def url(held: HeldRequest) -> str | None:
            item = items.get(id(held))
            if item is None and codec is not None:
                try:
                    item = codec.decode(held.data)
                except Exception:  # written all the same: push does not decode
                    return None
            return None if item is None else str(item.url)

        pairs = list(requests)
        items = {id(held): item for held, item in pairs}
        return write_held(self.store.file_path("held"), (held for held, _ in pairs), url)

    async def close(self, stats: Any) -> None:
        """Hand back what this process holds and leave the crawl."""
        store = self.store
        if store is None or self._link is None:
            return
        if store.frontier_lost:
            await self._link.stop()
            written = self._write_held(store.held_requests())
            logger.info(
                "Wrote the %d requests this process held to %s",
                written,
                store.file_path("held"),
            )
        else:
            if store.stuck_full:
                written = self._write_held(store.unsent_requests())
                store.drop_unsent()
                logger.info(
                    "Wrote the %d requests Redis refused to %s", written, store.file_path("held")
                )
            problem = await self._link.close()
            if problem is not None:
                logger.error("Could not hand back to the shared frontier: %s", problem)
                unsent = list(store.unsent_requests())
                if unsent:
                    written = self._write_held(unsent)
                    logger.error(
                        "Wrote the %d requests Redis never took to %s: queue them with "
                        "python -m scrapy_hostqueue push --requests",
                        written,
                        store.file_path("held"),
                    )
        store.capacity.backlog.close()
        for name, value in store.counts.items():
            if value:
                stats.set_value(stat_key(f"redis/{name}_count"), value)
        capacity = store.capacity
        if capacity.full_seconds or capacity.full_since is not None:
            stats.set_value(stat_key("redis/full_seconds"), round(capacity.seconds_full(), 3))
        if capacity.max_backlog:
            stats.set_value(stat_key("redis/max_backlog"), capacity.max_backlog)
        if capacity.backlog.spilled:
            stats.set_value(stat_key("redis/spilled_count"), capacity.backlog.spilled)
        try:
            await self._client.aclose()
        except Exception:  # closing a connection that is gone
            logger.debug("Closing the Redis client failed", exc_info=True)


__all__ = [
    "LocalSeen",
    "RedisFrontier",
    "async_client",
    "check_cluster_options",
    "check_url",
    "connect",
    "connect_problem",
    "default_partitions",
    "redis_client_module",
    "shown_url",
]
