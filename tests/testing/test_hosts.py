"""Tests of the local multi-host test server, ``scrapy_hostqueue.testing``.

Clients are raw asyncio sockets (exact control over what arrives) and aiohttp
(keep-alive). Tests that need requests held in flight give the host a long latency,
wait until the server reports them in flight, then ``set_spec`` a zero latency, so
counts never depend on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_hostqueue.testing import (
    HostSpec,
    LocalHosts,
    SpecError,
    format_spec,
    host_address,
    parse_spec,
    parse_specs,
)
from scrapy_hostqueue.testing.__main__ import main as cli_main
from scrapy_hostqueue.testing._state import HostState
from tests.helpers import ROOT
from tests.helpers.crawling import until

TEST_TIMEOUT = 30.0
LONG = 60.0  # a latency no test waits out: set_spec releases the requests

Factory = Callable[..., LocalHosts]


def async_test(
    function: Callable[..., Awaitable[None]],
) -> Callable[..., Any]:
    """Run an async test on the reactor's asyncio loop, bounded by TEST_TIMEOUT."""

    @functools.wraps(function)
    async def bounded(*args: Any, **kwargs: Any) -> None:
        await asyncio.wait_for(function(*args, **kwargs), TEST_TIMEOUT)

    return deferred_f_from_coro_f(bounded)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


