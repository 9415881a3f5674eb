"""``python example_project/run_demo.py``: a real Scrapy crawl against local test hosts.

Starts a varied set of local hosts (fast, slow, throttling with ``Retry-After``,
``Crawl-delay``) in a child process, runs ``scrapy crawl pages`` in this
example project against them, then prints what every host saw from the server
side: pages served, the most requests it had in flight, statuses, requests that
arrived inside a ``Retry-After`` window, and the smallest gap between requests.

Files written to ``--output-dir`` (default ``demo-output/``): ``crawl.log`` (the
crawl's whole output), ``scrapy-stats.json`` (Scrapy's final stats),
``hosts.json`` (host specs and server-side stats), ``timeline.jsonl``
(``HOSTQUEUE_TIMELINE_FILE``, unless ``--no-timeline``) and its chart
(``timeline.html``, and ``timeline.png`` when matplotlib is installed).

``--workers N`` runs one crawl on N ``scrapy crawl`` processes that share a
frontier on a local Redis server it starts (``HOSTQUEUE_FRONTIER`` on that
server, one ``HOSTQUEUE_CRAWL_ID``): the hosts' table then shows whether the
per-host limits held across the processes and which pages were fetched more
than once. ``--independent`` runs the N processes each on its own, to compare.
Each process writes ``crawl-K.log``, ``scrapy-stats-K.json`` and
``timeline-K.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from scrapy_hostqueue.testing import (
    PROXY_VARIABLES,
    HostSpec,
    HostStats,
    LocalHosts,
    SpecError,
    format_spec,
    parse_specs,
)
from scrapy_hostqueue.testing._redis_server import (
    RedisServer,
    RedisServerError,
    shared_frontier_refusal,
)

PROG = "python example_project/run_demo.py"
#: The example project: it lives next to this script, outside the package.
PROJECT_DIR = Path(__file__).resolve().parent
SPIDER = "pages"
OK_FINISH_REASONS = ("finished", "closespider_pagecount")
#: The crawl id of the shared mode's crawl (HOSTQUEUE_CRAWL_ID).
CRAWL_ID = "demo"
#: Answers that ask the client to come back later: fetching the page again
#: after one is no duplicate.
THROTTLE_STATUSES = (429, 503)

#: The default host set: (label, spec).
DEMO_HOSTS: list[tuple[str, HostSpec]] = [
    ("fast 10 ms", HostSpec(latency=0.01)),
    ("fast 30 ms", HostSpec(latency=0.03)),
    ("fast 50 ms", HostSpec(latency=0.05)),
    ("slow 1 s", HostSpec(latency=1.0)),
    (
        "429 above 3, Retry-After 2",
        HostSpec(latency=0.02, throttle_above=3, retry_after="2"),
    ),
    ("Crawl-delay 0.5 s", HostSpec(latency=0.02, crawl_delay=0.5)),
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _setting(text: str) -> str:
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return text


def build_parser() -> _Parser:
    parser = _Parser(
        prog=PROG,
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--pages",
        type=_positive,
        default=600,
        help="stop after this many responses (CLOSESPIDER_PAGECOUNT; default 600)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("demo-output"),
        help="where the log and stats go (default demo-output/)",
    )
    parser.add_argument(
        "--hosts",
        metavar="SPEC",
        help="host set in the spec language of scrapy_hostqueue.testing "
        '(e.g. "3x latency=10ms; latency=1s"); default: the varied demo set',
    )
    parser.add_argument(
        "--no-timeline",
        dest="timeline",
        action="store_false",
        help="do not record the per-host timeline (<dir>/timeline.jsonl) and its chart",
    )
    parser.add_argument(
        "--stock",
        action="store_true",
        help="crawl with stock Scrapy (ADDONS={}) to compare",
    )
    parser.add_argument(
        "-s",
        "--set",
        dest="settings",
        action="append",
        default=[],
        type=_setting,
        metavar="NAME=VALUE",
        help="extra Scrapy setting for the crawl (repeatable)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        help="stop the crawl after this many seconds (default 120; 3600 with --monitor)",
    )
    parser.add_argument(
        "--jobdir",
        type=Path,
        help="crawl with JOBDIR: the frontier in a crash-safe SQLite file there",
    )
    parser.add_argument(
        "--kill-after",
        type=_positive,
        metavar="N",
        help="with --jobdir: kill the crawl (SIGKILL) once the hosts served N pages, "
        "then start it again on the same JOBDIR",
    )
    parser.add_argument(
        "--monitor",
        action="store_true",
        help="keep the crawl, and its live monitor page, up until Enter is pressed "
        "(or --timeout): no page budget, and the spider stays open when idle",
    )
    parser.add_argument(
        "--workers",
        type=_positive,
        default=1,
        metavar="N",
        help="run the crawl on N scrapy crawl processes sharing one frontier on a local "
        "Redis server (the --pages budget split among them)",
    )
    parser.add_argument(
        "--independent",
        action="store_true",
        help="with --workers: no shared frontier, each process crawls on its own "
        "(to compare: each host then gets up to N times its limit)",
    )
    return parser


@dataclass
class CrawlResult:
    """How the ``scrapy crawl`` subprocess ended."""

    returncode: int
    seconds: float
    finish_reason: str | None = None
    scrapy_stats: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    #: --monitor: the crawl runs until stopped, by Enter or --timeout.
    kept_up: bool = False

    @property
    def ok(self) -> bool:
        if self.kept_up:
            return self.returncode == 0 and self.finish_reason == "shutdown"
        return (
            self.returncode == 0 and not self.timed_out and self.finish_reason in OK_FINISH_REASONS
        )


def crawl_command(
    start_urls: list[str],
    args: argparse.Namespace,
    output_dir: Path,
    *,
    worker: int | None = None,
    frontier: str | None = None,
) -> list[str]:
    """Return the ``scrapy crawl`` command line (run with cwd :data:`PROJECT_DIR`).

    *worker* numbers one of several processes (its files get ``-K``, its budget is its share of
    ``--pages``); *frontier* is the shared frontier's URL.
    """
    suffix = "" if worker is None else f"-{worker}"
    pages = args.pages if worker is None else math.ceil(args.pages / args.workers)
    command = [
        sys.executable,
        "-m",
        "scrapy",
        "crawl",
        SPIDER,
        "-a",
        "start_urls=" + ",".join(start_urls),
        "-s",
        f"CLOSESPIDER_PAGECOUNT={pages}",
        "-s",
        f"DEMO_STATS_FILE={output_dir / f'scrapy-stats{suffix}.json'}",
    ]
    if args.stock:
        command += ["-s", "ADDONS={}"]
        if args.timeline:
            # The add-on is off: wire the stats extension alone, so the stock
            # crawl gets a timeline to compare.
            command += ["-s", 'EXTENSIONS={"scrapy_hostqueue.stats.HostQueueStats": 0}']
    if args.timeline:
        command += [
            "-s",
            f"HOSTQUEUE_TIMELINE_FILE={output_dir / f'timeline{suffix}.jsonl'}",
            "-s",
            "HOSTQUEUE_TIMELINE_INTERVAL=0.25",
        ]
    if args.monitor:
        command += ["-s", "CLOSESPIDER_PAGECOUNT=0", "-s", "DEMO_KEEP_OPEN=True"]
    if args.jobdir is not None:
        command += ["-s", f"JOBDIR={args.jobdir.resolve()}"]
    if frontier is not None:
        command += ["-s", f"HOSTQUEUE_FRONTIER={frontier}", "-s", f"HOSTQUEUE_CRAWL_ID={CRAWL_ID}"]
    for setting in args.settings:
        command += ["-s", setting]
    return command


def kill_when(process: subprocess.Popen[bytes], condition: Callable[[], bool]) -> bool:
    """Kill *process* with SIGKILL once *condition* holds; False if it ended first."""
    while process.poll() is None:
        if condition():
            process.kill()
            process.wait()
            return True
        time.sleep(0.02)
    return False


def run_crawl(
    command: list[str],
    log_path: Path,
    timeout: float,
    kill: Callable[[subprocess.Popen[bytes]], object] | None = None,
    *,
    keep_up: bool = False,
) -> CrawlResult:
    """Run the crawl with its output in ``log_path``; stop it after ``timeout``.

    *kill*, if given, is called with the process once it runs (and may kill it).
    The monitor's URL is printed once the crawl logs it; *keep_up*: the crawl
    runs until Enter is pressed (or *timeout*).
    """
    started = time.monotonic()
    timed_out = False
    watch = CrawlWatch([log_path], keep_up)
    with log_path.open("wb") as log:
        process = _start(command, log)
        try:
            if kill is not None:
                kill(process)
            returncode = watch.wait(process, started + timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = _stop(process)
        except KeyboardInterrupt:
            _stop(process)
            raise
    return CrawlResult(returncode, time.monotonic() - started, timed_out=timed_out, kept_up=keep_up)


#: The line a crawl logs with its monitor's URL.
MONITOR_LINE = re.compile(r"Monitor: (http://\S+)")


class CrawlWatch:
    """Waits for crawl processes, printing each monitor URL their logs give.

    With *keep_up*, a press on Enter stops them (a closed stdin does not).
    """

    def __init__(self, log_paths: list[Path], keep_up: bool = False) -> None:
        self.log_paths = log_paths
        self.urls: dict[Path, str] = {}
        self.enter = threading.Event()
        if keep_up:
            threading.Thread(target=self._read_enter, daemon=True).start()

    def _read_enter(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if sys.stdin.readline():
                self.enter.set()

    def announce(self) -> None:
        for path in self.log_paths:
            if path in self.urls:
                continue
            with contextlib.suppress(OSError), path.open("rb") as log:
                found = MONITOR_LINE.search(log.read(200_000).decode(errors="replace"))
                if found:
                    self.urls[path] = found.group(1)
                    name = f" ({path.stem})" if len(self.log_paths) > 1 else ""
                    print(f"monitor{name}: {found.group(1)}", flush=True)

    def wait(self, process: subprocess.Popen[bytes], deadline: float) -> int:
        """*process*'s exit code; TimeoutExpired past *deadline*."""
        while True:
            if self.enter.is_set():
                return _stop(process)
            left = deadline - time.monotonic()
            try:
                code = process.wait(max(0.0, min(0.25, left)))
            except subprocess.TimeoutExpired:
                if left <= 0.25:
                    raise
                self.announce()
            else:
                self.announce()
                return code


