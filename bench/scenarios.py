"""The configurations and scenarios of the suite, and each scenario's politeness bound."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scrapy_hostqueue.testing import HostSpec, host_address, parse_specs

SCRAPY_AIOHTTP = "scrapy.core.downloader.handlers._aiohttp.AiohttpDownloadHandler"
#: The add-on's configuration, and the same without its GC tuning: the
#: difference between the two is what the GcTuning extension is worth.
ADDON = "hq-full"
ADDON_WITHOUT_GC = "hq-full-no-gc"
#: The add-on with JOBDIR (the SQLite frontier), which a target compares with
#: the add-on in memory.
ADDON_JOBDIR = "hq-full-jobdir"


@dataclass(frozen=True)
class Config:
    """One way to run Scrapy.

    Settings on top of the scenario's, and the import paths that must load for it to run at all.
    """

    name: str
    description: str
    settings: dict[str, Any] = field(default_factory=dict)
    requires: tuple[str, ...] = ()


CONFIGS: dict[str, Config] = {
    config.name: config
    for config in (
        Config("scrapy", "Scrapy 2.19 defaults (DownloaderAwarePriorityQueue, HTTP11 handler)"),
        Config(
            "scrapy-pq",
            "Scrapy with its single priority queue",
            {"SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue"},
            ("scrapy.pqueues.ScrapyPriorityQueue",),
        ),
        Config(
            "scrapy-autothrottle",
            "Scrapy with AutoThrottle",
            {"AUTOTHROTTLE_ENABLED": True},
        ),
        Config(
            "scrapy-aiohttp",
            "Scrapy's scheduler with its aiohttp handler",
            {"DOWNLOAD_HANDLERS": {"http": SCRAPY_AIOHTTP, "https": SCRAPY_AIOHTTP}},
            (SCRAPY_AIOHTTP,),
        ),
        Config(
            "hq-scheduler",
            "HostQueueScheduler alone (HTTP11 handler)",
            {"SCHEDULER": "scrapy_hostqueue.HostQueueScheduler"},
            ("scrapy_hostqueue.HostQueueScheduler",),
        ),
        Config(
            ADDON,
            "scrapy_hostqueue.Addon: scheduler + AIMD middleware + aiohttp handler"
            " + CONCURRENT_ITEMS 16 + GC tuning",
            {"ADDONS": {"scrapy_hostqueue.Addon": 0}},
            (
                "scrapy_hostqueue.Addon",
                "scrapy_hostqueue.HostQueueScheduler",
                "scrapy_hostqueue.AIMDMiddleware",
                "scrapy_hostqueue.AiohttpDownloadHandler",
                "scrapy_hostqueue.GcTuning",
            ),
        ),
        Config(
            ADDON_JOBDIR,
            "scrapy_hostqueue.Addon with JOBDIR: the frontier in an SQLite file",
            {"ADDONS": {"scrapy_hostqueue.Addon": 0}, "JOBDIR": "@fresh"},
            (
                "scrapy_hostqueue.Addon",
                "scrapy_hostqueue.HostQueueScheduler",
                "scrapy_hostqueue.AIMDMiddleware",
                "scrapy_hostqueue.AiohttpDownloadHandler",
            ),
        ),
        Config(
            ADDON_WITHOUT_GC,
            "scrapy_hostqueue.Addon without its GC tuning extension (HOSTQUEUE_GC_FREEZE"
            " = False, HOSTQUEUE_GC_YOUNG_THRESHOLD = 0)",
            {
                "ADDONS": {"scrapy_hostqueue.Addon": 0},
                "HOSTQUEUE_GC_FREEZE": False,
                "HOSTQUEUE_GC_YOUNG_THRESHOLD": 0,
            },
            (
                "scrapy_hostqueue.Addon",
                "scrapy_hostqueue.HostQueueScheduler",
                "scrapy_hostqueue.AIMDMiddleware",
                "scrapy_hostqueue.AiohttpDownloadHandler",
            ),
        ),
    )
}

DEFAULT_BUDGET = 1200
#: Every scenario runs every configuration (but a reference scenario: see
#: ``Scenario.only``). These run in every round (``--repeats``);
#: the others, which give context rather than being terms of the targets,
#: in the first rounds only (``--extra-repeats``), to keep the suite near 10 minutes.
REPEATED_CONFIGS = ("scrapy", "hq-scheduler", ADDON, ADDON_WITHOUT_GC)
#: A crawl stops at this many times its scenario's bound (but not before
#: MIN_TIME_LIMIT seconds, nor after ``--time-limit``): slower than that, a
#: configuration shows as "more than" the limit.
TIME_LIMIT_FACTOR = 5.0
MIN_TIME_LIMIT = 10.0


def unavailable_reason(config: Config) -> str | None:
    """Why *config* cannot run here (a component fails to import), or None."""
    from scrapy.utils.misc import load_object

    for path in config.requires:
        try:
            load_object(path)
        except Exception as error:
            return f"{path}: {type(error).__name__}: {error}"
    return None


@dataclass(frozen=True)
class Scenario:
    """Local hosts and crawl settings (the page budget is the run's).

    ``hosts`` is a :mod:`scrapy_hostqueue.testing` spec string. Host ``i`` is
    ``127.0.0.{i+1}``; ``slot_delays`` gives some hosts a per-host download delay
    through ``DOWNLOAD_SLOTS``.
    """

    name: str
    title: str
    hosts: str
    repeated: tuple[str, ...] = REPEATED_CONFIGS
    start_per_host: int = 400
    concurrent_requests: int = 20
    per_host_limit: int = 4
    slot_delays: tuple[tuple[int, float], ...] = ()
    #: A scenario compared with this one runs interleaved with it (crawl by
    #: crawl, each with its own hosts), so that a drift of the machine's speed
    #: during the suite does not land between the two.
    paired_with: str | None = None
    #: Rounds of the repeated configurations beyond ``--repeats`` (when that is
    #: more than 1): a pair whose target is a small change (S1 -> S1b: < 10 %)
    #: needs more crawls than the others to see past the machine's noise.
    extra_rounds: int = 0
    #: The only configurations the scenario runs (None: every one). A
    #: reference scenario, which gives another one's figures a yardstick, runs
    #: just those it compares.
    only: tuple[str, ...] | None = None

    def runs(self, config: str) -> bool:
        """Whether the scenario runs *config* at all."""
        return self.only is None or config in self.only

    @property
    def specs(self) -> list[HostSpec]:
        return parse_specs(self.hosts)

    def hostnames(self) -> list[str]:
        return [host_address(index) for index in range(len(self.specs))]

    def settings(self) -> dict[str, Any]:
        """Return the scenario's Scrapy settings (configurations add theirs on top)."""
        names = self.hostnames()
        settings: dict[str, Any] = {
            "CONCURRENT_REQUESTS": self.concurrent_requests,
            "CONCURRENT_REQUESTS_PER_DOMAIN": self.per_host_limit,
        }
        if self.slot_delays:
            settings["DOWNLOAD_SLOTS"] = {
                names[index]: {"delay": delay} for index, delay in self.slot_delays
            }
        return settings

    def limits(self) -> list[int]:
        """Every host's configured limit (what the server must never exceed)."""
        return [self.per_host_limit] * len(self.specs)

    def host_rates(self) -> list[tuple[float, float]]:
        """``(max pages/s, latency)`` of every host under politeness alone.

        The limit over the latency, the throttle threshold standing in for the limit when lower, one
        request per delay for a delayed host.
        """
        delays = dict(self.slot_delays)
        rates = []
        for index, (spec, limit) in enumerate(zip(self.specs, self.limits(), strict=True)):
            usable = limit if spec.throttle_above is None else min(limit, spec.throttle_above)
            rate = usable / spec.latency
            if index in delays:
                rate = min(rate, 1.0 / delays[index])
            rates.append((rate, spec.latency))
        return rates

    def per_host_bound(self, budget: int) -> float:
        """Return the scenario's politeness bound: budget / Σ per-host rate."""
        return budget / sum(rate for rate, _ in self.host_rates())

    def bound(self, budget: int) -> float:
        """Return the least time to the budget under the per-host and global limits.

        The least time to the budget under the per-host limits *and*
        ``CONCURRENT_REQUESTS``: each request in flight holds one of the global
        slots for a latency, so the best use of the slots fills the hosts with
        the shortest latency first (a fractional knapsack). Equals
        :meth:`per_host_bound` when the global limit does not bind.
        """
        slots = float(self.concurrent_requests)
        total = 0.0
        for rate, latency in sorted(self.host_rates(), key=lambda item: item[1]):
            used = min(slots, rate * latency)
            total += used / latency
            slots -= used
            if slots <= 0:
                break
        return budget / total

    def time_limit(self, budget: int, cap: float) -> float:
        """Seconds after which a crawl of this scenario stops short of the budget."""
        return min(cap, max(MIN_TIME_LIMIT, TIME_LIMIT_FACTOR * self.bound(budget)))

    def fast_hosts(self) -> list[str]:
        """Hostnames of the hosts with the shortest latency."""
        specs = self.specs
        fastest = min(spec.latency for spec in specs)
        return [
            name
            for name, spec in zip(self.hostnames(), specs, strict=True)
            if spec.latency == fastest
        ]


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            "S1",
            "10/10/10/200 ms, limit 4",
            "3x latency=10ms; latency=200ms",
            extra_rounds=2,
        ),
        Scenario(
            "S1b",
            "S1 with a 2 s host instead of 200 ms",
            "3x latency=10ms; latency=2s",
            paired_with="S1",
            extra_rounds=2,
        ),
        Scenario(
            "S2",
            "50/50/50/1000 ms, limit 4",
            "3x latency=50ms; latency=1s",
            # A target compares the add-on with Scrapy's aiohttp handler here.
            repeated=(*REPEATED_CONFIGS, "scrapy-aiohttp"),
        ),
        Scenario(
            "S3",
            "4 hosts at 50 ms + 8 with a 1 s slot delay, CONCURRENT_REQUESTS=16",
            "12x latency=50ms",
            concurrent_requests=16,
            slot_delays=tuple((index, 1.0) for index in range(4, 12)),
        ),
        Scenario(
            "S3r",
            "S3's 4 hosts at 50 ms alone, no delayed host (a reference for S3)",
            "4x latency=50ms",
            concurrent_requests=16,
            # What S3 would take if its delayed hosts cost nothing: Scrapy's
            # defaults there bound what any scheduler can gain over them in
            # S3 on the same download handler.
            repeated=("scrapy", "hq-scheduler"),
            only=("scrapy", "hq-scheduler"),
            paired_with="S3",
        ),
        Scenario(
            "S4",
            "1 host answers 429 above 3 in flight + 3 healthy, 50 ms, limit 8",
            "3x latency=50ms; latency=50ms,throttle=429>3",
            per_host_limit=8,
        ),
        Scenario(
            "S5",
            "1 host answers 429 + Retry-After: 2 above 2 in flight + 3 healthy, 50 ms",
            "3x latency=50ms; latency=50ms,throttle=429>2,retry-after=2",
        ),
        Scenario(
            "S6",
            "broad crawl: 500 hosts at 100 ms, 3 start URLs each",
            "500x latency=100ms",
            start_per_host=3,
        ),
    )
}

#: S7 is the in-process next_request micro-benchmark (bench/micro.py).
MICRO = "S7"
ALL_SCENARIOS = (*SCENARIOS, MICRO)
