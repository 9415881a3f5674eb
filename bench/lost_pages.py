"""Many small seeded crawls of finite sites, to check that every page reaches the spider.

Each crawl draws, from ``--seed`` and its number, a few local hosts (finite
sites of a few pages to a few dozen, linked as a tree from page 0), some with
transient faults (a reset connection, a truncated body, a 429 or 503 with or
without ``Retry-After``, a slow body, a malformed answer, a hang until
``DOWNLOAD_TIMEOUT``: each on a page's first request or two only,
``fault-attempts``), and the scheduler's settings (turn, turn seconds, idle
grace, active-host cap, prefetch, overdue, download delay, robots.txt
Crawl-delay, retries; the add-on, or the scheduler alone, or the scheduler
and the AIMD middleware on Scrapy's HTTP/1.1 handler), then crawls every site
from its page 0, following links. ``--parallel`` worker processes run crawls
side by side, to load the machine as a busy CI does; every worker serves its
crawl's hosts from a thread of its own.

A crawl passes when it closes with ``finished``, every page of every host
reached the spider with a 200, and the scheduler found nothing left in any of
its parts at close (``hostqueue/lost_at_close_count``). Every failed crawl is
printed with the seed, number and settings that repeat it, the finish
reason, the scheduler's and the retry counts, what every host served, and the
last lines of its log. The exit status is 1 if any crawl failed.

    python -m bench.lost_pages --crawls 500 --parallel 3 --seed 1   # a few minutes
    python -m bench.lost_pages --seed 1 --only 17 --store sqlite    # one crawl again
    python -m bench.lost_pages --crawls 200 --store both            # SQLite (JOBDIR) too
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from bench.runner import ROOT, child_environment

#: A crawl that takes longer than this has stalled (it closes with
#: ``closespider_timeout`` and fails).
CRAWL_TIMEOUT = 30
#: Log lines kept per crawl, shown when it fails.
LOG_TAIL = 40
#: Pages listed per failed crawl (missing pages, failures).
SHOWN = 12

FAULTS = ("reset", "truncate", "throttle", "throttle", "slow-body", "malformed", "hang")
WIRINGS = ("addon", "addon", "addon", "addon", "scheduler", "scheduler+aimd")

_SCHEDULER = "scrapy_hostqueue.HostQueueScheduler"
_MIDDLEWARE = "scrapy_hostqueue.AIMDMiddleware"
_HTTP11 = "scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler"


@dataclass(frozen=True)
class Case:
    """One crawl: its hosts (a spec of the local test hosts) and settings."""

    seed: int
    index: int
    store: str
    wiring: str
    hosts: str
    settings: dict[str, Any]

    def command(self) -> str:
        return (
            f"python -m bench.lost_pages --seed {self.seed} --only {self.index} "
            f"--store {self.store}"
        )


def _host_spec(rng: random.Random, robots: bool) -> tuple[str, int]:
    """Draw the spec of one host, and how many requests a page of it may fail."""
    pages = rng.randint(1, 25)
    latency = rng.choice((0, 1, 5, 10, 20, 40))
    fault = rng.choice(FAULTS) if rng.random() < 0.5 else None
    if fault in ("hang", "throttle"):
        # Each such fault costs a timeout or a block: a few per host.
        pages = min(pages, 10)
    items = [f"pages={pages}", f"links={rng.randint(1, 4)}", f"latency={latency}ms"]
    attempts = 0
    if fault is not None:
        attempts = 1 if fault == "hang" else rng.choice((1, 1, 2))
        rate = rng.choice((10, 25) if fault in ("hang", "throttle") else (10, 25, 50, 100))
        items += [f"fault={fault}", f"fault-rate={rate}%", f"fault-attempts={attempts}"]
        if fault == "throttle":
            items.append(f"throttle-status={rng.choice((429, 429, 503))}")
            retry_after = rng.choice((None, "0", "1", "date:1", "soon"))
            if retry_after is not None:
                items.append(f"retry-after={retry_after}")
        elif fault == "slow-body":
            items.append(f"trickle={rng.choice((20, 100, 300))}ms")
    if robots and rng.random() < 0.3:
        items.append("crawl-delay=10ms")
    return ",".join(items), attempts


def make_case(seed: int, index: int, store: str) -> Case:
    """Crawl *index* of *seed*: the same case every time."""
    rng = random.Random(f"{seed}/{index}")
    if store == "both":
        store = ("memory", "sqlite")[index % 2]
    wiring = rng.choice(WIRINGS)
    robots = wiring != "scheduler" and rng.random() < 0.15
    drawn = [_host_spec(rng, robots) for _ in range(rng.randint(2, 10))]
    specs = [spec for spec, _ in drawn]
    attempts = [attempt for _, attempt in drawn]
    concurrency = rng.choice((2, 4, 8, 16))
    settings: dict[str, Any] = {
        "CONCURRENT_REQUESTS": concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": rng.choice((1, 2, 4)),
        "HOSTQUEUE_TURN_REQUESTS": rng.choice((1, 2, 5, 100)),
        "HOSTQUEUE_TURN_SECONDS": rng.choice((0.0, 0.02, 0.1, 10.0)),
        "HOSTQUEUE_IDLE_GRACE": rng.choice((0.0, 0.005, 0.05, 0.1, 0.3)),
        "HOSTQUEUE_MAX_ACTIVE_HOSTS": rng.choice((0, 1, 2, 3, concurrency)),
        "HOSTQUEUE_PREFETCH": rng.choice((0, 1, 1, 2)),
        # Transient faults only: every page must get through.
        "RETRY_ENABLED": True,
        "RETRY_TIMES": max(attempts) + rng.choice((0, 1, 2)),
        "ROBOTSTXT_OBEY": robots,
    }
    if rng.random() < 0.15:
        settings["DOWNLOAD_DELAY"] = rng.choice((0.002, 0.01))
    if any("fault=hang" in spec for spec in specs):
        settings["DOWNLOAD_TIMEOUT"] = 1.0
    if wiring != "scheduler":
        # Short waits, so that a crawl with faults takes a second or two; a
        # host is parked often but never given up.
        settings.update(
            HOSTQUEUE_BACKOFF_BASE=0.05,
            HOSTQUEUE_BACKOFF_MAX=0.3,
            HOSTQUEUE_RETRY_AFTER_MAX=0.3,
            HOSTQUEUE_ERROR_COOLDOWN=0.1,
            HOSTQUEUE_ERROR_MAX_COOLDOWNS=1000,
        )
        if rng.random() < 0.3:
            settings.update(HOSTQUEUE_AIMD_FAST_LATENCY=0.01, HOSTQUEUE_AIMD_SLOW_LATENCY=0.1)
        if rng.random() < 0.2:
            settings["HOSTQUEUE_MAX_OVERDUE"] = rng.choice((0, 1))
    return Case(seed, index, store, wiring, "; ".join(specs), settings)


def crawl_settings(case: Case, jobdir: str | None) -> dict[str, Any]:
    """Every Scrapy setting of *case*'s crawl."""
    settings: dict[str, Any] = {
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "LOGSTATS_INTERVAL": 0,
        "CLOSESPIDER_TIMEOUT": CRAWL_TIMEOUT,
        "HOSTQUEUE_TIMELINE_FILE": None,
        "HOSTQUEUE_LOG_INTERVAL": 0,
    }
    if case.wiring == "addon":
        settings["ADDONS"] = {"scrapy_hostqueue.Addon": 0}
    else:
        settings["SCHEDULER"] = _SCHEDULER
        settings["DOWNLOAD_HANDLERS"] = {"http": _HTTP11, "https": _HTTP11}
        if case.wiring == "scheduler+aimd":
            settings["DOWNLOADER_MIDDLEWARES"] = {_MIDDLEWARE: 560}
    if jobdir is not None:
        settings["JOBDIR"] = jobdir
    settings.update(case.settings)
    return settings


