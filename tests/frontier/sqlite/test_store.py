"""Tests of the SQLite store and its file.

Serving order, bounded windows, leases across a reopen, group commit, and the files it refuses.

A fake clock for the ring; no crawl, no sleep.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import FormRequest, Request, Spider
from scrapy.utils.request import request_from_dict
from scrapy.utils.test import get_crawler

from scrapy_hostqueue.__main__ import main
from scrapy_hostqueue.frontier import FRONTIER_FILE, HostState, MemoryStore
from scrapy_hostqueue.frontier._codec import RequestCodec
from scrapy_hostqueue.frontier._dupefilter import FrontierDupeFilter
from scrapy_hostqueue.frontier.sqlite import _file as sqlfile
from scrapy_hostqueue.frontier.sqlite._file import (
    FORMAT_VERSION,
    FrontierFile,
    FrontierFileError,
    SeenFilter,
)
from scrapy_hostqueue.frontier.sqlite._store import SPARE, WINDOW, SqliteStore
from scrapy_hostqueue.scheduler import HostQueueScheduler
from tests.helpers.clock import FakeClock


class Item:
    """A request stand-in: a name, encoded as bytes (``unencodable`` ones cannot be)."""

    def __init__(self, name: str, *, unencodable: bool = False) -> None:
        self.name = name
        self.unencodable = unencodable

    def __repr__(self) -> str:
        return f"Item({self.name!r})"


def encode(item: Item) -> bytes | None:
    return None if item.unencodable else item.name.encode()


def decode(data: bytes) -> Item:
    return Item(data.decode())


def open_store(path: Path, *, limit: int = 100, window: int = WINDOW) -> SqliteStore[Item]:
    memory: MemoryStore = MemoryStore(lambda key: HostState(limit), clock=FakeClock())
    return SqliteStore(memory, FrontierFile(str(path)), encode, decode, window=window)


def killed(store: SqliteStore[Item]) -> None:
    """Kill the process that holds *store*, as far as the store can tell.

    What is not committed is lost, and the file's lock, its connections and its checkpoint thread go
    without a word (a connection left open would be reported unclosed when collected).
    """
    file = store.file
    assert file._checkpointer is not None and file._lock is not None
    file._checkpointer.stop()
    file._lock.close()
    file.conn.close()


def drain(store: SqliteStore[Item], *, ack: bool = True) -> list[tuple[str, str]]:
    out = []
    while (popped := store.pop()) is not None:
        key, item = popped
        out.append((key, item.name))
        store.finish(key)
        if ack:
            store.ack(item)
    return out


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "frontier.db"


def test_serving_order_matches_the_memory_store(path: Path) -> None:
    rng = random.Random(7)
    ranks = [0, 0, 0, 1, -1, 2]
    pushes = [(f"h{rng.randrange(5)}", rng.choice(ranks), f"r{n}") for n in range(400)]
    store = open_store(path, window=3)
    memory: MemoryStore[str] = MemoryStore(lambda key: HostState(100), clock=FakeClock())
    for key, rank, name in pushes:
        assert store.push(key, rank, Item(name))
        memory.push(key, rank, name)
    assert len(store) == len(memory) == 400
    expected = []
    while (popped := memory.pop()) is not None:
        expected.append(popped)
        memory.finish(popped[0])
    assert drain(store) == expected
    assert len(store) == 0
    store.close()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(-2, 2), st.booleans()),
        min_size=1,
        max_size=60,
    )
)
def test_interleaved_pushes_and_pops_keep_each_hosts_order(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int, bool]]
) -> None:
    """Within a host, requests come out by rank, FIFO among equals.

    This holds whatever part of the queue waits in the file.
    """
    path = tmp_path_factory.mktemp("prop") / "f.db"
    store = open_store(path, window=2)
    queued: dict[str, list[tuple[int, int]]] = {}
    for n, (key, rank, pop_first) in enumerate(steps):
        if pop_first and (popped := store.pop()) is not None:
            host, item = popped
            store.finish(host)
            store.ack(item)
            best = min(queued[host], key=lambda e: (-e[0], e[1]))
            assert int(item.name) == best[1]
            queued[host].remove(best)
        store.push(key, rank, Item(str(n)))
        queued.setdefault(key, []).append((rank, n))
    rest = drain(store)
    assert sorted(int(name) for _, name in rest) == sorted(
        n for entries in queued.values() for _, n in entries
    )
    store.close()


def test_memory_holds_a_window_per_host(path: Path) -> None:
    store = open_store(path)
    for n in range(1000):
        store.push(f"h{n % 10}", 0, Item(str(n)))
    assert len(store) == 1000
    assert len(store._mem) <= 10 * WINDOW
    assert all(store.queued(f"h{h}") == 100 for h in range(10))
    assert len(drain(store)) == 1000
    store.close()


def test_a_higher_priority_request_passes_the_backlog(path: Path) -> None:
    store = open_store(path, window=2)
    for n in range(10):
        store.push("h", 0, Item(f"low{n}"))
    store.push("h", 5, Item("high"))
    assert drain(store)[0] == ("h", "high")
    store.close()


def test_unacknowledged_requests_come_back_after_a_crash(path: Path) -> None:
    store = open_store(path)
    for n in range(20):
        store.push(f"h{n % 2}", 0, Item(str(n)))
    store.commit()
    handed = [store.pop() for _ in range(6)]
    for popped in handed[:3]:
        assert popped is not None
        store.finish(popped[0])
        store.ack(popped[1])
    store.commit()
    killed(store)
    again = open_store(path)
    assert again.resumed == 17
    names = {name for _, name in drain(again)}
    assert {p[1].name for p in handed[3:] if p} <= names
    assert not names & {p[1].name for p in handed[:3] if p}
    again.close()


def test_what_was_not_committed_is_lost_only_with_its_acknowledgement(path: Path) -> None:
    """A commit holds every write made before it.

    Children pushed before their parent's acknowledgement are durable when it is.
    """
    store = open_store(path)
    store.push("h", 0, Item("parent"))
    store.commit()
    popped = store.pop()
    assert popped is not None
    store.push("h", 0, Item("child"))
    store.finish("h")
    store.ack(popped[1])
    store.file.flush()  # in the transaction, not committed
    killed(store)
    again = open_store(path)
    assert [name for _, name in drain(again)] == ["parent"]
    again.close()


def test_graceful_close_and_reopen_is_exactly_once(path: Path) -> None:
    store = open_store(path)
    for n in range(50):
        store.push(f"h{n % 5}", 0, Item(str(n)))
    first: list[tuple[str, str]] = []
    for _ in range(20):
        popped = store.pop()
        assert popped is not None
        store.finish(popped[0])
        store.ack(popped[1])
        first.append((popped[0], popped[1].name))
    store.close()
    again = open_store(path)
    rest = drain(again)
    again.close()
    assert sorted(int(n) for _, n in first + rest) == list(range(50))


def test_fingerprints_are_kept(path: Path) -> None:
    store = open_store(path)
    assert not store.seen(b"a" * 20)
    assert store.seen(b"a" * 20)
    store.close()
    again = open_store(path)
    assert again.seen(b"a" * 20)
    assert not again.seen(b"b" * 20)
    again.close()


@pytest.mark.parametrize("filtered", [True, False])
def test_fingerprints_are_told_after_a_crash(
    path: Path, monkeypatch: pytest.MonkeyPatch, filtered: bool
) -> None:
    """Seen fingerprints are told apart from new ones after a crash.

    This holds with the filter in front of the table and without it (a file with more fingerprints
    than it takes in at the start), across the generations of recent ones.
    """
    monkeypatch.setattr(sqlfile, "RECENT", 64)
    fingerprints = [hashlib.sha1(str(n).encode()).digest() for n in range(3000)]
    store = open_store(path)
    assert not any(store.seen(fp) for fp in fingerprints[:2000])
    assert all(store.seen(fp) for fp in fingerprints[:2000])
    store.push("h", 0, Item("last"))
    store.commit()
    killed(store)
    if not filtered:
        monkeypatch.setattr(sqlfile, "FILTER_LOAD_MAX", 1999)
    again = open_store(path)
    assert (again.file._filter is not None) is filtered
    assert all(again.seen(fp) for fp in fingerprints[:2000])
    assert not any(again.seen(fp) for fp in fingerprints[2000:])
    assert all(again.seen(fp) for fp in fingerprints)
    # What is kept in memory stays bounded.
    assert len(again.file._recent) < 64 and len(again.file._older) <= 64
    again.close()


def test_a_fingerprint_is_durable_with_its_request_only(path: Path) -> None:
    store = open_store(path)
    assert not store.seen(b"1" * 20)
    store.push("h", 0, Item("1"))
    store.commit()
    assert not store.seen(b"2" * 20)
    store.push("h", 0, Item("2"))
    store.file.flush()  # in the transaction, not committed
    killed(store)
    again = open_store(path)
    assert [name for _, name in drain(again)] == ["1"]
    assert again.seen(b"1" * 20)
    assert not again.seen(b"2" * 20)
    again.close()


def test_a_large_batch_is_committed_before_the_timer(path: Path) -> None:
    store = open_store(path)
    for n in range(sqlfile._BATCH + 10):
        store.push(f"h{n % 7}", 0, Item(str(n)))
    reader = sqlite3.connect(str(path))
    committed = reader.execute("SELECT count(*) FROM requests").fetchone()[0]
    reader.close()
    assert committed == sqlfile._BATCH
    store.close()


def test_the_seen_filter_never_takes_a_fingerprint_for_new_twice() -> None:
    seen = SeenFilter(bits=2**16)  # small: many fingerprints share bits
    fingerprints = [hashlib.sha1(str(n).encode()).digest() for n in range(20000)]
    told_new = [seen.add(fp) for fp in fingerprints]
    assert not any(seen.add(fp) for fp in fingerprints)
    # Past its size it tells fewer new ones, and still some.
    assert 0 < sum(told_new) < len(fingerprints)


def test_requests_pushed_here_come_back_from_the_backlog_without_decoding(path: Path) -> None:
    decoded: list[bytes] = []

    def counting_decode(data: bytes) -> Item:
        decoded.append(data)
        return decode(data)

    for spare in (SPARE, 0):
        decoded.clear()
        memory: MemoryStore = MemoryStore(lambda key: HostState(100), clock=FakeClock())
        store = SqliteStore(memory, FrontierFile(str(path)), encode, counting_decode, spare=spare)
        pushed = [Item(str(n)) for n in range(40)]
        for item in pushed:
            store.push("h", 0, item)
        assert store.queued("h") == 40 and len(store._mem) < 40  # a backlog
        popped = drain(store)
        assert [name for _, name in popped] == [item.name for item in pushed]
        store.close()
        path.unlink()
        assert len(decoded) == (0 if spare else 40)


def test_host_state_survives(path: Path) -> None:
    store = open_store(path)
    store.push("h", 0, Item("x"))
    store.set_limit("h", 3)
    store.block_until("h", store._mem.clock() + 60, "retry-after")
    store.set_interval("g", 2.0)
    store.close()
    again = open_store(path)
    assert again.host_state("h").limit == 3
    assert again.host_state("h").block_reason == "retry-after"
    assert again.host_state("h").blocked_until > again._mem.clock() + 50
    assert again.host_state("g").interval == 2.0
    again.close()


class Learner:
    """The AIMD middleware's side of the store's learned state.

    What it knows per host, what it was given back.
    """

    def __init__(self, known: dict[str, dict[str, float]] | None = None) -> None:
        self.known = dict(known or {})
        self.given: dict[str, dict[str, float]] = {}

    def learned(self, key: str) -> dict[str, float] | None:
        return self.known.get(key)

    def relearn(self, key: str, data: dict[str, float]) -> None:
        self.given[key] = data


def attach(store: SqliteStore[Item], learner: Learner) -> None:
    """Do what the scheduler does when the AIMD middleware attaches."""
    store.export_learned = learner.learned
    store.import_learned = learner.relearn


def test_what_the_middleware_learned_is_given_back_on_resume(path: Path) -> None:
    store = open_store(path)
    learner = Learner(
        {
            "slow.example": {"limit": 1, "srtt": 0.8, "rttvar": 0.1, "failures": 2},
            "idle.example": {"limit": 3, "srtt": 0.05, "rttvar": 0.01},
        }
    )
    attach(store, learner)
    for n in range(6):
        store.push("slow.example", 0, Item(f"s{n}"))
    store.push("idle.example", 0, Item("i0"))
    # A request of each host is answered: what was learned is written at the
    # next commit, each host with only a limit learned.
    for _ in range(2):
        popped = store.pop()
        assert popped is not None
        store.finish(popped[0])
        store.ack(popped[1])
    store.set_limit("slow.example", 1)
    store.commit()
    store.file.close()  # a crash: no close of the store

    again = open_store(path)
    assert again.queued("slow.example") == 5
    assert again.host_state("slow.example").limit == 1
    # Nothing queued for idle.example: not loaded.
    assert again.known_state("idle.example") is None
    relearned = Learner()
    attach(again, relearned)
    assert relearned.given == {
        "slow.example": {"limit": 1, "srtt": 0.8, "rttvar": 0.1, "failures": 2}
    }
    again.close()


def test_learned_state_not_taken_back_is_kept_in_the_file(path: Path) -> None:
    store = open_store(path)
    attach(store, Learner({"h": {"limit": 2, "srtt": 0.3, "rttvar": 0.05}}))
    store.push("h", 0, Item("a"))
    store.push("h", 0, Item("b"))
    popped = store.pop()
    assert popped is not None
    store.finish("h")
    store.ack(popped[1])
    store.close()
    # A run without the middleware writes the host back as it found it.
    middle = open_store(path)
    middle.block_until("h", middle._mem.clock() + 1, "retry-after")
    middle.close()
    last = open_store(path)
    relearned = Learner()
    attach(last, relearned)
    assert relearned.given == {"h": {"limit": 2, "srtt": 0.3, "rttvar": 0.05}}
    last.close()


def test_a_file_without_the_learned_column_gets_it(path: Path) -> None:
    store = open_store(path)
    store.push("h", 0, Item("a"))
    store.set_limit("h", 3)
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE hosts DROP COLUMN learned")
    conn.commit()
    conn.close()
    old = FrontierFile(str(path), readonly=True)
    assert [row[7] for row in old.host_rows()] == [None]
    old.close()
    again = open_store(path)
    assert again.host_state("h").limit == 3
    attach(again, Learner({"h": {"limit": 3}}))
    popped = again.pop()
    assert popped is not None
    again.finish("h")
    again.close()
    last = open_store(path)
    relearned = Learner()
    attach(last, relearned)
    assert relearned.given == {"h": {"limit": 3}}
    last.close()


def test_requests_given_back_are_served_again(path: Path) -> None:
    store = open_store(path, window=2)
    for n in range(6):
        store.push("h", 0, Item(str(n)))
    popped = store.pop()
    assert popped is not None
    store.finish("h")
    store.give_back("h", 0, popped[1])
    assert sorted(int(n) for _, n in drain(store)) == list(range(6))
    store.close()


def test_given_up_hosts_hand_back_their_whole_queue(path: Path) -> None:
    store = open_store(path, window=2)
    for n in range(7):
        store.push("h", 0, Item(str(n)))
    dropped = store.give_up("h")
    assert sorted(int(i.name) for i in dropped) == list(range(7))
    assert len(store) == 0
    assert not store.push("h", 0, Item("late"))
    for item in dropped:
        store.ack(item)
    store.close()
    again = open_store(path)
    assert again.resumed == 0
    assert not again.push("h", 0, Item("later"))
    again.close()


def test_unencodable_items_stay_in_memory(path: Path) -> None:
    store = open_store(path, window=2)
    for n in range(5):
        store.push("h", 0, Item(str(n)))
    store.push("h", 0, Item("odd", unencodable=True))
    assert sorted(name for _, name in drain(store)) == sorted([*map(str, range(5)), "odd"])
    store.close()


# -- files it refuses ----------------------------------------------------------


def test_a_corrupt_file_is_refused_and_left_as_it_was(path: Path) -> None:
    path.write_bytes(b"this is not a database" * 100)
    before = path.read_bytes()
    with pytest.raises(FrontierFileError, match=str(path)) as info:
        FrontierFile(str(path))
    assert "\n" not in str(info.value)
    assert path.read_bytes() == before


def test_a_foreign_sqlite_file_is_refused(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(FrontierFileError, match="not a scrapy-hostqueue frontier file"):
        FrontierFile(str(path))


def test_a_file_of_another_format_is_refused(path: Path) -> None:
    FrontierFile(str(path)).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {FORMAT_VERSION + 1}")
    conn.close()
    with pytest.raises(FrontierFileError, match=f"format {FORMAT_VERSION + 1}"):
        FrontierFile(str(path))


def test_a_file_in_use_is_refused(path: Path) -> None:
    first = FrontierFile(str(path))
    with pytest.raises(FrontierFileError, match="locked by another running crawl"):
        FrontierFile(str(path))
    first.close()
    FrontierFile(str(path)).close()


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root writes anyway")
def test_an_unwritable_directory_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        with pytest.raises(FrontierFileError, match="writable"):
            FrontierFile(str(directory / "frontier.db"))
    finally:
        directory.chmod(0o700)


def test_an_unwritable_path_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(FrontierFileError, match="choose another JOBDIR"):
        FrontierFile(str(blocker / "sub" / "frontier.db"))


def test_a_full_disk_fails_the_commit_and_keeps_the_last_one(path: Path) -> None:
    store = open_store(path)
    store.push("h", 0, Item("kept"))
    store.commit()
    pages = store.file.conn.execute("PRAGMA page_count").fetchone()[0]
    store.file.conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(FrontierFileError, match="disk is full"):
        for n in range(2000):
            store.push("h", 0, Item("x" * 1000 + str(n)))
        store.commit()
    assert store.file.failed is not None
    store.close()
    again = open_store(path)
    assert next(name for _, name in drain(again)) == "kept"
    again.close()


# -- the frontier command --------------------------------------------------------


def test_the_frontier_command_reports_what_the_file_holds(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(path)
    for n in range(30):
        store.push("busy.example" if n % 3 else "quiet.example", 0, Item(str(n)))
    store.pop()
    store.block_until("quiet.example", store._mem.clock() + 3600, "retry-after")
    store.set_limit("busy.example", 2)
    attach(store, Learner({"busy.example": {"limit": 2, "srtt": 0.25, "rttvar": 0.05}}))
    store.commit()
    # Read while the crawl holds the file.
    try:
        assert main(["frontier", str(path), "--top", "5"]) == 0
    finally:
        store.close()
    out = capsys.readouterr().out
    assert "29 requests queued and 1 leased" in out
    assert "busy.example" in out and "quiet.example" in out
    assert "retry-after" in out
    assert "limit 2" in out
    assert "AIMD limit 2, latency 0.25 s" in out


def test_the_frontier_command_names_a_file_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"nope" * 1000)
    assert main(["frontier", f"sqlite://{bad}"]) == 2
    assert str(bad) in capsys.readouterr().err


# -- the scheduler on a JOBDIR ---------------------------------------------------


def _scheduler(jobdir: Path) -> HostQueueScheduler:
    settings = {"JOBDIR": str(jobdir), "TELNETCONSOLE_ENABLED": False}
    return HostQueueScheduler.from_crawler(get_crawler(Spider, settings))


def test_a_jobdir_another_crawl_holds_is_refused_at_start(tmp_path: Path) -> None:
    holder = FrontierFile(str(tmp_path / FRONTIER_FILE))
    try:
        with pytest.raises(FrontierFileError, match="locked by another running crawl") as info:
            _scheduler(tmp_path)
        assert str(tmp_path / FRONTIER_FILE) in str(info.value)
    finally:
        holder.close()
    # Once the other crawl is gone, the job resumes.
    scheduler = _scheduler(tmp_path)
    assert isinstance(scheduler.df, FrontierDupeFilter)
    scheduler.hosts.store.close()


def test_a_damaged_frontier_in_jobdir_is_refused_at_start(tmp_path: Path) -> None:
    (tmp_path / FRONTIER_FILE).write_bytes(b"\0garbage" * 512)
    with pytest.raises(FrontierFileError, match="damaged"):
        _scheduler(tmp_path)


# -- the request codec -------------------------------------------------------------


class CodecSpider(Spider):
    name = "codec"

    def parse(self, response: object) -> None:
        pass

    def parse_item(self, response: object) -> None:
        pass

    def failed(self, failure: object) -> None:
        pass


def test_the_codec_writes_what_request_to_dict_gives() -> None:
    crawler = get_crawler(CodecSpider, {"TELNETCONSOLE_ENABLED": False})
    spider = CodecSpider()
    codec = RequestCodec(crawler.stats, debug=False)
    codec.spider = spider
    other = CodecSpider()
    requests = [
        Request("http://a.example/1"),
        Request("http://a.example/2", callback=spider.parse, errback=spider.failed),
        Request("http://a.example/3", callback=spider.parse_item, priority=3, meta={"k": 1}),
        Request("http://a.example/4", callback=other.parse_item, cb_kwargs={"n": 2}),
        Request("http://a.example/5", headers={"X-A": "b"}, cookies={"c": "d"}),
        FormRequest("http://a.example/6", formdata={"q": "x"}, callback=spider.parse),
        Request(
            "http://a.example/9",
            method="PUT",
            body=b"x",
            encoding="latin-1",
            priority=-2,
            dont_filter=True,
            flags=["f"],
        ),
    ]
    default = Request("http://a.example/0").to_dict()
    # Twice: the second time the callbacks' names are remembered.
    for _ in range(2):
        for request in requests:
            data = codec.encode(request)
            assert data is not None
            stored, full = pickle.loads(data), request.to_dict(spider=spider)
            if type(request) is Request:
                # What is left out is at the default of a plain Request.
                assert stored.items() <= full.items()
                left_out = full.keys() - stored.keys()
                assert {key: full[key] for key in left_out} == {
                    key: value for key, value in default.items() if key in left_out
                }
            else:
                assert stored == full
            # Scrapy reads it back as it reads its own disk queues.
            assert request_from_dict(stored, spider=spider).to_dict(spider=spider) == full
            again = codec.decode(data)
            assert type(again) is type(request)
            assert again.to_dict(spider=spider) == request.to_dict(spider=spider)
        # A row written whole (every field, as Request.to_dict gives it) reads the same.
        for request in requests:
            whole = pickle.dumps(request.to_dict(spider=spider), protocol=4)
            assert codec.decode(whole).to_dict(spider=spider) == request.to_dict(spider=spider)
    # A followed link is its URL and its callback's name.
    data = codec.encode(requests[1].replace(errback=None))
    assert data is not None
    assert pickle.loads(data) == {"url": "http://a.example/2", "callback": "parse"}
    # A callback that is not one of the spider's methods cannot be written,
    # as with Request.to_dict.
    assert codec.encode(Request("http://a.example/7", callback=lambda r: None)) is None
    assert crawler.stats.get_value("scheduler/unserializable") == 1
    # A method the spider no longer has under its remembered name is looked
    # up again (and not found, as Request.to_dict would not find it).
    method = spider.parse_item
    spider.parse_item = spider.failed  # type: ignore[method-assign]
    request = Request("http://a.example/8", callback=method)
    with pytest.raises(ValueError, match="not an instance method"):
        request.to_dict(spider=spider)
    assert codec.encode(request) is None
    assert crawler.stats.get_value("scheduler/unserializable") == 2


def test_the_cpu_bench_runs_the_same_crawl_on_both_stores() -> None:
    """``python -m bench.frontier_cpu`` compares the stores on one crawl.

    The same requests enqueued and handed out with each (timing is its business).
    """
    from bench import frontier_cpu

    memory = frontier_cpu.crawl("memory", pages=60, per_host=10)
    sqlite = frontier_cpu.crawl("sqlite", pages=60, per_host=10)
    assert memory["pages"] == sqlite["pages"] == 60
    for key in ("enqueued", "popped"):
        assert memory[key] == sqlite[key] > 60
