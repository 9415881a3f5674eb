"""The GcTuning extension keeps the start-up heap out of full garbage collections.

The GcTuning extension keeps the start-up heap out of full garbage
collections while crawls run, and gives it back when the last one closes; the
scheduler alone leaves the interpreter as it is.
"""

from __future__ import annotations

import gc
import logging
import re
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_hostqueue import GcTuning, HostQueueScheduler, HostQueueSettingsError, gc_tuning
from tests.helpers.crawling import BASE_SETTINGS, SCHEDULER, PageSpider, crawl, settings

#: The scheduler with the GC extension, as the add-on wires them.
WITH_GC_TUNING = {
    "SCHEDULER": SCHEDULER,
    "EXTENSIONS": {**BASE_SETTINGS["EXTENSIONS"], "scrapy_hostqueue.GcTuning": 0},
}


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """Start and end every test with nothing frozen and Python's thresholds as they were.

    Every test starts and ends with nothing frozen, no holder and Python's
    thresholds as they were.
    """
    assert gc_tuning.holders() == 0
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    while gc_tuning.holders():
        gc_tuning.release()
    for _ in range(10):
        gc_tuning.restore_young_threshold()
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
    frozen = gc_tuning.hold()
    assert frozen > 0
    assert gc.get_freeze_count() > 0
    # A full collection no longer walks what was alive at the freeze.
    assert len(gc.get_objects(generation=2)) < before / 2
    gc_tuning.release()
    assert gc.get_freeze_count() == 0
    assert len(gc.get_objects(generation=2)) >= before / 2


def test_the_last_holder_undoes_the_freeze() -> None:
    gc_tuning.hold()
    gc_tuning.hold()
    gc_tuning.release()
    assert gc_tuning.holders() == 1
    assert gc.get_freeze_count() > 0
    gc_tuning.release()
    assert gc_tuning.holders() == 0
    assert gc.get_freeze_count() == 0
    gc_tuning.release()  # one release too many is harmless
    assert gc_tuning.holders() == 0


def test_a_freeze_made_before_the_crawls_is_left_alone() -> None:
    gc.freeze()
    gc_tuning.hold()
    gc_tuning.release()
    assert gc.get_freeze_count() > 0


def test_the_young_threshold_is_raised_and_restored(python_default: tuple[int, ...]) -> None:
    assert gc_tuning.raise_young_threshold(7000) == 7000
    assert gc.get_threshold() == (7000, 10, 10)
    # A second crawl asking for less keeps the higher one; the first to close
    # leaves it for the other.
    assert gc_tuning.raise_young_threshold(3000) == 7000
    gc_tuning.restore_young_threshold()
    assert gc.get_threshold() == (7000, 10, 10)
    gc_tuning.restore_young_threshold()
    assert gc.get_threshold() == python_default
    gc_tuning.restore_young_threshold()  # one restore too many is harmless
    assert gc.get_threshold() == python_default


def test_a_higher_threshold_or_automatic_collection_off_is_left_alone() -> None:
    gc.set_threshold(50_000, 10, 10)
    assert gc_tuning.raise_young_threshold(7000) == 50_000
    gc_tuning.restore_young_threshold()
    assert gc.get_threshold() == (50_000, 10, 10)
    gc.set_threshold(0, 10, 10)
    assert gc_tuning.raise_young_threshold(7000) == 0
    gc_tuning.restore_young_threshold()
    assert gc.get_threshold() == (0, 10, 10)


def test_a_threshold_changed_during_the_crawl_is_not_undone(
    python_default: tuple[int, ...],
) -> None:
    gc_tuning.raise_young_threshold(7000)
    gc.set_threshold(1500, 5, 5)
    gc_tuning.restore_young_threshold()
    assert gc.get_threshold() == (1500, 5, 5)


