"""Part (m) of ``python -m bench.redis_scale``: Redis memory per request and fingerprint.

The bytes of Redis memory a shared crawl's frontier takes, measured at the
server, beside scrapy-redis.

On a fresh local ``redis-server`` (``used_memory`` of ``INFO memory`` before
and after each step, the server's own figure):

1. **Queued.** ``--queued`` requests over ``--queued-hosts`` hosts, URLs like
   ``http://h123.example/p/123456``, pushed with this package's ``push``
   command (the requests encoded as the crawl's store encodes them, each
   through the dupefilter): bytes per queued request with its fingerprint.
   Then the crawl's queues deleted (what a crawl that fetched them keeps):
   bytes per fingerprint of a request no longer queued.
2. **Fingerprints.** ``--fingerprints`` requests of realistic URLs (60 to 100
   characters) over 1,000 hosts pushed the same way, their queues deleted:
   bytes per fingerprint of a fetched page, at that count. The same requests,
   at the same time, through scrapy-redis's ``RFPDupeFilter`` on a second
   fresh server: its bytes per fingerprint at that count.
3. **scrapy-redis**, the same URLs of step 1 through its own scheduler
   (``scrapy_redis.scheduler.Scheduler`` with its default ``PriorityQueue``
   and ``RFPDupeFilter``, installed from PyPI: ``pip install scrapy-redis``),
   then its queue deleted: its bytes per queued request and per fingerprint.
   Without the package, said so and left out.

What takes the time is making the requests (a Scrapy ``Request``, its
fingerprint and its encoded form, some 40 µs each) and one round trip per
command: :data:`WORKERS` processes make the requests while this one pushes
them, and scrapy-redis's code runs as it is with its client's commands sent
in batches (a pipeline), which Redis stores as it would one by one.
``--memory-full`` takes about 24 minutes of CPU (the workers, this process
and the two servers), spread over 2 cores.

The projection: 100M fetched pages (their fingerprints) and 10M queued
requests, from the figures of steps 1 and 2, against 4 GB.
"""

from __future__ import annotations

import importlib.util
import itertools
import multiprocessing
import random
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from scrapy_hostqueue.frontier._codec import RequestCodec
from scrapy_hostqueue.frontier.redis._capacity import HeldRequest
from scrapy_hostqueue.frontier.redis._cli import held_request, push
from scrapy_hostqueue.frontier.redis._db import part_prefix
from scrapy_hostqueue.testing._redis_server import RedisServer

#: Targets (bytes).
QUEUED_TARGET = 130
FINGERPRINT_TARGET = 20
PROJECTION_TARGET = 4e9
PROJECTED_FETCHED = 100_000_000
PROJECTED_QUEUED = 10_000_000
#: Processes that make the requests, URLs each is given at a time, and
#: batches made ahead of the push.
WORKERS = 2
BATCH = 2_000
AHEAD = 8
#: Commands per pipeline sent to scrapy-redis's server.
PIPELINE = 2_000


@dataclass
class MemoryFigures:
    """What part (m) measured (bytes)."""

    queued: int
    queued_hosts: int
    fingerprints: int
    server: str = ""
    queued_bytes: float | None = None  # per queued request with its fingerprint
    queued_fp_bytes: float | None = None  # per fingerprint once the queues are gone
    fingerprint_bytes: float | None = None  # per fingerprint, step 2
    url_chars: float | None = None  # mean length of step 2's URLs
    scrapy_redis: str = ""  # its version, or why it was left out
    scrapy_redis_queued_bytes: float | None = None
    scrapy_redis_fp_bytes: float | None = None
    scrapy_redis_fingerprint_bytes: float | None = None  # per fingerprint, step 2
    seconds: dict[str, float] = field(default_factory=dict)

    def projection(self) -> float | None:
        """Project the bytes of fetched pages and queued requests.

        :data:`PROJECTED_FETCHED` fetched pages and :data:`PROJECTED_QUEUED`
        queued requests.
        """
        fp = self.fingerprint_bytes or self.queued_fp_bytes
        if fp is None or self.queued_bytes is None:
            return None
        return PROJECTED_FETCHED * fp + PROJECTED_QUEUED * self.queued_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "projection": self.projection()}


def short_urls(count: int, hosts: int) -> Iterator[str]:
    """``http://h<host>.example/p/<n>``: *count* URLs over *hosts* hosts."""
    for n in range(count):
        yield f"http://h{n % hosts}.example/p/{100_000 + n}"


