"""A shared frontier on a Redis that asks for a password, and one reached over TLS.

Both are run as a user runs them: ``scrapy crawl`` processes and the ``push`` and ``frontier``
commands with ``redis://:PASSWORD@...`` and ``rediss://`` URLs, a wrong password or an untrusted
certificate refused at start in one line, and the password never written out.

The bundled ``redis-server`` 6.2 has no TLS: a forwarder that ends TLS
stands in front of a plain server (:class:`tests.helpers.redis.CuttableProxy`),
with a certificate made in the test.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue.frontier.redis._glue import async_client, connect
from scrapy_hostqueue.testing import HostSpec
from tests.helpers.crawl_report import watched_hosts
from tests.helpers.crawling import Certificate, crawl_refused_at_start, start_demo_crawl
from tests.helpers.redis import CuttableProxy, RedisClusterServers, RedisServer
from tests.helpers.requires_redis import import_redis, redis_server_marks

redis = import_redis()

pytestmark = redis_server_marks(pytest.mark.crawl)

PASSWORD = "hq-S3cret-9f2"
SITE = [HostSpec(latency=0.01, pages=25)] * 2


@pytest.fixture(scope="module")
def password_server() -> Iterator[RedisServer]:
    """Start a real ``redis-server`` that asks for :data:`PASSWORD`."""
    with RedisServer(password=PASSWORD) as server:
        yield server


def _with_password(server: RedisServer, password: str | None) -> str:
    auth = f":{password}@" if password is not None else ""
    return f"redis://{auth}127.0.0.1:{server.port}/0"


def _crawl(url: str, crawl_id: str, tmp_path: Path) -> tuple[list[dict[str, int]], str]:
    """One ``scrapy crawl`` of :data:`SITE` on the shared frontier at *url*.

    The pages each host served, and the crawl's log.
    """
    with watched_hosts(SITE, process=True) as hosts:
        worker = start_demo_crawl(
            [hosts.page_url(i, 0) for i in range(len(hosts))],
            tmp_path / "crawl.log",
            {
                "HOSTQUEUE_FRONTIER": url,
                "HOSTQUEUE_CRAWL_ID": crawl_id,
                "HOSTQUEUE_REDIS_FINISH_GRACE": 0.5,
                "HOSTQUEUE_TIMELINE_FILE": "",
                "ROBOTSTXT_OBEY": False,
                "CLOSESPIDER_TIMEOUT": 60,
                "DEMO_STATS_FILE": tmp_path / "stats.json",
                "DEMO_ITEMS_FILE": tmp_path / "items.jsonl",
            },
        )
        try:
            worker.wait(90)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        hosts.wait_idle(10)
        pages = [host.pages for host in hosts.all_stats(arrivals=False)]
    log = (tmp_path / "crawl.log").read_text()
    assert worker.returncode == 0, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["finish_reason"] == "finished", log[-4000:]
    return pages, log


def _every_page_once(pages: list[dict[str, int]]) -> None:
    for served, spec in zip(pages, SITE, strict=True):
        assert set(served) == {f"/page/{n}" for n in range(spec.pages or 0)}
        assert max(served.values()) == 1


# -- a password ----------------------------------------------------------------


def test_a_crawl_on_a_redis_with_a_password(password_server: RedisServer, tmp_path: Path) -> None:
    url = _with_password(password_server, PASSWORD)
    pages, log = _crawl(url, "auth", tmp_path)
    _every_page_once(pages)
    assert f"shared frontier at redis://:***@127.0.0.1:{password_server.port}/0" in log
    assert PASSWORD not in log
    # The crawl's keys are on that server.
    assert password_server.command("EXISTS hq:{auth}:version") == 1


@pytest.mark.parametrize(
    ("password", "words"),
    [
        ("wrong-One", "Redis refused the password (invalid username-password pair"),
        (None, "Redis asks for a password, and HOSTQUEUE_FRONTIER gives none: write it as"),
    ],
)
def test_a_wrong_or_missing_password_is_one_error_line_at_start(
    password_server: RedisServer, password: str | None, words: str
) -> None:
    error = crawl_refused_at_start(
        f"HOSTQUEUE_FRONTIER={_with_password(password_server, password)}"
    )
    shown = "redis://:***@" if password else "redis://"
    assert f"cannot use the shared frontier at {shown}127.0.0.1:{password_server.port}/0" in error
    assert words in error, error
    assert "wrong-One" not in error


def test_push_and_frontier_with_a_password(
    password_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _with_password(password_server, PASSWORD)
    page = "http://127.0.0.2:8000/page/"
    assert cli(["push", url, "--crawl-id", "fed", page + "1", page + "2", page + "1"]) == 0
    assert capsys.readouterr().out.strip() == "queued 2, 1 already seen"
    assert cli(["frontier", url, "--crawl-id", "fed"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"shared frontier redis://:***@127.0.0.1:{password_server.port}/0,")
    assert "2 requests queued and 0 leased" in out
    assert PASSWORD not in out
    # The same with the user named, as with Redis's access control lists.
    user = f"redis://default:{PASSWORD}@127.0.0.1:{password_server.port}/0"
    assert cli(["push", user, "--crawl-id", "fed", page + "2"]) == 0
    assert capsys.readouterr().out.strip() == "queued 0, 1 already seen"
    wrong = _with_password(password_server, "wrong-One")
    for argv in (["push", wrong, page + "3"], ["frontier", wrong]):
        assert cli([*argv, "--crawl-id", "fed"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        (line,) = captured.err.splitlines()
        shown = f"redis://:***@127.0.0.1:{password_server.port}/0"
        assert line.startswith(f"error: cannot reach Redis at {shown}: "), line
        assert "Redis refused the password" in line
        assert "wrong-One" not in line
    # Nothing was pushed with the wrong password.
    assert password_server.command("HGET hq:{fed/0}:stats queued") == "2"


def test_push_and_frontier_read_the_url_from_the_environment(
    password_server: RedisServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # env:NAME keeps the password out of the command line.
    monkeypatch.setenv("CRAWL_REDIS_URL", _with_password(password_server, PASSWORD))
    page = "http://127.0.0.2:8000/page/"
    assert cli(["push", "env:CRAWL_REDIS_URL", "--crawl-id", "env", page + "1"]) == 0
    assert capsys.readouterr().out.strip() == "queued 1, 0 already seen"
    assert cli(["frontier", "env:CRAWL_REDIS_URL", "--crawl-id", "env"]) == 0
    out = capsys.readouterr().out
    assert "1 requests queued and 0 leased" in out
    assert PASSWORD not in out
    monkeypatch.delenv("CRAWL_REDIS_URL")
    for argv in (["push", "env:CRAWL_REDIS_URL", page + "2"], ["frontier", "env:CRAWL_REDIS_URL"]):
        with pytest.raises(SystemExit) as exit_info:
            cli([*argv, "--crawl-id", "env"])
        assert exit_info.value.code == 2
        assert "the environment variable CRAWL_REDIS_URL is not set" in capsys.readouterr().err
    assert password_server.command("HGET hq:{env/0}:stats queued") == "1"


# -- TLS -----------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> Certificate:
    return Certificate.make(tmp_path, "127.0.0.1", "redis")


def test_a_crawl_over_tls(
    redis_server: RedisServer, certificate: Certificate, tmp_path: Path
) -> None:
    redis_server.flushall()
    with CuttableProxy(redis_server.port, tls=certificate.server_context()) as proxy:
        url = f"rediss://127.0.0.1:{proxy.port}/0?ssl_ca_certs={certificate.cert}"
        pages, log = _crawl(url, "tls", tmp_path)
    _every_page_once(pages)
    assert f"shared frontier at {url}, crawl id 'tls'" in log
    assert redis_server.command("EXISTS hq:{tls}:version") == 1


def test_an_untrusted_certificate_is_one_error_line_at_start(
    redis_server: RedisServer, certificate: Certificate
) -> None:
    with CuttableProxy(redis_server.port, tls=certificate.server_context()) as proxy:
        error = crawl_refused_at_start(f"HOSTQUEUE_FRONTIER={proxy.url}")
    assert f"cannot use the shared frontier at rediss://127.0.0.1:{proxy.port}/0: " in error
    assert "the server's TLS certificate is not trusted" in error
    assert "CERTIFICATE_VERIFY_FAILED" in error
    assert "?ssl_ca_certs=/path/to/ca.pem" in error


@deferred_f_from_coro_f
async def test_a_client_certificate_and_a_password_over_tls(
    password_server: RedisServer,
    certificate: Certificate,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Mutual TLS: the server asks the client for a certificate, given in the URL.

    The server asks the client for a certificate, given in the URL (``ssl_certfile``,
    ``ssl_keyfile``); the crawl's asyncio client and the commands' client take the same URL.
    """
    client = Certificate.make(tmp_path, "127.0.0.1", "client")
    tls = certificate.server_context(client_ca=client.cert)
    with CuttableProxy(password_server.port, tls=tls) as proxy:
        base = f"rediss://:{PASSWORD}@127.0.0.1:{proxy.port}/0?ssl_ca_certs={certificate.cert}"
        url = f"{base}&ssl_certfile={client.cert}&ssl_keyfile={client.key}"
        page = "http://127.0.0.2:8000/page/1"
        assert cli(["push", url, "--crawl-id", "mtls", page]) == 0
        assert capsys.readouterr().out.strip() == "queued 1, 0 already seen"
        async_redis = async_client(redis, url, cluster=False)
        try:
            assert await async_redis.ping()
        finally:
            await async_redis.aclose()
        # Without a certificate of its own, the client is turned away.
        assert cli(["frontier", base, "--crawl-id", "mtls"]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: cannot reach Redis at rediss://:***@127.0.0.1:{proxy.port}")
        assert "if the server asks for a client certificate, name it in the URL" in line
        assert PASSWORD not in line


def test_ssl_cert_reqs_none_connects_without_checking_the_certificate(
    redis_server: RedisServer, certificate: Certificate, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``ssl_cert_reqs=none`` does.

    TLS without checking whom the client talks to (the docs advise ``ssl_ca_certs`` instead).
    """
    redis_server.flushall()
    with CuttableProxy(redis_server.port, tls=certificate.server_context()) as proxy:
        url = f"rediss://127.0.0.1:{proxy.port}/0"
        assert cli(["push", url, "--crawl-id", "unchecked", "http://127.0.0.2/"]) == 2
        assert "TLS certificate is not trusted" in capsys.readouterr().err
        plain = f"redis://127.0.0.1:{proxy.port}/0"
        assert cli(["push", plain, "--crawl-id", "unchecked", "http://127.0.0.2/"]) == 2
        assert "if the server speaks TLS, write rediss:// in the URL" in capsys.readouterr().err
        unchecked = f"{url}?ssl_cert_reqs=none"
        assert cli(["push", unchecked, "--crawl-id", "unchecked", "http://127.0.0.2/"]) == 0
        assert capsys.readouterr().out.strip() == "queued 1, 0 already seen"


# -- a Redis Cluster -----------------------------------------------------------


@deferred_f_from_coro_f
async def test_a_redis_cluster_with_a_password(capsys: pytest.CaptureFixture[str]) -> None:
    """The URL of one node with the password.

    The cluster is found through it, and the cluster client gives the password to every node.
    """
    with RedisClusterServers(3, password=PASSWORD) as cluster:
        url = cluster.url
        assert url.startswith(f"redis://:{PASSWORD}@")
        client, is_cluster = connect(redis, url)
        client.close()
        assert is_cluster
        assert cli(["push", url, "--crawl-id", "guarded", "http://127.0.0.2/a"]) == 0
        assert capsys.readouterr().out.strip() == "queued 1, 0 already seen"
        assert cli(["frontier", url, "--crawl-id", "guarded"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("shared frontier redis://:***@127.0.0.1:")
        assert "1 requests queued" in out
        async_redis = async_client(redis, url, cluster=True)
        try:
            suffixes = (await async_redis.get("hq:{guarded}:partitions")).decode().split()
            queued = [
                await async_redis.hget(f"hq:{{guarded/{k}}}:stats", "queued") for k in suffixes
            ]
            assert sorted(queued, key=lambda n: n is None) == [b"1"] + [None] * 11
        finally:
            await async_redis.aclose()
        wrong = url.replace(PASSWORD, "wrong-One")
        assert cli(["frontier", wrong, "--crawl-id", "guarded"]) == 2
        assert "Redis refused the password" in capsys.readouterr().err