# -- one crawl (a worker process) ---------------------------------------------------


class _Tail(logging.Handler):
    """The last log lines of a crawl, and its ERROR lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self.errors = 0
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors += 1
        try:
            self.lines.append(" ".join(self.format(record).split())[:400])
        except Exception:  # a log line must not end the crawl
            self.lines.append(f"{record.levelname} {record.name}: (unformattable)")


def _spider_class() -> type[Any]:
    import scrapy

    class SitesSpider(scrapy.Spider):
        """Crawls every site from its page 0, following every link.

        Notes the status of every page that reaches it and every failure.
        """

        name = "lost_pages"
        start_urls: list[str]

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.statuses: dict[str, list[int]] = collections.defaultdict(list)
            self.failures: list[str] = []

        async def start(self) -> AsyncIterator[Any]:
            for url in self.start_urls:
                yield scrapy.Request(url, errback=self.failed)

        def parse(self, response: Any) -> Iterator[Any]:
            self.statuses[response.url].append(response.status)
            for href in response.css("a::attr(href)").getall():
                yield response.follow(href, errback=self.failed)

        def failed(self, failure: Any) -> None:
            request = getattr(failure, "request", None)
            url = request.url if request is not None else "?"
            self.failures.append(f"{url}: {failure.type.__name__}: {failure.value}"[:300])

    return SitesSpider


def _plain_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """Return the crawl's stats that JSON carries (not the start and finish times)."""
    return {
        key: value
        for key, value in sorted(stats.items())
        if isinstance(value, (int, float, str)) and not isinstance(value, bool)
    }