async def fetch(url: str, *, method: str = "GET", timeout: float = 10.0) -> Answer:
    """One request on a fresh connection (``Connection: close``)."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        request = (
            f"{method} {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(request.encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status_line, *lines = head.decode("latin-1").strip().split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = b""
        if method != "HEAD":
            body = await asyncio.wait_for(reader.readexactly(length), timeout)
        return Answer(int(status_line.split()[1]), headers, body)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def settle(hosts: LocalHosts) -> None:
    """Wait until the server has finished its accounting of every answered request.

    A client may read a response before the server's write call returns, so
    counts are read after in-flight drops to zero.
    """
    await until(lambda: all(s.in_flight == 0 for s in hosts.all_stats(arrivals=False)))


# -- addresses and pages -------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "address"),
    [
        (0, "127.0.0.1"),
        (1, "127.0.0.2"),
        (253, "127.0.0.254"),
        (254, "127.0.1.1"),
        (254 * 256, "127.1.0.1"),
    ],
)
def test_host_addresses(index: int, address: str) -> None:
    assert host_address(index) == address


def test_hosts_listen_on_distinct_addresses(local_hosts: Factory) -> None:
    hosts = local_hosts("3x")
    assert hosts.hostnames == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    for i, hostname in enumerate(hosts.hostnames):
        assert hosts.url(i) == f"http://{hostname}:{hosts.ports[i]}/"
        assert hosts.url(i, "/page/7") == f"http://{hostname}:{hosts.ports[i]}/page/7"
    assert hosts.start_urls(1, 3) == [hosts.page_url(1, n) for n in range(3)]


@async_test
async def test_pages_link_children_and_other_hosts(local_hosts: Factory) -> None:
    hosts = local_hosts([HostSpec(links=3, pages=8, cross_links=1), HostSpec(pages=5), HostSpec()])
    page = await fetch(hosts.page_url(0, 2))
    assert page.status == 200
    assert page.headers["content-type"].startswith("text/html")
    links = re.findall(r'<a href="([^"]+)">', page.body.decode())
    # children of page 2 are 7, 8, 9; only 7 exists on an 8-page site
    assert links == [hosts.page_url(0, 7), hosts.page_url(1, (2 * 3 + 1) % 5)]
    assert (await fetch(hosts.page_url(0, 8))).status == 404
    assert (await fetch(hosts.url(0, "/elsewhere"))).status == 404
    root = await fetch(hosts.url(2))
    assert re.findall(r'<a href="([^"]+)">', root.body.decode()) == [
        hosts.page_url(2, n) for n in (1, 2, 3)
    ]


@async_test
async def test_body_size_gzip_and_head(local_hosts: Factory) -> None:
    hosts = local_hosts([HostSpec(body_size=5000, gzip=True), HostSpec(body_size=0)])
    page = await fetch(hosts.page_url(0, 0))
    assert page.headers["content-encoding"] == "gzip"
    html = gzip.decompress(page.body)
    assert len(html) > 5000
    assert html.startswith(b"<!DOCTYPE html>")
    plain = await fetch(hosts.page_url(1, 0))
    assert "content-encoding" not in plain.headers
    assert len(plain.body) < 1000
    head = await fetch(hosts.page_url(1, 0), method="HEAD")
    assert head.body == b""
    assert int(head.headers["content-length"]) == len(plain.body)


@async_test
async def test_fixed_status(local_hosts: Factory) -> None:
    hosts = local_hosts("status=500")
    answers = [await fetch(hosts.page_url(0, n)) for n in range(3)]
    assert [answer.status for answer in answers] == [500, 500, 500]
    await settle(hosts)
    stats = hosts.stats(0)
    assert stats.statuses == {500: 3}
    assert stats.served == 3


# -- in-flight accounting -------------------------------------------------------


@async_test
async def test_max_in_flight_is_exactly_the_number_of_concurrent_clients(
    local_hosts: Factory,
) -> None:
    hosts = local_hosts([HostSpec(latency=LONG), HostSpec(latency=0)])
    tasks = [asyncio.ensure_future(fetch(hosts.page_url(0, n))) for n in range(50)]
    await until(lambda: hosts.stats(0).in_flight == 50)
    hosts.set_spec(0, HostSpec(latency=0))
    answers = await asyncio.gather(*tasks)
    assert [answer.status for answer in answers] == [200] * 50
    await settle(hosts)
    stats = hosts.stats(0)
    assert stats.max_in_flight == 50
    assert stats.in_flight == 0
    assert stats.requests == stats.served == 50
    assert stats.statuses == {200: 50}
    assert len(stats.arrivals) == 50
    assert hosts.stats(1).requests == 0


@async_test
async def test_keep_alive_reuses_one_connection(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0")
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for n in range(5):
            async with session.get(hosts.page_url(0, n)) as response:
                assert response.status == 200
                assert hosts.page_url(0, 3 * n + 1) in await response.text()
    await settle(hosts)
    stats = hosts.stats(0)
    assert stats.served == 5
    assert stats.connections == 1


@pytest.mark.parametrize("status", [429, 503])
@async_test
async def test_throttle_answers_status_exactly_above_k(local_hosts: Factory, status: int) -> None:
    slow = HostSpec(latency=LONG, throttle_above=3, throttle_status=status)
    hosts = local_hosts([slow])
    held = [asyncio.ensure_future(fetch(hosts.page_url(0, n))) for n in range(3)]
    await until(lambda: hosts.stats(0).in_flight == 3)
    # 4 and then still 4 in flight (the throttled one leaves at once): throttled
    assert (await fetch(hosts.page_url(0, 10))).status == status
    assert (await fetch(hosts.page_url(0, 11))).status == status
    hosts.set_spec(0, HostSpec(latency=0, throttle_above=3, throttle_status=status))
    assert [a.status for a in await asyncio.gather(*held)] == [200, 200, 200]
    # 1 in flight: answered
    assert (await fetch(hosts.page_url(0, 12))).status == 200
    await settle(hosts)
    stats = hosts.stats(0)
    assert stats.statuses == {200: 4, status: 2}
    assert stats.max_in_flight == 4


@async_test
async def test_throttle_under_concurrency_counts_match(local_hosts: Factory) -> None:
    hosts = local_hosts([HostSpec(latency=LONG, throttle_above=3)])
    tasks = [asyncio.ensure_future(fetch(hosts.page_url(0, n))) for n in range(20)]
    await until(lambda: hosts.stats(0).statuses.get(429, 0) == 17)
    hosts.set_spec(0, HostSpec(latency=0, throttle_above=3))
    statuses = sorted(answer.status for answer in await asyncio.gather(*tasks))
    assert statuses == [200] * 3 + [429] * 17


# -- Retry-After ---------------------------------------------------------------


@async_test
async def test_retry_after_window_counts_requests_inside_not_after(
    local_hosts: Factory,
) -> None:
    hosts = local_hosts([HostSpec(latency=0, throttle_above=0, retry_after="1")])
    first = await fetch(hosts.page_url(0, 0))
    assert first.status == 429
    assert first.headers["retry-after"] == "1"
    inside = await fetch(hosts.page_url(0, 1))
    assert hosts.stats(0).in_retry_after_window == 1
    await asyncio.sleep(1.2)  # past the 1 s window the second 429 opened
    after = await fetch(hosts.page_url(0, 2))
    await settle(hosts)
    assert (inside.status, after.status) == (429, 429)
    stats = hosts.stats(0)
    assert stats.in_retry_after_window == 1
    assert stats.requests == 3


@async_test
async def test_retry_after_as_http_date(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0,status=503,retry-after=date:3")
    before = time.time()
    first = await fetch(hosts.page_url(0, 0))
    assert first.status == 503
    when = parsedate_to_datetime(first.headers["retry-after"]).timestamp()
    # rounded up to a whole second, never earlier than 3 s ahead
    assert before + 3 <= when <= time.time() + 4
    await fetch(hosts.page_url(0, 1))
    await settle(hosts)
    assert hosts.stats(0).in_retry_after_window == 1


@async_test
async def test_unparseable_retry_after_is_sent_verbatim_and_opens_no_window(
    local_hosts: Factory,
) -> None:
    hosts = local_hosts('latency=0,status=429,retry-after="soon, maybe"')
    first = await fetch(hosts.page_url(0, 0))
    assert first.headers["retry-after"] == "soon, maybe"
    await fetch(hosts.page_url(0, 1))
    assert hosts.stats(0).in_retry_after_window == 0


@async_test
async def test_no_retry_after_on_success(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0,retry-after=5")
    answer = await fetch(hosts.page_url(0, 0))
    assert answer.status == 200
    assert "retry-after" not in answer.headers
    await fetch(hosts.page_url(0, 1))
    assert hosts.stats(0).in_retry_after_window == 0


# -- robots.txt ----------------------------------------------------------------


@async_test
async def test_robots_txt_with_and_without_crawl_delay(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0,crawl-delay=0.5; latency=0")
    delayed = await fetch(hosts.robots_url(0))
    assert delayed.status == 200
    assert delayed.body.decode().splitlines() == [
        "User-agent: *",
        "Allow: /",
        "Crawl-delay: 0.5",
    ]
    plain = await fetch(hosts.robots_url(1))
    await settle(hosts)
    assert "Crawl-delay" not in plain.body.decode()
    assert "Allow: /" in plain.body.decode()
    stats = hosts.stats(0)
    assert (stats.robots_served, stats.served, stats.requests) == (1, 0, 0)


# -- faults --------------------------------------------------------------------


@async_test
async def test_reset_fault_drops_the_connection(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0,fault=reset")
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await fetch(hosts.page_url(0, 0))
    await until(lambda: hosts.stats(0).resets == 1)
    stats = hosts.stats(0)
    assert (stats.faults, stats.served, stats.in_flight) == (1, 0, 0)


@async_test
async def test_hang_fault_never_answers_until_the_client_leaves(
    local_hosts: Factory,
) -> None:
    hosts = local_hosts("latency=0,fault=hang")
    with pytest.raises(asyncio.TimeoutError):
        await fetch(hosts.page_url(0, 0), timeout=0.3)
    await until(lambda: hosts.stats(0).in_flight == 0)
    stats = hosts.stats(0)
    assert (stats.faults, stats.resets, stats.served) == (1, 1, 0)


@async_test
async def test_truncate_fault_sends_less_than_content_length(
    local_hosts: Factory,
) -> None:
    hosts = local_hosts("latency=0,fault=truncate,body-size=2000")
    with pytest.raises(asyncio.IncompleteReadError) as caught:
        await fetch(hosts.page_url(0, 0))
    assert 0 < len(caught.value.partial) < caught.value.expected  # type: ignore[operator]
    await until(lambda: hosts.stats(0).resets == 1)
    assert hosts.stats(0).served == 0


@async_test
async def test_slow_body_fault_trickles_the_body(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0,fault=slow-body,trickle=0.3,body-size=2000")
    parts = urlsplit(hosts.page_url(0, 0))
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(b"GET /page/0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]
        pieces: list[bytes] = []
        while sum(map(len, pieces)) < length:
            piece = await asyncio.wait_for(reader.read(65536), 5)
            assert piece
            pieces.append(piece)
    finally:
        writer.close()
    assert len(pieces) > 1
    assert b"".join(pieces).endswith(b"</html>")
    await until(lambda: hosts.stats(0).served == 1)
    assert hosts.stats(0).faults == 1


@async_test
async def test_fault_rate_picks_every_kth_request(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0,fault=reset,fault-rate=25%")
    outcomes = []
    for n in range(8):
        try:
            outcomes.append((await fetch(hosts.page_url(0, n))).status)
        except (ConnectionResetError, asyncio.IncompleteReadError):
            outcomes.append(0)
    assert outcomes == [200, 200, 200, 0, 200, 200, 200, 0]
    await until(lambda: hosts.stats(0).resets == 2)
    assert hosts.stats(0).faults == 2


@async_test
async def test_fault_attempts_make_a_fault_transient_per_page(local_hosts: Factory) -> None:
    # Every 2nd page gets the fault on its first 2 requests, then answers.
    hosts = local_hosts("latency=0,fault=reset,fault-rate=50%,fault-attempts=2")
    outcomes = []
    for n in (0, 1, 1, 1, 1, 2, 3, 3, 3, 0):
        try:
            outcomes.append((await fetch(hosts.page_url(0, n))).status)
        except (ConnectionResetError, asyncio.IncompleteReadError):
            outcomes.append(0)
    assert outcomes == [200, 0, 0, 200, 200, 200, 0, 0, 200, 200]
    await settle(hosts)
    stats = hosts.stats(0)
    assert (stats.faults, stats.resets, stats.served) == (4, 4, 6)
    assert stats.pages == {"/page/0": 2, "/page/1": 2, "/page/2": 1, "/page/3": 1}
    hosts.reset()
    # After a reset, pages are picked afresh: the 2nd page asked for now.
    assert (await fetch(hosts.page_url(0, 3))).status == 200
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await fetch(hosts.page_url(0, 1))


def test_an_answer_a_client_has_read_is_counted(local_hosts: Factory) -> None:
    # Read right after the last byte of each answer, the count includes it:
    # the host counts an answer before its last bytes go out. (Counted after
    # them, the client read the counts first in most of these exchanges.)
    hosts = local_hosts("latency=0")
    lagging = 0
    with socket.create_connection((hosts.hostnames[0], hosts.ports[0]), timeout=10) as client:
        stream = client.makefile("rb")
        for n in range(300):
            client.sendall(f"GET /page/{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            length = 0
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            assert len(stream.read(length)) == length
            lagging += hosts.stats(0, arrivals=False).served != n + 1
    assert lagging == 0


def test_an_answer_dropped_after_it_was_counted_counts_as_a_reset() -> None:
    state = HostState(0, HostSpec())
    state.arrive(0.0, "/page/1")
    state.served(200, "/page/1")
    assert (state.snapshot().served, state.snapshot().in_flight) == (1, 1)
    state.finish(None, "/page/1", counted=200)
    stats = state.snapshot()
    assert (stats.served, stats.resets, stats.in_flight) == (0, 1, 0)
    assert (stats.statuses, stats.pages) == ({}, {})


@async_test
async def test_throttle_fault_answers_the_throttle_status_with_retry_after(
    local_hosts: Factory,
) -> None:
    hosts = local_hosts("latency=0,fault=throttle,fault-rate=50%,retry-after=5")
    first = await fetch(hosts.page_url(0, 0))
    second = await fetch(hosts.page_url(0, 1))
    assert (first.status, second.status) == (200, 429)
    assert second.headers["retry-after"] == "5"
    await fetch(hosts.page_url(0, 2))  # inside the window it announced
    await settle(hosts)
    stats = hosts.stats(0)
    assert (stats.faults, stats.statuses[429], stats.in_retry_after_window) == (1, 1, 1)


@async_test
async def test_refusing_host(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0; refuse")
    with pytest.raises(ConnectionRefusedError):
        await fetch(hosts.page_url(1, 0))
    assert (await fetch(hosts.page_url(0, 0))).status == 200
    assert hosts.stats(1).connections == 0


# -- stats ---------------------------------------------------------------------


@async_test
async def test_arrivals_min_gap_and_reset(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0")
    for n in range(3):
        await fetch(hosts.page_url(0, n))
    await settle(hosts)
    stats = hosts.stats(0)
    assert len(stats.arrivals) == 3
    gaps = [b - a for a, b in zip(stats.arrivals, stats.arrivals[1:], strict=False)]
    assert stats.min_gap == min(gaps)
    assert stats.requests == stats.served == 3
    hosts.reset()
    cleared = hosts.stats(0)
    assert (cleared.requests, cleared.served, cleared.max_in_flight) == (0, 0, 0)
    assert (cleared.statuses, cleared.arrivals, cleared.min_gap) == ({}, [], None)
    await fetch(hosts.page_url(0, 9))
    await settle(hosts)
    assert hosts.stats(0).statuses == {200: 1}
    without = hosts.stats(0, arrivals=False)
    assert without.arrivals == []
    assert without.requests == 1


def test_stats_round_trip_through_json(local_hosts: Factory) -> None:
    from scrapy_hostqueue.testing import HostStats

    hosts = local_hosts("2x")
    stats = hosts.stats(1)
    stats.statuses = {200: 3, 429: 1}
    assert HostStats.from_dict(json.loads(json.dumps(stats.to_dict()))) == stats


def test_set_spec_cannot_change_refuse(local_hosts: Factory) -> None:
    hosts = local_hosts("2x")
    with pytest.raises(SpecError, match="refuse"):
        hosts.set_spec(0, HostSpec(refuse=True))


def test_not_running_raises(local_hosts: Factory) -> None:
    hosts = LocalHosts("2x")
    with pytest.raises(RuntimeError, match="not running"):
        hosts.stats(0)


# -- lifecycle -----------------------------------------------------------------


def _port_is_free(hostname: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((hostname, port))
        except OSError:
            return False
        return True


def test_thread_mode_stops_cleanly() -> None:
    hosts = LocalHosts("2x latency=0; refuse")
    with hosts:
        addresses = list(zip(hosts.hostnames, hosts.ports, strict=True))
        names = {thread.name for thread in threading.enumerate()}
        assert "hostqueue-local-hosts" in names
    assert not hosts.running
    assert "hostqueue-local-hosts" not in {t.name for t in threading.enumerate()}
    assert all(_port_is_free(h, p) for h, p in addresses)
    hosts.stop()  # idempotent


@async_test
async def test_stop_with_requests_hanging(local_hosts: Factory) -> None:
    hosts = LocalHosts("latency=0,fault=hang")
    hosts.start()
    try:
        pending = asyncio.ensure_future(fetch(hosts.page_url(0, 0), timeout=10))
        await until(lambda: hosts.stats(0).in_flight == 1)
    finally:
        hosts.stop()
    with pytest.raises(asyncio.IncompleteReadError):
        await pending


@async_test
async def test_stop_with_requests_waiting_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    # A request waiting out its latency when the hosts stop: its connection
    # is dropped quietly, not reported by asyncio as an error in a callback.
    hosts = LocalHosts("latency=30s")
    hosts.start()
    try:
        pending = asyncio.ensure_future(fetch(hosts.page_url(0, 0), timeout=10))
        await until(lambda: hosts.stats(0).in_flight == 1)
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            hosts.stop()
    finally:
        hosts.stop()
    with pytest.raises(asyncio.IncompleteReadError):
        await pending
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.crawl
@async_test
async def test_process_mode(local_hosts: Factory) -> None:
    hosts = local_hosts("2x latency=0; refuse", process=True)
    answers = [await fetch(hosts.page_url(1, n)) for n in range(3)]
    assert [answer.status for answer in answers] == [200] * 3
    await settle(hosts)
    assert hosts.stats(1).served == 3
    assert [s.served for s in hosts.all_stats()] == [0, 3, 0]
    assert hosts.stats(2).hostname == "127.0.0.3"
    hosts.set_spec(0, HostSpec(latency=0, status=503, retry_after="7"))
    throttled = await fetch(hosts.page_url(0, 0))
    assert (throttled.status, throttled.headers["retry-after"]) == (503, "7")
    await settle(hosts)
    with pytest.raises(SpecError, match="refuse"):
        hosts.set_spec(2, HostSpec())
    hosts.reset()
    assert [s.requests for s in hosts.all_stats()] == [0, 0, 0]


@pytest.mark.crawl
def test_process_mode_stops_the_child() -> None:
    hosts = LocalHosts("latency=0", process=True)
    with hosts:
        backend: Any = hosts._backend
        process = backend._process
        port = hosts.ports[0]
    assert process.returncode == 0
    assert _port_is_free("127.0.0.1", port)


def test_wait_idle(local_hosts: Factory) -> None:
    hosts = local_hosts("latency=0")
    hosts.wait_idle(timeout=1)


# -- spec language -------------------------------------------------------------


def test_parse_specs_groups_and_counts() -> None:
    specs = parse_specs("3x latency=10ms,links=3; latency=200ms,throttle=429>3,retry-after=2")
    assert specs[:3] == [HostSpec(latency=0.01, links=3)] * 3
    assert specs[3] == HostSpec(latency=0.2, throttle_above=3, throttle_status=429, retry_after="2")
    assert parse_specs("2x") == [HostSpec(), HostSpec()]
    assert parse_spec("gzip,refuse,pages=inf,body-size=4k,fault=hang,fault-rate=0.5") == (
        HostSpec(gzip=True, refuse=True, body_size=4096, fault="hang", fault_rate=0.5)
    )
    assert parse_spec("crawl-delay=0.5,trickle=2s,status=404,cross-links=2") == HostSpec(
        crawl_delay=0.5, trickle=2.0, status=404, cross_links=2
    )
    assert parse_spec('retry-after="Wed, 21 Oct 2015 07:28:00 GMT"').retry_after == (
        "Wed, 21 Oct 2015 07:28:00 GMT"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty host spec"),
        ("latency=10ms;", "host group 2 is empty"),
        ("latncy=10ms", "unknown key 'latncy'"),
        ("latency=fast", "latency: expected a duration"),
        ("latency=-1", "latency: expected a duration"),
        ("latency=10ms,latency=20ms", "given twice"),
        ("links=two", "links: expected a whole number"),
        ("links", "links needs a value"),
        ("pages=0", "pages must be >= 1"),
        ("throttle=429", "throttle: expected STATUS>COUNT"),
        ("throttle=404>3", "throttle_status must be 429 or 503"),
        ("throttle=429>3,throttle-above=2", "either throttle"),
        ("fault=explode", "fault must be one of"),
        ("fault=reset,fault-rate=0", "fault_rate must be in (0, 1]"),
        ("fault-rate=150%", "fault_rate must be in (0, 1]"),
        ("status=99", "status must be >= 200"),
        ("status=600", "status must be an HTTP status"),
        ("body-size=1g", "body-size: expected a byte count"),
        ("gzip=maybe", "gzip: expected yes or no"),
        ("retry-after=date:soon", "retry_after 'date:N'"),
        ('retry-after="open', "unbalanced double quote"),
        ('retry-after=a"b"', "quoted as a whole"),
        ("0x latency=1", "count must be 1..10000"),
        ("latency=10ms; 2x bogus", "host group 2"),
        ("trickle=0", "trickle must be a finite number > 0"),
    ],
)
def test_spec_errors(text: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_specs(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"latency": float("nan")}, "latency"),
        ({"links": True}, "links must be an integer"),
        ({"retry_after": "a\r\nX-Injected: 1"}, "printable ASCII"),
        ({"retry_after": "  "}, "non-empty"),
        ({"crawl_delay": float("inf")}, "crawl_delay"),
    ],
)
def test_host_spec_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        HostSpec(**kwargs)


_specs = st.builds(
    HostSpec,
    latency=st.floats(0, 100, allow_nan=False),
    links=st.integers(0, 20),
    pages=st.none() | st.integers(1, 10**6),
    cross_links=st.integers(0, 5),
    throttle_above=st.none() | st.integers(0, 100),
    throttle_status=st.sampled_from([429, 503]),
    retry_after=st.none()
    | st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters='"'))
    .filter(str.strip)
    .filter(lambda text: not text.startswith("date:")),
    crawl_delay=st.none() | st.floats(0, 60, allow_nan=False),
    fault=st.none() | st.sampled_from(["reset", "hang", "truncate", "slow-body"]),
    fault_rate=st.floats(0.01, 1),
    fault_attempts=st.none() | st.integers(1, 10),
    trickle=st.floats(0.001, 10),
    status=st.integers(200, 599),
    body_size=st.integers(0, 10**6),
    gzip=st.booleans(),
    refuse=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(_specs)
def test_format_spec_round_trips(spec: HostSpec) -> None:
    text = format_spec(spec)
    assert parse_spec(text) == spec
    assert parse_specs(f"2x {text}" if text else "2x") == [spec, spec]


# -- command line --------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--hosts", "latncy=1"],
        ["serve", "--hosts", "2x; ;"],
        ["serve"],
        ["serve", "--hosts", "2x", "--offset", "-1"],
        ["stats", "not a url"],
        ["stats", "ftp://127.0.0.1:21/"],
        ["frobnicate"],
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli_main(argv)
    assert caught.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "error:" in error
    assert "Traceback" not in error


def test_cli_stats_of_unreachable_host(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: refused
        port = sock.getsockname()[1]
        assert cli_main(["stats", f"http://127.0.0.1:{port}/"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "cannot reach" in error


def test_cli_help_documents_the_language(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "throttle=STATUS>K" in out
    assert "3x latency=10ms" in out


@pytest.mark.crawl
def test_cli_serve_stats_reset(capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scrapy_hostqueue.testing",
            "serve",
            "--hosts",
            "2x latency=0",
            "--hosts",
            "crawl-delay=1",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert server.stdout is not None
        lines = []
        deadline = time.monotonic() + 15
        while not lines or not lines[-1].startswith("serving"):
            assert time.monotonic() < deadline
            line = server.stdout.readline()
            assert line, "server exited early"
            lines.append(line)
        urls = re.findall(r"http://[0-9.]+:\d+/", "".join(lines[:3]))
        assert [urlsplit(url).hostname for url in urls] == [
            "127.0.0.1",
            "127.0.0.2",
            "127.0.0.3",
        ]
        assert "crawl-delay=1s" in lines[2]
        assert "serving 3 host(s)" in lines[-1]

        async def hit() -> Answer:
            return await fetch(urls[1] + "page/4")

        answer = _run_in_thread(hit)
        assert answer.status == 200
        deadline = time.monotonic() + 10
        while json.loads(_stats_out(urls[1], capsys))["in_flight"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        capsys.readouterr()
        assert cli_main(["stats", urls[1]]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["served"] == 1
        assert stats["statuses"] == {"200": 1}
        assert cli_main(["stats", "--all", "--no-arrivals", urls[0]]) == 0
        every = json.loads(capsys.readouterr().out)
        assert [host["served"] for host in every] == [0, 1, 0]
        assert "arrivals" not in every[0]
        assert cli_main(["reset", urls[1]]) == 0
        capsys.readouterr()
        assert cli_main(["stats", urls[1]]) == 0
        assert json.loads(capsys.readouterr().out)["served"] == 0
    finally:
        server.send_signal(signal.SIGINT)
        try:
            code = server.wait(10)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
            assert server.stdout is not None
            server.stdout.close()
    assert code == 0


def _stats_out(url: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert cli_main(["stats", url]) == 0
    return capsys.readouterr().out


def _run_in_thread(coroutine_function: Callable[[], Awaitable[Answer]]) -> Answer:
    """Run a client coroutine from a sync test without touching the reactor's loop."""
    result: list[Answer] = []

    def target() -> None:
        result.append(asyncio.run(coroutine_function()))  # type: ignore[arg-type]

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(TEST_TIMEOUT)
    assert result, "client did not finish"
    return result[0]


