"""The pure Retry-After parser (RFC 9110 section 10.2.3)."""

from __future__ import annotations

import calendar
import math
from email.utils import formatdate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_hostqueue._retry_after import parse_retry_after

# 2024-03-10 12:00:00 UTC, a fixed "now" for the date forms.
NOW = float(calendar.timegm((2024, 3, 10, 12, 0, 0, 0, 0, 0)))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        ("2", 2.0),
        ("120", 120.0),
        (" 7 ", 7.0),
        (b"3", 3.0),
        ("007", 7.0),
        ("99999999999999999999", 1e20),  # huge: returned as is, the caller caps it
        ("9" * 5000, math.inf),
        # Not RFC 9110's delay-seconds, but sent by some rate limiters: still a wait.
        ("2.5", 2.5),
        ("0.25", 0.25),
        (" 10.0 ", 10.0),
        ("9" * 50 + ".5", math.inf),
    ],
)
def test_delay_seconds(value: str | bytes, expected: float) -> None:
    assert parse_retry_after(value, NOW) == expected


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "   ",
        "-1",
        "-120",
        "+5",
        "-1.5",
        "1.",
        ".5",
        "1.5.2",
        "1e3",
        "soon",
        "two",
        "0x10",
        "٣",  # a non-ASCII digit is not delay-seconds
        "Sun, 10 Mar 2024 12:00:61 GMT",  # no such second
        "Sun, 31 Feb 2024 12:00:00 GMT",  # no such day
        "Sun, 10 Foo 2024 12:00:00 GMT",  # no such month
        "Sun, 10 Mar 2024 25:00:00 GMT",  # no such hour
        "Sun, 10 Mar 2024 12:00:00 +0100",  # HTTP-dates are GMT only
        "Sun, 10 Mar 2024 12:00:00",
        "2024-03-10T12:00:00Z",  # ISO 8601 is not an HTTP-date
        "Sun, 10 Mar 2024 12:00:00 GMT trailing",
        b"\xff\xfe",
    ],
)
def test_unusable_values_give_none(value: str | bytes | None) -> None:
    assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # IMF-fixdate, the preferred form.
        ("Sun, 10 Mar 2024 12:00:30 GMT", 30.0),
        ("sun, 10 mar 2024 12:01:00 gmt", 60.0),
        # Obsolete RFC 850 form, two-digit year.
        ("Sunday, 10-Mar-24 12:00:05 GMT", 5.0),
        # ANSI C asctime() form, space-padded day.
        ("Sun Mar 10 12:00:09 2024", 9.0),
        ("Mon Mar  11 12:00:00 2024", 86400.0),
        ("Mon Mar 11 12:00:00 2024", 86400.0),
        # Dates in the past: wait 0, i.e. retry now.
        ("Sun, 10 Mar 2024 11:59:59 GMT", 0.0),
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),
        ("Sunday, 06-Nov-94 08:49:37 GMT", 0.0),
        ("Sun Nov  6 08:49:37 1994", 0.0),
        # Far future: returned as is, the caller caps it.
        ("Fri, 01 Jan 2100 00:00:00 GMT", calendar.timegm((2100, 1, 1, 0, 0, 0)) - NOW),
    ],
)
def test_http_dates(value: str, expected: float) -> None:
    assert parse_retry_after(value, NOW) == pytest.approx(expected)


def test_rfc850_two_digit_year_is_never_more_than_50_years_ahead() -> None:
    # "Monday, 10-Mar-80" read in 2024: 1980 (in the past), not 2080.
    assert parse_retry_after("Monday, 10-Mar-80 12:00:00 GMT", NOW) == 0.0
    # "..-74" is 2074, 50 years ahead: allowed.
    seconds = parse_retry_after("Saturday, 10-Mar-74 12:00:00 GMT", NOW)
    assert seconds is not None
    assert 49 * 365 * 86400 < seconds < 51 * 365 * 86400


def test_dates_written_by_the_standard_library_round_trip() -> None:
    for delta in (0, 1, 2, 59, 3600):
        value = formatdate(NOW + delta, usegmt=True)
        assert parse_retry_after(value, NOW) == float(delta)


@given(st.text(max_size=40) | st.binary(max_size=40))
def test_never_raises_and_never_negative(value: str | bytes) -> None:
    seconds = parse_retry_after(value, NOW)
    assert seconds is None or seconds >= 0


@given(st.integers(min_value=0, max_value=10**12))
def test_any_delay_seconds_is_read_exactly(seconds: int) -> None:
    assert parse_retry_after(str(seconds), NOW) == float(seconds)


@given(st.integers(min_value=-(10**9), max_value=10**9))
def test_any_imf_fixdate_is_read_as_its_distance_from_now(delta: int) -> None:
    value = formatdate(NOW + delta, usegmt=True)
    assert parse_retry_after(value, NOW) == float(max(0, delta))
