"""``python -m scrapy_hostqueue push|frontier redis://...``.

Feed a shared crawl from outside, and see what it holds.

Synchronous ``redis`` client: these are commands, not a crawl.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import fingerprint

from scrapy_hostqueue.frontier._codec import RequestCodec
from scrapy_hostqueue.frontier.redis import _check
from scrapy_hostqueue.frontier.redis._capacity import HeldRequest
from scrapy_hostqueue.frontier.redis._db import (
    LAYOUT_VERSION,
    SCRIPTS,
    RedisFrontierError,
    fingerprint_key,
    open_crawl,
    part_prefix,
    partition_of,
    partition_prefixes,
    prefix,
    split_value,
    stored_partitions,
)
from scrapy_hostqueue.frontier.redis._glue import (
    connect,
    connect_problem,
    default_partitions,
    redis_client_module,
    shown_url,
)

#: Requests per push script call.
_CHUNK = 200


def _client(url: str) -> Any:
    """Make a client of the Redis at *url*: of a Redis Cluster if it is a node of one."""
    redis = redis_client_module()
    try:
        client, _cluster = connect(redis, url, timeout=10)
    except (redis.RedisError, redis.exceptions.RedisClusterException) as error:
        raise RedisFrontierError(
            f"cannot reach Redis at {shown_url(url)}: {connect_problem(redis, url, error)}"
        ) from None
    return client


def _check_layout(client: Any, url: str, crawl_id: str) -> None:
    version = client.get(prefix(crawl_id) + "version")
    if version is not None and version.decode() != LAYOUT_VERSION:
        raise RedisFrontierError(
            f"crawl id {crawl_id!r} at {shown_url(url)} has frontier layout "
            f"{version.decode()}, this scrapy-hostqueue uses {LAYOUT_VERSION}"
        )


def _requests(urls: Iterable[str], priority: int) -> Iterator[HeldRequest]:
    """Make a request for each of *urls*, in the push script's form.

    A request for each of *urls*, as the spider's default callback gets
    them, encoded as the crawl's store encodes its requests
    (:class:`RequestCodec`, the fields at their defaults left out).
    """
    codec = RequestCodec(None, debug=False)
    for address in urls:
        yield held_request(Request(address.strip(), priority=priority), codec)


def held_request(request: Request, codec: RequestCodec) -> HeldRequest:
    """Put *request* (a URL and a priority) in the push script's form, encoded with *codec*."""
    host = urlparse_cached(request).hostname or ""
    data = codec.encode(request)
    assert data is not None  # a URL and a priority always encode
    return HeldRequest("", fingerprint(request), host, request.priority * 2 + 1, data)


def push(
    url: str,
    crawl_id: str,
    urls: Iterable[str] = (),
    *,
    priority: int = 0,
    requests: Iterable[HeldRequest] = (),
) -> tuple[int, int]:
    """Queue a request for each of *urls*, then *requests*, in the crawl.

    Queue a request for each of *urls* in the crawl, through its
    dupefilter, as its spider's default callback would get them, then
    *requests* as they are (from a file a crawl wrote, :func:`read_held`).
    Returns ``(queued, duplicates)``.
    """
    client = _client(url)
    try:
        _check_layout(client, url, crawl_id)
        # Made now if it is not there (on a Redis Cluster, with 4 partitions
        # per master, as a crawl process makes it).
        partitions, master_of = default_partitions(client)
        token = open_crawl(client, crawl_id, partitions=partitions, master_of=master_of)
        prefixes = partition_prefixes(client, crawl_id)
        script = client.register_script(SCRIPTS["push"])
        source = f"cli{client.incr(prefix(crawl_id) + 'procseq')}"
        batches: list[list[Any]] = [[] for _ in prefixes]
        statuses: Counter[int] = Counter()
        every = itertools.chain(_requests(urls, priority), requests)
        for n, held in enumerate(every):
            key = fingerprint_key(held.fingerprint) if held.fingerprint else b""
            part = partition_of(held.host, len(prefixes))
            args = batches[part]
            args += [f"{source}.{n}", key, held.host, held.rank, "0", held.data]
            if len(args) >= 6 * _CHUNK:
                statuses.update(script(keys=[prefixes[part]], args=[token, source, *args]))
                args.clear()
        for p, args in zip(prefixes, batches, strict=True):
            if args:
                statuses.update(script(keys=[p], args=[token, source, *args]))
        return statuses[1], statuses[0]
    finally:
        client.close()


