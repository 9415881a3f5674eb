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
    """Every test starts and ends with nothing frozen and no holder."""
    assert _gc.holders() == 0
    gc.unfreeze()
    yield
    while _gc.holders():
        _gc.release()
    gc.unfreeze()


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


class _Watcher(PageSpider):
    """Records, at every response, how many crawls hold the freeze."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holders: list[int] = []
        self.frozen: list[int] = []

    def parse(self, response: Response) -> Iterable[Any]:
        self.holders.append(_gc.holders())
        self.frozen.append(gc.get_freeze_count())
        return super().parse(response)


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
