"""``python -m bench.monitor_cost``: a crawl polled as a browser would."""

from __future__ import annotations

from collections.abc import Callable
from unittest.mock import patch

import pytest

from bench.monitor_cost import SETUPS, VARIANTS, crawl
from scrapy_hostqueue.testing import LocalHosts


def test_the_setups_are_s1_and_a_broad_crawl_of_1000_hosts() -> None:
    assert SETUPS["S1"][0] == "3x latency=10ms; latency=200ms"
    assert SETUPS["broad"][0].startswith("1000x ")
    assert VARIANTS == {"off": {"HOSTQUEUE_MONITOR": False}, "polled": {"HOSTQUEUE_MONITOR": True}}


@pytest.mark.crawl
@pytest.mark.parametrize(("variant", "polled"), [("polled", True), ("off", False)])
def test_a_polled_crawl_counts_the_monitor_requests(
    local_hosts: Callable[..., LocalHosts], variant: str, polled: bool
) -> None:
    hosts = local_hosts("2x latency=100ms")
    setup = ("2x latency=100ms", {"CONCURRENT_REQUESTS_PER_DOMAIN": 2}, 60, 100)
    with patch.dict(SETUPS, {"small": setup}):
        result = crawl(hosts, "small", variant, 0.2)
    assert result["finish_reason"] == "budget", result
    if polled:
        # /hosts.json, a host's detail and /metrics, several times.
        assert result["monitor_requests"] >= 3, result
    else:
        assert "monitor_requests" not in result