def _when(ms: float, now: float) -> str:
    wall = ms / 1000
    moment = datetime.fromtimestamp(wall, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{moment} (in {wall - now:,.1f} s)"


def report(url: str, crawl_id: str, *, top: int = 10) -> str:
    """Say what the shared crawl *crawl_id* holds, as text."""
    client = _client(url)
    try:
        _check_layout(client, url, crawl_id)
        return _report(client, url, crawl_id, top)
    finally:
        client.close()


def _server_lines(client: Any, crawl_id: str, prefixes: list[str]) -> list[str]:
    """Redis's memory and persistence, a line for each master holding a part of the crawl."""
    if not hasattr(client, "get_node_from_key"):
        return ["  Redis: " + _check.describe(_check.read(client))]
    # A Redis Cluster: the masters serving the crawl's home and its partitions.
    nodes: dict[str, Any] = {}
    held: Counter[str] = Counter()
    for p in [prefix(crawl_id), *prefixes]:
        node = client.get_node_from_key(p)
        nodes.setdefault(node.name, node)
        held[node.name] += p in prefixes
    return [
        f"  Redis {name} ({held[name]} partitions): "
        + _check.describe(_check.read(client, target_nodes=node))
        for name, node in sorted(nodes.items())
    ]


def _read_all(client: Any, prefixes: list[str], command: str, name: str) -> list[Any]:
    """Return what *command* answers for the key *name* of each partition."""
    return [getattr(client, command)(p + name) for p in prefixes]


def _report(client: Any, url: str, crawl_id: str, top: int) -> str:
    made = stored_partitions(client, crawl_id) is not None
    prefixes = partition_prefixes(client, crawl_id) if made else [part_prefix(crawl_id)]
    first = prefixes[0]
    now = time.time()
    stats: Counter[str] = Counter()
    for part in _read_all(client, prefixes, "hgetall", "stats"):
        stats.update({k.decode(): int(v) for k, v in part.items()})
    procs = [
        (m.decode(), score) for m, score in client.zrange(first + "procs", 0, -1, withscores=True)
    ]
    backlog = sum(int(n) for n in client.hvals(first + "backlog"))
    fingerprints = sum(int(client.hget(p + "fp", "n") or 0) for p in prefixes)
    lines = [
        f"shared frontier {shown_url(url)}, crawl id {crawl_id!r}"
        + (f", {len(prefixes)} partitions" if len(prefixes) > 1 else ""),
        *_server_lines(client, crawl_id, prefixes),
        f"  {stats.get('queued', 0):,} requests queued and {stats.get('leased', 0):,} leased; "
        f"{stats.get('pushed', 0):,} pushed, {stats.get('duplicates', 0):,} duplicates dropped, "
        f"{stats.get('acked', 0):,} done, {stats.get('reclaimed', 0):,} taken back from "
        f"processes that stopped; {fingerprints:,} fingerprints seen"
        + (f"; {backlog:,} kept back in processes while Redis is full" if backlog else ""),
    ]
    leased: Counter[str] = Counter()
    if procs:
        lines.append(f"processes ({len(procs)}):")
        for proc, expiry in procs:
            held: list[str] = []
            count = 0
            for p in prefixes:
                held += (h.decode() for h in client.smembers(p + f"held:{proc}"))
                ids = list(client.smembers(p + f"lease:{proc}"))
                count += len(ids)
                for value in client.hmget(p + "r", ids) if ids else []:
                    if value is not None:
                        leased[split_value(value)[0]] += 1
            held.sort()
            state = "alive" if expiry / 1000 > now else "heartbeat expired"
            shown = ", ".join(held[:top]) + (", ..." if len(held) > top else "")
            lines.append(
                f"  {proc}  {state}, {count:,} leased, {len(held)} hosts held: {shown or '-'}"
            )
    queued = {
        host.decode(): int(count)
        for p in prefixes
        for host, count in client.zrevrange(p + "qcount", 0, top - 1, withscores=True)
    }
    busiest = sorted(queued.keys() | leased.keys(), key=lambda h: (-queued.get(h, 0), h))[:top]
    if busiest:
        owners = {
            k.decode(): v.decode()
            for part in _read_all(client, prefixes, "hgetall", "owner")
            for k, v in part.items()
        }
        lines.append(f"queued and leased per host (top {len(busiest)}):")
        width = max(len(host) for host in busiest)
        for host in busiest:
            owner = owners.get(host)
            held_by = f"  held by {owner}" if owner else ""
            p = prefixes[partition_of(host, len(prefixes))]
            co, part = client.hmget(p + f"share:{host}", "co", "grant")
            if co is not None:
                # A busy host lent in part (see _share.py).
                held_by += f", {int(part)} of its limit lent to {co.decode()}"
            lines.append(
                f"  {host:<{width}}  {queued.get(host, 0):>9,} queued  "
                f"{leased.get(host, 0):>6,} leased{held_by}"
            )
    states = {
        k.decode(): json.loads(v)
        for part in _read_all(client, prefixes, "hgetall", "state")
        for k, v in part.items()
    }
    blocked = sorted(
        (
            (host, state)
            for host, state in states.items()
            if (state.get("blocked_until") or 0) > now
        ),
        key=lambda item: item[1]["blocked_until"],
    )
    if blocked:
        lines.append("blocked hosts:")
        for host, state in blocked[:top]:
            lines.append(
                f"  {host}  until {_when(state['blocked_until'] * 1000, now)}, "
                f"{state.get('reason') or 'blocked'}"
            )
    given_up = sorted(
        h.decode() for part in _read_all(client, prefixes, "smembers", "gaveup") for h in part
    )
    if given_up:
        lines.append(f"given-up hosts ({len(given_up):,}): " + ", ".join(given_up[:top]))
    learned = sorted(states.items())
    if learned:
        lines.append(f"learned limits and intervals ({len(learned):,} hosts):")
        for host, state in learned[:top]:
            interval = state.get("interval")
            extra = f", interval {interval:g} s" if interval else ""
            if state.get("learned"):
                extra += f", learned {json.dumps(state['learned'], sort_keys=True)}"
            lines.append(f"  {host}  limit {state.get('limit')}{extra}")
    return "\n".join(lines)


__all__ = ["held_request", "push", "report"]
