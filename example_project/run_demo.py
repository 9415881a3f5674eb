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
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
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

PROG = "python example_project/run_demo.py"
#: The example project: it lives next to this script, outside the package.
PROJECT_DIR = Path(__file__).resolve().parent
SPIDER = "pages"
OK_FINISH_REASONS = ("finished", "closespider_pagecount")

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
        default=120.0,
        help="stop the crawl after this many seconds (default 120)",
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
    return parser


@dataclass
class CrawlResult:
    """How the ``scrapy crawl`` subprocess ended."""

    returncode: int
    seconds: float
    finish_reason: str | None = None
    scrapy_stats: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return (
            self.returncode == 0 and not self.timed_out and self.finish_reason in OK_FINISH_REASONS
        )


def crawl_command(start_urls: list[str], args: argparse.Namespace, output_dir: Path) -> list[str]:
    """The ``scrapy crawl`` command line (run with cwd :data:`PROJECT_DIR`)."""
    command = [
        sys.executable,
        "-m",
        "scrapy",
        "crawl",
        SPIDER,
        "-a",
        "start_urls=" + ",".join(start_urls),
        "-s",
        f"CLOSESPIDER_PAGECOUNT={args.pages}",
        "-s",
        f"DEMO_STATS_FILE={output_dir / 'scrapy-stats.json'}",
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
            f"HOSTQUEUE_TIMELINE_FILE={output_dir / 'timeline.jsonl'}",
            "-s",
            "HOSTQUEUE_TIMELINE_INTERVAL=0.25",
        ]
    if args.jobdir is not None:
        command += ["-s", f"JOBDIR={args.jobdir.resolve()}"]
    for setting in args.settings:
        command += ["-s", setting]
    return command


def kill_when(process: subprocess.Popen[bytes], condition: Callable[[], bool]) -> bool:
    """Kill *process* with SIGKILL once *condition* holds; False if it ended
    first."""
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
) -> CrawlResult:
    """Run the crawl with its output in ``log_path``; stop it after ``timeout``.
    *kill*, if given, is called with the process once it runs (and may kill it)."""
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARIABLES}
    # The crawl imports scrapy_hostqueue from the checkout this project
    # lives in when the package is not installed.
    root = str(PROJECT_DIR.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    started = time.monotonic()
    timed_out = False
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=PROJECT_DIR, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            if kill is not None:
                kill(process)
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = _stop(process)
        except KeyboardInterrupt:
            _stop(process)
            raise
    return CrawlResult(returncode, time.monotonic() - started, timed_out=timed_out)


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


def _statuses(stats: HostStats) -> str:
    return " ".join(f"{code}:{count}" for code, count in sorted(stats.statuses.items()))


def host_table(labels: list[str], all_stats: list[HostStats]) -> str:
    """The per-host summary, one row per host, as aligned text."""
    header = (
        "host",
        "behaviour",
        "served",
        "max in flight",
        "statuses",
        "in Retry-After",
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
                str(stats.max_in_flight),
                _statuses(stats) or "-",
                str(stats.in_retry_after_window),
                gap,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    numeric = {2, 3, 5, 6}
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
    """The per-host ``hostqueue/hosts/{host}/...`` stats of the crawl, as a table."""
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
    from scrapy_hostqueue.plot import PlotError, plot  # noqa: PLC0415 - optional part
    from scrapy_hostqueue.timeline import TimelineError  # noqa: PLC0415

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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    host_set = _host_set(args, parser)
    output_dir: Path = args.output_dir.resolve()
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--output-dir: {error}")
    labels = [label for label, _ in host_set]
    log_path = output_dir / "crawl.log"
    stats_path = output_dir / "scrapy-stats.json"
    stats_path.unlink(missing_ok=True)

    with LocalHosts([spec for _, spec in host_set], process=True) as hosts:
        start_urls = [hosts.page_url(i, 0) for i in range(len(hosts))]
        for i, label in enumerate(labels):
            print(f"  {hosts.url(i):<28} {label}")
        mode = "stock Scrapy" if args.stock else "scrapy-hostqueue"
        print(
            f"crawling up to {args.pages} pages with {mode} (log: {log_path}) ...",
            flush=True,
        )
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
            result = run_crawl(command, log_path, args.timeout)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        # A hanging host may never go idle: report what the server saw so far.
        with contextlib.suppress(TimeoutError):
            hosts.wait_idle(timeout=5)
        all_stats = hosts.all_stats()

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
        "hosts": [
            {"label": label, "spec": spec.to_dict(), "stats": stats.to_dict()}
            for (label, spec), stats in zip(host_set, all_stats, strict=True)
        ],
    }
    (output_dir / "hosts.json").write_text(json.dumps(report, indent=2))

    print()
    print(host_table(labels, all_stats))
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
    problem = (
        f"timed out after {args.timeout:g} s"
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
    return result.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
