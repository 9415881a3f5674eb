"""Per-host stats in Scrapy's stats collector.

Every key is built by :func:`stat_key` / :func:`host_stat_key`. The scheduler,
the AIMD middleware and the download handler report events to one
:class:`HostStatsRecorder` per crawler (:func:`get_recorder`).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from scrapy_hostqueue._config import HostQueueConfig

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

PREFIX = "hostqueue"
#: Hosts beyond HOSTQUEUE_STATS_MAX_HOSTS add up under this host key.
OTHER_HOSTS = "_other"


def stat_key(name: str) -> str:
    """A global key: ``hostqueue/{name}``."""
    return f"{PREFIX}/{name}"


def host_stat_key(host: str, name: str) -> str:
    """A per-host key: ``hostqueue/hosts/{host}/{name}``."""
    return f"{PREFIX}/hosts/{host or '_nohost'}/{name}"


class HostStatsRecorder:
    """Turns per-host events into stats, with bounded cardinality."""

    def __init__(self, stats: StatsCollector, config: HostQueueConfig) -> None:
        self.stats = stats
        self.enabled = config.stats_enabled
        self.max_hosts = config.stats_max_hosts
        self._named: set[str] = set()
        self._seen = 0

    def _host(self, host: str) -> str:
        if host in self._named:
            return host
        if len(self._named) < self.max_hosts:
            self._named.add(host)
            return host
        return OTHER_HOSTS

    def _inc(self, host: str, name: str, count: int = 1) -> None:
        if self.enabled:
            self.stats.inc_value(host_stat_key(self._host(host), name), count)

    def _max(self, host: str, name: str, value: float) -> None:
        if self.enabled:
            self.stats.max_value(host_stat_key(self._host(host), name), value)

    def _min(self, host: str, name: str, value: float) -> None:
        if self.enabled:
            self.stats.min_value(host_stat_key(self._host(host), name), value)

    # -- scheduler events --------------------------------------------------

    def host_seen(self, host: str) -> None:
        if self.enabled:
            self.stats.inc_value(stat_key("hosts_seen_count"))

    def request_started(self, host: str, inflight: int, active_hosts: int) -> None:
        self._inc(host, "request_count")
        self._max(host, "max_inflight", inflight)
        if self.enabled:
            self.stats.max_value(stat_key("max_active_hosts"), active_hosts)

    def response(self, host: str, status: int, latency: float | None) -> None:
        self._inc(host, "response_count")
        self._inc(host, f"status_count/{status}")

    def exception(self, host: str, name: str) -> None:
        self._inc(host, "exception_count")
        self._inc(host, f"exception_type_count/{name}")

    # -- policy events -----------------------------------------------------

    def limit_changed(self, host: str, limit: int) -> None:
        if self.enabled:
            name = self._host(host)
            self.stats.set_value(host_stat_key(name, "limit"), limit)
        self._max(host, "max_limit", limit)
        self._min(host, "min_limit", limit)

    def backoff(self, host: str, reason: str) -> None:
        self._inc(host, f"backoff_count/{reason}")

    def blocked(self, host: str, seconds: float, reason: str) -> None:
        self._inc(host, f"block_count/{reason}")
        if self.enabled:
            key = host_stat_key(self._host(host), "blocked_seconds")
            self.stats.set_value(key, (self.stats.get_value(key) or 0.0) + seconds)

    def host_parked(self, host: str) -> None:
        if self.enabled:
            self.stats.inc_value(stat_key("hosts_parked_count"))

    def host_given_up(self, host: str, dropped: int) -> None:
        if self.enabled:
            self.stats.inc_value(stat_key("hosts_given_up_count"))
            self.stats.inc_value(stat_key("dropped_request_count"), dropped)
        self._inc(host, "dropped_request_count", dropped)


_recorders: weakref.WeakKeyDictionary[Crawler, HostStatsRecorder] = weakref.WeakKeyDictionary()


def get_recorder(crawler: Crawler) -> HostStatsRecorder:
    """The crawler's one recorder, shared by every component."""
    recorder = _recorders.get(crawler)
    if recorder is None:
        assert crawler.stats is not None
        recorder = HostStatsRecorder(crawler.stats, HostQueueConfig.from_settings(crawler.settings))
        _recorders[crawler] = recorder
    return recorder
