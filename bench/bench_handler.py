"""Pages per second of one crawl with three download handlers (CPU efficiency).

The same crawl (start requests spread over local hosts that answer at once, a
1 KB page each, Scrapy's stock scheduler) runs with:

A. scrapy_hostqueue.AiohttpDownloadHandler
B. Scrapy's HTTP11DownloadHandler (the default)
C. Scrapy's own aiohttp handler (scrapy.core.downloader.handlers._aiohttp)

alternating A B C A B C ..., each crawl in a fresh process under
AsyncCrawlerProcess (Scrapy's aiohttp handler needs the running loop at start).
The hosts are served by another process, so the crawler has a core of its own.
Prints per run the pages per second of wall time and per second of the
crawler's CPU time (wall: from spider_opened to the last response; CPU: from
spider_opened to spider_closed), then the medians
and the ratios. The CPU figure is the steadier one on a busy machine; the load
average is printed with the results.

    python bench/bench_handler.py                 # about a minute
    python bench/bench_handler.py --repeats 5 --pages 4000
"""

from __future__ import annotations

import argparse
import asyncio
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


# -- one crawl (a child process) ------------------------------------------------


def _crawl(handler: str, urls_file: str, concurrency: int, per_host: int) -> None:
    import scrapy
    from scrapy import signals
    from scrapy.crawler import AsyncCrawlerProcess

    urls = json.loads(Path(urls_file).read_text())
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

    process = AsyncCrawlerProcess(
        {
            "DOWNLOAD_HANDLERS": {"http": handler, "https": handler},
            "CONCURRENT_REQUESTS": concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": per_host,
            "LOG_LEVEL": "ERROR",
            "TELNETCONSOLE_ENABLED": False,
            "REMOTE_CONTROL_ENABLED": False,
            "LOGSTATS_INTERVAL": 0,
            **json.loads(os.environ.get("BENCH_EXTRA_SETTINGS", "{}")),
        }
    )
    crawler = process.create_crawler(Pages)
    crawler.signals.connect(opened, signal=signals.spider_opened)
    crawler.signals.connect(closed, signal=signals.spider_closed)
    process.crawl(crawler)
    process.start()
    assert crawler.stats is not None
    stats = crawler.stats.get_stats()
    print(
        json.dumps(
            {
                "pages": stats.get("response_received_count", 0),
                "errors": stats.get("log_count/ERROR", 0),
                "seconds": marks.get("last", 0.0) - marks.get("first", 0.0),
                "cpu_seconds": marks.get("closed_cpu", 0.0) - marks.get("first_cpu", 0.0),
            }
        )
    )


# -- the driver -------------------------------------------------------------------


def _environment() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if "proxy" not in name.lower()}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--pages", type=int, default=2000, help="pages per crawl")
    parser.add_argument("--repeats", type=int, default=3, help="crawls per handler")
    parser.add_argument("--concurrency", type=int, default=32, help="CONCURRENT_REQUESTS")
    parser.add_argument("--per-host", type=int, default=4, help="CONCURRENT_REQUESTS_PER_DOMAIN")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--crawl", help=argparse.SUPPRESS)
    parser.add_argument("--urls-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return
    if args.crawl:
        _crawl(args.crawl, args.urls_file, args.concurrency, args.per_host)
        return

    env = _environment()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(args.hosts)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        ports = json.loads(server.stdout.readline())
        urls = [
            f"http://127.0.0.{n % args.hosts + 2}:{ports[n % args.hosts]}/page/{n}"
            for n in range(args.pages)
        ]
        urls_file = ROOT / "bench" / ".bench_handler_urls.json"
        urls_file.write_text(json.dumps(urls))
        print(
            f"{args.pages} pages over {args.hosts} local hosts (0 ms), "
            f"CONCURRENT_REQUESTS={args.concurrency}, "
            f"CONCURRENT_REQUESTS_PER_DOMAIN={args.per_host}, stock scheduler, "
            f"{args.repeats} crawls per handler, alternating"
        )
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        rates: dict[str, list[float]] = {name: [] for name in HANDLERS}
        cpu_rates: dict[str, list[float]] = {name: [] for name in HANDLERS}
        for repeat in range(args.repeats):
            for name, path in HANDLERS.items():
                command = [
                    sys.executable,
                    __file__,
                    "--crawl",
                    path,
                    "--urls-file",
                    str(urls_file),
                    "--concurrency",
                    str(args.concurrency),
                    "--per-host",
                    str(args.per_host),
                ]
                run = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
                lines = run.stdout.strip().splitlines()
                if run.returncode or not lines:
                    sys.exit(f"{name} crawl failed:\n{run.stdout}\n{run.stderr}")
                result = json.loads(lines[-1])
                if result["pages"] != args.pages or result["errors"]:
                    sys.exit(f"{name} crawl incomplete: {result}\n{run.stderr}")
                rate = result["pages"] / result["seconds"]
                cpu_rate = result["pages"] / result["cpu_seconds"]
                rates[name].append(rate)
                cpu_rates[name].append(cpu_rate)
                print(
                    f"  run {repeat + 1} {name:<15} {rate:6.0f} pages/s"
                    f"  {cpu_rate:6.0f} pages/CPU-s"
                )
        urls_file.unlink()
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(10)
    print(f"load average after: {os.getloadavg()[0]:.2f}")

    for label, table in (("pages/s", rates), ("pages/CPU-s", cpu_rates)):
        medians = {name: statistics.median(values) for name, values in table.items()}
        ours = medians["hostqueue"]
        print(
            f"median {label}: "
            + ", ".join(f"{name} {value:.0f}" for name, value in medians.items())
            + f"; hostqueue/http11 = {ours / medians['http11']:.2f}"
            + f", hostqueue/scrapy-aiohttp = {ours / medians['scrapy-aiohttp']:.2f}"
        )


if __name__ == "__main__":
    main()
