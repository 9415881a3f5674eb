"""``/metrics``: the snapshot in Prometheus' text format.

With ``prometheus_client`` installed (the ``prometheus`` extra). Crawl-wide
series carry only labels from a fixed set of values (a host state, a status
class, a bound); per-host series exist only for the snapshot's top hosts, so
the number of series is bounded by ``HOSTQUEUE_MONITOR_HOSTS``. Read from the
same snapshot as the page: a scrape adds no work of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

#: Prefix of every series.
PREFIX = "scrapy_hostqueue"
#: The values of the ``bound`` label (see ``_snapshot.why_not_faster``).
BOUNDS = (
    "concurrent-requests",
    "active-hosts",
    "spider",
    "redis",
    "hosts",
    "idle",
    "none",
    "unknown",
)
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


def metrics_maker(snapshot: Callable[[], dict[str, Any]]) -> Callable[[], bytes] | None:
    """Return the function that renders ``/metrics`` from *snapshot*.

    None without ``prometheus_client``.
    """
    try:
        from prometheus_client import CollectorRegistry, generate_latest  # noqa: PLC0415
    except ImportError:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(snapshot))  # type: ignore[arg-type]

    def render() -> bytes:
        return bytes(generate_latest(registry))

    return render


class _Collector:
    """A custom collector: its families are made at each scrape."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (  # noqa: PLC0415
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        snap = self.snapshot()
        crawl = snap["crawl"]

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", documentation, value=value)

        yield CounterMetricFamily(
            f"{PREFIX}_responses", "Responses received.", value=crawl["responses"]
        )
        by_class = CounterMetricFamily(
            f"{PREFIX}_responses_by_status_class",
            "Responses received, by status class.",
            labels=["status_class"],
        )
        classes = dict.fromkeys(STATUS_CLASSES, 0)
        for code, count in crawl["statuses_total"].items():
            label = f"{code[:1]}xx"
            if label in classes:
                classes[label] += count
        for label, count in classes.items():
            by_class.add_metric([label], count)
        yield by_class
        yield gauge(
            "pages_per_second", "Responses per second, last 10 s.", crawl["pages_per_second"]
        )
        yield gauge("in_flight_requests", "Requests on the wire.", crawl["in_flight"])
        yield gauge("queued_requests", "Requests queued in the frontier.", crawl["queued"])
        yield gauge("active_hosts", "Hosts holding an active-host place.", crawl["active_hosts"])
        yield CounterMetricFamily(
            f"{PREFIX}_hosts_given_up", "Hosts given up.", value=crawl["given_up_hosts"]
        )
        states = GaugeMetricFamily(f"{PREFIX}_hosts", "Hosts, by state.", labels=["state"])
        for state, count in crawl["states"].items():
            states.add_metric([state], count)
        yield states
        bound = GaugeMetricFamily(
            f"{PREFIX}_bound",
            "What bounds the crawl's speed now (1) and not (0).",
            labels=["bound"],
        )
        for name in BOUNDS:
            bound.add_metric([name], 1 if crawl["why"]["bound"] == name else 0)
        yield bound
        yield from _per_host(snap["hosts"], GaugeMetricFamily, CounterMetricFamily)


def _per_host(hosts: list[dict[str, Any]], gauge: Any, counter: Any) -> Iterator[Any]:
    """Series of the top hosts only."""
    families = {
        "in_flight": gauge(
            f"{PREFIX}_host_in_flight_requests",
            "Requests of the host on the wire.",
            labels=["host"],
        ),
        "limit": gauge(f"{PREFIX}_host_limit", "The host's concurrency limit.", labels=["host"]),
        "queued": gauge(
            f"{PREFIX}_host_queued_requests", "Requests queued for the host.", labels=["host"]
        ),
        "block_left": gauge(
            f"{PREFIX}_host_block_remaining_seconds",
            "Seconds left of the host's block (0: not blocked).",
            labels=["host"],
        ),
        "responses": counter(
            f"{PREFIX}_host_responses", "Responses received from the host.", labels=["host"]
        ),
    }
    latency = gauge(
        f"{PREFIX}_host_latency_seconds",
        "Quantiles of the host's download latency.",
        labels=["host", "quantile"],
    )
    for host in hosts:
        for field, family in families.items():
            family.add_metric([host["host"]], host[field])
        for quantile, field in (("0.5", "latency_p50"), ("0.95", "latency_p95")):
            if host[field] is not None:
                latency.add_metric([host["host"], quantile], host[field])
    yield from families.values()
    yield latency
