"""The in-memory frontier (``HOSTQUEUE_FRONTIER = "memory"``) and its ``JOBDIR`` file.

At a graceful stop the queued requests, host blocks and spacing are written to one file, and read
back when the job resumes.

This is not crash-safe: the file is written only at a graceful stop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.utils.request import request_from_dict

from scrapy_hostqueue.frontier import FRONTIER_FILE
from scrapy_hostqueue.frontier._dupefilter import scrapy_dupefilter
from scrapy_hostqueue.frontier.memory import MemoryStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred

    from scrapy_hostqueue.frontier import HostState, RequestStore
    from scrapy_hostqueue.frontier._codec import RequestCodec

logger = logging.getLogger(__name__)

#: File in JOBDIR holding the queued requests and host blocks of a stopped crawl.
STATE_FILE = "hostqueue.state"
#: 2: every request pickled on its own (version 1 pickled their dicts in one
#: go, so one request that could not be pickled lost the whole state).
_STATE_VERSION = 2
_READABLE_STATE_VERSIONS = (1, 2)
#: The ``finish_reason`` of a crawl whose ``JOBDIR/hostqueue.state`` cannot be
#: read (damaged, from another version, or naming a callback the spider no
#: longer has): it closes before any request, and the file is left as it was.
JOBDIR_STATE_UNREADABLE = "hostqueue_jobdir_state_unreadable"
#: The ``finish_reason`` of a crawl with the in-memory store on a JOBDIR that
#: holds a frontier file: it closes before any request, the file as it was.
JOBDIR_OF_SQLITE_FRONTIER = "hostqueue_jobdir_of_sqlite_frontier"


def state_path(jobdir: str) -> str:
    return os.path.join(jobdir, STATE_FILE)


def scrapy_job_refusal(jobdir: str | None) -> str | None:
    """Why a JOBDIR is refused.

    Scrapy's own scheduler left requests queued in it, which this scheduler cannot read, and the
    dupefilter's ``requests.seen`` would keep the crawl from finding them again, so they would be
    lost without a word. None if it is not.
    """
    if not jobdir:
        return None
    path = os.path.join(jobdir, "requests.queue", "active.json")
    try:
        with open(path, encoding="utf-8") as f:
            queued = json.load(f)
    except (OSError, ValueError):
        return None  # none (or nothing readable) to lose
    if not queued:
        return None
    return (
        f"JOBDIR {jobdir!r} holds requests queued by Scrapy's own scheduler "
        f"({os.path.join(jobdir, 'requests.queue')}), which HostQueueScheduler "
        "cannot read: resumed with it, the crawl would lose them (the "
        "dupefilter's requests.seen keeps their links from being found again). "
        "Finish this job with the scheduler that started it, or start a new "
        "JOBDIR; to resume it with HostQueueScheduler anyway, losing those "
        "requests, delete that directory."
    )


@dataclass
class SavedState:
    """What a stopped job left.

    Its queued requests, and the host blocks and spacing still in force (on the monotonic clock).
    """

    requests: list[Request]
    blocks: list[tuple[str, float, str | None]]
    spacing: list[tuple[str, float]]


def save_state(
    path: str,
    store: RequestStore[Request],
    given_up: Iterable[tuple[str, Request]],
    spider: Spider,
    *,
    debug: bool,
) -> int:
    """Write what *store* holds to *path*, atomically.

    Write what *store* holds (and the requests of given-up hosts, whose
    host may be back next time) to *path*, atomically. Returns how many
    requests could not be serialised.
    """
    requests: list[tuple[str, bytes]] = []
    unserializable = 0
    queued = [(host, request) for host, _rank, request in store.items()]
    for host, request in [*queued, *given_up]:
        try:
            # Pickled one by one: a request whose meta cannot be pickled (a
            # Selector, a Response) is lost alone, as with Scrapy's disk queues.
            data = pickle.dumps(request.to_dict(spider=spider), protocol=4)
        except Exception:
            unserializable += 1
            if debug or unserializable == 1:
                logger.warning(
                    "Unable to serialize request %s; it is lost at this stop "
                    "(this warning is shown once; SCHEDULER_DEBUG=True shows all)",
                    request,
                )
        else:
            requests.append((host, data))
    now = time.monotonic()
    # Times are saved on the wall clock: the monotonic one restarts.
    to_wall = time.time() - now
    # Idle hosts too: a host blocked with nothing queued stays blocked for
    # the requests the resumed crawl will find for it.
    blocks = {
        host: (state.blocked_until + to_wall, state.block_reason)
        for host, state in store.blocked(now)
    }
    # When each host with an interval between starts (DOWNLOAD_DELAY,
    # Crawl-delay) may start its next request: also after the resume.
    spacing = {host: when + to_wall for host, when in store.spaced(now)}
    state = {"version": _STATE_VERSION, "requests": requests, "blocks": blocks, "spacing": spacing}
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            pickle.dump(state, f, protocol=4)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    logger.info("Saved %d queued requests to %s", len(requests), path)
    return unserializable


def load_state(path: str, spider: Spider) -> SavedState | None:
    """Read what the last stop saved at *path*, None if nothing.

    Reads the whole file first: if any of it cannot be read, it raises.
    """
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        state = pickle.load(f)  # our own file, in the user's JOBDIR
    version = state.get("version") if isinstance(state, dict) else None
    if version not in _READABLE_STATE_VERSIONS:
        raise ValueError(f"written by an incompatible scrapy-hostqueue (version {version!r})")
    requests = [
        request_from_dict(pickle.loads(data) if version >= 2 else data, spider=spider)
        for _host, data in state["requests"]
    ]
    now = time.time()
    to_monotonic = time.monotonic() - now
    blocks = [
        (host, until + to_monotonic, reason)
        for host, (until, reason) in state["blocks"].items()
        if until > now
    ]
    spacing = [
        (host, when + to_monotonic) for host, when in state.get("spacing", {}).items() if when > now
    ]
    return SavedState(requests, blocks, spacing)


def memory_job_refusal(jobdir: str | None) -> str | None:
    """Why the in-memory store refuses *jobdir*.

    It holds a frontier file, whose requests the in-memory store would not see. None if it does not.
    """
    if not jobdir:
        return None
    path = os.path.join(jobdir, FRONTIER_FILE)
    if not os.path.exists(path):
        return None
    return (
        f"JOBDIR {jobdir!r} holds the frontier file {path}, which the in-memory store "
        "(HOSTQUEUE_FRONTIER = 'memory') does not read: resumed with it, the crawl "
        "would lose the requests queued there. Finish this job with "
        "HOSTQUEUE_FRONTIER = 'sqlite' (the default with JOBDIR), or start a new JOBDIR."
    )


class MemoryFrontier:
    """The in-memory frontier.

    Every request in this process, and with a ``JOBDIR`` the job in ``hostqueue.state``, read at the
    start and written at a graceful stop; Scrapy's own dupefilter (``requests.seen``).
    """

    queue = "memory"
    codec: RequestCodec | None = None

    def __init__(self, crawler: Crawler, jobdir: str | None, *, debug: bool) -> None:
        self._crawler = crawler
        self._jobdir = jobdir
        self._debug = debug
        self._store: MemoryStore[Request] | None = None
        self._spider: Spider | None = None

    def dupefilter(self) -> BaseDupeFilter:
        return scrapy_dupefilter(self._crawler)

    def make_store(
        self,
        dupefilter: BaseDupeFilter,
        state_factory: Callable[[str], HostState],
        **kwargs: Any,
    ) -> RequestStore[Request]:
        self._store = MemoryStore(state_factory, **kwargs)
        return self._store

    def refusal(self) -> tuple[str, str] | None:
        message = memory_job_refusal(self._jobdir)
        return None if message is None else (JOBDIR_OF_SQLITE_FRONTIER, message)

    def resume(
        self, spider: Spider, push: Callable[[Request], bool], refuse: Callable[[str], None]
    ) -> tuple[int, int]:
        assert self._store is not None
        self._spider = spider
        if not self._jobdir:
            return 0, 0
        path = state_path(self._jobdir)
        try:
            saved = load_state(path, spider)
        except Exception as error:
            # Closed before any request, without saving over the file: the
            # job is left as it was, for the user to mend or drop.
            logger.error(
                "Cannot resume the job in JOBDIR %r: %s cannot be read (%s: %s). "
                "The crawl closes before any request and leaves the file as it is. If "
                "the spider lost a callback that queued requests name, give it "
                "back; otherwise start a new JOBDIR, or delete %s to start "
                "this job again from its start requests, losing the requests "
                "queued in it (the dupefilter's requests.seen filters every "
                "request it has seen before).",
                self._jobdir,
                path,
                type(error).__name__,
                error,
                path,
            )
            refuse(JOBDIR_STATE_UNREADABLE)
            return 0, 0
        if saved is None:
            return 0, 0
        for request in saved.requests:
            push(request)
        for host, until, reason in saved.blocks:
            self._store.block_until(host, until, reason)
        for host, when in saved.spacing:
            self._store.space_until(host, when)
        return len(saved.requests), len(saved.blocks)

    def stop(self) -> None:
        """Nothing runs in the background."""

    def save(self, given_up: Iterable[tuple[str, Request]]) -> int:
        if not (self._jobdir and self._spider is not None and self._store is not None):
            return 0
        path = state_path(self._jobdir)
        try:
            return save_state(path, self._store, given_up, self._spider, debug=self._debug)
        except Exception:
            logger.exception(
                "Could not save the queued requests to %s: they are lost at this "
                "stop (requests.seen keeps their links from being found again "
                "when the job resumes)",
                path,
            )
            return 0

    def close(self, dupefilter: BaseDupeFilter, reason: str) -> Deferred[None] | None:
        return dupefilter.close(reason)  # type: ignore[no-any-return]
