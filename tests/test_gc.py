"""The start-up heap is kept out of full garbage collections while crawls run,
and given back when the last one closes."""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from scrapy.http import Response
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import HostQueueScheduler, HostQueueSettingsError, _gc
from tests.crawling import SCHEDULER, PageSpider, crawl, settings


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """Every test starts and ends with nothing frozen, no holder and Python's
    thresholds as they were."""
    assert _gc.holders() == 0
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    while _gc.holders():
        _gc.release()
    for _ in range(10):
        _gc.restore_young_threshold()
    gc.set_threshold(*thresholds)
    gc.unfreeze()


@pytest.fixture
def python_default() -> Iterator[tuple[int, int, int]]:
    """Thresholds of (700, 10, 10) for the test."""
    gc.set_threshold(700, 10, 10)
    yield (700, 10, 10)


def test_hold_takes_live_objects_out_of_the_oldest_generation() -> None:
    gc.collect()
    before = len(gc.get_objects(generation=2))
    frozen = _gc.hold()
    assert frozen > 0
    assert gc.get_freeze_count() > 0
    # A full collection no longer walks what was alive at the freeze.
    assert len(gc.get_objects(generation=2)) < before / 2
    _gc.release()
    assert gc.get_freeze_count() == 0
    assert len(gc.get_objects(generation=2)) >= before / 2


def test_the_last_holder_undoes_the_freeze() -> None:
    _gc.hold()
    _gc.hold()
    _gc.release()
    assert _gc.holders() == 1
    assert gc.get_freeze_count() > 0
    _gc.release()
    assert _gc.holders() == 0
    assert gc.get_freeze_count() == 0
    _gc.release()  # one release too many is harmless
    assert _gc.holders() == 0


def test_a_freeze_made_before_the_crawls_is_left_alone() -> None:
    gc.freeze()
    _gc.hold()
    _gc.release()
    assert gc.get_freeze_count() > 0


def test_the_young_threshold_is_raised_and_restored(python_default: tuple[int, ...]) -> None:
    assert _gc.raise_young_threshold(7000) == 7000
    assert gc.get_threshold() == (7000, 10, 10)
    # A second crawl asking for less keeps the higher one; the first to close
    # leaves it for the other.
    assert _gc.raise_young_threshold(3000) == 7000
    _gc.restore_young_threshold()
    assert gc.get_threshold() == (7000, 10, 10)
    _gc.restore_young_threshold()
    assert gc.get_threshold() == python_default
    _gc.restore_young_threshold()  # one restore too many is harmless
    assert gc.get_threshold() == python_default


def test_a_higher_threshold_or_automatic_collection_off_is_left_alone() -> None:
    gc.set_threshold(50_000, 10, 10)
    assert _gc.raise_young_threshold(7000) == 50_000
    _gc.restore_young_threshold()
    assert gc.get_threshold() == (50_000, 10, 10)
    gc.set_threshold(0, 10, 10)
    assert _gc.raise_young_threshold(7000) == 0
    _gc.restore_young_threshold()
    assert gc.get_threshold() == (0, 10, 10)


def test_a_threshold_changed_during_the_crawl_is_not_undone(
    python_default: tuple[int, ...],
) -> None:
    _gc.raise_young_threshold(7000)
    gc.set_threshold(1500, 5, 5)
    _gc.restore_young_threshold()
    assert gc.get_threshold() == (1500, 5, 5)


class _Watcher(PageSpider):
    """Records, at every response, how many crawls hold the freeze, and the
    young generation's threshold."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holders: list[int] = []
        self.frozen: list[int] = []
        self.young: list[int] = []

    def parse(self, response: Response) -> Iterable[Any]:
        self.holders.append(_gc.holders())
        self.frozen.append(gc.get_freeze_count())
        self.young.append(gc.get_threshold()[0])
        return super().parse(response)


@pytest.mark.crawl
@pytest.mark.parametrize(("setting", "during"), [(None, 7000), (0, 700), (12_000, 12_000)])
@deferred_f_from_coro_f
async def test_the_scheduler_raises_the_young_threshold_while_the_crawl_runs(
    python_default: tuple[int, ...], setting: int | None, during: int
) -> None:
    overrides = {} if setting is None else {"HOSTQUEUE_GC_YOUNG_THRESHOLD": setting}
    crawler = await crawl(
        ["data:,one", "data:,two"], spider_cls=_Watcher, SCHEDULER=SCHEDULER, **overrides
    )
    spider = crawler.spider
    assert isinstance(spider, _Watcher)
    assert spider.young == [during, during]
    assert gc.get_threshold() == python_default


@pytest.mark.parametrize("bad", [-1, "often", 1.5])
def test_a_bad_young_threshold_is_refused_naming_the_setting(bad: object) -> None:
    crawler = get_crawler(
        PageSpider, settings(SCHEDULER=SCHEDULER, HOSTQUEUE_GC_YOUNG_THRESHOLD=bad)
    )
    with pytest.raises(HostQueueSettingsError, match="HOSTQUEUE_GC_YOUNG_THRESHOLD"):
        HostQueueScheduler.from_crawler(crawler)


@pytest.mark.crawl
@pytest.mark.parametrize("enabled", [True, False])
@deferred_f_from_coro_f
async def test_the_scheduler_freezes_while_the_crawl_runs(enabled: bool) -> None:
    urls = ["data:,one", "data:,two"]
    crawler = await crawl(
        urls, spider_cls=_Watcher, SCHEDULER=SCHEDULER, HOSTQUEUE_GC_FREEZE=enabled
    )
    spider = crawler.spider
    assert isinstance(spider, _Watcher)
    assert len(spider.holders) == 2
    if enabled:
        assert spider.holders == [1, 1]
        assert min(spider.frozen) > 0
    else:
        assert spider.holders == [0, 0]
        assert spider.frozen == [0, 0]
    assert _gc.holders() == 0
    assert gc.get_freeze_count() == 0


def test_a_bad_value_is_refused_naming_the_setting() -> None:
    crawler = get_crawler(PageSpider, settings(SCHEDULER=SCHEDULER, HOSTQUEUE_GC_FREEZE="often"))
    with pytest.raises(HostQueueSettingsError, match="HOSTQUEUE_GC_FREEZE"):
        HostQueueScheduler.from_crawler(crawler)