class _Watcher(PageSpider):
    """Records how many crawls hold the freeze, and the young generation's threshold.

    Records, when the first start request is read and at every response,
    how many crawls hold the freeze, and the young generation's threshold.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holders_at_start: int | None = None
        self.holders: list[int] = []
        self.frozen: list[int] = []
        self.young: list[int] = []

    async def start(self) -> AsyncIterator[Any]:
        self.holders_at_start = gc_tuning.holders()
        async for request in super().start():
            yield request

    def parse(self, response: Response) -> Iterable[Any]:
        self.holders.append(gc_tuning.holders())
        self.frozen.append(gc.get_freeze_count())
        self.young.append(gc.get_threshold()[0])
        return super().parse(response)


@pytest.mark.crawl
@pytest.mark.parametrize(("setting", "during"), [(None, 7000), (0, 700), (12_000, 12_000)])
@deferred_f_from_coro_f
async def test_the_extension_raises_the_young_threshold_while_the_crawl_runs(
    python_default: tuple[int, ...], setting: int | None, during: int
) -> None:
    overrides = {} if setting is None else {"HOSTQUEUE_GC_YOUNG_THRESHOLD": setting}
    crawler = await crawl(
        ["data:,one", "data:,two"], spider_cls=_Watcher, **WITH_GC_TUNING, **overrides
    )
    spider = crawler.spider
    assert isinstance(spider, _Watcher)
    assert spider.young == [during, during]
    assert gc.get_threshold() == python_default


@pytest.mark.parametrize("component", [HostQueueScheduler, GcTuning])
@pytest.mark.parametrize("bad", [-1, "often", 1.5])
def test_a_bad_young_threshold_is_refused_naming_the_setting(
    bad: object, component: type[HostQueueScheduler | GcTuning]
) -> None:
    crawler = get_crawler(
        PageSpider, settings(SCHEDULER=SCHEDULER, HOSTQUEUE_GC_YOUNG_THRESHOLD=bad)
    )
    with pytest.raises(HostQueueSettingsError, match="HOSTQUEUE_GC_YOUNG_THRESHOLD"):
        component.from_crawler(crawler)


@pytest.mark.crawl
@pytest.mark.parametrize("enabled", [True, False])
@deferred_f_from_coro_f
async def test_the_extension_freezes_while_the_crawl_runs(enabled: bool) -> None:
    urls = ["data:,one", "data:,two"]
    crawler = await crawl(urls, spider_cls=_Watcher, **WITH_GC_TUNING, HOSTQUEUE_GC_FREEZE=enabled)
    spider = crawler.spider
    assert isinstance(spider, _Watcher)
    assert len(spider.holders) == 2
    if enabled:
        # Frozen before the crawl's requests pile up.
        assert spider.holders_at_start == 1
        assert spider.holders == [1, 1]
        assert min(spider.frozen) > 0
    else:
        assert spider.holders_at_start == 0
        assert spider.holders == [0, 0]
        assert spider.frozen == [0, 0]
    assert gc_tuning.holders() == 0
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("component", [HostQueueScheduler, GcTuning])
def test_a_bad_value_is_refused_naming_the_setting(
    component: type[HostQueueScheduler | GcTuning],
) -> None:
    crawler = get_crawler(PageSpider, settings(SCHEDULER=SCHEDULER, HOSTQUEUE_GC_FREEZE="often"))
    with pytest.raises(HostQueueSettingsError, match="HOSTQUEUE_GC_FREEZE"):
        component.from_crawler(crawler)


@deferred_f_from_coro_f
async def test_the_scheduler_alone_leaves_the_interpreter_as_it_is(
    python_default: tuple[int, ...],
) -> None:
    crawler = await crawl(["data:,one", "data:,two"], spider_cls=_Watcher, SCHEDULER=SCHEDULER)
    spider = crawler.spider
    assert isinstance(spider, _Watcher)
    assert spider.holders == [0, 0]
    assert spider.frozen == [0, 0]
    assert spider.young == [700, 700]


@pytest.mark.parametrize(
    ("freeze", "young", "line"),
    [
        (
            True,
            7000,
            r"GcTuning: [\d,]+ start-up objects frozen out of full GC passes; "
            r"young GC generation collected every 7,000 allocations$",
        ),
        (True, 0, r"GcTuning: [\d,]+ start-up objects frozen out of full GC passes$"),
        (False, 9000, r"GcTuning: young GC generation collected every 9,000 allocations$"),
    ],
)
@deferred_f_from_coro_f
async def test_the_extension_says_in_one_line_what_it_did(
    python_default: tuple[int, ...],
    caplog: pytest.LogCaptureFixture,
    freeze: bool,
    young: int,
    line: str,
) -> None:
    with caplog.at_level(logging.INFO, logger="scrapy_hostqueue"):
        await crawl(
            ["data:,one"],
            **WITH_GC_TUNING,
            HOSTQUEUE_GC_FREEZE=freeze,
            HOSTQUEUE_GC_YOUNG_THRESHOLD=young,
        )
    (said,) = [r.getMessage() for r in caplog.records if r.name == "scrapy_hostqueue.gc_tuning"]
    assert re.fullmatch(line, said), said
    # The scheduler's own start line no longer speaks of the GC.
    (start,) = [r.getMessage() for r in caplog.records if "HostQueueScheduler:" in r.getMessage()]
    assert "GC" not in start


def test_the_extension_is_off_when_both_settings_are_off() -> None:
    crawler = get_crawler(
        PageSpider, settings(HOSTQUEUE_GC_FREEZE=False, HOSTQUEUE_GC_YOUNG_THRESHOLD=0)
    )
    with pytest.raises(NotConfigured):
        GcTuning.from_crawler(crawler)
    for on in ({"HOSTQUEUE_GC_FREEZE": False}, {"HOSTQUEUE_GC_YOUNG_THRESHOLD": 0}):
        assert isinstance(GcTuning.from_crawler(get_crawler(PageSpider, settings(**on))), GcTuning)


def test_the_scrapy_hostqueue_modules_but_gc_tuning_never_import_gc() -> None:
    package = Path(gc_tuning.__file__).parent
    importing = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if re.search(r"^\s*(import gc\b|from gc import)", path.read_text(), re.MULTILINE)
    )
    assert importing == ["gc_tuning.py"]
