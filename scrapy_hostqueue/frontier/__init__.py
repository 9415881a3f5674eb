"""The frontier: where a crawl's queued requests and per-host state live.

``HOSTQUEUE_FRONTIER`` picks one of three kinds, once, in :func:`open_frontier`:
in memory (:mod:`scrapy_hostqueue.frontier.memory`, with its ``JOBDIR`` file in
``_jobdir``), a SQLite file (``frontier/sqlite/``, the default with
``JOBDIR``) or Redis (``frontier/redis/``, a crawl shared by several
processes). Each kind is one :class:`Frontier` object, which the scheduler
and the job hold without asking which kind it is: it makes the dupefilter and
the request store, resumes the job, saves it and closes it. The store of
every kind keeps the contract of :class:`RequestStore`, so the scheduler
talks to it the same way; the SQLite and Redis stores layer theirs on the
in-memory one (:class:`MemoryStore`, pure), which holds the hosts of this
process.

The store's contract is at-least-once. A request handed out by :meth:`RequestStore.pop`
stays the store's, leased, until the scheduler acknowledges it
(:meth:`RequestStore.ack`) once its outcome has been taken over; a store that
outlives the process gives unacknowledged requests back on restart.
:meth:`RequestStore.finish` is a different moment: the request stopped holding
one of its host's places in flight (it left the downloader), which frees room
for the host's next request, while its lease may last until its callback has
run.

Only this module names a backend's modules outside the backend's folder, and
only inside the functions that pick one (``tests/test_layout.py`` holds every
module to that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from scrapy_hostqueue.frontier.memory import HostState, MemoryStore, Standing

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred

    from scrapy_hostqueue._config import HostQueueConfig
    from scrapy_hostqueue.frontier._codec import RequestCodec

__all__ = [
    "FRONTIER_FILE",
    "Frontier",
    "HostState",
    "MemoryStore",
    "RequestStore",
    "Standing",
    "monitor_board",
    "open_frontier",
    "push",
    "report",
]

T = TypeVar("T")

#: The SQLite frontier's file in ``JOBDIR`` (``HOSTQUEUE_FRONTIER = "sqlite"``,
#: the default with ``JOBDIR``).
FRONTIER_FILE = "hostqueue.frontier.db"
#: Where ``HOSTQUEUE_FRONTIER`` (or the command line) names a Redis server.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class RequestStore(Protocol[T]):
    """What the scheduler needs of a request store.

    "Host" is the key the scheduler gives (the downloader slot key). Every
    method is synchronous and cheap: Scrapy's scheduler contract is
    synchronous, and the engine asks for the next request many times a second.
    Times are ``time.monotonic()`` seconds.
    """

    #: Requests a host may be handed beyond its limit (they wait at the send
    #: gate); 0 without a send gate.
    prefetch: int
    #: At most this many requests in flight for a silent host (0: its limit).
    silent_limit: int
    #: The crawl's global limit (``CONCURRENT_REQUESTS``); a host gets at
    #: most its share of it among the active hosts (0: no share).
    global_limit: int
    #: Called with a host's key when the store forgets the host for good.
    on_forget: Callable[[str], None] | None
    #: What the AIMD middleware learned about a host (a small dict a JSON
    #: object holds), for a store that outlives the process to keep with the
    #: host; None without the middleware. Set by the scheduler.
    export_learned: Callable[[str], dict[str, float] | None] | None
    #: Gives the middleware back what :attr:`export_learned` gave, for a host
    #: the store resumed with requests queued (or in force: a block, an
    #: interval). A store that resumed hosts before it is set gives theirs
    #: back when it is set. Set by the scheduler.
    import_learned: Callable[[str, dict[str, float]], None] | None

    def __len__(self) -> int:
        """Count the requests queued (not handed out)."""

    @property
    def active(self) -> int:
        """Hosts holding an active-host place now."""

    # -- requests --------------------------------------------------------

    def push(self, key: str, rank: int, item: T) -> bool:
        """Queue *item* for host *key* (higher *rank* first, FIFO among equals).

        False, and nothing queued, if the host was given up.
        """

    def pop(self, now: float | None = None) -> tuple[str, T] | None:
        """Hand out the next request of a ready host, or None.

        Hand out the next request of a ready host, round-robin among ready
        hosts, or None. The request counts in flight for its host until
        :meth:`finish` and stays leased until :meth:`ack`.
        """

    def finish(self, key: str, overdue: bool = False) -> None:
        """Count one request of *key* no longer in flight.

        One request of *key* is no longer in flight (*overdue*: one marked
        with :meth:`set_overdue`).
        """

    def set_overdue(self, key: str) -> None:
        """One request of *key* in flight is overdue.

        It still counts against the host's limit, but does not keep the host's active place.
        """

    def overdue(self, key: str) -> int:
        """Count the requests of *key* in flight and overdue."""

    def ack(self, item: T) -> None:
        """*item*, handed out earlier, is done.

        Its outcome (the requests and items its callback produced) has been taken over. Ends its
        lease.
        """

    def give_back(self, key: str, rank: int, item: T) -> None:
        """Put *item*, handed out earlier and not done, back in its host's queue.

        Its lease ends (after :meth:`finish`, if it was in flight).
        """

    def adopt(self, key: str, now: float) -> None:
        """Count a request that did not come from :meth:`pop` in flight for *key*.

        Count a request that did not come from :meth:`pop` in flight for
        *key* until :meth:`finish`.
        """

    def give_up(self, key: str) -> list[T]:
        """Give up *key* and any request pushed for it from now on; return its queued requests."""

    def items(self) -> Iterator[tuple[str, int, T]]:
        """``(key, rank, item)`` of every queued request (O(requests))."""

    # -- hosts -----------------------------------------------------------

    def host_state(self, key: str) -> HostState:
        """Return the state of *key*, made on first sight."""

    def known_state(self, key: str) -> HostState | None:
        """Return the state of *key* if the store knows the host."""

    def queued(self, key: str) -> int: ...

    def in_flight(self, key: str) -> int: ...

    def in_flight_cap(self, state: HostState) -> int:
        """How many requests a host in *state* may have in flight now."""

    def is_full(self, key: str) -> bool: ...

    def note_full(self, key: str, now: float) -> None: ...

    def hosts(self) -> Iterator[tuple[str, int, int, HostState]]:
        """``(key, queued, in_flight, state)`` of every live host (O(hosts))."""

    def blocked(self, now: float) -> Iterator[tuple[str, HostState]]: ...

    def spaced(self, now: float) -> Iterator[tuple[str, float]]: ...

    def next_wakeup(self) -> float | None:
        """When the earliest blocked or idle host changes state, if any."""

    def set_limit(self, key: str, limit: int) -> None: ...

    def set_answering(self, key: str, answering: bool) -> None: ...

    def block_until(self, key: str, when: float, reason: str | None = None) -> None: ...

    def unblock(self, key: str) -> None:
        """End the block of *key* now (the monitor's controls; nothing else shortens one)."""

    def redis_figures(self) -> dict[str, Any] | None:
        """How much Redis holds this process back (the Redis store; None for the others)."""

    def set_interval(self, key: str, interval: float, jitter: float | None = None) -> None: ...

    def space_until(self, key: str, when: float) -> None: ...

    def started(self, key: str, started_at: float, now: float) -> None:
        """Note that the hand-out of *key* made at *started_at* reached the downloader at *now*.

        The host's interval between starts counts from then.
        """

    def unstart(self, key: str, started_at: float) -> None:
        """Note that the hand-out of *key* made at *started_at* never went to the host."""

    def close(self) -> None:
        """Close what the store holds open (files, connections)."""


class Frontier(Protocol):
    """One kind of frontier, as the scheduler and the job use it.

    One kind of frontier (``HOSTQUEUE_FRONTIER``), as the scheduler and
    the job use it, in the order they call it: :meth:`dupefilter` and
    :meth:`make_store` while the scheduler is built; :meth:`refusal` and
    :meth:`resume` when the spider opens; :meth:`stop`, :meth:`save` and
    :meth:`close` when it closes.
    """

    #: Which of Scrapy's scheduler stats the crawl's requests count in:
    #: ``scheduler/enqueued/memory`` or ``scheduler/enqueued/disk``.
    queue: str
    #: How requests become bytes in a store outside this process; None in memory.
    codec: RequestCodec | None

    def dupefilter(self) -> BaseDupeFilter:
        """Make the crawl's dupefilter.

        ``DUPEFILTER_CLASS``, or in place of Scrapy's own, the same filter on the store's seen
        fingerprints.
        """

    def make_store(
        self,
        dupefilter: BaseDupeFilter,
        state_factory: Callable[[str], HostState],
        **kwargs: Any,
    ) -> RequestStore[Request]:
        """Make the crawl's request store.

        The crawl's request store (*state_factory* and *kwargs* as for
        :class:`MemoryStore`); *dupefilter* is the scheduler's.
        """

    def refusal(self) -> tuple[str, str] | None:
        """Why the crawl cannot go on with its ``JOBDIR``: the finish reason and the ERROR line.

        None if it can.
        """

    def resume(
        self, spider: Spider, push: Callable[[Request], bool], refuse: Callable[[str], None]
    ) -> tuple[int, int]:
        """Resume the job: queue what it saved, or join the shared crawl.

        Queue what the job saved with *push* (its requests, already seen
        by the dupefilter) and restore its host blocks and spacing, or join
        the shared crawl; *refuse* closes the crawl before its first request
        with a finish reason. Returns the requests resumed and the host
        blocks still in force.
        """

    def stop(self) -> None:
        """Stop what runs in the background (the SQLite file's commits)."""

    def save(self, given_up: Iterable[tuple[str, Request]]) -> int:
        """Keep what the store holds at a graceful stop, for the next run.

        At a graceful stop, keep what the store holds (and *given_up*, the
        requests of given-up hosts) for the next run, where the store does
        not keep every change itself. Returns how many requests could not be
        serialised.
        """

    def close(self, dupefilter: BaseDupeFilter, reason: str) -> Deferred[None] | None:
        """Close *dupefilter*, in a shared crawl once this process has handed back what it holds."""


def open_frontier(crawler: Crawler, config: HostQueueConfig, *, debug: bool) -> Frontier:
    """Open the frontier ``HOSTQUEUE_FRONTIER`` picks.

    The frontier ``HOSTQUEUE_FRONTIER`` picks, opened: its file locked,
    or this process registered with Redis. Raises a
    :class:`~scrapy_hostqueue.exceptions.HostQueueError` with one line when
    it cannot be used.
    """
    # Imported here: importing a pure module of the frontier imports this
    # package too, which therefore imports no Scrapy at its top; and a crawl
    # loads only the backend it uses (the Redis one needs the redis client).
    from scrapy.utils.job import job_dir  # noqa: PLC0415

    jobdir = job_dir(crawler.settings)
    if config.frontier_url is not None:
        from scrapy_hostqueue.frontier.redis._frontier import SharedFrontier  # noqa: PLC0415

        return SharedFrontier.open(crawler, config, debug=debug)
    if config.frontier_path is not None:
        from scrapy_hostqueue.frontier.sqlite._glue import SqliteFrontier  # noqa: PLC0415

        return SqliteFrontier.open(crawler, config.frontier_path, jobdir, debug=debug)
    from scrapy_hostqueue.frontier._jobdir import MemoryFrontier  # noqa: PLC0415

    return MemoryFrontier(crawler, jobdir, debug=debug)


def is_shared(location: str) -> bool:
    """Whether *location* (``HOSTQUEUE_FRONTIER``, or the command line's) names a Redis server."""
    return location.startswith(REDIS_SCHEMES)


def report(location: str, *, crawl_id: str | None = None, top: int = 10) -> str:
    """Say what the frontier at *location* holds, as text.

    A frontier file (or its ``JOBDIR``), or with *crawl_id* a shared crawl on Redis.
    """
    if is_shared(location):
        from scrapy_hostqueue.frontier.redis import _cli  # noqa: PLC0415

        assert crawl_id is not None
        return _cli.report(location, crawl_id, top=top)
    from scrapy_hostqueue.frontier.sqlite import _report  # noqa: PLC0415

    return _report.report(location, top=top)


def push(
    url: str,
    crawl_id: str,
    urls: Iterable[str],
    *,
    priority: int = 0,
    requests_file: str | None = None,
) -> tuple[int, int]:
    """Queue *urls*, then the requests of *requests_file*, in a shared crawl.

    Queue *urls* in the shared crawl *crawl_id* at *url*, through its
    dupefilter, then the requests of *requests_file* as they are (a file a
    crawl wrote when Redis lost the crawl or was full). Returns how many were
    queued and how many already seen. Raises :class:`OSError` if the file
    cannot be read (before anything is queued).
    """
    from scrapy_hostqueue.frontier.redis import _capacity, _cli  # noqa: PLC0415

    held: list[_capacity.HeldRequest] = []
    if requests_file is not None:
        with open(requests_file, encoding="utf-8") as lines:
            held = list(_capacity.read_held(lines))
    return _cli.push(url, crawl_id, urls, priority=priority, requests=held)


def monitor_board(url: str, crawl_id: str) -> Any:
    """Return where the processes of a shared crawl publish their monitor's snapshots.

    That is ``frontier.redis._monitor.MonitorBoard`` for the crawl *crawl_id*
    at *url*: ``open``, ``beat``, ``withdraw``, ``close``, all coroutines.
    """
    from scrapy_hostqueue.frontier.redis._monitor import MonitorBoard  # noqa: PLC0415

    return MonitorBoard(url, crawl_id)