async def run_case(case: Case) -> dict[str, Any]:
    """Crawl *case*; what it saw, and whether every page got through."""
    from scrapy.crawler import AsyncCrawlerRunner

    from scrapy_hostqueue.testing import LocalHosts

    started = time.monotonic()
    tail = _Tail()
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(tail)
    jobdir = tempfile.mkdtemp(prefix="hostqueue-lost-") if case.store == "sqlite" else None
    try:
        with LocalHosts(case.hosts) as hosts:
            runner = AsyncCrawlerRunner(crawl_settings(case, jobdir))
            crawler = runner.create_crawler(_spider_class())
            urls = [hosts.page_url(i, 0) for i in range(len(hosts))]
            await runner.crawl(crawler, start_urls=urls)
            hosts.wait_idle(10)
            served = hosts.all_stats(arrivals=False)
            expected = [
                hosts.page_url(i, page)
                for i, spec in enumerate(hosts.specs)
                for page in range(spec.pages or 0)
            ]
    finally:
        root.removeHandler(tail)
        root.setLevel(level)
        if jobdir is not None:
            shutil.rmtree(jobdir, ignore_errors=True)
    assert crawler.stats is not None
    stats = _plain_stats(crawler.stats.get_stats())
    spider = crawler.spider
    missing = [url for url in expected if 200 not in spider.statuses.get(url, ())]
    reason = stats.get("finish_reason")
    lost_at_close = stats.get("hostqueue/lost_at_close_count", 0)
    ok = reason == "finished" and not missing and not lost_at_close
    result: dict[str, Any] = {
        "index": case.index,
        "ok": ok,
        "pages": len(expected),
        "seconds": round(time.monotonic() - started, 2),
        "reason": reason,
        "errors": tail.errors,
    }
    if not ok:
        result.update(
            case=asdict(case),
            missing=missing[:SHOWN],
            missing_count=len(missing),
            failures=spider.failures[:SHOWN],
            stats=stats,
            hosts=[host.to_dict(arrivals=False) for host in served],
            specs=[spec.to_dict() for spec in hosts.specs],
            log=list(tail.lines),
        )
    return result


async def _work(cases: Iterable[Case]) -> None:
    for case in cases:
        try:
            result = await run_case(case)
        except Exception as error:  # reported as a failed crawl
            result = {"index": case.index, "ok": False, "case": asdict(case), "error": repr(error)}
        print(json.dumps(result), flush=True)


def run_worker(cases: list[Case]) -> None:
    """Run *cases* one after the other in this process, one JSON line each."""
    from scrapy.utils.defer import deferred_from_coro
    from scrapy.utils.reactor import install_reactor

    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    from twisted.internet import reactor

    done = deferred_from_coro(_work(cases))
    outcome: list[Any] = []
    done.addBoth(outcome.append)
    done.addBoth(lambda _: reactor.stop())  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]
    if outcome and outcome[0] is not None:
        print(json.dumps({"index": -1, "ok": False, "error": repr(outcome[0])}), flush=True)


# -- many crawls (this process) ------------------------------------------------------


