"""Parse a ``Retry-After`` header value (RFC 9110, section 10.2.3).

Pure logic: no Scrapy or Twisted import. The value is either delay-seconds
(``1*DIGIT``) or an HTTP-date in one of the three formats RFC 9110 requires a
recipient to accept (IMF-fixdate, obsolete RFC 850, ANSI C ``asctime()``).
A decimal number of seconds (``2.5``), which RFC 9110 does not allow but some
rate limiters send, is read too: it still says how long to wait. The caller
applies its own cap (``HOSTQUEUE_RETRY_AFTER_MAX``).
"""

from __future__ import annotations

import calendar
import math
import re
import time

__all__ = ["parse_retry_after"]

_MONTHS = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_WEEKDAYS = "(?:mon|tue|wed|thu|fri|sat|sun)"
_LONG_WEEKDAYS = "(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_TIME = r"(?P<hour>\d\d):(?P<minute>\d\d):(?P<second>\d\d)"
_MONTH = r"(?P<month>[a-z]{3})"

# Runs of whitespace are accepted wherever the grammar has one space (asctime
# pads a one-digit day with a second space; senders are not always exact).
# Sun, 06 Nov 1994 08:49:37 GMT
_IMF_FIXDATE = re.compile(
    rf"{_WEEKDAYS},\s*(?P<day>\d\d?)\s+{_MONTH}\s+(?P<year>\d{{4}})\s+{_TIME}\s+gmt",
    re.IGNORECASE,
)
# Sunday, 06-Nov-94 08:49:37 GMT
_RFC850 = re.compile(
    rf"{_LONG_WEEKDAYS},\s*(?P<day>\d\d?)-{_MONTH}-(?P<year>\d\d)\s+{_TIME}\s+gmt",
    re.IGNORECASE,
)
# Sun Nov  6 08:49:37 1994
_ASCTIME = re.compile(
    rf"{_WEEKDAYS}\s+{_MONTH}\s+(?P<day>\d\d?)\s+{_TIME}\s+(?P<year>\d{{4}})",
    re.IGNORECASE,
)
# 2.5 (ASCII digits only, no sign, no exponent).
_DECIMAL = re.compile(r"[0-9]+\.[0-9]+")


def parse_retry_after(value: str | bytes | None, now: float) -> float | None:
    """How many seconds a ``Retry-After`` *value* asks the client to wait.

    *now* is the current wall-clock time (``time.time()``), needed for an
    HTTP-date. Returns ``None`` when the value is missing or unusable
    (garbage, a negative number, an exponent, an impossible date), and
    ``0.0`` for a date in the past. No upper bound is applied (the result may
    be ``math.inf`` for an absurdly long number).
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    text = value.strip()
    if not text:
        return None
    if text.isascii() and text.isdigit():
        # Absurdly long numbers mean "a very long time" (the caller caps it);
        # int() of thousands of digits would raise.
        return float(int(text)) if len(text) <= 20 else math.inf
    if _DECIMAL.fullmatch(text):
        return float(text) if len(text) <= 40 else math.inf
    when = _parse_http_date(text, now)
    if when is None:
        return None
    return max(0.0, when - now)


def _parse_http_date(text: str, now: float) -> float | None:
    """Return the POSIX timestamp of an HTTP-date, or None if *text* is not one."""
    match = _IMF_FIXDATE.fullmatch(text) or _ASCTIME.fullmatch(text)
    two_digit_year = False
    if match is None:
        match = _RFC850.fullmatch(text)
        two_digit_year = match is not None
    if match is None:
        return None
    month = _MONTHS.get(match["month"].lower())
    if month is None:
        return None
    year = int(match["year"])
    if two_digit_year:
        # RFC 9110: a two-digit year that appears to be more than 50 years in
        # the future is taken as the most recent past year with those digits.
        this_year = _year_of(now)
        year += this_year - this_year % 100
        if year > this_year + 50:
            year -= 100
    day = int(match["day"])
    hour, minute, second = int(match["hour"]), int(match["minute"]), int(match["second"])
    # 60 allows a leap second, as RFC 5322 does.
    if not (1 <= day <= _days_in(year, month) and hour < 24 and minute < 60 and second <= 60):
        return None
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


def _days_in(year: int, month: int) -> int:
    return calendar.monthrange(year, month)[1]


def _year_of(timestamp: float) -> int:
    return time.gmtime(max(0.0, timestamp)).tm_year