def realistic_urls(count: int, hosts: int = 1_000, seed: int = 1) -> Iterator[str]:
    """*count* distinct URLs of 60 to 100 characters over *hosts* hosts."""
    rng = random.Random(seed)
    words = ("catalog", "products", "news", "articles", "category", "item", "search", "archive")
    for n in range(count):
        host = f"www.shop-{n % hosts}.example.com"
        path = f"/{rng.choice(words)}/{rng.choice(words)}-{rng.randrange(10**6)}/item-{n}.html"
        url = f"https://{host}{path}"
        pad = rng.randrange(60, 101) - len(url)
        if pad > 8:
            url += "?ref=" + "x" * (pad - 5)
        yield url


def used_memory(server: RedisServer) -> int:
    text = str(server.command("INFO memory"))
    for line in text.splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":", 1)[1])
    raise RuntimeError("INFO memory has no used_memory")


def _delete(client: Any, pattern: str) -> None:
    """Delete the keys matching *pattern* (a benchmark's cleaning, not the crawl's)."""
    batch: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            client.delete(*batch)
            batch = []
    if batch:
        client.delete(*batch)


def _drop_queues(client: Any, crawl_id: str) -> None:
    """Leave what a crawl keeps once its queued requests were fetched.

    The queues and their per-host records gone, the fingerprints kept.
    """
    p = part_prefix(crawl_id)
    for pattern in ("l:*", "q:*", "b:*"):
        _delete(client, f"{p}{pattern}".replace("{", "[{]").replace("}", "[}]"))
    client.delete(p + "qcount", p + "avail")


#: A worker's codec, and scrapy-redis's dupefilter with its pipeline when it is fed too.
_worker: dict[str, Any] = {}


def _start_worker(their_url: str | None) -> None:
    _worker["codec"] = RequestCodec(None, debug=False)
    if their_url is not None:
        import redis
        from scrapy_redis.dupefilter import RFPDupeFilter

        pipeline = redis.Redis.from_url(their_url).pipeline(transaction=False)
        _worker["theirs"] = (pipeline, RFPDupeFilter(pipeline, key="bench:dupefilter"))


def _prepare(urls: list[str]) -> list[HeldRequest]:
    """Make the requests of *urls* in the push script's form (in a worker).

    Each also through scrapy-redis's dupefilter when the worker feeds it.
    """
    from scrapy import Request

    requests = [Request(url) for url in urls]
    held = [held_request(request, _worker["codec"]) for request in requests]
    if "theirs" in _worker:
        pipeline, dupefilter = _worker["theirs"]
        for request in requests:
            assert not dupefilter.request_seen(request)  # a pipeline answers later
        added = pipeline.execute()
        assert added == [1] * len(requests), "scrapy-redis saw a fingerprint twice"
    return held


def prepared(urls: Iterator[str], their_url: str | None = None) -> Iterator[HeldRequest]:
    """Yield the requests of *urls* in the push script's form, in order.

    :data:`WORKERS` processes make them, a few batches ahead of the consumer; with
    *their_url*, each request also goes through scrapy-redis's ``RFPDupeFilter`` on that
    server.
    """
    with multiprocessing.Pool(WORKERS, _start_worker, (their_url,)) as pool:
        pending: deque[Any] = deque()
        while batch := list(itertools.islice(urls, BATCH)):
            pending.append(pool.apply_async(_prepare, (batch,)))
            if len(pending) >= AHEAD:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def _push_measured(
    server: RedisServer,
    client: Any,
    crawl_id: str,
    urls: Iterator[str],
    count: int,
    *,
    their_url: str | None = None,
) -> tuple[float, float, float]:
    """Push *urls* and measure them.

    Returns (bytes per request queued, bytes per fingerprint once the queues
    are gone, seconds). With *their_url*, scrapy-redis's dupefilter there is
    fed the same requests.
    """
    before = used_memory(server)
    started = time.monotonic()
    queued, duplicates = push(server.url, crawl_id, requests=prepared(urls, their_url))
    seconds = time.monotonic() - started
    assert (queued, duplicates) == (count, 0), (queued, duplicates)
    after = used_memory(server)
    _drop_queues(client, crawl_id)
    left = used_memory(server)
    return (after - before) / count, (left - before) / count, seconds