def _start(command: list[str], log: Any) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARIABLES}
    # The crawl imports scrapy_hostqueue from the checkout this project
    # lives in when the package is not installed.
    root = str(PROJECT_DIR.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(command, cwd=PROJECT_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_crawls(
    commands: list[list[str]], log_paths: list[Path], timeout: float, *, keep_up: bool = False
) -> list[CrawlResult]:
    """Run the crawls at once, each with its output in its log.

    Stop those still running ``timeout`` seconds after the start (*keep_up*:
    or when Enter is pressed).
    """
    started = time.monotonic()
    results: list[CrawlResult] = []
    watch = CrawlWatch(log_paths, keep_up)
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(path.open("wb")) for path in log_paths]
        processes = [_start(command, log) for command, log in zip(commands, logs, strict=True)]
        try:
            for process in processes:
                try:
                    returncode = watch.wait(process, started + timeout)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    returncode, timed_out = _stop(process), True
                results.append(
                    CrawlResult(
                        returncode,
                        time.monotonic() - started,
                        timed_out=timed_out,
                        kept_up=keep_up,
                    )
                )
        except KeyboardInterrupt:
            for process in processes:
                if process.poll() is None:
                    _stop(process)
            raise
    return results


def _stop(process: subprocess.Popen[bytes]) -> int:
    """Ask Scrapy to shut down (SIGINT, as Ctrl-C would), then insist."""
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _read_scrapy_stats(result: CrawlResult, path: Path) -> None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    result.finish_reason = data.get("finish_reason")
    result.scrapy_stats = data.get("stats", {})


def _idle_stats(hosts: LocalHosts) -> list[HostStats]:
    """Return every host's counts once the hosts are idle, or after 5 s.

    A hanging host may never go idle: then the counts are what the hosts saw so far.
    """
    with contextlib.suppress(TimeoutError):
        hosts.wait_idle(timeout=5)
    return hosts.all_stats()


def _hosts_report(
    host_set: list[tuple[str, HostSpec]], all_stats: list[HostStats]
) -> list[dict[str, Any]]:
    """Return each host's label, spec and counts, for ``hosts.json``."""
    return [
        {"label": label, "spec": spec.to_dict(), "stats": stats.to_dict()}
        for (label, spec), stats in zip(host_set, all_stats, strict=True)
    ]


def _statuses(stats: HostStats) -> str:
    return " ".join(f"{code}:{count}" for code, count in sorted(stats.statuses.items()))


def fetched_again(stats: HostStats) -> int:
    """Count page fetches beyond each page's first, those after a 429 or 503 aside.

    Page fetches beyond each page's first, a fetch after a 429 or 503
    answer not counted (the host asked for it).
    """
    throttled = sum(stats.statuses.get(code, 0) for code in THROTTLE_STATUSES)
    return max(0, stats.served - len(stats.pages) - throttled)


def host_table(labels: list[str], all_stats: list[HostStats], limit: int | None = None) -> str:
    """Return the per-host summary, one row per host, as aligned text.

    *limit* is the per-host limit the crawl was given (CONCURRENT_REQUESTS_PER_DOMAIN).
    """
    header = (
        "host",
        "behaviour",
        "served",
        "max in flight",
        "statuses",
        "in Retry-After",
        "fetched again",
        "min gap",
    )
    rows = [header]
    for label, stats in zip(labels, all_stats, strict=True):
        gap = "-" if stats.min_gap is None else f"{stats.min_gap * 1000:.0f} ms"
        rows.append(
            (
                stats.hostname,
                label,
                str(stats.served),
                f"{stats.max_in_flight}" + ("" if limit is None else f" / {limit}"),
                _statuses(stats) or "-",
                str(stats.in_retry_after_window),
                str(fetched_again(stats)),
                gap,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    numeric = {2, 3, 5, 6, 7}
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if i in numeric else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _host_set(args: argparse.Namespace, parser: _Parser) -> list[tuple[str, HostSpec]]:
    if args.kill_after is not None and args.jobdir is None:
        parser.error("--kill-after needs --jobdir")
    if args.workers > 1 and args.jobdir is not None:
        parser.error("--workers runs a shared frontier on Redis, not in a JOBDIR")
    if args.independent and args.workers == 1:
        parser.error("--independent needs --workers N (N > 1)")
    if args.hosts is None:
        return DEMO_HOSTS
    try:
        specs = parse_specs(args.hosts)
    except SpecError as error:
        parser.error(f"--hosts: {error}")
    return [(format_spec(spec) or "defaults", spec) for spec in specs]


_STATS_COLUMNS = (
    ("requests", "request_count"),
    ("responses", "response_count"),
    ("max in flight", "max_inflight"),
    ("limit min-max", None),
    ("back-offs", "backoff_count"),
    ("blocked s", "blocked_seconds"),
    ("p95 latency", "latency_p95"),
)


def hostqueue_stats_table(scrapy_stats: dict[str, Any]) -> str:
    """Return the per-host ``hostqueue/hosts/{host}/...`` stats of the crawl, as a table."""
    prefix = "hostqueue/hosts/"
    hosts: dict[str, dict[str, Any]] = {}
    for key, value in scrapy_stats.items():
        if key.startswith(prefix):
            host, _, name = key[len(prefix) :].partition("/")
            hosts.setdefault(host, {})[name] = value
    if not hosts:
        return ""
    rows = [["host", *(title for title, _ in _STATS_COLUMNS)]]
    for host in sorted(hosts):
        values = hosts[host]
        row = [host]
        for _, column in _STATS_COLUMNS:
            if column is None:
                low, high = values.get("min_limit"), values.get("max_limit")
                row.append("-" if low is None else f"{low}-{high}")
            elif column == "backoff_count":
                total = sum(v for k, v in values.items() if k.startswith("backoff_count/"))
                row.append(str(total))
            else:
                value = values.get(column)
                row.append(
                    "-"
                    if value is None
                    else f"{value:.3g}"
                    if isinstance(value, float)
                    else str(value)
                )
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    )


def _draw_timeline(timeline: Path, output_dir: Path) -> None:
    if not timeline.is_file():
        print(f"timeline: not written ({timeline}); is HostQueueStats enabled?")
        return
    from scrapy_hostqueue._plot import plot  # noqa: PLC0415 - optional part
    from scrapy_hostqueue.exceptions import PlotError, TimelineError  # noqa: PLC0415

    outputs = [output_dir / "timeline.html"]
    if importlib.util.find_spec("matplotlib") is not None:
        outputs.append(output_dir / "timeline.png")
    for out in outputs:
        try:
            plot(str(timeline), str(out))
        except (PlotError, TimelineError) as error:
            print(f"chart: {out} not drawn: {error}")
        else:
            print(f"chart: {out}")


def per_host_limit(args: argparse.Namespace) -> int | None:
    """Return the crawl's per-host limit.

    ``CONCURRENT_REQUESTS_PER_DOMAIN`` from ``-s``, else from the example project's settings.
    """
    for setting in reversed(args.settings):
        name, _, value = setting.partition("=")
        if name.strip() == "CONCURRENT_REQUESTS_PER_DOMAIN":
            return int(value) if value.strip().isdigit() else None
    project = runpy.run_path(str(PROJECT_DIR / "hostqueue_demo" / "settings.py"))
    value = project.get("CONCURRENT_REQUESTS_PER_DOMAIN")
    return value if isinstance(value, int) else None


def _crawl_failed(result: CrawlResult, log_path: Path, timeout: float) -> None:
    problem = (
        f"timed out after {timeout:g} s"
        if result.timed_out
        else f"exit code {result.returncode}, finish reason {result.finish_reason}"
    )
    print(f"{PROG}: the crawl failed ({problem}); end of {log_path}:", file=sys.stderr)
    try:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
    except OSError:
        tail = []
    for line in tail:
        print(f"  {line}", file=sys.stderr)


def run_workers(
    args: argparse.Namespace, host_set: list[tuple[str, HostSpec]], output_dir: Path
) -> int:
    """Run N crawl processes on one shared frontier (``--workers N``).

    N crawl processes on one shared frontier (or each on its own with ``--independent`` or
    ``--stock``), then the hosts' table.
    """
    workers = args.workers
    labels = [label for label, _ in host_set]
    limit = per_host_limit(args)
    with contextlib.ExitStack() as stack:
        frontier = None
        if not (args.independent or args.stock):
            try:
                server = stack.enter_context(RedisServer())
            except RedisServerError as error:
                print(f"{PROG}: {error}", file=sys.stderr)
                return 2
            refusal = shared_frontier_refusal(server.url)
            if refusal is None:
                frontier = server.url
                print(f"Redis: {server.url} (crawl id {CRAWL_ID!r})")
            else:
                print(
                    f"the shared frontier is refused: {refusal}; the {workers} processes "
                    "crawl each on its own instead (as with --independent)",
                    flush=True,
                )
                server.stop()
        hosts = stack.enter_context(LocalHosts([spec for _, spec in host_set], process=True))
        start_urls = [hosts.page_url(i, 0) for i in range(len(hosts))]
        for i, label in enumerate(labels):
            print(f"  {hosts.url(i):<28} {label}")
        how = "one shared frontier" if frontier else "each on its own"
        budget = "" if args.monitor else f"up to {args.pages} pages "
        print(
            f"crawling {budget}with {workers} scrapy crawl processes, "
            f"{how} (logs: {output_dir}/crawl-K.log) ...",
            flush=True,
        )
        numbers = range(1, workers + 1)
        commands = [
            crawl_command(start_urls, args, output_dir, worker=k, frontier=frontier)
            for k in numbers
        ]
        logs = [output_dir / f"crawl-{k}.log" for k in numbers]
        stats_paths = [output_dir / f"scrapy-stats-{k}.json" for k in numbers]
        for path in stats_paths:
            path.unlink(missing_ok=True)
        try:
            if args.monitor:
                print("the crawls go on until you press Enter (or --timeout)", flush=True)
            results = run_crawls(commands, logs, args.timeout, keep_up=args.monitor)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        all_stats = _idle_stats(hosts)
        redis_calls = None
        if frontier is not None:
            redis_calls = sum(
                stat.calls
                for name, stat in server.commandstats().items()
                if name.split("|")[0] not in ("info", "config")
            )
    for result, path in zip(results, stats_paths, strict=True):
        _read_scrapy_stats(result, path)
    report = {
        "mode": "shared" if frontier else "independent",
        "workers": workers,
        "pages": args.pages,
        "limit": limit,
        "crawls": [
            {
                "returncode": result.returncode,
                "seconds": round(result.seconds, 3),
                "finish_reason": result.finish_reason,
                "timed_out": result.timed_out,
                "responses": result.scrapy_stats.get("response_received_count"),
            }
            for result in results
        ],
        "redis_commands": redis_calls,
        "hosts": _hosts_report(host_set, all_stats),
    }
    (output_dir / "hosts.json").write_text(json.dumps(report, indent=2))

    print()
    print(host_table(labels, all_stats, limit))
    print()
    for k, result in zip(numbers, results, strict=True):
        responses = result.scrapy_stats.get("response_received_count", "?")
        print(
            f"process {k}: {responses} responses in {result.seconds:.1f} s; "
            f"finish reason {result.finish_reason or '?'}"
        )
    served = sum(stats.served for stats in all_stats)
    worst = max(stats.max_in_flight for stats in all_stats)
    over = sum(limit is not None and stats.max_in_flight > limit for stats in all_stats)
    print(
        f"hosts: {served} page requests answered; most in flight at one host {worst}"
        + ("" if limit is None else f" (limit {limit}, {over} host(s) over it)")
    )
    print(
        "requests sent inside Retry-After windows: "
        f"{sum(stats.in_retry_after_window for stats in all_stats)}; pages fetched again: "
        f"{sum(fetched_again(stats) for stats in all_stats)}"
    )
    if redis_calls is not None:
        per_page = redis_calls / served if served else 0.0
        print(f"Redis: {redis_calls} commands, {per_page:.1f} per page")
    print(f"details: {output_dir / 'hosts.json'}, {output_dir}/scrapy-stats-K.json, crawl-K.log")
    if args.timeline:
        print(
            f"timelines: {output_dir}/timeline-K.jsonl "
            "(python -m scrapy_hostqueue plot FILE -o FILE.html draws one)"
        )
    failed = [(result, log) for result, log in zip(results, logs, strict=True) if not result.ok]
    if failed:
        # The first failure's log; the others fail the same way, most often.
        _crawl_failed(*failed[0], args.timeout)
        for _, log in failed[1:]:
            print(f"{PROG}: that crawl failed too: {log}", file=sys.stderr)
    if failed or not served:
        return next((result.returncode for result, _ in failed if result.returncode), 1)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.timeout is None:
        args.timeout = 3600.0 if args.monitor else 120.0
    host_set = _host_set(args, parser)
    output_dir: Path = args.output_dir.resolve()
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--output-dir: {error}")
    if args.workers > 1:
        return run_workers(args, host_set, output_dir)
    labels = [label for label, _ in host_set]
    log_path = output_dir / "crawl.log"
    stats_path = output_dir / "scrapy-stats.json"
    stats_path.unlink(missing_ok=True)

    with LocalHosts([spec for _, spec in host_set], process=True) as hosts:
        start_urls = [hosts.page_url(i, 0) for i in range(len(hosts))]
        for i, label in enumerate(labels):
            print(f"  {hosts.url(i):<28} {label}")
        mode = "stock Scrapy" if args.stock else "scrapy-hostqueue"
        budget = "" if args.monitor else f"up to {args.pages} pages "
        print(f"crawling {budget}with {mode} (log: {log_path}) ...", flush=True)
        command = crawl_command(start_urls, args, output_dir)
        try:
            if args.kill_after is not None:
                limit = args.kill_after
                served = lambda: sum(s.served for s in hosts.all_stats(arrivals=False))  # noqa: E731
                first = run_crawl(
                    command,
                    output_dir / "crawl-killed.log",
                    args.timeout,
                    lambda process: kill_when(process, lambda: served() >= limit),
                )
                if first.returncode == -signal.SIGKILL:
                    print(
                        f"killed the crawl with SIGKILL after {served()} pages; starting it "
                        f"again on JOBDIR {args.jobdir} (python -m scrapy_hostqueue frontier "
                        f"{args.jobdir} shows what it holds) ...",
                        flush=True,
                    )
            if args.monitor:
                print("the crawl goes on until you press Enter (or --timeout)", flush=True)
            result = run_crawl(command, log_path, args.timeout, keep_up=args.monitor)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        all_stats = _idle_stats(hosts)

    _read_scrapy_stats(result, stats_path)
    report = {
        "mode": "stock" if args.stock else "hostqueue",
        "pages": args.pages,
        "crawl": {
            "returncode": result.returncode,
            "seconds": round(result.seconds, 3),
            "finish_reason": result.finish_reason,
            "timed_out": result.timed_out,
        },
        "hosts": _hosts_report(host_set, all_stats),
    }
    (output_dir / "hosts.json").write_text(json.dumps(report, indent=2))

    print()
    print(host_table(labels, all_stats, per_host_limit(args)))
    print()
    served = sum(stats.served for stats in all_stats)
    responses = result.scrapy_stats.get("response_received_count", "?")
    print(
        f"crawl: {responses} responses, {served} page requests answered by the hosts "
        f"in {result.seconds:.1f} s; finish reason {result.finish_reason or '?'}"
    )
    inside = sum(stats.in_retry_after_window for stats in all_stats)
    print(f"requests sent inside Retry-After windows: {inside}")
    host_keys = hostqueue_stats_table(result.scrapy_stats)
    if host_keys:
        print()
        print("per-host stats (Scrapy stats collector, hostqueue/hosts/{host}/...):")
        print(host_keys)
    if args.timeline:
        _draw_timeline(output_dir / "timeline.jsonl", output_dir)
    print(f"details: {output_dir / 'hosts.json'}, {stats_path}, {log_path}")

    if result.ok and served:
        return 0
    _crawl_failed(result, log_path, args.timeout)
    return result.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
