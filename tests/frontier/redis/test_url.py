"""The Redis URL of a shared frontier, before any connection.

What log lines show of it (never its secrets), and the URLs refused at once with one line (a
malformed URL, an option the client does not take, TLS options without TLS, a certificate file that
is not there).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from scrapy.settings import Settings

from scrapy_hostqueue._config import HostQueueConfig
from scrapy_hostqueue.frontier.redis._db import RedisFrontierError
from scrapy_hostqueue.frontier.redis._glue import check_url, shown_url
from tests.helpers.requires_redis import import_redis

redis = import_redis()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@10.0.0.5:6379/0", "redis://:***@10.0.0.5:6379/0"),
        ("rediss://crawler:s3cret@10.0.0.5:6380/2", "rediss://crawler:***@10.0.0.5:6380/2"),
        # A password with an @ or a / in it is escaped in the URL.
        ("redis://:p%40ss%2Fw@h:1/0", "redis://:***@h:1/0"),
        ("redis://crawler@h:1/0", "redis://crawler@h:1/0"),
        (
            "rediss://h:1/0?ssl_ca_certs=/etc/ca.pem&password=s3cret&ssl_password=k3y",
            "rediss://h:1/0?ssl_ca_certs=/etc/ca.pem&password=***&ssl_password=***",
        ),
        ("rediss://h:1/0?ssl_cert_reqs=none", "rediss://h:1/0?ssl_cert_reqs=none"),
    ],
)
def test_log_lines_show_the_url_without_its_secrets(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_the_configuration_keeps_the_url_out_of_its_repr() -> None:
    config = HostQueueConfig.from_settings(
        Settings({"HOSTQUEUE_FRONTIER": "redis://:s3cret@10.0.0.5:6379/0"})
    )
    assert config.frontier_url == "redis://:s3cret@10.0.0.5:6379/0"
    assert "s3cret" not in repr(config)


def _refusal(url: str) -> str:
    with pytest.raises(RedisFrontierError) as caught:
        check_url(redis, url)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://:s3cret@127.0.0.1:x/0", "is malformed: Port could not be cast"),
        ("redis://:s3cret@127.0.0.1:6379/0?db=x", "is malformed: Invalid value for 'db'"),
        # A misspelt option: the client would fail at its first connection
        # with a TypeError and a traceback.
        (
            "rediss://:s3cret@127.0.0.1:6379/0?ssl_ca_cert=/etc/ca.pem",
            "an option the redis client does not take: ssl_ca_cert",
        ),
        # One the synchronous client takes, and the crawl's asyncio one does not.
        (
            "rediss://:s3cret@127.0.0.1:6379/0?ssl_validate_ocsp=true",
            "an option the redis client does not take: ssl_validate_ocsp",
        ),
        # TLS options on a plain URL: the same TypeError, not a plain connection.
        (
            "redis://:s3cret@127.0.0.1:6379/0?ssl_cert_reqs=required",
            "has TLS options (ssl_cert_reqs) and does not use TLS: write rediss://",
        ),
        (
            "rediss://:s3cret@127.0.0.1:6379/0?ssl_cert_reqs=never",
            "Invalid SSL Certificate Requirements Flag: never",
        ),
    ],
)
def test_a_url_the_client_cannot_use_is_refused_in_one_line(url: str, words: str) -> None:
    message = _refusal(url)
    assert words in message, message
    assert "s3cret" not in message
    assert ":***@127.0.0.1" in message


def test_a_certificate_file_that_is_not_there_is_named(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    url = f"rediss://127.0.0.1:6379/0?ssl_ca_certs={ca}"
    assert _refusal(url).endswith(f"names ssl_ca_certs={ca}: not found")
    ca.write_text("")
    check_url(redis, url)
    key = tmp_path / "client.key"
    assert _refusal(f"{url}&ssl_certfile={ca}&ssl_keyfile={key}").endswith(
        f"names ssl_keyfile={key}: not found"
    )


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://:s3cret@127.0.0.1:6379",
        "redis://crawler:s3cret@127.0.0.1:6379/3?socket_keepalive=true",
        "rediss://127.0.0.1:6380/0?ssl_cert_reqs=none&ssl_check_hostname=false",
        "unix:///run/redis.sock?db=1",
    ],
)
def test_urls_the_client_takes_pass(url: str) -> None:
    check_url(redis, url)