def format_failure(result: dict[str, Any]) -> str:
    """Describe a failed crawl.

    What repeats it, what the spider missed, and the crawl's report
    (``scrapy_hostqueue.testing.crawl_report``).
    """
    from scrapy_hostqueue.testing import HostSpec, HostStats, crawl_report

    case = result.get("case") or {}
    lines = [f"FAILED crawl {result['index']}"]
    if case:
        lines += [
            f"  repeat: {Case(**case).command()}",
            f"  wiring: {case['wiring']}; store: {case['store']}",
            f"  hosts: {case['hosts']}",
            f"  settings: {json.dumps(case['settings'], sort_keys=True)}",
        ]
    if "error" in result:
        lines.append(f"  error: {result['error']}")
        return "\n".join(lines)
    lines.append(
        f"  finish reason: {result['reason']}; pages the spider got no 200 for: "
        f"{result['missing_count']} of {result['pages']}; ERROR lines: {result['errors']}"
    )
    lines += [f"  missing: {url}" for url in result["missing"]]
    lines += [f"  failure: {failure}" for failure in result["failures"]]
    report = crawl_report(
        result["stats"],
        hosts=[HostStats.from_dict(host) for host in result["hosts"]],
        specs=[HostSpec.from_dict(spec) for spec in result["specs"]],
        log=result["log"],
        title=f"crawl {result['index']}",
    )
    lines += [f"  {line}" for line in report.splitlines()]
    return "\n".join(lines)


def _read_worker(
    process: subprocess.Popen[str], results: list[dict[str, Any]], lock: threading.Lock
) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        try:
            result = json.loads(line)
        except ValueError:
            continue
        with lock:
            results.append(result)
            if not result["ok"]:
                print(format_failure(result), flush=True)
            elif len(results) % 50 == 0:
                print(f"... {len(results)} crawls", flush=True)


def run_crawls(seed: int, indices: list[int], store: str, parallel: int) -> list[dict[str, Any]]:
    """Crawls *indices* of *seed* in *parallel* worker processes; their results."""
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    workers = []
    for worker in range(parallel):
        share = indices[worker::parallel]
        if not share:
            continue
        command = [sys.executable, "-m", "bench.lost_pages", "--worker"]
        command += ["--seed", str(seed), "--store", store]
        command += ["--indices", ",".join(map(str, share))]
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=child_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        reader = threading.Thread(target=_read_worker, args=(process, results, lock))
        reader.start()
        workers.append((process, reader, share))
    for process, reader, share in workers:
        process.wait()
        reader.join()
        got = {result["index"] for result in results}
        for index in share:
            if index not in got:
                result = {
                    "index": index,
                    "ok": False,
                    "case": asdict(make_case(seed, index, store)),
                    "error": f"its worker ended (exit code {process.returncode}) before it",
                }
                results.append(result)
                print(format_failure(result), flush=True)
    return results


def summary(results: list[dict[str, Any]], seconds: float, store: str, seed: int) -> str:
    passed = [result for result in results if result["ok"]]
    pages = sum(result.get("pages", 0) for result in passed)
    failed = sorted(result["index"] for result in results if not result["ok"])
    line = (
        f"{len(passed)} of {len(results)} crawls (seed {seed}, store {store}) fetched every "
        f"page with a 200: {pages:,} pages in {seconds:.0f} s"
    )
    if failed:
        line += f"; failed: {', '.join(map(str, failed))}"
    return line


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lost_pages",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--crawls", type=int, default=100, help="crawls to run (default 100)")
    parser.add_argument("--parallel", type=int, default=3, help="crawls side by side (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="number of the first crawl")
    parser.add_argument("--only", type=int, help="run crawl ONLY alone, in this process")
    parser.add_argument("--store", choices=("memory", "sqlite", "both"), default="memory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--indices", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crawls < 1 or args.parallel < 1 or args.first < 0:
        parser.error("--crawls and --parallel must be at least 1, --first at least 0")
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        os.environ.pop(name, None)
    if args.worker:
        indices = [int(index) for index in (args.indices or "").split(",") if index]
        run_worker([make_case(args.seed, index, args.store) for index in indices])
        return 0
    if args.only is not None:
        case = make_case(args.seed, args.only, args.store)
        print(f"crawl {case.index}: {case.wiring}, {case.store}; hosts: {case.hosts}")
        print(f"settings: {json.dumps(case.settings, sort_keys=True)}", flush=True)
        indices = [args.only]
        parallel = 1
    else:
        indices = list(range(args.first, args.first + args.crawls))
        parallel = args.parallel
    began = time.monotonic()
    results = run_crawls(args.seed, indices, args.store, parallel)
    print(summary(results, time.monotonic() - began, args.store, args.seed), flush=True)
    return 0 if results and all(result["ok"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
