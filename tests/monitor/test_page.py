"""The monitor's page in a real browser during a real crawl.

Debian's ``chromium``, headless, finds the header and a row per host, and
with the controls on, the controls.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue.monitor.extension import HostQueueMonitor
from scrapy_hostqueue.testing import HostSpec
from scrapy_hostqueue.testing._browser import headless_chromium
from tests.helpers.crawling import ADDON, HostsFactory, PageSpider, settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.crawl,
    pytest.mark.skipif(
        CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium; CI installs it)"
    ),
]


async def render(url: str, *, width: int = 1280, screenshot: str | None = None) -> str:
    """Return the page's DOM after it ran its script for a few (virtual) seconds.

    From a headless chromium that talks to nothing but *url*.
    """
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        arguments = headless_chromium(CHROMIUM, profile, width, 900)
        arguments += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        process = await asyncio.create_subprocess_exec(
            *arguments,
            url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), 60)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise
    assert process.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode()


def controlled_crawler(**extra: Any) -> Any:
    """Return a crawler with the add-on, the monitor's controls on."""
    return get_crawler(
        PageSpider,
        settings(
            ADDONS=ADDON,
            TWISTED_REACTOR="twisted.internet.asyncioreactor.AsyncioSelectorReactor",
            HOSTQUEUE_LOG_INTERVAL=0,
            HOSTQUEUE_MONITOR_CONTROLS=True,
            **extra,
        ),
    )


async def monitor_once(crawler: Any, ready: Callable[[], bool]) -> HostQueueMonitor:
    """Return the crawl's monitor once it serves and *ready* says the crawl got going."""
    for _ in range(150):
        monitors = [
            m
            for m in getattr(crawler.extensions, "middlewares", ())
            if isinstance(m, HostQueueMonitor)
        ]
        if monitors and monitors[0].url and ready():
            return monitors[0]
        await asyncio.sleep(0.1)
    raise AssertionError("the monitor did not start, or the crawl did not get going")


@deferred_f_from_coro_f
async def test_the_page_in_a_browser_during_a_crawl(local_hosts: HostsFactory) -> None:
    hosts = local_hosts(
        [
            HostSpec(latency=0.1, links=3),
            HostSpec(latency=0.1, links=3),
            HostSpec(latency=0.05, links=3, throttle_above=1, retry_after="20"),
        ]
    )
    crawler = controlled_crawler()
    seen: dict[str, Any] = {}

    async def look() -> None:
        try:
            monitor = await monitor_once(
                crawler, lambda: crawler.stats.get_value("response_received_count", 0) > 20
            )
            # With a host's detail open (as a click on its row does).
            seen["dom"] = await render(f"{monitor.url}#host={hosts.hostnames[0]}")
        finally:
            await crawler.stop_async()

    looker = asyncio.ensure_future(look())
    await crawler.crawl_async(start_urls=[hosts.url(i) for i in range(3)], follow=True)
    await looker

    dom = seen["dom"]
    rows = re.findall(r'<tr class="host[^"]*" data-host="([^"]+)"', dom)
    assert set(hosts.hostnames) <= set(rows), rows
    why = re.search(r'<p id="why">(.*?)</p>', dom, re.S)
    assert why is not None
    assert html.unescape(why.group(1)).startswith("Why not faster? ")
    figures = re.findall(r'<div class="figure"><b>([^<]*)</b><span>([^<]*)</span>', dom)
    labels = [label for _, label in figures]
    assert labels[:2] == ["pages/s", "in flight"], figures
    states = re.findall(r'<span class="pill state ([\w-]+)">', dom)
    assert "retry-after" in states or "backoff" in states, states
    # The controls: pause and resume in the header, a host's in its detail.
    assert re.search(r'<div class="actions" id="crawl-controls">', dom), dom[:3000]
    assert '<button type="button" id="pause">Pause the crawl</button>' in dom
    assert re.search(r'<section id="host-controls">', dom)
    assert f'<span id="control-host">{hosts.hostnames[0]}</span>' in dom
    for label in ("Block", "Unblock", "Set ceiling", "Give up"):
        assert f">{label}</button>" in dom, label


class DevTools:
    """A headless chromium on *url*, driven through its DevTools protocol."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._next = 0

    async def __aenter__(self) -> DevTools:
        assert CHROMIUM is not None
        self._profile = tempfile.TemporaryDirectory()
        arguments = [
            argument
            for argument in headless_chromium(CHROMIUM, self._profile.name, 1280, 900)
            if not argument.startswith("--virtual-time-budget")
        ]
        self._process = await asyncio.create_subprocess_exec(
            *arguments,
            "--remote-debugging-port=0",
            self.url,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self._process.stderr is not None
        while True:
            line = (await asyncio.wait_for(self._process.stderr.readline(), 30)).decode()
            assert line, "chromium ended without its DevTools address"
            found = re.search(r"ws://127\.0\.0\.1:(\d+)/", line)
            if found:
                break
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{found.group(1)}/json") as answer:
            page = next(t for t in await answer.json() if t["type"] == "page")
        self._socket = await self._session.ws_connect(page["webSocketDebuggerUrl"])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._socket.close()
        await self._session.close()
        self._process.kill()
        await self._process.wait()
        self._profile.cleanup()

    async def run(self, expression: str) -> Any:
        """Return what the page's *expression* evaluates to."""
        self._next += 1
        await self._socket.send_json(
            {
                "id": self._next,
                "method": "Runtime.evaluate",
                "params": {"expression": expression, "returnByValue": True},
            }
        )
        while True:
            message = json.loads((await asyncio.wait_for(self._socket.receive(), 30)).data)
            if message.get("id") == self._next:
                return message["result"]["result"].get("value")


@deferred_f_from_coro_f
async def test_the_controls_in_a_browser_during_a_crawl(local_hosts: HostsFactory) -> None:
    hosts = local_hosts([HostSpec(latency=0.05, links=3, pages=150)])
    crawler = controlled_crawler(HOSTQUEUE_AIMD_CEILING=2)
    seen: dict[str, Any] = {}

    async def click() -> None:
        try:
            monitor = await monitor_once(crawler, lambda: hosts.stats(0).served >= 5)
            assert monitor.url is not None
            async with DevTools(monitor.url) as page:
                for _ in range(100):
                    if await page.run("document.getElementById('crawl-controls').hidden === false"):
                        break
                    await asyncio.sleep(0.1)
                await page.run("document.getElementById('pause').click()")
                # Past the next refresh of the page.
                await asyncio.sleep(2.5)
                seen["paused"] = monitor.controller is not None and monitor.controller.hosts.paused
                seen["results"] = await page.run("document.getElementById('results').innerText")
                seen["states"] = await page.run("document.getElementById('states').innerText")
                seen["served_paused"] = hosts.stats(0).served
                await page.run("document.getElementById('resume').click()")
                for _ in range(50):
                    text = await page.run("document.getElementById('results').innerText")
                    if "resume" in text:
                        break
                    await asyncio.sleep(0.1)
                seen["after"] = text
        except BaseException:
            await crawler.stop_async()
            raise

    clicker = asyncio.ensure_future(click())
    await crawler.crawl_async(start_urls=[hosts.url(0)], follow=True)
    await clicker

    assert seen["paused"] is True
    # The answer stays under the header through the page's refreshes.
    assert "pause: paused: no new request is handed out" in seen["results"]
    assert "crawl paused" in seen["states"]
    assert seen["served_paused"] < 150
    assert "resume: resumed" in seen["after"]
    assert "pause: paused" in seen["after"]
    assert hosts.stats(0).served == 150
    assert crawler.stats.get_value("finish_reason") == "finished"