# -- the demo and the example project ---------------------------------------------


@pytest.mark.crawl
def test_demo_runs_a_small_crawl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from example_project import run_demo as demo

    code = demo.main(
        [
            "--pages",
            "40",
            "--hosts",
            # 45 pages in all, so the budget of 40 needs every host, the
            # Crawl-delay one included, whatever the machine's speed.
            "2x latency=5ms,pages=15; latency=5ms,pages=15,crawl-delay=0.05",
            "--output-dir",
            str(tmp_path),
            "--timeout",
            "60",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((tmp_path / "hosts.json").read_text())
    assert report["crawl"]["finish_reason"] == "closespider_pagecount"
    served = [host["stats"]["served"] for host in report["hosts"]]
    # The budget counts every response, the three robots.txt ones included.
    assert sum(served) >= 40 - 3
    assert all(served)  # every host was crawled from its start URL
    log = (tmp_path / "crawl.log").read_text()
    assert "Spider closed (closespider_pagecount)" in log
    assert "127.0.0.3" in out
    assert "max in flight" in out
    # The scheduler's own per-host stats and the timeline chart.
    assert "per-host stats" in out
    assert "hostqueue/hosts" in out
    assert (tmp_path / "timeline.jsonl").stat().st_size > 0
    assert "<svg" in (tmp_path / "timeline.html").read_text()


@pytest.mark.crawl
def test_demo_reports_a_failed_crawl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from example_project import run_demo as demo

    code = demo.main(
        [
            "--pages",
            "5",
            "--hosts",
            "latency=0",
            "--output-dir",
            str(tmp_path),
            "-s",
            "SPIDER_MODULES=no_such_module",
        ]
    )
    assert code != 0
    assert "the crawl failed" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["--pages", "0"], ["--hosts", "2x lat=1"], ["-s", "NOVALUE"], ["--timeout", "x"]],
)
def test_demo_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from example_project import run_demo as demo

    with pytest.raises(SystemExit) as caught:
        demo.main(argv)
    assert caught.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
