"""Every ``HOSTQUEUE_*`` setting is read and validated here, once.

Components build a :class:`HostQueueConfig` with :meth:`HostQueueConfig.from_settings`
and never read ``HOSTQUEUE_*`` settings themselves, so defaults, validation and
error messages live in one place.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.settings import SETTINGS_PRIORITIES

from scrapy_hostqueue._errors import HostQueueSettingsError
from scrapy_hostqueue.frontier import FRONTIER_FILE, is_shared

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings


#: Scrapy's queue classes, which this scheduler does not use.
UNUSED_QUEUE_SETTINGS = (
    "SCHEDULER_PRIORITY_QUEUE",
    "SCHEDULER_MEMORY_QUEUE",
    "SCHEDULER_DISK_QUEUE",
    "SCHEDULER_START_MEMORY_QUEUE",
    "SCHEDULER_START_DISK_QUEUE",
)


def warn_unused_queue_settings(settings: BaseSettings, logger: logging.Logger) -> None:
    """Return the line naming the queue settings the scheduler ignores, if any.

    One line naming the queue settings the project set, since this
    scheduler keeps its own queues and would silently ignore them: INFO when
    each is a FIFO queue class (the breadth-first recipe of Scrapy's docs,
    which these queues already follow), else a WARNING. On *logger*: the
    scheduler's, which the line is about.
    """
    default = SETTINGS_PRIORITIES["default"]
    named = [name for name in UNUSED_QUEUE_SETTINGS if (settings.getpriority(name) or 0) > default]
    if not named:
        return
    fifo = all("Fifo" in getattr(settings[name], "__name__", str(settings[name])) for name in named)
    logger.log(
        logging.INFO if fifo else logging.WARNING,
        "%s: not used by HostQueueScheduler, which keeps a queue per host, "
        "FIFO among requests of the same priority (set DEPTH_PRIORITY to "
        "crawl breadth-first, > 0, or depth-first, < 0)",
        ", ".join(named),
    )


_MISSING = object()
#: Python's default is 700 (2,000 from 3.13). In crawls of 1,200 pages on 2
#: cores, 7,000 cut the time spent in garbage collection by 55-70 %; 20,000
#: gained little more.
GC_YOUNG_THRESHOLD = 7_000
#: Seconds opening a connection may take with the add-on's handler. A TCP
#: connection that is not open after 10 s had no answer to its SYN nor to the
#: three sent again after 1, 3 and 7 s: the address drops them, and waiting
#: out Scrapy's DOWNLOAD_TIMEOUT (180 s) would hold the host's place and a
#: download slot all that time.
CONNECT_TIMEOUT = 10.0
#: The longest a setting may make a host wait (a block, a cool-down, a delay):
#: a day. Longer would stall a crawl that still has work for the host, and a
#: graceful stop waits for requests already handed out.
_MAX_WAIT = 86_400.0
#: The most partitions a shared crawl may have (see ``frontier/redis/_db``).
MAX_REDIS_PARTITIONS = 1024
#: ``gc.set_threshold`` takes a C int.
_MAX_GC_THRESHOLD = 2**31 - 1
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _raw(settings: BaseSettings, name: str) -> Any:
    value = settings.get(name, _MISSING)
    return None if value is _MISSING else value


def _number(
    settings: BaseSettings,
    name: str,
    default: float,
    *,
    minimum: float = 0.0,
    strict: bool = False,
    maximum: float | None = None,
) -> float:
    """Read a finite number of seconds (or of anything else) in range."""
    value = _raw(settings, name)
    if value is None:
        return default
    if isinstance(value, bool):
        raise HostQueueSettingsError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise HostQueueSettingsError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(number) or (strict and number <= minimum) or number < minimum:
        relation = ">" if strict else ">="
        raise HostQueueSettingsError(f"{name} must be {relation} {minimum:g}, got {value!r}")
    if math.isinf(number):
        raise HostQueueSettingsError(f"{name} must be a finite number, got {value!r}")
    if maximum is not None and number > maximum:
        raise HostQueueSettingsError(f"{name} must be <= {maximum:g}, got {value!r}")
    return number


#: Shortest period of the host log line and of the timeline rows, in seconds:
#: shorter, writing them would take a good part of the crawl's CPU.
_MIN_INTERVAL = 0.01


def _interval(settings: BaseSettings, name: str, default: float, *, off: bool = False) -> float:
    """Read the seconds between two periodic writes.

    Seconds between two periodic writes, at least :data:`_MIN_INTERVAL`
    (or ``0``, for "never", when *off* allows it).
    """
    number = _number(settings, name, default, maximum=_MAX_WAIT)
    if number == 0 and off:
        return 0.0
    if number < _MIN_INTERVAL:
        also = " (or 0 for none)" if off else ""
        raise HostQueueSettingsError(
            f"{name} must be >= {_MIN_INTERVAL:g} seconds{also}, got {_raw(settings, name)!r}"
        )
    return number


def _logstats_interval(settings: BaseSettings) -> float:
    """Return the default of HOSTQUEUE_LOG_INTERVAL.

    Scrapy's LOGSTATS_INTERVAL, held to :data:`_MIN_INTERVAL` (0, or anything Scrapy would not run,
    means none).
    """
    try:
        value = settings.getfloat("LOGSTATS_INTERVAL", 60.0)
    except (TypeError, ValueError):
        return 60.0
    if not math.isfinite(value) or value <= 0:
        return 0.0
    return min(max(value, _MIN_INTERVAL), _MAX_WAIT)


#: The numbers a ``DOWNLOAD_SLOTS`` entry may hold, and how Scrapy reads them.
_SLOT_NUMBERS = (("concurrency", int), ("delay", float), ("jitter", float))


def _check_download_slots(settings: BaseSettings) -> None:
    """Refuse the ``DOWNLOAD_SLOTS`` entries that would fail their host's requests.

    Refuse, at start, the ``DOWNLOAD_SLOTS`` entries that would fail the
    requests of their host when the first one is queued.
    """
    try:
        slots = settings.getdict("DOWNLOAD_SLOTS")
    except (TypeError, ValueError):
        raise HostQueueSettingsError(
            "DOWNLOAD_SLOTS must be a dict of slot settings by host, got "
            f"{settings.get('DOWNLOAD_SLOTS')!r}"
        ) from None
    for key, entry in slots.items():
        name = f"DOWNLOAD_SLOTS[{key!r}]"
        if not isinstance(entry, Mapping):
            raise HostQueueSettingsError(
                f"{name} must be a dict such as {{'concurrency': 2, 'delay': 1.0}}, got {entry!r}"
            )
        for field, convert in _SLOT_NUMBERS:
            if field not in entry:
                continue
            value = entry[field]
            try:
                number = convert(value)
            except (TypeError, ValueError, OverflowError):
                raise HostQueueSettingsError(
                    f"{name}[{field!r}] must be a number, got {value!r}"
                ) from None
            if not math.isfinite(number):
                raise HostQueueSettingsError(
                    f"{name}[{field!r}] must be a finite number, got {value!r}"
                )


def _integer(
    settings: BaseSettings,
    name: str,
    default: int,
    *,
    minimum: int = 0,
    maximum: int | None = None,
) -> int:
    value = _raw(settings, name)
    if value is None:
        return default
    if isinstance(value, bool):
        raise HostQueueSettingsError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise HostQueueSettingsError(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, float) and value != number:
        raise HostQueueSettingsError(f"{name} must be an integer, got {value!r}")
    if number < minimum:
        raise HostQueueSettingsError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and number > maximum:
        raise HostQueueSettingsError(f"{name} must be <= {maximum}, got {value!r}")
    return number


def _boolean(settings: BaseSettings, name: str, default: bool) -> bool:
    """Read a boolean setting, refusing what is not a spelling of one.

    ``True``/``False``, ``1``/``0``, or one of their usual spellings in a
    string (as from the command line); anything else is refused rather than
    read as ``bool(int(value))``.
    """
    value = _raw(settings, name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise HostQueueSettingsError(f"{name} must be a boolean, got {value!r}")


def _status_codes(settings: BaseSettings, name: str, default: tuple[int, ...]) -> frozenset[int]:
    value = _raw(settings, name)
    if value is None:
        return frozenset(default)
    if isinstance(value, str):
        value = [part for part in value.replace(",", " ").split() if part]
    if isinstance(value, dict) or not isinstance(value, (list, tuple, set, frozenset)):
        raise HostQueueSettingsError(f"{name} must be a list of HTTP status codes, got {value!r}")
    codes: set[int] = set()
    for item in value:
        code = int(item) if isinstance(item, str) and item.strip().isdigit() else item
        if isinstance(code, bool) or not isinstance(code, int):
            raise HostQueueSettingsError(
                f"{name} must be a list of HTTP status codes, got {value!r}"
            )
        codes.add(code)
    bad = sorted(code for code in codes if not 100 <= code <= 599)
    if bad:
        raise HostQueueSettingsError(f"{name} holds values that are not HTTP status codes: {bad!r}")
    successes = sorted(code for code in codes if code < 300)
    if successes:
        raise HostQueueSettingsError(
            f"{name} holds statuses that are not errors, so every such answer would "
            f"slow the host down: {successes!r}"
        )
    return frozenset(codes)


_FRONTIER_FORMS = "'memory', 'sqlite', 'sqlite:///path' or 'redis://host:port/db'"


def _frontier_path(settings: BaseSettings) -> str | None:
    """Where the frontier lives: None for memory, else the SQLite file."""
    value = _raw(settings, "HOSTQUEUE_FRONTIER")
    jobdir = settings.get("JOBDIR") or None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if value is None or value == "":
        return os.path.join(jobdir, FRONTIER_FILE) if jobdir else None
    if not isinstance(value, str):
        raise HostQueueSettingsError(f"HOSTQUEUE_FRONTIER must be {_FRONTIER_FORMS}, got {value!r}")
    if value == "memory":
        return None
    if value == "sqlite":
        if not jobdir:
            raise HostQueueSettingsError(
                "HOSTQUEUE_FRONTIER = 'sqlite' keeps the frontier in JOBDIR, which is not "
                "set: set JOBDIR, or name a file with 'sqlite:///path/to/frontier.db'"
            )
        return os.path.join(jobdir, FRONTIER_FILE)
    if is_shared(value):
        return None
    if value.startswith("sqlite://") and len(value) > len("sqlite://"):
        return value[len("sqlite://") :]
    raise HostQueueSettingsError(f"HOSTQUEUE_FRONTIER must be {_FRONTIER_FORMS}, got {value!r}")


def _frontier_url(settings: BaseSettings) -> str | None:
    """Return the Redis URL of a shared frontier, or None."""
    value = _raw(settings, "HOSTQUEUE_FRONTIER")
    if isinstance(value, str) and is_shared(value):
        return value
    return None


def _crawl_id(settings: BaseSettings) -> str | None:
    value = _raw(settings, "HOSTQUEUE_CRAWL_ID")
    if value is None or value == "":
        return None
    if not isinstance(value, str) or any(c in value for c in "{}\n"):
        raise HostQueueSettingsError(
            f"HOSTQUEUE_CRAWL_ID must be a name without braces or line breaks, got {value!r}"
        )
    return value


def _spill_dir(settings: BaseSettings) -> str:
    """HOSTQUEUE_REDIS_SPILL_DIR: a directory, "" for JOBDIR or else the temporary directory."""
    value = _raw(settings, "HOSTQUEUE_REDIS_SPILL_DIR")
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if value is None or value == "":
        return str(settings.get("JOBDIR") or "")
    if not isinstance(value, str):
        raise HostQueueSettingsError(
            f"HOSTQUEUE_REDIS_SPILL_DIR must be a directory, got {value!r}"
        )
    return value


def _bind_address(settings: BaseSettings) -> str:
    """HOSTQUEUE_MONITOR_BIND: an IP address to listen on (loopback by default)."""
    value = _raw(settings, "HOSTQUEUE_MONITOR_BIND")
    if value is None or value == "":
        return "127.0.0.1"
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise HostQueueSettingsError(
            f"HOSTQUEUE_MONITOR_BIND must be an IP address such as '127.0.0.1', got {value!r}"
        ) from None


@dataclass(frozen=True)
class HostQueueConfig:
    """The effective configuration of every component, validated."""

    # Scheduler
    max_active_hosts: int  # 0 = no cap
    turn_requests: int  # requests a host is handed in one turn at an active-host place
    turn_seconds: float  # how long a turn lasts at most, 0 = no bound
    idle_grace: float  # seconds a host with nothing left to do keeps its place
    prefetch: int  # requests per host handed out beyond the limit (own handler only)
    remember_hosts: int
    frontier_path: str | None  # None: the in-memory or Redis store; else the SQLite file
    # The Redis URL of a shared frontier, else None; out of the repr, since it
    # may carry a password.
    frontier_url: str | None = dataclasses.field(repr=False)
    crawl_id: str | None  # None: the spider's name
    lease_timeout: float  # seconds a dead process's hosts stay held, its requests leased
    redis_finish_grace: float  # seconds the shared crawl must be empty before closing
    redis_wait_for_urls: bool  # never close when the shared crawl is empty
    redis_share_hosts: bool  # lend a part of a busy host to a process with no host
    redis_backlog: int  # requests kept back in memory while Redis is full; past it, a file
    redis_spill_dir: str  # where those files go; "": JOBDIR, else the temporary directory
    redis_bloom: float  # the error rate of the crawl's Bloom filter; 0: exact fingerprints
    redis_partitions: int  # partitions of a new shared crawl; 0: 1 on a server, 4 per master
    default_concurrency: int  # per-host limit without the AIMD middleware
    global_concurrency: int  # CONCURRENT_REQUESTS, 0 = no limit
    max_overdue: int  # overdue requests kept out of CONCURRENT_REQUESTS, 0 = none
    # GC tuning extension
    gc_freeze: bool  # keep the heap alive at start out of full collections
    gc_young_threshold: int  # 0 = Python's own
    # AIMD middleware
    aimd_start: int
    aimd_floor: int
    aimd_ceiling: int
    aimd_fast_latency: float
    aimd_slow_latency: float
    aimd_backoff_http_codes: frozenset[int]
    aimd_debug: bool
    retry_after_max: float
    backoff_base: float
    backoff_max: float
    crawl_delay_enabled: bool
    crawl_delay_max: float
    error_budget: int
    error_cooldown: float
    error_max_cooldowns: int
    # Download handler
    dns_cache_ttl: float
    keepalive_timeout: float  # seconds an idle kept-alive connection stays open
    connect_timeout: float  # 0 = bounded by the download's timeout only
    # Stats and diagnostics
    stats_enabled: bool
    stats_max_hosts: int
    log_interval: float  # 0 = no periodic log line
    timeline_file: str | None
    timeline_interval: float
    # The live monitor
    monitor: bool
    monitor_bind: str
    monitor_port: int  # 0 = a free port
    monitor_hosts: int  # hosts the snapshot shows one by one; the rest add up
    monitor_interval: float  # seconds a snapshot is served before the next
    monitor_controls: bool  # the page may block, limit, give up hosts and pause the crawl

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> HostQueueConfig:
        global_concurrency = settings.getint("CONCURRENT_REQUESTS")
        per_domain = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
        if per_domain < 1:
            raise HostQueueSettingsError(
                f"CONCURRENT_REQUESTS_PER_DOMAIN must be >= 1, got {per_domain!r}"
            )
        _check_download_slots(settings)
        floor = _integer(settings, "HOSTQUEUE_AIMD_FLOOR", 1, minimum=1)
        ceiling = _integer(settings, "HOSTQUEUE_AIMD_CEILING", per_domain, minimum=1)
        start = _integer(settings, "HOSTQUEUE_AIMD_START", min(max(2, floor), ceiling), minimum=1)
        if not floor <= start <= ceiling:
            raise HostQueueSettingsError(
                "HOSTQUEUE_AIMD_FLOOR <= HOSTQUEUE_AIMD_START <= HOSTQUEUE_AIMD_CEILING "
                f"must hold, got {floor} <= {start} <= {ceiling}"
            )
        fast = _number(settings, "HOSTQUEUE_AIMD_FAST_LATENCY", 0.5, strict=True, maximum=_MAX_WAIT)
        slow = _number(settings, "HOSTQUEUE_AIMD_SLOW_LATENCY", 5.0, strict=True, maximum=_MAX_WAIT)
        if fast > slow:
            raise HostQueueSettingsError(
                "HOSTQUEUE_AIMD_FAST_LATENCY must not exceed HOSTQUEUE_AIMD_SLOW_LATENCY, "
                f"got {fast:g} > {slow:g}"
            )
        backoff_base = _number(
            settings, "HOSTQUEUE_BACKOFF_BASE", 1.0, strict=True, maximum=_MAX_WAIT
        )
        backoff_max = _number(
            settings, "HOSTQUEUE_BACKOFF_MAX", 60.0, strict=True, maximum=_MAX_WAIT
        )
        if backoff_base > backoff_max:
            raise HostQueueSettingsError(
                "HOSTQUEUE_BACKOFF_BASE must not exceed HOSTQUEUE_BACKOFF_MAX, "
                f"got {backoff_base:g} > {backoff_max:g}"
            )
        max_active = _integer(settings, "HOSTQUEUE_MAX_ACTIVE_HOSTS", global_concurrency, minimum=0)
        # An idle host keeps its place, and the hosts waiting for one wait,
        # that long: meant for the links of a last response, not minutes.
        idle_grace = _number(settings, "HOSTQUEUE_IDLE_GRACE", 0.1, maximum=60.0)
        timeline = _raw(settings, "HOSTQUEUE_TIMELINE_FILE")
        if isinstance(timeline, os.PathLike):
            # A pathlib.Path, as Scrapy's own path settings take.
            timeline = os.fspath(timeline)
        if timeline is not None and not isinstance(timeline, str):
            raise HostQueueSettingsError(
                f"HOSTQUEUE_TIMELINE_FILE must be a file path, got {timeline!r}"
            )
        return cls(
            max_active_hosts=max_active,
            turn_requests=_integer(settings, "HOSTQUEUE_TURN_REQUESTS", 100, minimum=1),
            turn_seconds=_number(settings, "HOSTQUEUE_TURN_SECONDS", 10.0, maximum=_MAX_WAIT),
            idle_grace=idle_grace,
            prefetch=_integer(settings, "HOSTQUEUE_PREFETCH", 1, minimum=0),
            remember_hosts=_integer(settings, "HOSTQUEUE_REMEMBER_HOSTS", 10_000),
            frontier_path=_frontier_path(settings),
            frontier_url=_frontier_url(settings),
            crawl_id=_crawl_id(settings),
            lease_timeout=_number(
                settings, "HOSTQUEUE_LEASE_TIMEOUT", 30.0, minimum=1.0, maximum=_MAX_WAIT
            ),
            redis_finish_grace=_number(
                settings, "HOSTQUEUE_REDIS_FINISH_GRACE", 3.0, maximum=_MAX_WAIT
            ),
            redis_wait_for_urls=_boolean(settings, "HOSTQUEUE_REDIS_WAIT_FOR_URLS", False),
            redis_share_hosts=_boolean(settings, "HOSTQUEUE_REDIS_SHARE_HOSTS", True),
            redis_backlog=_integer(settings, "HOSTQUEUE_REDIS_BACKLOG", 10_000, minimum=1),
            redis_spill_dir=_spill_dir(settings),
            redis_bloom=_number(settings, "HOSTQUEUE_REDIS_BLOOM_ERROR_RATE", 0.0, maximum=0.5),
            redis_partitions=_integer(
                settings, "HOSTQUEUE_REDIS_PARTITIONS", 0, maximum=MAX_REDIS_PARTITIONS
            ),
            default_concurrency=per_domain,
            global_concurrency=global_concurrency,
            max_overdue=_integer(
                settings, "HOSTQUEUE_MAX_OVERDUE", 2 * max(global_concurrency, 0), minimum=0
            ),
            gc_freeze=_boolean(settings, "HOSTQUEUE_GC_FREEZE", True),
            gc_young_threshold=_integer(
                settings,
                "HOSTQUEUE_GC_YOUNG_THRESHOLD",
                GC_YOUNG_THRESHOLD,
                minimum=0,
                maximum=_MAX_GC_THRESHOLD,
            ),
            aimd_start=start,
            aimd_floor=floor,
            aimd_ceiling=ceiling,
            aimd_fast_latency=fast,
            aimd_slow_latency=slow,
            aimd_backoff_http_codes=_status_codes(
                settings, "HOSTQUEUE_AIMD_BACKOFF_HTTP_CODES", (429, 503)
            ),
            aimd_debug=_boolean(settings, "HOSTQUEUE_AIMD_DEBUG", False),
            retry_after_max=_number(
                settings, "HOSTQUEUE_RETRY_AFTER_MAX", 300.0, strict=True, maximum=_MAX_WAIT
            ),
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            crawl_delay_enabled=_boolean(settings, "HOSTQUEUE_CRAWL_DELAY_ENABLED", True),
            crawl_delay_max=_number(settings, "HOSTQUEUE_CRAWL_DELAY_MAX", 30.0, maximum=_MAX_WAIT),
            error_budget=_integer(settings, "HOSTQUEUE_ERROR_BUDGET", 5, minimum=1),
            error_cooldown=_number(
                settings, "HOSTQUEUE_ERROR_COOLDOWN", 10.0, strict=True, maximum=_MAX_WAIT
            ),
            error_max_cooldowns=_integer(settings, "HOSTQUEUE_ERROR_MAX_COOLDOWNS", 3, minimum=0),
            dns_cache_ttl=_number(settings, "HOSTQUEUE_DNS_CACHE_TTL", 300.0),
            keepalive_timeout=_number(
                settings, "HOSTQUEUE_KEEPALIVE_TIMEOUT", 120.0, strict=True, maximum=3600.0
            ),
            connect_timeout=_number(
                settings, "HOSTQUEUE_CONNECT_TIMEOUT", CONNECT_TIMEOUT, maximum=_MAX_WAIT
            ),
            stats_enabled=_boolean(settings, "HOSTQUEUE_STATS_ENABLED", True),
            stats_max_hosts=_integer(settings, "HOSTQUEUE_STATS_MAX_HOSTS", 100),
            log_interval=_interval(
                settings, "HOSTQUEUE_LOG_INTERVAL", _logstats_interval(settings), off=True
            ),
            timeline_file=timeline or None,
            timeline_interval=_interval(settings, "HOSTQUEUE_TIMELINE_INTERVAL", 1.0),
            monitor=_boolean(settings, "HOSTQUEUE_MONITOR", True),
            monitor_bind=_bind_address(settings),
            monitor_port=_integer(settings, "HOSTQUEUE_MONITOR_PORT", 0, maximum=65_535),
            monitor_hosts=_integer(settings, "HOSTQUEUE_MONITOR_HOSTS", 50, minimum=1),
            monitor_interval=_interval(settings, "HOSTQUEUE_MONITOR_INTERVAL", 1.0),
            monitor_controls=_boolean(settings, "HOSTQUEUE_MONITOR_CONTROLS", False),
        )
