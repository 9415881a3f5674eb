"""When Redis is full: the pushes it refuses, kept back in this process.

Pure: no Scrapy, Twisted or ``redis`` import; the clock is injected.

A Redis at ``maxmemory`` with ``noeviction`` refuses the push script (see
:mod:`scrapy_hostqueue.frontier.redis._db`: every other script runs when Redis
is full). The requests it refused, and those found while it is nearly full,
wait here in a :class:`Backlog`, in memory up to a bound and past it in a
file, and go to Redis again with a back-off while the crawl fetches what is
queued and leased, which frees memory. :class:`Capacity` decides how many
go in each exchange, and what to log: one WARNING when Redis fills, one INFO
when it takes them all again, never a line per retry.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

__all__ = ["Backlog", "Capacity", "HeldRequest", "is_oom", "read_held", "write_held"]

logger = logging.getLogger(__name__)

#: What Redis answers a write it refuses for lack of memory (a command's
#: ``-OOM`` error, quoted in a script's error on Redis 6.2).
OOM_TEXT = "OOM command not allowed"
#: The ``redis`` client's error for an answer that starts with ``-OOM`` (a
#: script's refusal on Redis 7 and Valkey): the code is not in its text.
OOM_ERROR = "OutOfMemoryError"
#: Share of ``maxmemory`` past which new pushes are slowed (and one WARNING).
WARN_AT = 0.8
#: Share below which the warning may come again.
CALM_AT = 0.7
#: Seconds between two WARNING lines about a full Redis: the refills of one
#: crawl that keeps Redis at its limit are one story.
LOG_EVERY = 300.0
#: Back-off of the retries (seconds), first and longest.
RETRY_FIRST = 0.1
RETRY_MAX = 2.0
#: Pushes sent at most in one exchange while Redis is full, when it said it
#: has room again.
PROBE = 200
#: Pushes sent blindly to a full Redis after a back-off.
BLIND = 20
#: Bytes of Redis memory a request takes at most, about (its value, its
#: queue entry, its fingerprint).
REQUEST_BYTES = 1_000
#: Pushes an exchange sends while Redis is nearly full, beyond the
#: acknowledgements it sends: the queues in Redis stop growing.
SLOW_MIN = 20
#: Pushes an exchange sends at most.
FAST = 2_000


def is_oom(error: BaseException) -> bool:
    """Whether *error* is Redis refusing a write for lack of memory."""
    return type(error).__name__ == OOM_ERROR or OOM_TEXT in str(error)


class HeldRequest(NamedTuple):
    """A request kept in this process, in the form the push script takes.

    Its id, fingerprint (b"" for none), host, rank and encoded form.
    """

    rid: str
    fingerprint: bytes
    host: str
    rank: int
    data: bytes


def _line(held: HeldRequest, url: str | None = None) -> str:
    record: dict[str, Any] = {
        "host": held.host,
        "rank": held.rank,
        "fingerprint": held.fingerprint.hex(),
        "data": base64.b64encode(held.data).decode(),
        "id": held.rid,
    }
    if url is not None:
        record["url"] = url
    return json.dumps(record, separators=(",", ":")) + "\n"


def write_held(
    path: str, requests: Iterable[HeldRequest], url: Callable[[HeldRequest], str | None]
) -> int:
    """Write *requests* to *path* (JSON lines, ``url`` given for the eye); returns how many.

    ``python -m scrapy_hostqueue push --requests`` loads such a file.
    """
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for held in requests:
            out.write(_line(held, url(held)))
            count += 1
    return count


def read_held(lines: Iterable[str]) -> Iterator[HeldRequest]:
    """Read the requests of a file :func:`write_held` (or a spill) wrote.

    ``ValueError`` naming the line for one that is not.
    """
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            yield HeldRequest(
                str(record.get("id", "")),
                bytes.fromhex(record["fingerprint"]),
                str(record["host"]),
                int(record["rank"]),
                base64.b64decode(record["data"], validate=True),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"line {n} is not a held request ({error})") from None


class Backlog:
    """Requests waiting for room in Redis, first in first out.

    In memory up to *limit*, past it appended to the file *path* (made when needed, removed once
    read back).
    """

    def __init__(self, limit: int, path: str) -> None:
        self.limit = max(1, limit)
        self.path = path
        self._mem: deque[HeldRequest] = deque()
        self._file: Any = None
        self._unread = 0  # requests in the file not read back yet
        self._offset = 0  # where reading back goes on
        #: Requests written to the file so far.
        self.spilled = 0

    def __len__(self) -> int:
        return len(self._mem) + self._unread

    def append(self, held: HeldRequest) -> None:
        """Keep *held* behind the others."""
        if self._unread or len(self._mem) >= self.limit:
            if self._file is None:
                self._file = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115
            self._file.seek(0, os.SEEK_END)
            self._file.write(_line(held))
            self._unread += 1
            self.spilled += 1
        else:
            self._mem.append(held)

    def put_back(self, requests: list[HeldRequest]) -> None:
        """Keep *requests* (refused again) before every other, in order."""
        self._mem.extendleft(reversed(requests))

    def take(self, n: int) -> list[HeldRequest]:
        """Up to *n* requests, the oldest first."""
        out: list[HeldRequest] = []
        while len(out) < n and (self._mem or self._unread):
            if not self._mem:
                self._read_back()
            while len(out) < n and self._mem:
                out.append(self._mem.popleft())
        return out

    def _read_back(self) -> None:
        assert self._file is not None
        self._file.flush()
        self._file.seek(self._offset)
        lines: list[str] = []
        while len(lines) < self.limit and self._unread - len(lines) > 0:
            lines.append(self._file.readline())
        self._offset = self._file.tell()
        self._unread -= len(lines)
        self._mem.extend(read_held(lines))
        if not self._unread:
            self.close()

    def items(self) -> Iterator[HeldRequest]:
        """Every request kept, the oldest first (read, not taken)."""
        yield from self._mem
        if self._unread:
            assert self._file is not None
            self._file.flush()
            with open(self.path, encoding="utf-8") as spill:
                spill.seek(self._offset)
                yield from read_held(spill)

    def close(self) -> None:
        """Close and remove the file."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._offset = 0
            self._unread = 0
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)


