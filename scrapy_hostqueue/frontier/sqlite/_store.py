"""The SQLite store: the queued requests in one file, crash-safe, memory bounded by hosts.

Pure logic: no Scrapy or Twisted import; items are encoded by the caller's
codec. Every queued request is a row of the frontier file
(:mod:`scrapy_hostqueue.frontier.sqlite._file`). The ring of ready hosts and the
per-host state are the in-memory store's (:class:`MemoryStore`), which holds,
per host, only a *window*: the first few requests of its queue. A host's
requests beyond its window wait in the file, its *backlog*, counted by a
number; when a host's window runs low, the next requests are read from the
file. A request in a window is its row's id and its bytes, and the request
itself only for hosts with requests in flight (whose next requests are
handed out soon); the others are decoded when handed out. The latest
requests pushed in this process that wait as bytes or in a backlog are also
kept whole, up to :data:`SPARE` of them, so that a crawl of a few hosts
hands them out without decoding them. So the memory a crawl needs grows with
the hosts it knows, not with the requests it queued. A host with
requests in flight has a larger window (:data:`ACTIVE_WINDOW`): the requests
its responses yield stay in memory, as in the in-memory store, until its last
request in flight finishes.

Every request in memory comes before every request of the host's backlog in
serving order (higher rank first, FIFO among equals): a request pushed for a
host with a backlog goes to the backlog unless its rank is above every rank
there (``_bound``, an upper bound of them); a window grown past its size
hands its last requests back to the backlog.

At-least-once: a handed-out request stays in the file, marked leased, until
:meth:`SqliteStore.ack`; a file opened again gives leased requests back to
their queues (see :class:`FrontierFile`).

Host state: each host's limit, block, interval, spacing, given-up mark and
what the AIMD middleware learned about it (``export_learned``) are written
with the host's row at the commits after they change (a host is written at
the commit after a request of it finishes, while ``export_learned`` is set).
A file opened again takes back the state of the hosts with requests queued or
with a block, an interval or a give-up in force, never the others: memory
stays bounded by the hosts being worked on.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from scrapy_hostqueue._errors import FrontierFileError
from scrapy_hostqueue.frontier._layered import LayeredStore
from scrapy_hostqueue.frontier.memory import HostState, MemoryStore
from scrapy_hostqueue.frontier.sqlite._file import FrontierFile

__all__ = ["FrontierFile", "FrontierFileError", "SqliteStore"]

T = TypeVar("T")

#: Requests of a host kept in memory, and the count at which more are read.
WINDOW = 4
REFILL_AT = 1
#: The window of a host with requests in flight, which takes the links its
#: responses lead to without a trip through the file. Only the hosts being
#: crawled have one (they are as many as the active-host places, about); a
#: host's window shrinks back when its last request in flight finishes.
ACTIVE_WINDOW = 64
#: Requests pushed in this process that went to their host's backlog, kept
#: decoded (by row, the latest this many): a crawl of a few hosts reads them
#: back without decoding them. A decoded request is about 1 KB.
SPARE = 2048


class _Entry(Generic[T]):
    """A request in memory.

    Its row (0: kept in memory only, its codec could not encode it), its rank, and the item, or None
    to decode it when it is handed out: from *data*, its bytes, or if None, from the file.
    """

    __slots__ = ("data", "item", "rank", "rowid")

    def __init__(self, rowid: int, rank: int, item: T | None, data: bytes | None = None) -> None:
        self.rowid = rowid
        self.rank = rank
        self.item = item
        self.data = data


class SqliteStore(LayeredStore[_Entry[T]], Generic[T]):
    """A :class:`~scrapy_hostqueue.frontier.RequestStore` on a frontier file.

    *memory* is the in-memory store that keeps the ring and the host states
    (its items are this store's entries); *encode* turns an item into bytes,
    or None when it cannot (such an item is kept in memory only and is lost
    with the process); *decode* turns bytes back into an item.
    """

    def __init__(
        self,
        memory: MemoryStore[_Entry[T]],
        file: FrontierFile,
        encode: Callable[[T], bytes | None],
        decode: Callable[[bytes], T],
        *,
        window: int = WINDOW,
        active_window: int = ACTIVE_WINDOW,
        spare: int = SPARE,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(memory)
        self.file = file
        self._encode = encode
        self._decode = decode
        self._window = max(2, window)
        self._active_window = max(self._window, active_window)
        # The window of each host with requests in flight (see _refill).
        self._grown: dict[str, int] = {}
        self._wall = wall_clock
        self._backlog: dict[str, int] = {}
        self._bound: dict[str, int] = {}
        self._backlog_total = 0
        # Rows held in the memory store's queues.
        self._held: set[int] = set()
        # Decoded requests of rows in the backlogs (see SPARE), oldest first.
        self._spare: OrderedDict[int, T] = OrderedDict()
        self._spare_max = spare
        # Handed-out items by identity: (item, row, host, rank).
        self._leases: dict[int, tuple[T, int, str, int]] = {}
        self._dirty_hosts: set[str] = set()
        self.export_learned: Callable[[str], dict[str, float] | None] | None = None
        self._import_learned: Callable[[str, dict[str, float]], None] | None = None
        # What was learned about the hosts resumed, until import_learned takes it.
        self._learned: dict[str, dict[str, float]] = {}
        #: Requests found queued in the file when it was opened.
        self.resumed = self._resume()

    # -- the RequestStore attributes --------------------------------------------

    @property
    def import_learned(self) -> Callable[[str, dict[str, float]], None] | None:
        return self._import_learned

    @import_learned.setter
    def import_learned(self, value: Callable[[str, dict[str, float]], None] | None) -> None:
        """Set it, and give it what was learned about the hosts resumed."""
        self._import_learned = value
        if value is None:
            return
        learned, self._learned = self._learned, {}
        for key, data in learned.items():
            value(key, data)

    def _changed(self, key: str) -> None:
        self._dirty_hosts.add(key)

    def __len__(self) -> int:
        return len(self._mem) + self._backlog_total

    # -- requests ----------------------------------------------------------------

    def push(self, key: str, rank: int, item: T) -> bool:
        state = self._mem.known_state(key)
        if state is not None and state.given_up:
            return False
        data = self._encode(item)
        if data is None:
            return self._mem.push(key, rank, _Entry(0, rank, item))
        rowid = self.file.new_id()
        if self._to_backlog(key, rank):
            self.file.insert(rowid, key, rank, data)
            self._keep_spare(rowid, item)
            return True
        # Kept whole only for a host being crawled: the others' requests wait
        # as bytes.
        in_flight = self._mem.in_flight(key)
        entry = _Entry(rowid, rank, item) if in_flight else _Entry(rowid, rank, None, data)
        if not self._mem.push(key, rank, entry):
            return False
        if not in_flight:
            self._keep_spare(rowid, item)
        self.file.insert(rowid, key, rank, data)
        self._held.add(rowid)
        self._trim(key)
        return True

    def _keep_spare(self, rowid: int, item: T) -> None:
        spare = self._spare
        spare[rowid] = item
        if len(spare) > self._spare_max:
            spare.popitem(last=False)

    def _to_backlog(self, key: str, rank: int) -> bool:
        """Whether a request of *rank* for *key* waits in the file (and is counted there).

        Behind requests of its host already waiting there.
        """
        backlog = self._backlog.get(key, 0)
        if not backlog or rank > self._bound[key]:
            return False
        self._backlog[key] = backlog + 1
        self._backlog_total += 1
        return True

    def _add_backlog(self, key: str, count: int, rank: int) -> None:
        if key in self._backlog:
            self._backlog[key] += count
            self._bound[key] = max(self._bound[key], rank)
        else:
            self._backlog[key] = count
            self._bound[key] = rank
        self._backlog_total += count

    def _trim(self, key: str) -> None:
        if self._mem.in_flight(key):
            window = self._active_window
        else:
            window = self._window
            self._grown.pop(key, None)
        if self._mem.queued(key) <= window:
            return
        evicted = self._mem.trim(key, window)
        kept: list[_Entry[T]] = []
        for entry in evicted:
            if entry.rowid:
                self._held.discard(entry.rowid)
                self._add_backlog(key, 1, entry.rank)
                if entry.item is not None:
                    self._keep_spare(entry.rowid, entry.item)
            else:
                kept.append(entry)  # nowhere else to keep it
        for entry in kept:
            self._mem.push(key, entry.rank, entry)

    def _refill(self, key: str) -> None:
        """Read the next requests of *key*'s backlog into memory.

        Up to its window, which grows for a host with requests in flight (their rows, as bytes: a
        read, and the flush of the pending writes before it, per few requests handed out cost more
        than the memory).
        """
        backlog = self._backlog.get(key, 0)
        if not backlog:
            return
        held = self._mem.queued(key)
        window = self._window
        if self._mem.in_flight(key):
            # Four times larger at each read while the host is worked on, up to the
            # active window: a host handed out a few requests (a broad crawl's
            # many hosts) reads few rows, a host worked on at length few times.
            window = min(self._active_window, 4 * self._grown.get(key, self._window))
            self._grown[key] = window
        want = window - held
        if want <= 0:
            return
        rows = self.file.head(key, held + want)
        loaded = 0
        last_rank = None
        spare = self._spare
        for rowid, rank, data in rows:
            if rowid in self._held:
                continue
            item = spare.pop(rowid, None)
            self._mem.push(key, rank, _Entry(rowid, rank, item, None if item is not None else data))
            self._held.add(rowid)
            last_rank = rank
            loaded += 1
            if loaded == want:
                break
        if len(rows) < held + want or loaded >= backlog:
            # The file holds no more (the count is corrected from the file).
            self._backlog_total -= backlog
            del self._backlog[key]
            del self._bound[key]
            return
        self._backlog[key] = backlog - loaded
        self._backlog_total -= loaded
        if last_rank is not None:
            # What is left comes after the last request read.
            self._bound[key] = min(self._bound[key], last_rank)

    def pop(self, now: float | None = None) -> tuple[str, T] | None:
        popped = self._mem.pop(now)
        if popped is None:
            return None
        key, entry = popped
        item = self._item(entry)
        if entry.rowid:
            self._held.discard(entry.rowid)
            self.file.set_leased(entry.rowid, True)
            self._leases[id(item)] = (item, entry.rowid, key, entry.rank)
        if key in self._backlog and self._mem.queued(key) <= REFILL_AT:
            self._refill(key)
        return key, item

    def _item(self, entry: _Entry[T]) -> T:
        """Return the request of *entry*, leaving memory: whole, from the spare, or decoded."""
        item = entry.item
        if item is None:
            item = self._spare.pop(entry.rowid, None)
            if item is None:
                item = self._decode(entry.data or self.file.data(entry.rowid))
        return item

    def finish(self, key: str, overdue: bool = False) -> None:
        self._mem.finish(key, overdue)
        if self.export_learned is not None:
            # Its answer (or failure) taught the middleware something.
            self._dirty_hosts.add(key)
        if not self._mem.in_flight(key):
            self._trim(key)

    def ack(self, item: T) -> None:
        lease = self._leases.pop(id(item), None)
        if lease is not None:
            self.file.delete(lease[1])

    def give_back(self, key: str, rank: int, item: T) -> None:
        lease = self._leases.pop(id(item), None)
        if lease is None:
            self._mem.push(key, rank, _Entry(0, rank, item))
            return
        rowid = lease[1]
        self.file.set_leased(rowid, False)
        if key in self._backlog:
            # Back in the file: read again in its turn.
            self._add_backlog(key, 1, rank)
            self._keep_spare(rowid, item)
            return
        if self._mem.push(key, rank, _Entry(rowid, rank, item)):
            self._held.add(rowid)
            self._trim(key)

    def give_up(self, key: str) -> list[T]:
        """Give up *key* from now on; return its queued requests.

        From memory and from the file, each leased until acknowledged (they go
        to their errbacks).
        """
        self._dirty_hosts.add(key)
        entries = self._mem.give_up(key)
        backlog = self._backlog.pop(key, 0)
        self._bound.pop(key, None)
        self._backlog_total -= backlog
        for entry in entries:
            self._held.discard(entry.rowid)
        held = {entry.rowid for entry in entries}
        if backlog:
            entries += [
                _Entry(rowid, rank, None, data)
                for rowid, _host, rank, data in self.file.rows(key)
                if rowid not in held
            ]
        items = []
        for entry in entries:
            item = self._item(entry)
            if entry.rowid:
                self.file.set_leased(entry.rowid, True)
                self._leases[id(item)] = (item, entry.rowid, key, entry.rank)
            items.append(item)
        return items

    def items(self) -> Iterator[tuple[str, int, T]]:
        """List ``(key, rank, item)`` of every queued request.

        ``(key, rank, item)`` of every queued request, from the file and
        memory (O(requests), decoding each).
        """
        for key, rank, entry in self._mem.items():
            if not entry.rowid:
                assert entry.item is not None
                yield key, rank, entry.item
        for _rowid, key, rank, data in self.file.rows():
            yield key, rank, self._decode(data)

    def seen(self, fingerprint: bytes) -> bool:
        """Answer the dupefilter from the file: whether *fingerprint* was seen.

        Notes it if not (in the same commit as the request pushed next).
        """
        return self.file.seen(fingerprint)

    # -- hosts -----------------------------------------------------------------

    def queued(self, key: str) -> int:
        return self._mem.queued(key) + self._backlog.get(key, 0)

    def hosts(self) -> Iterator[tuple[str, int, int, HostState]]:
        for key, queued, in_flight, state in self._mem.hosts():
            yield key, queued + self._backlog.get(key, 0), in_flight, state

    # -- the file ----------------------------------------------------------------

    def commit(self) -> None:
        """Make every change so far durable (the caller's group-commit timer)."""
        if self._dirty_hosts:
            self._save_hosts(spacing=False)
        self.file.commit()

    def close(self) -> None:
        try:
            if self.file.failed is None:
                self._save_hosts(spacing=True)
        finally:
            self.file.close()

    def _save_hosts(self, *, spacing: bool) -> None:
        now = self._mem.clock()
        to_wall = self._wall() - now
        dirty, self._dirty_hosts = self._dirty_hosts, set()
        if self.file.failed is not None:
            return
        # At a close, the spacing of every host too (the next start it allows).
        spaced = dict(self._mem.spaced(now)) if spacing else {}
        export = self.export_learned
        for key in dirty | spaced.keys():
            state = self._mem.known_state(key)
            if state is None:
                continue
            blocked = state.blocked_until > now
            when = spaced.get(key)
            learned = export(key) if export is not None else self._learned.get(key)
            self.file.put_host(
                (
                    key,
                    state.limit,
                    state.interval,
                    state.blocked_until + to_wall if blocked else None,
                    state.block_reason if blocked else None,
                    when + to_wall if when is not None else None,
                    int(state.given_up),
                    json.dumps(learned, separators=(",", ":")) if learned else None,
                )
            )

    def _resume(self) -> int:
        """Take over what the file holds: host state, then a window of every host's queue."""
        now = self._mem.clock()
        to_monotonic = now - self._wall()
        queued = dict(self.file.queued_per_host())
        for row in self.file.host_rows():
            key, limit, interval, blocked_at, reason, spaced_at, given_up, learned = row
            blocked = blocked_at + to_monotonic if blocked_at is not None else 0.0
            spaced = spaced_at + to_monotonic if spaced_at is not None else 0.0
            if key not in queued and not (given_up or interval or blocked > now or spaced > now):
                # Nothing to do for it and nothing in force: a broad crawl's
                # hosts are many, and memory is for those being worked on.
                continue
            data = parse_learned(learned)
            if data is not None:
                self._learned[key] = data
            if given_up and key not in queued:
                # A host given up with requests queued (they were on their
                # way to their errbacks) gets another chance instead.
                self._mem.give_up(key)
            if limit:
                self._mem.set_limit(key, limit)
            if interval:
                self._mem.set_interval(key, interval)
            if blocked > now:
                self._mem.block_until(key, blocked, reason)
            if spaced > now:
                self._mem.space_until(key, spaced)
        for key, count in queued.items():
            self._backlog[key] = count
            self._bound[key] = 2**62
            self._backlog_total += count
            self._refill(key)
        return sum(queued.values())


def parse_learned(text: str | None) -> dict[str, float] | None:
    """Read the ``learned`` column of a host row as a dict.

    The ``learned`` column of a host row as a dict (None if it is empty or
    not a JSON object of numbers).
    """
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return {
        str(name): value
        for name, value in data.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    } or None


def open_error(error: BaseException) -> FrontierFileError:
    """*error* as a :class:`FrontierFileError` (for callers that open a file)."""
    if isinstance(error, FrontierFileError):
        return error
    return FrontierFileError(str(error))
