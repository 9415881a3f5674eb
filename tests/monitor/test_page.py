"""The monitor's page in a real browser during a real crawl.

Debian's ``chromium``, headless, finds the header and a row per host, and
with the controls on, the controls.
"""

from __future__ import annotations

import asyncio
import html
import re
import shutil
import tempfile
from typing import Any

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


@deferred_f_from_coro_f
async def test_the_page_in_a_browser_during_a_crawl(local_hosts: HostsFactory) -> None:
    hosts = local_hosts(
        [
            HostSpec(latency=0.1, links=3),
            HostSpec(latency=0.1, links=3),
            HostSpec(latency=0.05, links=3, throttle_above=1, retry_after="20"),
        ]
    )
    crawler = get_crawler(
        PageSpider,
        settings(
            ADDONS=ADDON,
            TWISTED_REACTOR="twisted.internet.asyncioreactor.AsyncioSelectorReactor",
            HOSTQUEUE_LOG_INTERVAL=0,
            HOSTQUEUE_MONITOR_CONTROLS=True,
        ),
    )
    seen: dict[str, Any] = {}

    async def look() -> None:
        try:
            for _ in range(150):
                monitors = [
                    m
                    for m in getattr(crawler.extensions, "middlewares", ())
                    if isinstance(m, HostQueueMonitor)
                ]
                if (
                    monitors
                    and monitors[0].url
                    and crawler.stats.get_value("response_received_count", 0) > 20
                ):
                    break
                await asyncio.sleep(0.1)
            # With a host's detail open (as a click on its row does).
            seen["dom"] = await render(f"{monitors[0].url}#host={hosts.hostnames[0]}")
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