def _mb(size: float) -> str:
    return f"{size / 1e6:,.1f} MB"


class Capacity:
    """How full Redis is, as this process sees it, and what that means for its pushes.

    How many an exchange sends (:meth:`budget`), and the log lines. *where* names the Redis in them;
    *clock* gives seconds.
    """

    def __init__(self, backlog: Backlog, where: str, clock: Callable[[], float]) -> None:
        self.backlog = backlog
        self.where = where
        self.clock = clock
        self.used = 0
        self.maxmemory = 0
        #: Since when Redis refuses pushes (None: it takes them).
        self.full_since: float | None = None
        #: Seconds Redis refused pushes, in finished spells.
        self.full_seconds = 0.0
        #: The most requests kept back at once.
        self.max_backlog = 0
        self._retry_at = 0.0
        self._retry_wait = RETRY_FIRST
        self._read_at = -1.0  # when Redis last said how much memory it uses
        self._refused_at = 0.0
        self._warned_high = False
        self._logged_full_at: float | None = None
        self._logged_spell = False

    @property
    def ratio(self) -> float:
        """Used memory over ``maxmemory`` (0 without a limit)."""
        return self.used / self.maxmemory if self.maxmemory else 0.0

    @property
    def holding(self) -> bool:
        """Whether new pushes wait here (behind others, or to slow down)."""
        return bool(self.backlog) or self.full_since is not None or self.ratio >= WARN_AT

    def memory(self, used: int, maxmemory: int) -> None:
        """Redis said how much memory it uses, of how much."""
        self.used, self.maxmemory = used, maxmemory
        self._read_at = self.clock()
        ratio = self.ratio
        if ratio >= WARN_AT and not self._warned_high and self.full_since is None:
            self._warned_high = True
            logger.warning(
                "Redis at %s uses %d %% of its maxmemory (%s of %s): new requests go to "
                "it more slowly; raise maxmemory before it fills (see 'When Redis is full "
                "or restarts' in the docs)",
                self.where,
                round(ratio * 100),
                _mb(used),
                _mb(maxmemory),
            )
        elif ratio < CALM_AT:
            self._warned_high = False

    def budget(self, acks: int) -> int:
        """How many kept requests the next exchange sends, with *acks* acknowledgements in it."""
        if not self.backlog:
            return 0
        if self.full_since is not None:
            if self._read_at > self._refused_at:
                # Redis said how much room it has since it refused: as much
                # as fits (no limit any more: a full exchange's worth).
                room = self.maxmemory - self.used if self.maxmemory else PROBE * REQUEST_BYTES
                n = min(PROBE, max(0, room) // REQUEST_BYTES)
                if n:
                    self.used += n * REQUEST_BYTES
                    return n
            return BLIND if self.clock() >= self._retry_at else 0
        if self.ratio >= WARN_AT:
            return acks + SLOW_MIN
        return FAST

    def note_backlog(self) -> None:
        self.max_backlog = max(self.max_backlog, len(self.backlog))

    def refused(self) -> bool:
        """Redis refused pushes for lack of memory: back off.

        Returns True when this starts a spell worth a WARNING (then :meth:`warn_full`, with what the
        crawl's keys hold).
        """
        now = self.clock()
        self._refused_at = now
        self._retry_at = now + self._retry_wait
        self._retry_wait = min(self._retry_wait * 2, RETRY_MAX)
        self.note_backlog()
        if self.full_since is not None:
            return False
        self.full_since = now
        due = self._logged_full_at is None or now - self._logged_full_at >= LOG_EVERY
        self._logged_spell = due
        if due:
            self._logged_full_at = now
        return due

    def warn_full(self, keys: str) -> None:
        logger.warning(
            "Redis at %s is full (%s used of maxmemory %s) and refuses new requests: "
            "this process keeps them (%d now, past %d in the file %s) and sends them "
            "again as the crawl frees memory; fetching goes on. %s. Raise maxmemory "
            "(CONFIG SET maxmemory), or give the crawl a Redis of its own",
            self.where,
            _mb(self.used),
            _mb(self.maxmemory),
            len(self.backlog),
            self.backlog.limit,
            self.backlog.path,
            keys,
        )

    def accepted(self) -> None:
        """Redis took the pushes of an exchange: when the backlog is empty, the spell is over."""
        self._retry_wait = RETRY_FIRST
        if self.full_since is None or self.backlog:
            return
        spell = self.clock() - self.full_since
        self.full_seconds += spell
        self.full_since = None
        if self._logged_spell:
            logger.info(
                "Redis at %s takes new requests again: this process sent those it kept "
                "(%.1f s full in all)",
                self.where,
                self.full_seconds,
            )

    def seconds_full(self) -> float:
        """Seconds Redis refused pushes, the spell under way included."""
        ongoing = self.clock() - self.full_since if self.full_since is not None else 0.0
        return self.full_seconds + ongoing
