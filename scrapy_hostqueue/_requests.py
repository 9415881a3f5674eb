"""One record per request the scheduler counts for a host.

A request handed out by the scheduler (or counted for its host without it,
see ``Hosts.adopt`` in ``_hosts``) gets a :class:`RequestRecord` until it
leaves the downloader; every stage it reaches is noted on that one object, so
that its leaving updates one place. Nothing of this is kept in
``request.meta``, which requests built from ``response.meta`` would inherit.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request

#: A request is sent back to the scheduler at most this many times.
MAX_REQUEUES = 3


class Stage(Enum):
    """How far a counted request has gone, latest first."""

    BACKING_OFF = "backing off"  # its status asks the host to back off
    ON_WIRE = "on the wire"  # past the send gate
    REACHED = "reached the downloader"
    HANDED_OUT = "handed out"
    ADOPTED = "adopted"  # counted without next_request
    GIVEN_UP = "host given up"  # handed out only to fail (its host was given up)


class AutoSlot(str):
    """Return the ``download_slot`` the scheduler writes into a request without one.

    The ``download_slot`` the scheduler writes into a request's meta at
    hand-out when the request had none: the key Scrapy's downloader would
    compute (and write there) from the URL. A request built from
    ``response.meta`` carries the same object, so the scheduler knows the slot
    is inherited, not chosen, and keys the new request by its own URL, while a
    slot the spider set (a plain ``str``) is kept.
    """

    __slots__ = ()


@dataclass(slots=True, eq=False)
class RequestRecord:
    """What the scheduler knows of one counted request."""

    #: The host it counts for (which a later middleware's download_slot may
    #: differ from).
    host: str
    adopted: bool = False
    #: Handed out only to fail with HostGivenUp (its host was given up).
    given_up: bool = False
    #: Counted on its way to the handler (without the send gate, see has_room).
    reached: bool = False
    #: For a host with an interval between starts: when its hand-out was
    #: made, until it reaches the downloader (the interval counts from then).
    unsent_at: float | None = None
    on_wire: bool = False
    backing_off: bool = False
    #: When it went to the host (past the send gate, or into the downloader
    #: without one), for the overdue watch; None before, and once the
    #: headers of its answer are in.
    sent_at: float | None = None
    #: In flight far longer than its host usually takes (see
    #: scrapy_hostqueue._overdue).
    overdue: bool = False

    @property
    def stage(self) -> Stage:
        if self.given_up:
            return Stage.GIVEN_UP
        if self.backing_off:
            return Stage.BACKING_OFF
        if self.on_wire:
            return Stage.ON_WIRE
        if self.reached:
            return Stage.REACHED
        return Stage.ADOPTED if self.adopted else Stage.HANDED_OUT


class RequestTable:
    """The records of the requests counted now, and what must outlive them.

    Requests the send gate sent back, and how often each went back.
    """

    def __init__(self) -> None:
        self._records: dict[Request, RequestRecord] = {}
        #: Requests on their way to the handler per host (see has_room).
        self.reached_per_host: dict[str, int] = {}
        #: Requests the send gate sent back to the scheduler, until gone.
        self.sent_back: weakref.WeakSet[Request] = weakref.WeakSet()
        self._requeues: weakref.WeakKeyDictionary[Request, int] = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        return len(self._records)

    def hand_out(self, request: Request, host: str, unsent_at: float | None) -> None:
        self._records[request] = RequestRecord(host, unsent_at=unsent_at)

    def adopt(self, request: Request, host: str) -> RequestRecord:
        record = self._records[request] = RequestRecord(host, adopted=True)
        return record

    def give_up(self, request: Request, host: str) -> None:
        self._records[request] = RequestRecord(host, given_up=True)

    def get(self, request: Request) -> RequestRecord | None:
        return self._records.get(request)

    def handed_out(self, request: Request) -> RequestRecord | None:
        """Return the record of *request* if :meth:`hand_out` made it."""
        record = self._records.get(request)
        if record is None or record.adopted or record.given_up:
            return None
        return record

    def count_on_the_way(self, record: RequestRecord) -> None:
        if not record.reached:
            record.reached = True
            self.reached_per_host[record.host] = self.reached_per_host.get(record.host, 0) + 1

    def put_on_wire(self, request: Request, now: float) -> None:
        record = self._records[request]
        record.on_wire = True
        record.sent_at = now

    def items(self) -> Iterator[tuple[Request, RequestRecord]]:
        return iter(self._records.items())

    def leave(self, request: Request) -> RequestRecord | None:
        """*request* left the downloader: its record, now dropped."""
        record = self._records.pop(request, None)
        if record is not None and record.reached:
            count_down(self.reached_per_host, record.host)
        return record

    def requeues(self, request: Request) -> int:
        """How many times *request* (or the requests it replaces) went back."""
        return self._requeues.get(request, 0)

    def requeued(self, old: Request, new: Request) -> None:
        """Let *new* replace *old*, sent back to the scheduler once more."""
        self._requeues[new] = self._requeues.get(old, 0) + 1


def request_rank(request: Request) -> int:
    """Return the serving order of *request* within its host.

    Higher priority first, and among equal priorities other requests before start requests, as
    Scrapy's own scheduler does. Across hosts, only the priority (``rank // 2``) counts.
    """
    return request.priority * 2 + (0 if request.meta.get("is_start_request") else 1)


def count_down(counts: dict[str, int], key: str) -> None:
    """One fewer for *key* in a table of per-host counts that keeps no zeros."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
