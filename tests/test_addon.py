"""The add-on's merging with what the user set.

Values the user gave win, whether components are named by import path or given as classes.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import scrapy
from scrapy.core.downloader.handlers._base_streaming import BaseStreamingDownloadHandler
from scrapy.core.engine import ExecutionEngine
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

import scrapy_hostqueue._scrapy_internals as internals
from example_project.run_demo import PROJECT_DIR
from scrapy_hostqueue import (
    Addon,
    AIMDMiddleware,
    AiohttpDownloadHandler,
    GcTuning,
    HostQueueScheduler,
    HostQueueSettingsError,
    StartRequestsMiddleware,
)
from scrapy_hostqueue.stats import HostQueueStats
from tests.helpers.crawling import ADDON, PageSpider, run_command, settings


def applied(**overrides: Any) -> Settings:
    crawler = get_crawler(PageSpider, settings(ADDONS=ADDON, **overrides))
    crawler._apply_settings()
    return crawler.settings


def resolved(components: Any, cls: type) -> list[Any]:
    """Return the orders under which *cls* is placed, by path or as a class."""
    path = f"{cls.__module__}.{cls.__qualname__}"
    short = f"scrapy_hostqueue.{cls.__qualname__}"
    return [order for key, order in dict(components).items() if key is cls or key in (path, short)]


@pytest.mark.parametrize(
    ("setting", "cls"),
    [
        ("DOWNLOADER_MIDDLEWARES", AIMDMiddleware),
        ("SPIDER_MIDDLEWARES", StartRequestsMiddleware),
        ("EXTENSIONS", HostQueueStats),
        ("EXTENSIONS", GcTuning),
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
    assert resolved(result["EXTENSIONS"], GcTuning) == [0]


@pytest.mark.parametrize(
    "path", ["scrapy_hostqueue.GcTuning", "scrapy_hostqueue.gc_tuning.GcTuning"]
)
def test_the_gc_extension_the_user_disabled_stays_disabled(path: str) -> None:
    result = applied(EXTENSIONS={path: None})
    assert resolved(result["EXTENSIONS"], GcTuning) == [None]


@pytest.mark.parametrize(
    ("gc_settings", "enabled"),
    [
        ({}, True),
        ({"HOSTQUEUE_GC_FREEZE": False}, True),
        ({"HOSTQUEUE_GC_YOUNG_THRESHOLD": 0}, True),
        ({"HOSTQUEUE_GC_FREEZE": False, "HOSTQUEUE_GC_YOUNG_THRESHOLD": 0}, False),
    ],
)
def test_the_addon_runs_the_gc_extension_unless_both_gc_settings_are_off(
    gc_settings: dict[str, Any], enabled: bool
) -> None:
    crawler = get_crawler(PageSpider, settings(ADDONS=ADDON, **gc_settings))
    crawler._apply_settings()
    running = [type(ext) for ext in crawler.extensions.middlewares]
    assert (GcTuning in running) is enabled


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
        values = applied(SCHEDULER=scheduler)
    assert ("does not enable the AIMD middleware" in caplog.text) is warned
    # The middleware would refuse to run with another scheduler: not enabled then.
    enabled = values.getwithbase("DOWNLOADER_MIDDLEWARES").get("scrapy_hostqueue.AIMDMiddleware")
    assert (enabled is None) is warned


def test_the_addon_runs_on_asyncio_without_a_twisted_reactor() -> None:
    values = Settings({"TWISTED_REACTOR_ENABLED": False})
    Addon().update_settings(values)
    assert values["SCHEDULER"] == "scrapy_hostqueue.HostQueueScheduler"


def test_the_addon_refuses_another_reactor_naming_it() -> None:
    reactor = "twisted.internet.selectreactor.SelectReactor"
    with pytest.raises(HostQueueSettingsError, match="SelectReactor"):
        Addon().update_settings(Settings({"TWISTED_REACTOR": reactor}))


# -- refusing to start ---------------------------------------------------------


def _start_addon() -> None:
    Addon().update_settings(Settings())


def _start_scheduler() -> None:
    HostQueueScheduler.from_crawler(get_crawler(PageSpider, settings()))


def _start_handler() -> None:
    crawler = get_crawler(PageSpider, settings())
    AiohttpDownloadHandler.from_crawler(crawler)


STARTS = [_start_addon, _start_scheduler, _start_handler]


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize(
    ("library", "version"), [(scrapy, "2.18.1"), (aiohttp, "3.13.2"), (scrapy, "dev")]
)
def test_an_older_scrapy_or_aiohttp_is_refused_naming_the_versions(
    start: Callable[[], None], library: Any, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(library, "__version__", version)
    with pytest.raises(ImportError) as raised:
        start()
    message = str(raised.value)
    assert "\n" not in message
    assert f"{library.__name__} {version}" in message.lower()
    assert "needs Scrapy >= 2.19 and aiohttp >= 3.13.3" in message
    assert "tested with Scrapy 2.19.x and aiohttp 3.13.3 to 3.14" in message


@pytest.fixture
def untested_warnings(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Callable[[], list[str]]:
    """Return the WARNINGs about untested versions logged so far.

    The WARNINGs about untested versions logged so far, starting from a
    process that has logged none.
    """
    monkeypatch.setattr(internals, "_warned_untested", set())
    caplog.set_level(logging.WARNING, logger=internals.__name__)

    def warnings() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == internals.__name__ and r.levelno == logging.WARNING
        ]

    return warnings


@pytest.mark.parametrize(
    ("library", "version", "name"),
    [(scrapy, "2.20.0", "Scrapy"), (scrapy, "3.0.0rc1", "Scrapy"), (aiohttp, "4.0.0", "aiohttp")],
)
def test_a_newer_scrapy_or_aiohttp_with_every_name_starts_with_one_warning(
    library: Any,
    version: str,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    untested_warnings: Callable[[], list[str]],
) -> None:
    monkeypatch.setattr(library, "__version__", version)
    for start in STARTS:
        start()
    start()
    [warning] = untested_warnings()
    assert f"not tested with {name} {version} " in warning
    assert "tested with Scrapy 2.19.x and aiohttp 3.13.3 to 3.14" in warning


@pytest.mark.parametrize("version", ["2.19.0", "2.19.3", "2.19.1rc1"])
def test_the_tested_versions_start_without_a_warning(
    version: str, monkeypatch: pytest.MonkeyPatch, untested_warnings: Callable[[], list[str]]
) -> None:
    monkeypatch.setattr(scrapy, "__version__", version)
    for start in STARTS:
        start()
    assert untested_warnings() == []


@pytest.mark.parametrize(
    ("owner", "name", "value"),
    [
        (aiohttp.ClientSession, "ATTRS", frozenset()),
        (BaseStreamingDownloadHandler, "_read_response", None),
    ],
)
def test_a_missing_private_name_is_refused_at_start_up(
    owner: Any, name: str, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delattr(owner, name)
    else:
        monkeypatch.setattr(owner, name, value)
    with pytest.raises(ImportError, match=r"lack .*_re") as raised:
        _start_handler()
    assert f"Scrapy {scrapy.__version__}" in str(raised.value)


def test_a_newer_scrapy_without_a_name_the_handler_uses_refuses_the_handler(
    monkeypatch: pytest.MonkeyPatch, untested_warnings: Callable[[], list[str]]
) -> None:
    monkeypatch.setattr(scrapy, "__version__", "2.20.0")
    monkeypatch.delattr(BaseStreamingDownloadHandler, "_read_response")
    # The add-on and the scheduler use none of the handler's names: they
    # start, with the warning.
    _start_addon()
    _start_scheduler()
    with pytest.raises(ImportError, match=r"Scrapy 2\.20\.0, .* lack .*_read_response"):
        _start_handler()
    assert len(untested_warnings()) == 1


def test_the_scheduler_refuses_an_engine_without_its_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    init = ExecutionEngine.__init__

    def without_slot(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)

    monkeypatch.setattr(ExecutionEngine, "__init__", without_slot)
    with pytest.raises(ImportError, match=r"ExecutionEngine\._slot"):
        _start_scheduler()


@pytest.mark.parametrize(
    "wiring",
    [
        [],
        # Without the add-on, the scheduler's from_crawler refuses (inside
        # the engine's start, which Scrapy then fails to close).
        ["-s", "ADDONS={}", "-s", "SCHEDULER=scrapy_hostqueue.HostQueueScheduler"],
    ],
    ids=["addon", "scheduler"],
)
@pytest.mark.crawl
def test_scrapy_crawl_with_a_bad_setting_says_so_in_one_line(wiring: list[str]) -> None:
    command = [
        *(sys.executable, "-m", "scrapy", "crawl", "pages"),
        *("-a", "start_urls=http://127.0.0.2:9/", "-s", "HOSTQUEUE_AIMD_FLOOR=0"),
        *wiring,
    ]
    done = run_command(command, PROJECT_DIR, timeout=120)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "HOSTQUEUE_AIMD_FLOOR" in line]
    assert len(errors) == 1, done.stderr
    assert "ERROR" in errors[0] and "got '0'" in errors[0]
    assert "Traceback" not in done.stderr
    assert "Task exception was never retrieved" not in done.stderr
