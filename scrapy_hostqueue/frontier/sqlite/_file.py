"""The frontier file.

One SQLite file (WAL mode) with the queued requests, the host state a crawl learned and the
fingerprints its dupefilter has seen.

Pure: no Scrapy or Twisted import. Writes are batched (group commit): they
wait in memory, go into the open transaction before any read that must see
them (or when the batch is large), and are committed by :meth:`FrontierFile.commit`,
which the caller runs on a timer and at close. A commit holds every write made
before it, in the order they were made: a request's acknowledgement is never
durable without the requests its callback produced, which were written before.

A lock file next to the file (``fcntl.flock``, which the OS releases when the
process dies, however it dies) keeps a second crawl out.

The dupefilter's question (:meth:`FrontierFile.seen`) is answered without a
statement for a recent fingerprint and, through a Bloom filter of the
fingerprints in the file (:class:`SeenFilter`), for most new ones; a new
fingerprint is then written with the pending writes, so with its request.

Checkpoints (copying the WAL into the file, with an ``fsync``) run in a thread
of their own on a connection of their own: done inside a commit on the event
loop they held it for 200 ms at times.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from typing import IO, Any

from scrapy_hostqueue._errors import FrontierFileError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock
    fcntl = None  # type: ignore[assignment]

#: ``PRAGMA application_id``: "HQFR", marks a file as a frontier file.
APPLICATION_ID = 0x48514652
#: ``PRAGMA user_version``: the layout of the tables. A file of another
#: version is refused, never converted silently.
FORMAT_VERSION = 1

_SCHEMA = (
    # ``nrank`` is minus the rank, so that the serving order is ascending.
    """CREATE TABLE requests (
        id INTEGER PRIMARY KEY,
        host TEXT NOT NULL,
        nrank INTEGER NOT NULL,
        leased INTEGER NOT NULL DEFAULT 0,
        data BLOB NOT NULL)""",
    # Covers the read of a host's next queued requests (their ids only).
    "CREATE INDEX requests_order ON requests (host, leased, nrank, id)",
    "CREATE TABLE fingerprints (fp BLOB PRIMARY KEY) WITHOUT ROWID",
    # Times on the wall clock (seconds since the epoch): the monotonic one
    # restarts with the process.
    """CREATE TABLE hosts (
        host TEXT PRIMARY KEY,
        host_limit INTEGER,
        interval REAL,
        blocked_until REAL,
        block_reason TEXT,
        spaced_until REAL,
        given_up INTEGER NOT NULL DEFAULT 0,
        learned TEXT) WITHOUT ROWID""",
)
#: What the AIMD middleware learned about a host (a JSON object). Added to the
#: hosts table of a file made before it had one: the column is NULL where
#: unknown, and a version without it reads and writes the file as before.
_LEARNED_COLUMN = "ALTER TABLE hosts ADD COLUMN learned TEXT"
_TABLES = {"requests", "fingerprints", "hosts"}
#: Pending writes beyond which they are committed before the timer's commit:
#: a commit writes every page its writes touched (one per host, in a broad
#: crawl), so this bounds how long one holds the event loop.
_BATCH = 2_000
#: Seconds between two checkpoints of the WAL (in the checkpoint thread).
CHECKPOINT_INTERVAL = 1.0
#: Bits of the filter in front of the fingerprints table (4 MiB): see SeenFilter.
FILTER_BITS = 2**25
#: Fingerprints noted or found in the file kept in memory (two generations of
#: up to this many): a duplicate is most often of a recent link (a site's
#: navigation, a page linked from its neighbours), told without a statement.
RECENT = 8192
#: A file opened with more fingerprints than this gets no filter: reading
#: them all into it would hold the start of the crawl (about 1.5 s a million).
FILTER_LOAD_MAX = 1_000_000


def _has_learned_column(conn: sqlite3.Connection) -> bool:
    return any(row[1] == "learned" for row in conn.execute("PRAGMA table_info(hosts)"))


#: ``(host, limit, interval, blocked_until, block_reason, spaced_until,
#: given_up, learned)``.
HostRow = tuple[
    str, int | None, float | None, float | None, str | None, float | None, int, str | None
]


def _lock(path: str) -> IO[str]:
    """Lock *path* (created if needed) for this process, or raise."""
    try:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held until close
    except OSError as error:
        raise FrontierFileError(
            f"cannot create the lock file {path} ({error.strerror or error}): make its "
            "directory writable, or choose another JOBDIR or HOSTQUEUE_FRONTIER"
        ) from error
    try:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise FrontierFileError(
            f"{path} is locked by another running crawl (pid {owner}): stop that crawl "
            "first, or give this one another JOBDIR or HOSTQUEUE_FRONTIER"
        ) from error
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


class _Checkpointer(threading.Thread):
    """Copies the WAL into the frontier file every CHECKPOINT_INTERVAL seconds.

    Beside the writer (a PASSIVE checkpoint waits for no one).
    """

    def __init__(self, path: str) -> None:
        super().__init__(name=f"frontier checkpoints {path}", daemon=True)
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.wait(CHECKPOINT_INTERVAL):
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:
            pass  # the writer checkpoints by itself again (see FrontierFile.commit)
        finally:
            self._conn.close()

    def stop(self) -> None:
        self._halt.set()
        self.join()


class SeenFilter:
    """A Bloom filter of the fingerprints in the file.

    :meth:`add` tells a fingerprint never added (most new ones) without a statement, which costs
    more than the rest of the dupefilter's work. Its size is fixed (:data:`FILTER_BITS`): past
    millions of fingerprints it tells fewer of them, never a wrong one. It lives in the process
    (Python's ``hash``).
    """

    __slots__ = ("_bits", "_mask")

    def __init__(self, bits: int = FILTER_BITS) -> None:
        # Anonymous memory: the pages are zero and take no RAM until written.
        self._bits = mmap.mmap(-1, bits >> 3)
        self._mask = bits - 1

    def add(self, fingerprint: bytes) -> bool:
        """Note *fingerprint*; True if it was certainly not noted before."""
        h = hash(fingerprint) & 0xFFFFFFFFFFFFFFFF
        bits, mask = self._bits, self._mask
        # Three positions from the 64 bits of the hash (rotated).
        one, two, three = h & mask, (h >> 21) & mask, ((h >> 42) | (h << 22)) & mask
        bit1, bit2, bit3 = 1 << (one & 7), 1 << (two & 7), 1 << (three & 7)
        if bits[one >> 3] & bit1 and bits[two >> 3] & bit2 and bits[three >> 3] & bit3:
            return False
        bits[one >> 3] |= bit1
        bits[two >> 3] |= bit2
        bits[three >> 3] |= bit3
        return True


class FrontierFile:
    """An open frontier file, locked for this process.

    Opening checks that the file is a frontier file of this format (or
    creates it), then gives every leased request back to its queue: those are
    the requests the last process handed out and never acknowledged.
    """

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        directory = os.path.dirname(os.path.abspath(path))
        self._lock: IO[str] | None = None
        if readonly:
            # A look from outside (the frontier command), also while a crawl
            # runs on the file: no lock, nothing written.
            if not os.path.exists(path):
                raise FrontierFileError(f"{path}: no such frontier file")
        else:
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as error:
                raise FrontierFileError(
                    f"cannot create the directory of {path} ({error.strerror or error}): "
                    "choose another JOBDIR or HOSTQUEUE_FRONTIER"
                ) from error
            self._lock = _lock(f"{path}.lock")
        # Whether the hosts table has the learned column (see _LEARNED_COLUMN).
        self._learned_column = True
        try:
            self.conn = self._connect()
        except BaseException:
            if self._lock is not None:
                self._lock.close()
            raise
        # Pending writes: rows by id ([host, nrank, leased, data]), lease
        # changes, deletions, fingerprints and host rows.
        self._inserts: dict[int, list[Any]] = {}
        self._leases: dict[int, int] = {}
        self._deletes: set[int] = set()
        self._fingerprints: set[bytes] = set()
        # Fingerprints known to be in the file (see RECENT).
        self._recent: set[bytes] = set()
        self._older: set[bytes] = set()
        self._hosts: dict[str, HostRow] = {}
        self._writes = 0
        self.failed: FrontierFileError | None = None
        self._checkpointer: _Checkpointer | None = None
        if not readonly:
            self.conn.execute("PRAGMA wal_autocheckpoint = 0")
            self._checkpointer = _Checkpointer(path)
            self._checkpointer.start()
        row = self.conn.execute("SELECT max(id) FROM requests").fetchone()
        self._next_id = (row[0] or 0) + 1
        self._filter: SeenFilter | None = None
        if not readonly:
            self._filter = self._load_filter()

    def _load_filter(self) -> SeenFilter | None:
        """Load the filter of the fingerprints in the file.

        None if they are too many to read at the start (see FILTER_LOAD_MAX).
        """
        try:
            count = self.conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM fingerprints LIMIT ?)",
                (FILTER_LOAD_MAX + 1,),
            ).fetchone()[0]
            if count > FILTER_LOAD_MAX:
                return None
            seen = SeenFilter()
            for (fingerprint,) in self.conn.execute("SELECT fp FROM fingerprints"):
                seen.add(fingerprint)
        except sqlite3.Error as error:
            with contextlib.suppress(FrontierFileError, sqlite3.Error):
                self.close()
            raise self._error("cannot be read", error) from error
        return seen

    def _connect(self) -> sqlite3.Connection:
        existed = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        try:
            if self.readonly:
                uri = "file:" + os.path.abspath(self.path) + "?mode=ro"
                conn = sqlite3.connect(uri, uri=True, isolation_level=None)
            else:
                conn = sqlite3.connect(self.path, isolation_level=None)
        except sqlite3.Error as error:
            raise self._error("cannot be opened", error) from error
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if existed and (app_id != APPLICATION_ID or not tables):
                conn.close()
                raise FrontierFileError(
                    f"{self.path} is not a scrapy-hostqueue frontier file: move it away, "
                    "or choose another JOBDIR or HOSTQUEUE_FRONTIER"
                )
            if existed and version != FORMAT_VERSION:
                conn.close()
                raise FrontierFileError(
                    f"{self.path} was written by a scrapy-hostqueue with frontier format "
                    f"{version}, this one reads format {FORMAT_VERSION}: finish the crawl "
                    "with the version that wrote it, or start a new JOBDIR"
                )
            if existed and not tables >= _TABLES:
                conn.close()
                raise FrontierFileError(
                    f"{self.path} is damaged (tables missing): move it away to start "
                    "afresh, or restore it from a copy"
                )
            self._learned_column = not existed or _has_learned_column(conn)
            if self.readonly:
                return conn
            conn.execute("PRAGMA journal_mode = WAL")
            # A commit survives the process (kill -9) at once; the OS writes it
            # to the disk later (a power cut may lose the last commits).
            conn.execute("PRAGMA synchronous = NORMAL")
            if not existed:
                conn.execute("BEGIN")
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
                conn.execute("COMMIT")
            else:
                if not self._learned_column:
                    conn.execute(_LEARNED_COLUMN)
                    self._learned_column = True
                # Handed out by the last process and never acknowledged.
                conn.execute("UPDATE requests SET leased = 0 WHERE leased = 1")
        except FrontierFileError:
            raise
        except sqlite3.Error as error:
            conn.close()
            raise self._error("cannot be used", error) from error
        return conn

    def _error(self, what: str, error: BaseException) -> FrontierFileError:
        text = str(error)
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            advice = "it is damaged or not a frontier file: move it away to start afresh"
        elif "full" in text:
            advice = "the disk is full: free space, then resume the crawl"
        elif "readonly" in text or "unable to open" in text or "permission" in text.lower():
            advice = "it is not writable: fix the permissions, or choose another JOBDIR"
        else:
            advice = "resume the crawl once the cause is fixed"
        return FrontierFileError(f"{self.path} {what} ({text}): {advice}")

    # -- writes (batched) ----------------------------------------------------

    def new_id(self) -> int:
        rowid = self._next_id
        self._next_id += 1
        return rowid

    def insert(self, rowid: int, host: str, rank: int, data: bytes) -> None:
        self._inserts[rowid] = [host, -rank, 0, data]
        self._maybe_flush()

    def set_leased(self, rowid: int, leased: bool) -> None:
        row = self._inserts.get(rowid)
        if row is not None:
            row[2] = int(leased)
        else:
            self._leases[rowid] = int(leased)
            self._maybe_flush()

    def delete(self, rowid: int) -> None:
        if self._inserts.pop(rowid, None) is None:
            self._leases.pop(rowid, None)
            self._deletes.add(rowid)
            self._maybe_flush()

    def seen(self, fingerprint: bytes) -> bool:
        """Whether *fingerprint* was seen.

        Notes it if not, in the batch of the request pushed next (committed with it). Without a
        statement if it is a recent one or the filter knows it is new; else one, into the open
        transaction.
        """
        recent = self._recent
        if fingerprint in recent or fingerprint in self._older:
            return True
        if self.failed is not None:
            return False
        found = False
        if self._filter is not None and self._filter.add(fingerprint):
            # Written at the next flush, with the request pushed next (not
            # flushed here: a commit must not take one without the other).
            self._fingerprints.add(fingerprint)
            self._writes += 1
        elif fingerprint in self._fingerprints:
            return True  # noted, not written yet
        else:
            try:
                if not self.conn.in_transaction:
                    self.conn.execute("BEGIN")
                cursor = self.conn.execute(
                    "INSERT OR IGNORE INTO fingerprints (fp) VALUES (?)", (fingerprint,)
                )
            except sqlite3.Error as error:
                self._fail("cannot be written", error)  # the next commit raises it
                return False
            found = not cursor.rowcount
        # Known to be in the file (or in the batch) from now on.
        recent.add(fingerprint)
        if len(recent) >= RECENT:
            self._older, self._recent = recent, set()
        return found

    def put_host(self, row: HostRow) -> None:
        self._hosts[row[0]] = row

    def _pending(self) -> int:
        return (
            len(self._inserts)
            + len(self._leases)
            + len(self._deletes)
            + len(self._fingerprints)
            + len(self._hosts)
        )

    def _maybe_flush(self) -> None:
        # Writes since the last flush (those that cancelled others included):
        # cheaper to count than the pending writes.
        self._writes += 1
        if self._writes >= _BATCH and self._pending() >= _BATCH:
            if self.failed is not None:
                self._clear()
                return
            # A failure is kept for the next commit of the timer to raise,
            # not raised in the middle of a request's way.
            with contextlib.suppress(FrontierFileError):
                self.commit()

    def flush(self) -> None:
        """Put the pending writes into the open transaction (not committed).

        After a failed write, nothing more is written: the file keeps its last commit, and
        :meth:`commit` raises.
        """
        if self.failed is not None:
            self._clear()
            return
        if not self._pending():
            return
        try:
            conn = self.conn
            if not conn.in_transaction:
                conn.execute("BEGIN")
            if self._inserts:
                conn.executemany(
                    "INSERT INTO requests (id, host, nrank, leased, data) VALUES (?, ?, ?, ?, ?)",
                    [(rowid, *row) for rowid, row in self._inserts.items()],
                )
            if self._leases:
                conn.executemany(
                    "UPDATE requests SET leased = ? WHERE id = ?",
                    [(leased, rowid) for rowid, leased in self._leases.items()],
                )
            if self._deletes:
                conn.executemany(
                    "DELETE FROM requests WHERE id = ?", [(rowid,) for rowid in self._deletes]
                )
            if self._fingerprints:
                conn.executemany(
                    "INSERT OR IGNORE INTO fingerprints (fp) VALUES (?)",
                    [(fp,) for fp in self._fingerprints],
                )
            if self._hosts:
                conn.executemany(
                    "INSERT OR REPLACE INTO hosts (host, host_limit, interval, blocked_until, "
                    "block_reason, spaced_until, given_up, learned) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    list(self._hosts.values()),
                )
        except sqlite3.Error as error:
            raise self._fail("cannot be written", error) from error
        self._clear()

    def _clear(self) -> None:
        self._writes = 0
        self._inserts.clear()
        self._leases.clear()
        self._deletes.clear()
        self._fingerprints.clear()
        self._hosts.clear()

    def commit(self) -> None:
        """Make every write made so far durable, at once."""
        if self.failed is not None:
            raise self.failed
        self.flush()
        if self._checkpointer is not None and not self._checkpointer.is_alive():
            self._checkpointer = None
            self.conn.execute("PRAGMA wal_autocheckpoint = 1000")
        if self.conn.in_transaction:
            try:
                self.conn.execute("COMMIT")
            except sqlite3.Error as error:
                raise self._fail("cannot be written", error) from error

    def _fail(self, what: str, error: BaseException) -> FrontierFileError:
        """Return the error for a failed write.

        Nothing more is committed (what the last commit holds stays as it was), and the caller is
        told once.
        """
        failure = self._error(what, error)
        if self.failed is None:
            self.failed = failure
            with contextlib.suppress(sqlite3.Error):
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
        return failure

    # -- reads -----------------------------------------------------------------

    def _read(self, sql: str, args: tuple[Any, ...] = (), *, flush: bool = True) -> sqlite3.Cursor:
        if flush:
            with contextlib.suppress(FrontierFileError):  # the next commit raises it
                self.flush()
        try:
            return self.conn.execute(sql, args)
        except sqlite3.Error as error:
            raise self._error("cannot be read", error) from error

    def head(self, host: str, limit: int) -> list[tuple[int, int, bytes]]:
        """Return the first *limit* queued requests of *host*, in serving order.

        ``(id, rank, data)`` of the first *limit* queued (not leased)
        requests of *host*, in serving order.
        """
        rows = self._read(
            "SELECT id, nrank, data FROM requests WHERE host = ? AND leased = 0 "
            "ORDER BY nrank, id LIMIT ?",
            (host, limit),
        ).fetchall()
        return [(rowid, -nrank, data) for rowid, nrank, data in rows]

    def data(self, rowid: int) -> bytes:
        """Return the encoded request of row *rowid*."""
        pending = self._inserts.get(rowid)
        if pending is not None:
            data: bytes = pending[3]
            return data
        row = self._read("SELECT data FROM requests WHERE id = ?", (rowid,), flush=False).fetchone()
        if row is None:
            raise self._fail("lost a request", LookupError(f"no row {rowid}"))
        return row[0]  # type: ignore[no-any-return]

    def queued_per_host(self) -> Iterator[tuple[str, int]]:
        """``(host, queued)`` for every host with queued requests."""
        yield from self._read(
            "SELECT host, count(*) FROM requests WHERE leased = 0 GROUP BY host"
        ).fetchall()

    def leased_per_host(self) -> Iterator[tuple[str, int]]:
        yield from self._read(
            "SELECT host, count(*) FROM requests WHERE leased = 1 GROUP BY host"
        ).fetchall()

    def host_rows(self) -> Iterator[HostRow]:
        """Every host row, read as iterated (a broad crawl has many)."""
        learned = "learned" if self._learned_column else "NULL"
        yield from self._read(
            "SELECT host, host_limit, interval, blocked_until, block_reason, spaced_until, "
            f"given_up, {learned} FROM hosts"
        )

    def rows(self, host: str | None = None) -> Iterator[tuple[int, str, int, bytes]]:
        """``(id, host, rank, data)`` of queued requests (O(requests))."""
        sql = "SELECT id, host, nrank, data FROM requests WHERE leased = 0"
        args: tuple[Any, ...] = ()
        if host is not None:
            sql += " AND host = ?"
            args = (host,)
        for rowid, key, nrank, data in self._read(sql + " ORDER BY host, nrank, id", args):
            yield rowid, key, -nrank, data

    def fingerprint_count(self) -> int:
        count: int = self._read("SELECT count(*) FROM fingerprints").fetchone()[0]
        return count

    def add_fingerprints(self, fingerprints: Iterable[bytes]) -> None:
        for fingerprint in fingerprints:
            self._fingerprints.add(fingerprint)
            if self._filter is not None:
                self._filter.add(fingerprint)
        self._maybe_flush()

    def close(self) -> None:
        """Commit what is pending and release the file and its lock."""
        try:
            if self._checkpointer is not None:
                self._checkpointer.stop()
                self._checkpointer = None
            if self.failed is None and not self.readonly:
                self.commit()
                # The file alone then holds everything (the WAL is emptied).
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._filter = None
            with contextlib.suppress(sqlite3.Error):
                self.conn.close()
            if self._lock is not None:
                self._lock.close()
