"""The report a crawl test prints when it fails.

Every crawl a test runs is watched: in this process through :class:`CrawlWatch`,
an extension that :data:`tests.helpers.crawling.BASE_SETTINGS` enables (it keeps the
crawler, whose stats outlive the crawl, and the last records of its log); in a
``scrapy crawl`` subprocess through its log file (``start_demo_crawl``). The
hosts of the ``local_hosts`` fixture and of :func:`watched_hosts` are kept too.
When a test fails, ``conftest.py`` adds :meth:`Watched.report` to its output,
a section of its own: per crawl, what
:func:`scrapy_hostqueue.testing.crawl_report` makes of it. The report is built
then only; watching costs a list entry and a few log records per crawl.
"""

from __future__ import annotations

import ast
import logging
import re
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scrapy import signals
from scrapy.crawler import Crawler

from scrapy_hostqueue.testing import HostSpec, HostStats, LocalHosts, crawl_report

#: Log lines kept per crawl.
LOG_TAIL = 40
#: Crawls shown in full, the latest ones; older ones get their title and
#: finish reason.
FULL_CRAWLS = 3
#: The loggers whose records a crawl keeps down to its ``LOG_LEVEL``.
TAPPED = ("scrapy", "scrapy_hostqueue")

_FORMAT = logging.Formatter("%(asctime)s [%(name)s] %(levelname)s: %(message)s")


class _Sink:
    """The last :data:`LOG_TAIL` records of one crawl at or above *level*.

    There is one object per crawl: the tap tells them apart by identity.
    """

    def __init__(self, level: int) -> None:
        self.level = level
        self.records: deque[logging.LogRecord] = deque(maxlen=LOG_TAIL)


class _LogTap(logging.Handler):
    """Hands the records of the :data:`TAPPED` loggers to the crawls open now.

    Each crawl gets them down to its ``LOG_LEVEL``, without changing what the rest of the test sees
    (``caplog``, pytest's captured log, Scrapy's ``log_count``).

    Outside a crawl a test's root logger is at WARNING, so Scrapy's INFO
    records are never made. While a crawl is open the tapped loggers go down
    to its level and stop propagating; the tap passes on to the root logger the
    records that the loggers would have let through before, and only those.
    """

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self._sinks: list[_Sink] = []
        self._saved: dict[str, tuple[int, bool]] = {}

    def add(self, sink: _Sink) -> None:
        if not self._sinks:
            for name in TAPPED:
                logger = logging.getLogger(name)
                self._saved[name] = (logger.level, logger.propagate)
                logger.addHandler(self)
                logger.propagate = False
        self._sinks.append(sink)
        self._set_levels()

    def remove(self, sink: _Sink) -> None:
        if sink not in self._sinks:
            return
        self._sinks.remove(sink)
        if self._sinks:
            self._set_levels()
            return
        for name, (level, propagate) in self._saved.items():
            logger = logging.getLogger(name)
            logger.removeHandler(self)
            logger.setLevel(level)
            logger.propagate = propagate
        self._saved.clear()

    def remove_all(self) -> None:
        for sink in list(self._sinks):
            self.remove(sink)

    def _set_levels(self) -> None:
        lowest = min(sink.level for sink in self._sinks)
        for name in TAPPED:
            logging.getLogger(name).setLevel(min(lowest, self._level_before(name)))

    def _level_before(self, name: str) -> int:
        """Return the effective level logger *name* had before the tap."""
        logger: logging.Logger | None = logging.getLogger(name)
        while logger is not None:
            level = self._saved[logger.name][0] if logger.name in self._saved else logger.level
            if level:
                return level
            logger = logger.parent
        return logging.WARNING

    def emit(self, record: logging.LogRecord) -> None:
        for sink in self._sinks:
            if record.levelno >= sink.level:
                sink.records.append(record)
        if record.levelno >= self._level_before(record.name):
            logging.getLogger().handle(record)


_TAP = _LogTap()


def _level(value: Any) -> int:
    if isinstance(value, int):
        return value
    level = logging.getLevelName(str(value).upper())
    return level if isinstance(level, int) else logging.INFO


def _line(record: logging.LogRecord) -> str:
    """Write one line per log record.

    The first line of its message (a stats dump or a settings list would fill the tail), and the
    exception it carries.
    """
    first, *rest = _FORMAT.format(record).split("\n")
    if record.exc_info and record.exc_info[1] is not None:
        first += f" | {record.exc_info[1]!r}"
    elif rest:
        first += f" [+{len(rest)} lines]"
    return first


