"""``python -m scrapy_hostqueue``: the command line.

``plot FILE -o OUT.png|OUT.html`` draws a host timeline
(``HOSTQUEUE_TIMELINE_FILE``); the chart itself is :mod:`scrapy_hostqueue.plot`.
``frontier PATH`` prints what a frontier file (``HOSTQUEUE_FRONTIER``) holds.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from scrapy_hostqueue._frontier_report import report
from scrapy_hostqueue.plot import PlotError, plot
from scrapy_hostqueue.store._sqlfile import FrontierFileError
from scrapy_hostqueue.timeline import TimelineError

if TYPE_CHECKING:
    from collections.abc import Sequence


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
        "path", help="the frontier file, its JOBDIR, or sqlite:///path/to/frontier.db"
    )
    frontier_parser.add_argument(
        "--top", type=int, default=10, help="hosts listed per section (default 10)"
    )
    args = parser.parse_args(argv)
    if args.command == "frontier":
        if args.top < 1:
            parser.error("--top must be >= 1")
        try:
            print(report(args.path, top=args.top))
        except FrontierFileError as error:
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


if __name__ == "__main__":
    sys.exit(main())
