"""Command line of the local test hosts; ``--help`` documents the spec language."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import NoReturn
from urllib.parse import urlsplit

from scrapy_hostqueue import testing
from scrapy_hostqueue.testing._hosts import ControlError, control_request
from scrapy_hostqueue.testing._server import CONTROL_PREFIX, HostGroup
from scrapy_hostqueue.testing._spec import HostSpec, SpecError, format_spec, parse_specs
from scrapy_hostqueue.testing._state import host_address

PROG = "python -m scrapy_hostqueue.testing"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _offset(text: str) -> int:
    try:
        value = int(text)
        host_address(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a host index: {text!r}") from None
    return value


def _build_parser() -> _Parser:
    doc = testing.__doc__ or ""
    language = doc[doc.index("Host spec mini-language") :]
    parser = _Parser(
        prog=PROG,
        description="Local multi-host HTTP/1.1 test server, one loopback address per host.",
        epilog=language,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve hosts until Ctrl-C",
        description="Start the hosts, print their URLs and serve until Ctrl-C.",
        epilog=language,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--hosts",
        action="append",
        required=True,
        metavar="SPEC",
        help='host spec, e.g. "3x latency=10ms; latency=1s" (repeatable)',
    )
    serve.add_argument("--offset", type=_offset, default=0, help="first host index (default 0)")
    serve.add_argument("--json", action="store_true", help="print the hosts as one JSON line")
    stats = commands.add_parser("stats", help="print a running host's stats as JSON")
    stats.add_argument("url", help="any URL of the host, e.g. http://127.0.0.2:PORT/")
    stats.add_argument("--all", action="store_true", help="every host of the server")
    stats.add_argument(
        "--no-arrivals", action="store_true", help="leave out the arrival timestamps"
    )
    reset = commands.add_parser("reset", help="zero a running host's counters")
    reset.add_argument("url", help="any URL of the host")
    reset.add_argument("--all", action="store_true", help="every host of the server")
    return parser


def _host_port(parser: _Parser, url: str) -> tuple[str, int]:
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        port = parts.port
    except ValueError as error:
        parser.error(f"bad URL {url!r}: {error}")
    if parts.scheme != "http" or not parts.hostname or port is None:
        parser.error(f"expected a host URL like http://127.0.0.2:8080/, got {url!r}")
    return parts.hostname, port


async def _serve(specs: list[HostSpec], offset: int, as_json: bool) -> int:
    group = HostGroup(specs, offset=offset)
    try:
        await group.start()
    except OSError as error:
        print(f"{PROG}: error: cannot bind the hosts: {error}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    hosts = [
        {
            "index": state.index,
            "url": f"http://{state.hostname}:{state.port}/",
            "spec": format_spec(state.spec),
        }
        for state in group.states
    ]
    if as_json:
        print(json.dumps({"hosts": hosts}), flush=True)
    else:
        for host in hosts:
            print(f"host {host['index']:<4} {host['url']:<28} {host['spec'] or '(defaults)'}")
        first = next((h["url"] for h, s in zip(hosts, specs, strict=True) if not s.refuse), None)
        if first is not None:
            print(f"stats: {PROG} stats {first}")
        print(f"serving {len(hosts)} host(s); Ctrl-C to stop", flush=True)
    try:
        await stop.wait()
    finally:
        await group.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        specs: list[HostSpec] = []
        for text in args.hosts:
            try:
                specs.extend(parse_specs(text))
            except SpecError as error:
                parser.error(f"--hosts {text!r}: {error}")
        try:
            host_address(args.offset + len(specs) - 1)
        except ValueError as error:
            parser.error(str(error))
        return asyncio.run(_serve(specs, args.offset, args.json))
    hostname, port = _host_port(parser, args.url)
    scope = "?host=all" if args.all else ""
    try:
        if args.command == "stats":
            arrivals = "arrivals=0" if args.no_arrivals else ""
            query = "&".join(filter(None, [scope.lstrip("?"), arrivals]))
            path = f"{CONTROL_PREFIX}stats" + (f"?{query}" if query else "")
            result = control_request(hostname, port, "GET", path)
        else:
            result = control_request(hostname, port, "POST", f"{CONTROL_PREFIX}reset{scope}")
    except ControlError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
