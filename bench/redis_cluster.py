"""Part (k) of ``python -m bench.redis_scale``: one crawl over a Redis Cluster's masters.

A Redis Cluster of :data:`MASTERS` real ``redis-server`` masters
(:class:`~scrapy_hostqueue.testing._redis_cluster.RedisCluster`) beside one
plain server, and ``--hosts`` local hosts at 10 ms, each a finite site of
``--cluster-pages`` pages, every link followed, with the (a) settings
(``CONCURRENT_REQUESTS`` 32, a limit of 4 per host) and
``HOSTQUEUE_REDIS_PARTITIONS`` = ``--partitions`` (0 by default: the
setting's own choice on each). One crawl with 1 process,
then with 2, on the plain server and on the cluster, each crawled to its end:

* pages per second counted by the hosts while every process runs, on the
  cluster against the plain server;
* each master's share of the crawl's memory: ``MEMORY USAGE`` of every key the
  master holds once the crawl ended (the cluster is flushed before each crawl,
  so every key is the crawl's), summed per master. Target: each master 20 to
  50 % of the whole;
* every page fetched: the distinct pages the hosts served against the pages
  of the sites, and the pages served more than once;
* the most requests a host had in flight, counted by the host, against the
  limit of 4.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.redis_scale import SCALE_LATENCY, SCALE_SETTINGS, ScaleRun, scale_crawl
from bench.standalone import median
from scrapy_hostqueue.testing import LocalHosts
from scrapy_hostqueue.testing._redis_cluster import RedisCluster
from scrapy_hostqueue.testing._redis_server import RedisServer

MASTERS = 3
#: Each master's share of one crawl's memory (target).
SHARE_LOW, SHARE_HIGH = 0.20, 0.50
LIMIT = int(SCALE_SETTINGS["CONCURRENT_REQUESTS_PER_DOMAIN"])
#: The crawls of a round: (where, processes).
VARIANTS = (("server", 1), ("cluster", 1), ("server", 2), ("cluster", 2))
#: Seconds a crawl may take to reach its end (a backstop: it ends when done).
CRAWL_LIMIT = 300.0


@dataclass
class ClusterRun:
    """One (k) crawl: *processes* processes on the plain server or on the cluster."""

    where: str
    processes: int
    round: int
    crawl: ScaleRun
    #: Pages of the sites, distinct pages the hosts served, and all they served.
    site_pages: int = 0
    distinct: int = 0
    served: int = 0
    #: ``MEMORY USAGE`` of the keys each master holds once the crawl ended.
    node_bytes: list[int] = field(default_factory=list)

    @property
    def shares(self) -> list[float]:
        """Each master's share of the crawl's memory."""
        total = sum(self.node_bytes)
        return [size / total for size in self.node_bytes] if total else []

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shares": self.shares}


def key_bytes(node: RedisServer) -> int:
    """Sum ``MEMORY USAGE`` of every key *node* holds (``SAMPLES 0``: every element counted)."""
    import redis

    client = redis.Redis.from_url(node.url)
    try:
        return sum(client.memory_usage(key, samples=0) or 0 for key in client.scan_iter(count=1000))
    finally:
        client.close()


def cluster_crawl(
    hosts: LocalHosts,
    redis: RedisServer | RedisCluster,
    where: str,
    processes: int,
    *,
    round_: int,
    partitions: int,
    site_pages: int,
) -> ClusterRun:
    """Run one (k) crawl to its end and count what the hosts and the masters saw."""
    settings = {**SCALE_SETTINGS, "HOSTQUEUE_REDIS_PARTITIONS": partitions}
    crawl = scale_crawl(
        hosts, redis, where, processes, round_=round_, seconds=CRAWL_LIMIT, settings=settings
    )
    run = ClusterRun(where, processes, round_, crawl, site_pages=site_pages)
    stats = hosts.all_stats(arrivals=False)
    run.distinct = sum(len(host.pages) for host in stats)
    run.served = sum(host.served for host in stats)
    nodes = redis.nodes if isinstance(redis, RedisCluster) else [redis]
    run.node_bytes = [key_bytes(node) for node in nodes]
    return run


def measure(
    server: RedisServer, *, hosts: int, pages: int, partitions: int, rounds: int
) -> list[ClusterRun]:
    """Start the cluster and the hosts, and run every (k) crawl, printing each."""
    runs: list[ClusterRun] = []
    spec = f"{hosts}x latency={SCALE_LATENCY * 1000:g}ms,pages={pages}"
    with (
        RedisCluster(MASTERS) as cluster,
        LocalHosts(spec, process=True, start_timeout=60.0) as local,
    ):
        places: dict[str, RedisServer | RedisCluster] = {"server": server, "cluster": cluster}
        for round_ in range(rounds):
            for where, processes in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
                run = cluster_crawl(
                    local,
                    places[where],
                    where,
                    processes,
                    round_=round_,
                    partitions=partitions,
                    site_pages=hosts * pages,
                )
                runs.append(run)
                print(describe(run), flush=True)
    return runs


def describe(run: ClusterRun) -> str:
    head = f"  (k) {run.where:<7} x{run.processes}  #{run.round + 1}  "
    crawl = run.crawl
    if crawl.error:
        return head + f"FAILED: {crawl.error}"
    rate = "-" if crawl.pages_per_second is None else f"{crawl.pages_per_second:.0f}"
    line = (
        f"{rate:>6} pages/s  {run.distinct} of {run.site_pages} pages "
        f"({run.served - run.distinct} twice)  max in flight {crawl.max_in_flight}  "
        f"Redis {crawl.commands_per_page or 0:.1f} commands/page  "
        f"memory {sum(run.node_bytes) / 1000:.0f} kB"
    )
    if len(run.shares) > 1:
        line += " (" + " / ".join(f"{100 * share:.0f} %" for share in run.shares) + ")"
    return head + line


def summarise(runs: Sequence[ClusterRun]) -> dict[str, Any]:
    """Medians per crawl, the cluster's ratios to the plain server, and the targets' verdicts."""
    summary: dict[str, Any] = {}
    for where, processes in VARIANTS:
        mine = [run for run in runs if (run.where, run.processes) == (where, processes)]
        if not mine:
            continue
        summary[f"{where}x{processes}"] = {
            "pages_per_second": median([run.crawl.pages_per_second for run in mine]),
            "shares": [run.shares for run in mine],
            "bytes": median([float(sum(run.node_bytes)) for run in mine]),
        }
    for processes in (1, 2):
        cluster = summary.get(f"clusterx{processes}", {}).get("pages_per_second")
        server = summary.get(f"serverx{processes}", {}).get("pages_per_second")
        if f"clusterx{processes}" in summary:
            summary[f"clusterx{processes}"]["ratio"] = (
                cluster / server if cluster is not None and server else None
            )
    cluster_shares = [share for run in runs if run.where == "cluster" for share in run.shares]
    summary["shares_ok"] = bool(cluster_shares) and all(
        SHARE_LOW <= share <= SHARE_HIGH for share in cluster_shares
    )
    summary["every_page"] = bool(runs) and all(
        not run.crawl.error and run.distinct == run.site_pages for run in runs
    )
    summary["twice"] = sum(run.served - run.distinct for run in runs)
    summary["max_in_flight"] = max((run.crawl.max_in_flight for run in runs), default=0)
    return summary


def _pass(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def report_lines(summary: dict[str, Any], runs: Sequence[ClusterRun]) -> list[str]:
    """Return the figures against the targets, as lines."""
    if not runs:
        return []
    rates = []
    for key in ("serverx1", "clusterx1", "serverx2", "clusterx2"):
        if key in summary:
            value = summary[key]["pages_per_second"]
            ratio = summary[key].get("ratio")
            rates.append(
                key.replace("x", " x")
                + f" {'-' if value is None else f'{value:.0f}'}"
                + (f" ({ratio:.2f}x the server)" if ratio is not None else "")
            )
    lines = [f"(k) one crawl on a Redis Cluster of {MASTERS} masters, pages/s: {', '.join(rates)}"]
    for processes in (1, 2):
        mine = [run for run in runs if (run.where, run.processes) == ("cluster", processes)]
        if mine:
            each = "; ".join(
                " / ".join(f"{100 * share:.0f} %" for share in run.shares) or "-" for run in mine
            )
            lines.append(
                f"    x{processes}: each master's share of the crawl's memory "
                f"(MEMORY USAGE of its keys at the end): {each}"
            )
    lines.append(
        f"    Target: each master {100 * SHARE_LOW:.0f}-{100 * SHARE_HIGH:.0f} % of the crawl's "
        f"memory: {_pass(summary['shares_ok'])}"
    )
    fetched = ", ".join(f"{run.distinct} of {run.site_pages}" for run in runs)
    lines.append(
        f"    Every page fetched: {fetched} ({summary['twice']} fetched twice): "
        f"{_pass(summary['every_page'])}"
    )
    lines.append(
        f"    Most in flight at a host, counted by the host: {summary['max_in_flight']} "
        f"(limit {LIMIT}): {_pass(summary['max_in_flight'] <= LIMIT)}"
    )
    return lines


__all__ = ["ClusterRun", "measure", "report_lines", "summarise"]
