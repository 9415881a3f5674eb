"""The add-on's merging with what the user set: values the user gave win,
whether components are named by import path or given as classes."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import (
    Addon,
    AIMDMiddleware,
    HostQueueScheduler,
    HostQueueSettingsError,
    StartRequestsMiddleware,
)
from scrapy_hostqueue.stats import HostQueueStats
from tests.crawling import ADDON, PageSpider, settings


def applied(**overrides: Any) -> Settings:
    crawler = get_crawler(PageSpider, settings(ADDONS=ADDON, **overrides))
    crawler._apply_settings()
    return crawler.settings


def resolved(components: Any, cls: type) -> list[Any]:
    """The orders under which *cls* is placed, by path or as a class."""
    path = f"{cls.__module__}.{cls.__qualname__}"
    short = f"scrapy_hostqueue.{cls.__qualname__}"
    return [order for key, order in dict(components).items() if key is cls or key in (path, short)]


@pytest.mark.parametrize(
    ("setting", "cls"),
    [
        ("DOWNLOADER_MIDDLEWARES", AIMDMiddleware),
        ("SPIDER_MIDDLEWARES", StartRequestsMiddleware),
        ("EXTENSIONS", HostQueueStats),
    ],
)
@pytest.mark.parametrize("user_order", [None, 600])
def test_a_component_the_user_gave_as_a_class_is_left_as_given(
    setting: str, cls: type, user_order: int | None
) -> None:
    result = applied(**{setting: {cls: user_order}})
    assert resolved(result[setting], cls) == [user_order]


def test_the_addon_places_its_components_when_the_user_did_not() -> None:
    result = applied()
    assert resolved(result["DOWNLOADER_MIDDLEWARES"], AIMDMiddleware) == [560]
    assert resolved(result["SPIDER_MIDDLEWARES"], StartRequestsMiddleware) == [10]
    assert resolved(result["EXTENSIONS"], HostQueueStats) == [0]


class MyScheduler(HostQueueScheduler):
    pass


@pytest.mark.parametrize(
    ("scheduler", "warned"),
    [
        ("scrapy_hostqueue.scheduler.HostQueueScheduler", False),
        (HostQueueScheduler, False),
        (MyScheduler, False),
        (f"{__name__}.MyScheduler", False),
        ("scrapy.core.scheduler.Scheduler", True),
    ],
)
def test_the_addon_warns_only_about_a_scheduler_the_middleware_refuses(
    scheduler: Any, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="scrapy_hostqueue.addon"):
        applied(SCHEDULER=scheduler)
    assert ("will refuse to run" in caplog.text) is warned


def test_the_addon_runs_on_asyncio_without_a_twisted_reactor() -> None:
    values = Settings({"TWISTED_REACTOR_ENABLED": False})
    Addon().update_settings(values)
    assert values["SCHEDULER"] == "scrapy_hostqueue.HostQueueScheduler"


def test_the_addon_refuses_another_reactor_naming_it() -> None:
    reactor = "twisted.internet.selectreactor.SelectReactor"
    with pytest.raises(HostQueueSettingsError, match="SelectReactor"):
        Addon().update_settings(Settings({"TWISTED_REACTOR": reactor}))
