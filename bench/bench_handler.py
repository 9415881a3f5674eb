"""Pages per second of one crawl with three download handlers (CPU efficiency).

The same crawl (start requests spread over local hosts that answer at once, a
1 KB page each, Scrapy's stock scheduler) runs with:

A. scrapy_hostqueue.AiohttpDownloadHandler
B. Scrapy's HTTP11DownloadHandler (the default)
C. Scrapy's own aiohttp handler (scrapy.core.downloader.handlers._aiohttp)

in rounds A B C, A B C, ... in one crawler process (AsyncCrawlerRunner on the
asyncio reactor: Scrapy's aiohttp handler needs the running loop at start).
The hosts are served by another process, so the crawler has a core of its own.
Prints per run the pages per second of wall time (spider_opened to the last
response) and of the crawler's CPU time (spider_opened to spider_closed), then
the medians and the medians of the per-round ratios: each ratio compares
crawls run seconds apart, which cancels most of the drift of a busy machine
(the load average is printed too).

    python bench/bench_handler.py                 # about a minute
    python bench/bench_handler.py --rounds 15 --pages 2000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HANDLERS = {
    "hostqueue": "scrapy_hostqueue.AiohttpDownloadHandler",
    "http11": "scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler",
    "scrapy-aiohttp": "scrapy.core.downloader.handlers._aiohttp.AiohttpDownloadHandler",
}
ROOT = Path(__file__).resolve().parent.parent
PAGE = b"<html><body>" + b"x" * 1000 + b"</body></html>"


# -- the hosts (a child process) ----------------------------------------------


async def _serve(hosts: int) -> None:
    response = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
        b"Content-Length: " + str(len(PAGE)).encode() + b"\r\n\r\n" + PAGE
    )

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")  # GET requests: no body
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    ports = []
    for index in range(hosts):
        server = await asyncio.start_server(connection, f"127.0.0.{index + 2}", 0)
        ports.append(server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    # Serve until the parent closes stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


# -- the crawls (this process) ----------------------------------------------------


async def _crawl(handler: str, urls: list[str], args: argparse.Namespace) -> dict[str, float]:
    import scrapy
    from scrapy import signals
    from scrapy.crawler import AsyncCrawlerRunner

    marks: dict[str, float] = {}

    class Pages(scrapy.Spider):
        name = "pages"

        async def start(self) -> Any:
            for url in urls:
                yield scrapy.Request(url, dont_filter=True)

        def parse(self, response: Any) -> None:
            marks["last"] = time.perf_counter()

    def opened(spider: Any) -> None:
        marks["first"] = time.perf_counter()
        marks["first_cpu"] = time.process_time()

    def closed(spider: Any) -> None:
        # Read once: the CPU clock is a system call, too slow to read per page.
        marks["closed_cpu"] = time.process_time()

    runner = AsyncCrawlerRunner(
        {
            "DOWNLOAD_HANDLERS": {"http": handler, "https": handler},
            "CONCURRENT_REQUESTS": args.concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": args.per_host,
            "TELNETCONSOLE_ENABLED": False,
            "REMOTE_CONTROL_ENABLED": False,
            "LOGSTATS_INTERVAL": 0,
            "LOG_LEVEL": "ERROR",
        }
    )
    crawler = runner.create_crawler(Pages)
    crawler.signals.connect(opened, signal=signals.spider_opened)
    crawler.signals.connect(closed, signal=signals.spider_closed)
    await runner.crawl(crawler)
    assert crawler.stats is not None
    stats = crawler.stats.get_stats()
    pages = stats.get("response_received_count", 0)
    if pages != len(urls) or stats.get("log_count/ERROR"):
        raise RuntimeError(f"{handler}: incomplete crawl: {stats}")
    return {
        "pages/s": pages / (marks["last"] - marks["first"]),
        "pages/CPU-s": pages / (marks["closed_cpu"] - marks["first_cpu"]),
    }


async def _rounds(args: argparse.Namespace, urls: list[str]) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {name: [] for name in HANDLERS}
    for path in HANDLERS.values():  # warm-up: imports, first connections
        await _crawl(path, urls[: len(urls) // 4], args)
    for number in range(args.rounds):
        for name, path in HANDLERS.items():
            # Each crawl starts without the previous one's garbage.
            gc.collect()
            result = await _crawl(path, urls, args)
            results[name].append(result)
            print(
                f"  round {number + 1:>2} {name:<15} {result['pages/s']:6.0f} pages/s"
                f"  {result['pages/CPU-s']:6.0f} pages/CPU-s",
                flush=True,
            )
    return results


def _report(results: dict[str, list[dict[str, float]]]) -> None:
    for metric in ("pages/s", "pages/CPU-s"):
        medians = {
            name: statistics.median(run[metric] for run in runs) for name, runs in results.items()
        }
        ratios = {
            other: statistics.median(
                ours[metric] / theirs[metric]
                for ours, theirs in zip(results["hostqueue"], results[other], strict=True)
            )
            for other in ("http11", "scrapy-aiohttp")
        }
        print(
            f"median {metric}: "
            + ", ".join(f"{name} {value:.0f}" for name, value in medians.items())
            + "; median ratio per round: "
            + ", ".join(f"hostqueue/{other} {ratio:.2f}" for other, ratio in ratios.items())
        )


# -- the driver -------------------------------------------------------------------


def _environment() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if "proxy" not in name.lower()}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--pages", type=int, default=1000, help="pages per crawl")
    parser.add_argument("--rounds", type=int, default=9, help="crawls per handler")
    parser.add_argument("--concurrency", type=int, default=32, help="CONCURRENT_REQUESTS")
    parser.add_argument("--per-host", type=int, default=4, help="CONCURRENT_REQUESTS_PER_DOMAIN")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return

    for name in [n for n in os.environ if "proxy" in n.lower()]:
        del os.environ[name]  # aiohttp would send loopback requests to a proxy
    sys.path.insert(0, str(ROOT))
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(args.hosts)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_environment(),
    )
    try:
        assert server.stdout is not None
        ports = json.loads(server.stdout.readline())
        urls = [
            f"http://127.0.0.{n % args.hosts + 2}:{ports[n % args.hosts]}/page/{n}"
            for n in range(args.pages)
        ]
        print(
            f"{args.pages} pages over {args.hosts} local hosts (0 ms), "
            f"CONCURRENT_REQUESTS={args.concurrency}, "
            f"CONCURRENT_REQUESTS_PER_DOMAIN={args.per_host}, stock scheduler, "
            f"{args.rounds} rounds of A B C; load average before: {os.getloadavg()[0]:.2f}"
        )
        from scrapy.utils.defer import deferred_from_coro
        from scrapy.utils.log import configure_logging
        from scrapy.utils.reactor import install_reactor

        configure_logging({"LOG_LEVEL": "ERROR"})
        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
        from twisted.internet import reactor

        outcome: list[Any] = []
        done = deferred_from_coro(_rounds(args, urls))
        done.addBoth(outcome.append)
        done.addBoth(lambda _: reactor.stop())  # type: ignore[attr-defined]
        reactor.run()  # type: ignore[attr-defined]
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(10)
    if not outcome or not isinstance(outcome[0], dict):
        sys.exit(f"benchmark failed: {outcome[0] if outcome else 'no result'}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    _report(outcome[0])


if __name__ == "__main__":
    main()
