"""HostQueueConfig: every bad value of a setting is refused at start.

Every bad value of a setting is refused at start with an error naming the setting and the value;
good spellings are read as meant.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import HostQueueSettingsError
from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue._scrapy_internals import configured_slot
from scrapy_hostqueue.stats import HostQueueStats
from tests.helpers.crawling import PageSpider

DURATIONS = [
    "HOSTQUEUE_IDLE_GRACE",
    "HOSTQUEUE_TURN_SECONDS",
    "HOSTQUEUE_AIMD_FAST_LATENCY",
    "HOSTQUEUE_AIMD_SLOW_LATENCY",
    "HOSTQUEUE_RETRY_AFTER_MAX",
    "HOSTQUEUE_BACKOFF_BASE",
    "HOSTQUEUE_BACKOFF_MAX",
    "HOSTQUEUE_CRAWL_DELAY_MAX",
    "HOSTQUEUE_ERROR_COOLDOWN",
    "HOSTQUEUE_DNS_CACHE_TTL",
    "HOSTQUEUE_CONNECT_TIMEOUT",
    "HOSTQUEUE_LOG_INTERVAL",
    "HOSTQUEUE_TIMELINE_INTERVAL",
]
INTEGERS = [
    "HOSTQUEUE_MAX_ACTIVE_HOSTS",
    "HOSTQUEUE_TURN_REQUESTS",
    "HOSTQUEUE_PREFETCH",
    "HOSTQUEUE_REMEMBER_HOSTS",
    "HOSTQUEUE_GC_YOUNG_THRESHOLD",
    "HOSTQUEUE_AIMD_CEILING",
    "HOSTQUEUE_ERROR_BUDGET",
    "HOSTQUEUE_ERROR_MAX_COOLDOWNS",
    "HOSTQUEUE_STATS_MAX_HOSTS",
]
BOOLEANS = [
    "HOSTQUEUE_GC_FREEZE",
    "HOSTQUEUE_AIMD_DEBUG",
    "HOSTQUEUE_CRAWL_DELAY_ENABLED",
    "HOSTQUEUE_STATS_ENABLED",
]


def config(**values: Any) -> HostQueueConfig:
    return HostQueueConfig.from_settings(Settings(values))


def refused(name: str, value: Any, **others: Any) -> str:
    with pytest.raises(HostQueueSettingsError) as info:
        config(**{name: value}, **others)
    message = str(info.value)
    assert name in message
    return message


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("value", [math.inf, "inf", -math.inf, math.nan, 10**400, "soon", True])
def test_a_duration_must_be_a_finite_number(name: str, value: Any) -> None:
    refused(name, value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # Blocks and cool-downs of more than a day would stall the crawl, and
        # a graceful stop, that long.
        ("HOSTQUEUE_RETRY_AFTER_MAX", 1e8),
        ("HOSTQUEUE_BACKOFF_MAX", 1e308),
        ("HOSTQUEUE_ERROR_COOLDOWN", 1e300),
        ("HOSTQUEUE_CRAWL_DELAY_MAX", 90_000),
        ("HOSTQUEUE_IDLE_GRACE", 1e12),
        ("HOSTQUEUE_CONNECT_TIMEOUT", 1e6),
        ("HOSTQUEUE_TURN_SECONDS", 1e6),
    ],
)
def test_waits_beyond_their_bound_are_refused(name: str, value: float) -> None:
    assert "<=" in refused(name, value)


def test_connect_timeout_defaults_to_10_s_and_0_turns_it_off() -> None:
    assert config().connect_timeout == 10.0
    assert config(HOSTQUEUE_CONNECT_TIMEOUT="2.5").connect_timeout == 2.5
    assert config(HOSTQUEUE_CONNECT_TIMEOUT=0).connect_timeout == 0.0
    assert ">= 0" in refused("HOSTQUEUE_CONNECT_TIMEOUT", -1)


def test_turn_seconds_defaults_to_10_s_and_0_turns_it_off() -> None:
    assert config().turn_seconds == 10.0
    assert config(HOSTQUEUE_TURN_SECONDS="2.5").turn_seconds == 2.5
    assert config(HOSTQUEUE_TURN_SECONDS=0).turn_seconds == 0.0
    assert ">= 0" in refused("HOSTQUEUE_TURN_SECONDS", -1)


@pytest.mark.parametrize("name", ["HOSTQUEUE_LOG_INTERVAL", "HOSTQUEUE_TIMELINE_INTERVAL"])
@pytest.mark.parametrize("value", [1e-9, 0.001, "0.005", -1])
def test_a_periodic_write_is_not_more_frequent_than_every_10_ms(name: str, value: Any) -> None:
    # Every millisecond, the log line or the timeline row would take a good
    # part of the crawl's CPU.
    refused(name, value)


def test_periodic_intervals_at_the_bounds() -> None:
    assert config(HOSTQUEUE_LOG_INTERVAL=0.01).log_interval == 0.01
    assert config(HOSTQUEUE_TIMELINE_INTERVAL="0.01").timeline_interval == 0.01
    # 0: no log line; no timeline rows makes no timeline, so 0 is refused there.
    assert config(HOSTQUEUE_LOG_INTERVAL=0).log_interval == 0
    assert "or 0 for none" in refused("HOSTQUEUE_LOG_INTERVAL", 0.001)
    refused("HOSTQUEUE_TIMELINE_INTERVAL", 0)


@pytest.mark.parametrize(
    ("logstats", "expected"),
    [(30, 30.0), (0.0001, 0.01), (0, 0.0), (-5, 0.0), (1e12, 86_400.0)],
)
def test_the_log_interval_follows_logstats_interval(logstats: float, expected: float) -> None:
    assert config(LOGSTATS_INTERVAL=logstats).log_interval == expected


@pytest.mark.parametrize(
    ("slots", "named"),
    [
        ({"example.com": 3}, "DOWNLOAD_SLOTS['example.com']"),
        ({"example.com": {"concurrency": None}}, "DOWNLOAD_SLOTS['example.com']['concurrency']"),
        ({"a.example": {"delay": "abc"}}, "DOWNLOAD_SLOTS['a.example']['delay']"),
        ({"a.example": {"delay": math.inf}}, "DOWNLOAD_SLOTS['a.example']['delay']"),
        ({"a.example": {"jitter": [0.5]}}, "DOWNLOAD_SLOTS['a.example']['jitter']"),
    ],
)
def test_a_download_slot_scrapy_cannot_read_is_refused_at_start(
    slots: dict[str, Any], named: str
) -> None:
    # Scrapy fails such a host's requests at its first one; the scheduler
    # failed the whole crawl there.
    with pytest.raises(HostQueueSettingsError) as info:
        config(DOWNLOAD_SLOTS=slots)
    assert named in str(info.value)


def test_download_slots_scrapy_reads_are_accepted() -> None:
    slots = {
        "a.example": {"concurrency": "2", "delay": "0.5", "randomize_delay": False},
        "b.example": {"concurrency": 2.7, "jitter": 0},
        "c.example": {},
    }
    assert config(DOWNLOAD_SLOTS=slots).default_concurrency == 8


@pytest.mark.parametrize(
    ("values", "jitter"),
    [
        ({}, 0.5),
        ({"DOWNLOAD_DELAY_JITTER": 0.2}, 0.2),
        # The deprecated setting, set above its default, still counts in Scrapy 2.19.
        ({"RANDOMIZE_DOWNLOAD_DELAY": False}, 0.0),
        ({"RANDOMIZE_DOWNLOAD_DELAY": True, "DOWNLOAD_DELAY_JITTER": 0.1}, 0.1),
    ],
)
def test_the_delay_jitter_is_read_as_scrapy_reads_it(values: dict[str, Any], jitter: float) -> None:
    assert configured_slot(Settings({"DOWNLOAD_DELAY": 1.0, **values}), "a.example") == (
        8,
        1.0,
        jitter,
    )


def test_a_backoff_base_beyond_a_day_is_refused_with_a_larger_max() -> None:
    refused("HOSTQUEUE_BACKOFF_BASE", 1e308, HOSTQUEUE_BACKOFF_MAX=1e308)


@pytest.mark.parametrize("name", INTEGERS)
@pytest.mark.parametrize("value", [math.inf, "1e400", 2.5, [], True])
def test_an_integer_setting_refuses_what_is_not_an_integer(name: str, value: Any) -> None:
    refused(name, value)


def test_the_gc_threshold_must_fit_python_s() -> None:
    refused("HOSTQUEUE_GC_YOUNG_THRESHOLD", 2**70)
    assert config(HOSTQUEUE_GC_YOUNG_THRESHOLD=2**31 - 1).gc_young_threshold == 2**31 - 1


@pytest.mark.parametrize("name", BOOLEANS)
@pytest.mark.parametrize("value", [0.5, 2, [], [1], "maybe", {}])
def test_a_boolean_setting_refuses_what_is_not_a_boolean(name: str, value: Any) -> None:
    refused(name, value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        ("true", True),
        ("False", False),
        ("0", False),
        (" yes ", True),
        ("off", False),
    ],
)
def test_boolean_spellings(value: Any, expected: bool) -> None:
    assert config(HOSTQUEUE_GC_FREEZE=value).gc_freeze is expected


@pytest.mark.parametrize(
    "value",
    [[429.7], {"429": 1}, [200, 429], [204], ["429x"], "soon", 429, [True], [99], [600]],
)
def test_backoff_codes_must_be_error_statuses(value: Any) -> None:
    refused("HOSTQUEUE_AIMD_BACKOFF_HTTP_CODES", value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [([429, 503], {429, 503}), ("429, 503", {429, 503}), (["403"], {403}), ([], set())],
)
def test_backoff_code_spellings(value: Any, expected: set[int]) -> None:
    assert config(HOSTQUEUE_AIMD_BACKOFF_HTTP_CODES=value).aimd_backoff_http_codes == expected


def test_a_floor_alone_raises_the_default_start() -> None:
    raised = config(HOSTQUEUE_AIMD_FLOOR=3, CONCURRENT_REQUESTS_PER_DOMAIN=8)
    assert (raised.aimd_floor, raised.aimd_start, raised.aimd_ceiling) == (3, 3, 8)
    default = config(CONCURRENT_REQUESTS_PER_DOMAIN=8)
    assert (default.aimd_floor, default.aimd_start) == (1, 2)
    # A start the user set below the floor is still refused.
    refused("HOSTQUEUE_AIMD_START", 2, HOSTQUEUE_AIMD_FLOOR=3, CONCURRENT_REQUESTS_PER_DOMAIN=8)


def test_a_timeline_file_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    crawler = get_crawler(PageSpider, {"HOSTQUEUE_TIMELINE_FILE": str(tmp_path)})
    with pytest.raises(HostQueueSettingsError, match="HOSTQUEUE_TIMELINE_FILE") as info:
        HostQueueStats.from_crawler(crawler)
    assert "directory" in str(info.value)


def test_a_timeline_file_may_be_a_pathlib_path(tmp_path: Path) -> None:
    """As Scrapy's own path settings (FEEDS, JOBDIR) take one."""
    path = tmp_path / "timeline.jsonl"
    assert config(HOSTQUEUE_TIMELINE_FILE=path).timeline_file == str(path)
    refused("HOSTQUEUE_TIMELINE_FILE", 3)


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({}, None),
        ({"JOBDIR": "job"}, "job/hostqueue.frontier.db"),
        ({"JOBDIR": "job", "HOSTQUEUE_FRONTIER": "memory"}, None),
        ({"JOBDIR": "job", "HOSTQUEUE_FRONTIER": "sqlite"}, "job/hostqueue.frontier.db"),
        ({"HOSTQUEUE_FRONTIER": "sqlite:///var/crawl/f.db"}, "/var/crawl/f.db"),
        ({"HOSTQUEUE_FRONTIER": "sqlite://rel/f.db", "JOBDIR": "job"}, "rel/f.db"),
    ],
)
def test_the_frontier_is_in_jobdir_unless_told_otherwise(
    values: dict[str, Any], path: str | None
) -> None:
    assert config(**values).frontier_path == path


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("sqlite", "JOBDIR, which is not set"),
        ("postgres://x", "must be 'memory', 'sqlite'"),
        ("sqlite://", "must be 'memory', 'sqlite'"),
        (3, "must be 'memory', 'sqlite'"),
    ],
)
def test_a_frontier_this_version_cannot_use_is_refused(value: Any, words: str) -> None:
    assert words in refused("HOSTQUEUE_FRONTIER", value)


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "rediss://example:6380"])
def test_a_redis_url_names_a_shared_frontier(url: str) -> None:
    got = config(HOSTQUEUE_FRONTIER=url, JOBDIR="job")
    assert (got.frontier_url, got.frontier_path) == (url, None)
    assert got.lease_timeout == 30.0
    assert config().frontier_url is None
    assert "HOSTQUEUE_CRAWL_ID" in refused("HOSTQUEUE_CRAWL_ID", "a{b}")
    assert "HOSTQUEUE_LEASE_TIMEOUT" in refused("HOSTQUEUE_LEASE_TIMEOUT", 0)
