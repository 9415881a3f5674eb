"""``python -m scrapy_hostqueue``: the command line.

``plot FILE -o OUT.png|OUT.html`` draws a host timeline
(``HOSTQUEUE_TIMELINE_FILE``); the chart itself is :mod:`scrapy_hostqueue._plot`.
``frontier PATH`` prints what a frontier file (``HOSTQUEUE_FRONTIER``) holds;
``frontier redis://... --crawl-id ID`` what a shared crawl holds, and ``push
redis://... --crawl-id ID URL...`` feeds it (see :mod:`scrapy_hostqueue.frontier`);
``monitor redis://... --crawl-id ID`` serves its live monitor from Redis.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from scrapy_hostqueue import frontier
from scrapy_hostqueue._plot import plot
from scrapy_hostqueue.exceptions import (
    FrontierFileError,
    PlotError,
    RedisFrontierError,
    TimelineError,
)

if TYPE_CHECKING:
    from collections.abc import Sequence


#: A location argument of this form is read from the environment variable
#: it names, so that a Redis URL with a password stays out of the process
#: list, where every user of the machine sees command lines.
ENV_PREFIX = "env:"


def _location(parser: argparse.ArgumentParser, value: str) -> str:
    """*value*, or with :data:`ENV_PREFIX`, the environment variable it names."""
    if not value.startswith(ENV_PREFIX):
        return value
    name = value[len(ENV_PREFIX) :]
    found = os.environ.get(name, "")
    if not name or not found:
        parser.error(f"{value}: the environment variable {name or '(no name)'} is not set")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scrapy_hostqueue",
        description="scrapy-hostqueue tools",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    plot_parser = commands.add_parser(
        "plot",
        help="draw a host timeline (HOSTQUEUE_TIMELINE_FILE)",
        description="Draw requests in flight and responses per second per host over time.",
    )
    plot_parser.add_argument("file", help="a timeline written with HOSTQUEUE_TIMELINE_FILE")
    plot_parser.add_argument(
        "-o",
        "--output",
        required=True,
        help="OUT.png (needs matplotlib) or OUT.html (self-contained)",
    )
    plot_parser.add_argument(
        "--hosts",
        type=int,
        default=10,
        help="hosts drawn with their own line (default 10, the rest add up)",
    )
    frontier_parser = commands.add_parser(
        "frontier",
        help="print what a frontier file holds",
        description="Queued and leased requests per host, blocked hosts and until when, "
        "learned limits: what a frontier file (HOSTQUEUE_FRONTIER) holds. Also while a "
        "crawl runs on it.",
    )
    frontier_parser.add_argument(
        "path",
        help="the frontier file, its JOBDIR, sqlite:///path/to/frontier.db, or "
        "redis://host:port/db with --crawl-id; env:NAME reads it from the environment "
        "variable NAME",
    )
    frontier_parser.add_argument(
        "--top", type=int, default=10, help="hosts listed per section (default 10)"
    )
    frontier_parser.add_argument("--crawl-id", help="the shared crawl (HOSTQUEUE_CRAWL_ID)")
    push_parser = commands.add_parser(
        "push",
        help="add URLs to a shared crawl on Redis",
        description="Queue URLs in a shared crawl (HOSTQUEUE_FRONTIER = 'redis://...'), "
        "through its dupefilter, for its spider's default callback.",
    )
    push_parser.add_argument(
        "url",
        help="redis://host:port/db; env:NAME reads it from the environment variable NAME",
    )
    push_parser.add_argument("--crawl-id", required=True, help="HOSTQUEUE_CRAWL_ID")
    push_parser.add_argument("urls", nargs="*", help="URLs; none: one a line on standard input")
    push_parser.add_argument("--priority", type=int, default=0, help="Request.priority")
    push_parser.add_argument(
        "--requests",
        metavar="FILE",
        help="also the requests of FILE, as a crawl wrote them when Redis lost the crawl "
        "or was full (their callbacks, meta and priority kept)",
    )
    monitor_parser = commands.add_parser(
        "monitor",
        help="serve the live monitor of a shared crawl on Redis",
        description="Serve the page of a shared crawl (HOSTQUEUE_FRONTIER = 'redis://...') "
        "from what its processes publish to Redis, with no crawl in this process, until "
        "Ctrl-C. Prints the page's URL, with its token.",
    )
    monitor_parser.add_argument(
        "url", help="redis://host:port/db; env:NAME reads it from the environment variable NAME"
    )
    monitor_parser.add_argument("--crawl-id", required=True, help="HOSTQUEUE_CRAWL_ID")
    monitor_parser.add_argument(
        "--bind", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)"
    )
    monitor_parser.add_argument(
        "--port", type=int, default=0, help="the port to listen on (default: a free one)"
    )
    monitor_parser.add_argument(
        "--hosts", type=int, default=50, help="hosts shown one by one (default 50)"
    )
    monitor_parser.add_argument(
        "--controls",
        action="store_true",
        help="let the page block, limit and give up hosts and pause the crawl "
        "(the crawl's processes need HOSTQUEUE_MONITOR_CONTROLS = True too)",
    )
    # URLs may come after --crawl-id, where argparse no longer takes them.
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command != "push" or any(arg.startswith("-") for arg in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "push":
        url = _location(push_parser, args.url)
        urls = args.urls + extra
        if not urls and not args.requests:
            urls = [line.strip() for line in sys.stdin if line.strip()]
        try:
            queued, duplicates = frontier.push(
                url, args.crawl_id, urls, priority=args.priority, requests_file=args.requests
            )
        except OSError as error:
            print(f"error: cannot read {args.requests}: {error.strerror}", file=sys.stderr)
            return 2
        except (RedisFrontierError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"queued {queued}, {duplicates} already seen")
        return 0
    if args.command == "monitor":
        return _monitor(monitor_parser, args)
    if args.command == "frontier":
        if args.top < 1:
            parser.error("--top must be >= 1")
        path = _location(frontier_parser, args.path)
        if frontier.is_shared(path) and not args.crawl_id:
            parser.error("a Redis URL needs --crawl-id")
        try:
            print(frontier.report(path, crawl_id=args.crawl_id, top=args.top))
        except (FrontierFileError, RedisFrontierError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0
    if args.hosts < 1:
        parser.error("--hosts must be >= 1")
    try:
        plot(args.file, args.output, max_lines=args.hosts)
    except TimelineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except PlotError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}")
    return 0


def _monitor(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import asyncio  # noqa: PLC0415 - only this command needs them
    import ipaddress  # noqa: PLC0415

    from scrapy_hostqueue.monitor._shared import serve  # noqa: PLC0415

    if args.hosts < 1:
        parser.error("--hosts must be >= 1")
    if not 0 <= args.port <= 65_535:
        parser.error("--port must be from 0 to 65535")
    try:
        ipaddress.ip_address(args.bind)
    except ValueError:
        parser.error(f"--bind must be an IP address, got {args.bind!r}")
    url = _location(parser, args.url)
    if not frontier.is_shared(url):
        parser.error(f"{args.url}: not a Redis URL (redis://, rediss://)")
    try:
        asyncio.run(serve(url, args.crawl_id, args.bind, args.port, args.hosts, args.controls))
    except KeyboardInterrupt:
        return 0
    except (RedisFrontierError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
