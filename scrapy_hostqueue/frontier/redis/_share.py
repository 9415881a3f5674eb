"""The rules of a busy host shared by two processes, within its one limit.

Pure: no Scrapy, Twisted or ``redis`` import. The Redis store
(:mod:`scrapy_hostqueue.frontier.redis._store`) applies them; the scripts that keep the
share record are ``OFFER`` and ``SHARE`` in
:mod:`scrapy_hostqueue.frontier.redis._db`.

A host is held whole by one process, its *holder*. When the holder's
process has more of the host than it can work alone (a deep queue, a limit
of a few requests, no spacing) and another process finds no host to claim,
the holder lends that process a *part* of the host's limit ``L``: ``part =
L // 2``, the holder keeps ``L - part``. The hand-over never lets the two
have more than ``L`` in flight between them:

1. *lowering*: the holder caps itself at one request, and waits until it has
   at most ``L - part`` handed out (with the send gate's prefetch, handed
   out is at least what is on the wire);
2. *offered*: it caps itself at ``L - part`` and offers the part in Redis;
   the co-holder, when it takes it, is capped at ``part`` from its first
   request;
3. the part comes back only when the record in Redis is gone: the
   co-holder ended it with nothing in flight, or its heartbeat expired
   (``HOSTQUEUE_LEASE_TIMEOUT``). Until the holder has read that, it stays
   at ``L - part``.

Each holder's AIMD middleware adjusts its own limit as usual, capped at its
part. A block (``Retry-After``, back-off) either holder sees is written to
the share record at once and read by the other at its next step.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "OFFER_WAIT",
    "SHARE_DEPTH",
    "SHARE_END_DEPTH",
    "SHARE_TICK",
    "SHARE_TURN",
    "Share",
    "may_share",
]

#: A host is shared only while its queue holds at least this many times its
#: limit (in the holder's window and queued in Redis) ...
SHARE_DEPTH = 4
#: ... and its share ends when the queue falls under this many times.
SHARE_END_DEPTH = 2
#: Seconds an offer nobody took stays open.
OFFER_WAIT = 1.0
#: Seconds a co-holder keeps a part while other processes want hosts.
SHARE_TURN = 10.0
#: Seconds between two steps of the store's task while it holds a share:
#: how late a block one holder saw reaches the other, at most.
SHARE_TICK = 0.02

LOWERING = "lowering"
OFFERED = "offered"
RECALLING = "recalling"
WORKING = "working"


@dataclass
class Share:
    """This process's side of a shared host: its holder (*owner*) or its co-holder.

    *limit* is the host's limit that was split, *part* the co-holder's; *wanted* the limit the AIMD
    middleware last set here, which the cap holds down.
    """

    owner: bool
    limit: int
    part: int
    wanted: int
    phase: str
    since: float
    #: A share step is on its way to Redis.
    stepping: bool = False
    #: The co-holder took the part (as the holder last read).
    taken: bool = False

    @property
    def cap(self) -> int:
        """The most this process may have in flight at the host now."""
        if not self.owner:
            return self.part
        if self.phase == LOWERING:
            return 1
        return self.limit - self.part

    def limit_here(self) -> int:
        """Return the limit the frontier applies here: the AIMD one, capped."""
        return max(1, min(self.wanted, self.cap))


def may_share(
    limit: int,
    *,
    interval: float,
    blocked: bool,
    given_up: bool,
    answering: bool,
    queued: int,
    prefetch: int,
) -> bool:
    """Whether a held host is busy enough to lend a part of its *limit*.

    Two processes can both work it, it is not spaced (``Crawl-delay``, a download delay), blocked or
    given up, it answers, and its queue holds several times its limit. The holder must be able to
    bring what it has handed out (at a cap of one, plus *prefetch*) down to its own part.
    """
    part = limit // 2
    return (
        limit >= 2
        and limit - part >= 1 + prefetch
        and not interval
        and not blocked
        and not given_up
        and answering
        and queued >= SHARE_DEPTH * limit
    )