def _scrapy_redis(server: RedisServer, urls: list[str]) -> tuple[str, float, float] | str:
    """Feed *urls* to scrapy-redis's own scheduler and measure them.

    Returns (version, bytes per queued request with its fingerprint, bytes
    per fingerprint once its queue is gone), or why it could not run.
    """
    try:
        import scrapy_redis
        from scrapy_redis.scheduler import Scheduler
    except ImportError:
        return "not installed (pip install scrapy-redis)"
    from scrapy import Request, Spider
    from scrapy.utils.test import get_crawler

    class Bench(Spider):
        name = "bench"

    # As scrapy-redis's README sets it up: its scheduler and its dupefilter.
    settings = {
        "REDIS_URL": server.url,
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_PERSIST": True,
    }
    crawler = get_crawler(Bench, settings)
    crawler.spider = crawler._create_spider()
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    # Its dupefilter's and queue's commands sent in batches, each answered
    # as it would be alone.
    pipeline = scheduler.server.pipeline(transaction=False)
    scheduler.df.server = scheduler.queue.server = pipeline
    before = used_memory(server)
    for n, url in enumerate(urls, 1):
        scheduler.enqueue_request(Request(url))
        if n % PIPELINE == 0 or n == len(urls):
            # SADD and ZADD of each request: 1 when new.
            assert set(pipeline.execute()) == {1}, "scrapy-redis saw a request twice"
    after = used_memory(server)
    server_client = scheduler.server
    server_client.delete(scheduler.queue.key)
    left = used_memory(server)
    version = getattr(scrapy_redis, "__version__", "?")
    return str(version), (after - before) / len(urls), (left - before) / len(urls)


def measure(queued: int, queued_hosts: int, fingerprints: int) -> MemoryFigures:
    """Run the three steps on a fresh server."""
    import redis

    figures = MemoryFigures(queued, queued_hosts, fingerprints)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        info = str(server.command("INFO server"))
        version = next(
            (line.split(":", 1)[1] for line in info.splitlines() if "_version:" in line), "?"
        )
        figures.server = version.strip()
        figures.queued_bytes, figures.queued_fp_bytes, seconds = _push_measured(
            server, client, "mem-queued", short_urls(queued, queued_hosts), queued
        )
        figures.seconds["queued"] = seconds
        if fingerprints:
            urls = realistic_urls(fingerprints)
            lengths = [len(u) for u in realistic_urls(min(fingerprints, 10_000))]
            figures.url_chars = sum(lengths) / len(lengths)
            with RedisServer() as theirs:
                feed = theirs.url if importlib.util.find_spec("scrapy_redis") else None
                their_before = used_memory(theirs)
                _, figures.fingerprint_bytes, seconds = _push_measured(
                    server, client, "mem-seen", urls, fingerprints, their_url=feed
                )
                if feed is not None:
                    figures.scrapy_redis_fingerprint_bytes = (
                        used_memory(theirs) - their_before
                    ) / fingerprints
            figures.seconds["fingerprints"] = seconds
        started = time.monotonic()
        result = _scrapy_redis(server, list(short_urls(queued, queued_hosts)))
        figures.seconds["scrapy_redis"] = time.monotonic() - started
        if isinstance(result, str):
            figures.scrapy_redis = result
        else:
            (
                figures.scrapy_redis,
                figures.scrapy_redis_queued_bytes,
                figures.scrapy_redis_fp_bytes,
            ) = result
        client.close()
    return figures


def _b(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} B"


def report_lines(figures: MemoryFigures) -> list[str]:
    """Return the figures against the targets, as lines."""
    lines = [
        f"(m) Redis memory at the server ({figures.server}), used_memory growth:",
        f"  {figures.queued:,} queued over {figures.queued_hosts:,} hosts "
        "(http://h123.example/p/123456):",
        f"    this package {_b(figures.queued_bytes)} per queued request with its "
        f"fingerprint (target <= {QUEUED_TARGET} B), "
        f"{_b(figures.queued_fp_bytes)} per fingerprint once fetched",
    ]
    if figures.scrapy_redis_queued_bytes is not None:
        lines.append(
            f"    scrapy-redis {figures.scrapy_redis} {_b(figures.scrapy_redis_queued_bytes)} "
            f"per queued request with its fingerprint, {_b(figures.scrapy_redis_fp_bytes)} "
            "per fingerprint once its queue is gone"
        )
    else:
        lines.append(f"    scrapy-redis: {figures.scrapy_redis}")
    if figures.fingerprint_bytes is not None:
        lines.append(
            f"  {figures.fingerprints:,} fingerprints of URLs of {figures.url_chars or 0:.0f} "
            f"characters on average: this package {_b(figures.fingerprint_bytes)} each "
            f"(target <= {FINGERPRINT_TARGET} B)"
            + (
                f", scrapy-redis {_b(figures.scrapy_redis_fingerprint_bytes)} each"
                if figures.scrapy_redis_fingerprint_bytes is not None
                else ""
            )
        )
    projected = figures.projection()
    if projected is not None:
        lines.append(
            f"  Projected: {PROJECTED_FETCHED / 1e6:.0f}M fetched + "
            f"{PROJECTED_QUEUED / 1e6:.0f}M queued = {projected / 1e9:.2f} GB "
            f"(target <= {PROJECTION_TARGET / 1e9:.0f} GB)"
        )
    return lines


__all__ = ["MemoryFigures", "measure", "realistic_urls", "report_lines", "short_urls"]
