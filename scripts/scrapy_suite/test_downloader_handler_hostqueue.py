"""Scrapy's download handler tests, run against ``scrapy_hostqueue``'s handler.

Not part of this project's test suite: ``scripts/scrapy_suite.sh`` copies it
into the ``tests/`` folder of Scrapy's source tree, beside Scrapy's
``test_downloader_handler_aiohttp.py``, whose test classes it reuses with
``scrapy_hostqueue.AiohttpDownloadHandler`` in place of Scrapy's aiohttp
handler. Class attributes that differ from Scrapy's handler say what the
difference is; ``docs/compatibility.rst`` names each for users.
"""

from __future__ import annotations

from typing import Any

import pytest

from scrapy_hostqueue import AiohttpDownloadHandler
from tests import test_downloader_handler_aiohttp as scrapy_aiohttp

pytestmark = pytest.mark.only_asyncio

HANDLER = "scrapy_hostqueue.AiohttpDownloadHandler"


class HostQueueHandlerMixin:
    @property
    def download_handler_cls(self) -> type[AiohttpDownloadHandler]:
        return AiohttpDownloadHandler

    @property
    def settings_dict(self) -> dict[str, Any] | None:
        return {"DOWNLOAD_HANDLERS": {"http": HANDLER, "https": HANDLER}}


class TestHttp(HostQueueHandlerMixin, scrapy_aiohttp.TestHttp):
    pass


class TestHttps(HostQueueHandlerMixin, scrapy_aiohttp.TestHttps):
    pass


class TestSimpleHttps(HostQueueHandlerMixin, scrapy_aiohttp.TestSimpleHttps):
    pass


class TestHttpsWrongHostname(HostQueueHandlerMixin, scrapy_aiohttp.TestHttpsWrongHostname):
    pass


class TestHttpsInvalidDNSId(HostQueueHandlerMixin, scrapy_aiohttp.TestHttpsInvalidDNSId):
    pass


class TestHttpsInvalidDNSPattern(HostQueueHandlerMixin, scrapy_aiohttp.TestHttpsInvalidDNSPattern):
    pass


class TestHttpsCustomCiphers(HostQueueHandlerMixin, scrapy_aiohttp.TestHttpsCustomCiphers):
    pass


class TestHttpsDefaultCiphers(HostQueueHandlerMixin, scrapy_aiohttp.TestHttpsDefaultCiphers):
    pass


class TestHttpsTLSVersion(HostQueueHandlerMixin, scrapy_aiohttp.TestHttpsTLSVersion):
    pass


class TestHttpWithCrawler(HostQueueHandlerMixin, scrapy_aiohttp.TestHttpWithCrawler):
    pass


class TestHttpsWithCrawler(TestHttpWithCrawler):
    is_secure = True


class TestHttpProxy(HostQueueHandlerMixin, scrapy_aiohttp.TestHttpProxy):
    pass


class TestHttpsProxy(HostQueueHandlerMixin, scrapy_aiohttp.TestHttpsProxy):
    pass