class CrawlWatch:
    """Keeps the crawler and the last log lines of a crawl, for the failure report.

    Keeps, for the failure report of the test that runs it, the crawler of
    an in-process crawl and the last lines of its log (a Scrapy extension).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.log = _Sink(_level(crawler.settings.get("LOG_LEVEL")))
        _TAP.add(self.log)
        crawler.signals.connect(self._stopped, signal=signals.engine_stopped)
        WATCHED.crawls.append(self)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CrawlWatch:
        return cls(crawler)

    def _stopped(self) -> None:
        _TAP.remove(self.log)

    def render(self, title: str, hosts: list[_WatchedHosts]) -> str:
        stats = self.crawler.stats.get_stats() if self.crawler.stats is not None else None
        spider = type(self.crawler.spider).__name__ if self.crawler.spider else "no spider"
        return _render(
            f"{title} in this process ({spider})",
            stats,
            [_line(r) for r in self.log.records],
            hosts,
        )

    def finish_reason(self) -> Any:
        return self.crawler.stats.get_value("finish_reason") if self.crawler.stats else None


# A line that starts a log record of ``scrapy crawl``: "2026-01-02 03:04:05 [".
_RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_STAT_LINE = re.compile(r"^[{ ]?'(?P<key>[^']+)': (?P<value>.*?),?}?$")


@dataclass
class ProcessCrawl:
    """A ``scrapy crawl`` in a subprocess, known by its log file.

    Its stats are read from the last stats dump in the log (none if the process was killed before),
    the tail from the last records (a record's first line).
    """

    log: Path

    def _read(self) -> tuple[dict[str, Any] | None, list[str]]:
        try:
            text = self.log.read_text(errors="replace")
        except OSError as error:
            return None, [f"cannot read {self.log}: {error}"]
        stats: dict[str, Any] | None = None
        records: list[list[str]] = []
        for line in text.splitlines():
            if _RECORD_START.match(line) or not records:
                records.append([line])
            else:
                records[-1].append(line)
        for first, *rest in records:
            if "Dumping Scrapy stats" in first:
                stats = {}
                for line in rest:
                    match = _STAT_LINE.match(line.strip())
                    if match:
                        stats[match["key"]] = _value(match["value"])
        return stats, [_record_line(record) for record in records[-LOG_TAIL:]]

    def render(self, title: str, hosts: list[_WatchedHosts]) -> str:
        stats, tail = self._read()
        return _render(f"{title}: scrapy crawl, log {self.log}", stats, tail, hosts)

    def finish_reason(self) -> Any:
        stats, _ = self._read()
        return None if stats is None else stats.get("finish_reason")


def _record_line(record: list[str]) -> str:
    """One line per record of a log file, as :func:`_line` makes them."""
    first, *rest = record
    if any(line.startswith("Traceback") for line in rest):
        return f"{first} | {next(line for line in reversed(rest) if line.strip())}"
    return f"{first} [+{len(rest)} lines]" if rest else first


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


class _WatchedHosts:
    """Local hosts whose counts the report shows.

    Read when it is made, or, for hosts stopped before
    (:func:`watched_hosts`), as they were at their stop.
    """

    def __init__(self, hosts: LocalHosts) -> None:
        self.hosts = hosts
        self.kept: tuple[list[HostStats], list[HostSpec]] | str | None = None

    def keep(self) -> None:
        self.kept = self._read()

    def counts(self) -> tuple[list[HostStats], list[HostSpec]] | str:
        return self._read() if self.kept is None else self.kept

    def _read(self) -> tuple[list[HostStats], list[HostSpec]] | str:
        try:
            return self.hosts.all_stats(arrivals=False), self.hosts.specs
        except (RuntimeError, OSError) as error:  # ControlError is a RuntimeError
            return f"the counts of {len(self.hosts)} hosts are gone: {error}"


def _render(
    title: str, stats: dict[str, Any] | None, log: list[str], hosts: list[_WatchedHosts]
) -> str:
    counts: list[HostStats] = []
    specs: list[HostSpec] = []
    for each in hosts:
        read = each.counts()
        if isinstance(read, str):
            title += f" ({read})"
            continue
        counts += read[0]
        specs += read[1]
    return crawl_report(stats, hosts=counts, specs=specs, log=log, title=title)


@dataclass
class Watched:
    """What the running test has crawled, and the hosts it started."""

    crawls: list[CrawlWatch | ProcessCrawl] = field(default_factory=list)
    hosts: list[_WatchedHosts] = field(default_factory=list)

    def hosts_started(self, hosts: LocalHosts) -> _WatchedHosts:
        watched = _WatchedHosts(hosts)
        self.hosts.append(watched)
        return watched

    def process_started(self, log: Path) -> None:
        """Watch a ``scrapy crawl`` logging to *log*, which started.

        A ``scrapy crawl`` logging to *log* started (a log written again
        by a later run counts once, at its latest place).
        """
        self.crawls = [c for c in self.crawls if not (isinstance(c, ProcessCrawl) and c.log == log)]
        self.crawls.append(ProcessCrawl(log))

    def reset(self) -> None:
        _TAP.remove_all()
        self.crawls.clear()
        self.hosts.clear()

    def report(self) -> str | None:
        """Report every crawl of the test, None if it ran none.

        The latest crawl comes with the counts of every host the test started.
        """
        if not self.crawls:
            return None
        parts = list(self._older())
        count = len(self.crawls)
        first = max(0, count - FULL_CRAWLS)
        for number, crawl in enumerate(self.crawls[first:], first + 1):
            hosts = self.hosts if number == count else []
            parts.append(crawl.render(f"crawl {number} of {count}", hosts))
        return "\n\n".join(parts)

    def _older(self) -> Iterator[str]:
        older = self.crawls[: max(0, len(self.crawls) - FULL_CRAWLS)]
        if older:
            reasons = ", ".join(f"{n}: {c.finish_reason()!r}" for n, c in enumerate(older, 1))
            yield f"== crawls 1 to {len(older)} (finish reasons): {reasons}"


#: The running test's crawls and hosts (each xdist worker runs one test at a time).
WATCHED = Watched()


@contextmanager
def watched_hosts(specs: Iterable[HostSpec] | str, **kwargs: Any) -> Iterator[LocalHosts]:
    """Serve ``LocalHosts`` whose counts go into the test's crawl report.

    ``with LocalHosts(specs, **kwargs)`` whose counts, as the block ends,
    go into the test's crawl report (the ``local_hosts`` fixture's hosts
    run until the report is made).
    """
    with LocalHosts(specs, **kwargs) as hosts:
        watched = WATCHED.hosts_started(hosts)
        try:
            yield hosts
        finally:
            watched.keep()
