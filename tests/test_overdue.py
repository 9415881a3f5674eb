"""The overdue watch and the downloader budget it frees, without a crawl."""

from __future__ import annotations

from typing import Any

from scrapy import Request

from scrapy_hostqueue import _scrapy_internals as internals
from scrapy_hostqueue._overdue import OverdueWatch
from scrapy_hostqueue._requests import RequestRecord, RequestTable
from scrapy_hostqueue.frontier.memory import HostState, MemoryStore
from tests.helpers.clock import FakeClock


def watch(
    thresholds: dict[str, float], max_excused: int = 10
) -> tuple[OverdueWatch, MemoryStore[Request], RequestTable, FakeClock, list[Any]]:
    clock = FakeClock()
    store: MemoryStore[Request] = MemoryStore(lambda key: HostState(4), clock=clock)
    records = RequestTable()
    heard: list[Any] = []

    def on_overdue(request: Request, record: RequestRecord, seconds: float) -> None:
        heard.append((request.url, record.host, seconds))

    overdue = OverdueWatch(
        records, store, thresholds.__getitem__, on_overdue, max_excused=max_excused, clock=clock
    )
    return overdue, store, records, clock, heard


def send(store: MemoryStore[Request], records: RequestTable, clock: FakeClock, url: str) -> Request:
    request = Request(url)
    host = url.split("/")[2]
    store.push(host, 0, request)
    popped = store.pop()
    assert popped is not None and popped[1] is request
    records.hand_out(request, host, None)
    records.put_on_wire(request, clock.now)
    return request


def test_requests_past_their_hosts_overdue_time_are_marked_once() -> None:
    overdue, store, records, clock, heard = watch({"fast.test": 0.5, "slow.test": 5.0})
    send(store, records, clock, "http://fast.test/1")
    send(store, records, clock, "http://slow.test/1")
    clock.now += 0.4
    overdue.check()
    assert heard == []
    clock.now += 0.2
    overdue.check()
    overdue.check()
    assert [(url, host) for url, host, _ in heard] == [("http://fast.test/1", "fast.test")]
    assert abs(heard[0][2] - 0.6) < 1e-9
    assert store.overdue("fast.test") == 1 and store.overdue("slow.test") == 0
    assert overdue.count == 1


def test_an_answered_request_is_not_watched() -> None:
    overdue, store, records, clock, heard = watch({"h.test": 0.5})
    request = send(store, records, clock, "http://h.test/1")
    record = records.get(request)
    assert record is not None
    record.sent_at = None  # its headers are in: a long body is not a hang
    clock.now += 10
    overdue.check()
    assert heard == [] and overdue.count == 0


def test_at_most_max_excused_requests_leave_the_budget() -> None:
    overdue, store, records, clock, _heard = watch({"h.test": 0.5}, max_excused=2)
    requests = [send(store, records, clock, f"http://h.test/{page}") for page in range(3)]
    clock.now += 1
    overdue.check()
    assert overdue.count == 3
    assert overdue.excused() == 2
    record = records.leave(requests[0])
    assert record is not None
    overdue.left(record)
    assert overdue.count == 2


def test_the_downloader_budget_leaves_out_excused_requests() -> None:
    excused = [0]
    left: list[Any] = []
    active = internals._LeaveNotifyingSet(["a", "b", "c"], left.append, lambda: excused[0])
    assert len(active) == 3
    excused[0] = 2
    assert len(active) == 1
    excused[0] = 3
    assert len(active) == 0
    # Still busy: the engine must not take the spider for idle.
    assert active
    active.remove("a")
    assert left == ["a"]
    assert len(active) == 0 and active
