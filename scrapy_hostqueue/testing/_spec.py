"""What a local test host does (:class:`HostSpec`) and the spec mini-language.

The grammar is documented in the package docstring (``scrapy_hostqueue.testing``);
:func:`parse_specs` and :func:`format_spec` are exact inverses for every valid spec.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from email.utils import parsedate_to_datetime
from typing import Any

FAULTS = ("reset", "hang", "truncate", "slow-body", "malformed", "throttle")
THROTTLE_STATUSES = (429, 503)
MAX_BODY_SIZE = 64 * 1024 * 1024
MAX_HOSTS_PER_GROUP = 10_000


class SpecError(ValueError):
    """A host spec (Python arguments or mini-language text) cannot work."""


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(f"{name} must be >= {minimum}, got {value!r}")


def _check_seconds(name: str, value: object, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        relation = "> 0" if positive else ">= 0"
        raise SpecError(f"{name} must be a finite number {relation}, got {value!r}")


@dataclass(frozen=True)
class HostSpec:
    """The behaviour of one local test host.

    Pages live at ``/page/{n}`` (``/`` is an alias of page 0). Page ``n`` links the
    ``links`` children ``n*links+1 .. n*links+links`` on the same host (a tree that
    reaches every page id exactly once) plus ``cross_links`` pages on the following
    hosts of the same :class:`~scrapy_hostqueue.testing.LocalHosts`. Ids at or beyond
    ``pages`` are never linked and answer 404.

    A page request is handled in this order: if more than ``throttle_above`` page
    requests are in flight (this one included) it is answered at once with
    ``throttle_status``; otherwise, if it is picked for the ``fault``, the fault
    happens; otherwise the host waits ``latency`` and answers ``status``. Faults:
    ``hang`` never answers (the request stays in flight until the client gives
    up); ``reset`` waits ``latency`` then resets the connection (RST);
    ``truncate`` waits ``latency``, announces the full Content-Length, sends half
    the body and closes; ``slow-body`` waits ``latency``, sends the headers, then
    the body in 10 pieces spread over ``trickle`` seconds; ``malformed`` waits
    ``latency`` and answers with a header line that has no colon (Scrapy's
    HTTP/1.1 handler skips the line, aiohttp refuses the response);
    ``throttle`` answers at once with ``throttle_status``, as a throttled
    request (a host that throttles by rate rather than by concurrency). With
    ``fault_attempts`` the fault is transient: ``fault_rate`` picks pages (the
    1st, 2nd, ... distinct page requested) rather than requests, and a picked
    page gets the fault on its first ``fault_attempts`` requests only, then is
    answered as usual, so a client that retries often enough gets every page.
    robots.txt (after
    ``latency``) is never throttled nor faulted and is not a page request.
    ``Retry-After`` is sent on every 429 and 503 answer when ``retry_after`` is set:
    ``"2"`` sends delta-seconds, ``"date:2"`` an HTTP-date 2 s ahead (rounded up to
    the next whole second), anything else is sent verbatim (e.g. garbage).
    """

    latency: float = 0.01
    links: int = 3
    pages: int | None = None
    cross_links: int = 0
    throttle_above: int | None = None
    throttle_status: int = 429
    retry_after: str | None = None
    crawl_delay: float | None = None
    fault: str | None = None
    fault_rate: float = 1.0
    fault_attempts: int | None = None
    trickle: float = 1.0  # seconds a "slow-body" body takes to arrive
    status: int = 200
    body_size: int = 512
    gzip: bool = False
    refuse: bool = False

    def __post_init__(self) -> None:
        retry_after: Any = self.retry_after
        if isinstance(retry_after, int) and not isinstance(retry_after, bool):
            # A convenience for Python callers: HostSpec(retry_after=2).
            object.__setattr__(self, "retry_after", str(retry_after))
        _check_seconds("latency", self.latency)
        _check_int("links", self.links, 0)
        if self.pages is not None:
            _check_int("pages", self.pages, 1)
        _check_int("cross_links", self.cross_links, 0)
        if self.throttle_above is not None:
            _check_int("throttle_above", self.throttle_above, 0)
        if self.throttle_status not in THROTTLE_STATUSES:
            raise SpecError(f"throttle_status must be 429 or 503, got {self.throttle_status!r}")
        if self.retry_after is not None:
            _check_retry_after(self.retry_after)
        if self.crawl_delay is not None:
            _check_seconds("crawl_delay", self.crawl_delay)
        if self.fault is not None and self.fault not in FAULTS:
            raise SpecError(f"fault must be one of {', '.join(FAULTS)}, got {self.fault!r}")
        if (
            isinstance(self.fault_rate, bool)
            or not isinstance(self.fault_rate, (int, float))
            or not 0 < self.fault_rate <= 1
        ):
            raise SpecError(f"fault_rate must be in (0, 1], got {self.fault_rate!r}")
        if self.fault_attempts is not None:
            _check_int("fault_attempts", self.fault_attempts, 1)
        _check_seconds("trickle", self.trickle, positive=True)
        _check_int("status", self.status, 200)
        if self.status > 599:
            raise SpecError(f"status must be an HTTP status 200-599, got {self.status}")
        _check_int("body_size", self.body_size, 0)
        if self.body_size > MAX_BODY_SIZE:
            raise SpecError(f"body_size must be <= {MAX_BODY_SIZE}, got {self.body_size}")
        for name in ("gzip", "refuse"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"{name} must be True or False")

    def to_dict(self) -> dict[str, Any]:
        """Return the spec as a JSON-ready dict (``HostSpec(**d)`` rebuilds it)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostSpec:
        """Rebuild a spec from :meth:`to_dict` output, naming unknown fields."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown HostSpec field(s): {', '.join(unknown)}")
        return cls(**data)

    def faulted(self, number: int) -> bool:
        """Whether the ``number``-th (1-based) eligible page request gets the fault.

        Deterministic and evenly spread: rate 0.25 faults requests 4, 8, 12, ...
        """
        if self.fault is None:
            return False
        return math.floor(number * self.fault_rate + 1e-9) > math.floor(
            (number - 1) * self.fault_rate + 1e-9
        )


def _check_retry_after(value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"retry_after must be a non-empty string, got {value!r}")
    if any(not 32 <= ord(char) <= 126 for char in value):
        raise SpecError(
            f"retry_after must be printable ASCII (it is a header value), got {value!r}"
        )
    if value.startswith("date:"):
        try:
            seconds = float(value[5:])
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise SpecError(f"retry_after 'date:N' needs N >= 0 seconds, got {value[5:]!r}")


def retry_after_seconds(value: str, now: float) -> float | None:
    """How many seconds a client should wait for a sent ``Retry-After`` value.

    ``now`` is the wall-clock time the header was sent. None when a client cannot
    make sense of the value (so it opens no window).
    """
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


# --- the mini-language ---------------------------------------------------

_DURATION = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<unit>ms|s)?$")
_SIZE = re.compile(r"^(?P<number>[0-9]+)(?P<unit>[kKmM]?)$")
_COUNT = re.compile(r"^\s*(?P<count>[0-9]+)\s*x(?:\s+|$)")
_THROTTLE = re.compile(r"^(?P<status>[0-9]{3})\s*>\s*(?P<above>[0-9]+)$")
_TRUE = {"1", "yes", "true", "on"}
_FALSE = {"0", "no", "false", "off"}

# key in the language -> HostSpec field (None: compound key handled apart)
_KEYS: dict[str, str | None] = {
    "latency": "latency",
    "links": "links",
    "pages": "pages",
    "cross-links": "cross_links",
    "throttle": None,
    "throttle-above": "throttle_above",
    "throttle-status": "throttle_status",
    "retry-after": "retry_after",
    "crawl-delay": "crawl_delay",
    "fault": "fault",
    "fault-rate": "fault_rate",
    "fault-attempts": "fault_attempts",
    "trickle": "trickle",
    "status": "status",
    "body-size": "body_size",
    "gzip": "gzip",
    "refuse": "refuse",
}
_FLAGS = ("gzip", "refuse")


def _duration(key: str, text: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise SpecError(f"{key}: expected a duration like 10ms, 0.5s or 2, got {text!r}")
    # Decimal keeps "10ms" and "0.01" the same float.
    number = Decimal(match["number"])
    if match["unit"] == "ms":
        number /= 1000
    return float(number)


def _integer(key: str, text: str) -> int:
    if not text.isdigit():
        raise SpecError(f"{key}: expected a whole number, got {text!r}")
    return int(text)


def _size(key: str, text: str) -> int:
    match = _SIZE.match(text)
    if match is None:
        raise SpecError(f"{key}: expected a byte count like 512, 4k or 1m, got {text!r}")
    factor = {"": 1, "k": 1024, "m": 1024 * 1024}[match["unit"].lower()]
    return int(match["number"]) * factor


def _boolean(key: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise SpecError(f"{key}: expected yes or no, got {text!r}")


def _fraction(key: str, text: str) -> float:
    try:
        if text.endswith("%"):
            return float(Decimal(text[:-1]) / 100)
        return float(Decimal(text))
    except InvalidOperation:
        raise SpecError(f"{key}: expected a fraction like 0.25 or 25%, got {text!r}") from None


def _value(key: str, text: str, *, quoted: bool = False) -> dict[str, Any]:
    """Convert one ``key=value`` item to HostSpec keyword arguments."""
    if quoted and key == "retry-after":
        return {"retry_after": text}
    if key == "throttle":
        if text.lower() in ("off", "none"):
            return {"throttle_above": None}
        match = _THROTTLE.match(text)
        if match is None:
            raise SpecError(f"throttle: expected STATUS>COUNT like 429>3 or 503>0, got {text!r}")
        return {
            "throttle_status": int(match["status"]),
            "throttle_above": int(match["above"]),
        }
    field = _KEYS[key]
    assert field is not None
    converted: Any
    if key in ("latency", "crawl-delay", "trickle"):
        converted = (
            None if key == "crawl-delay" and text.lower() == "none" else _duration(key, text)
        )
    elif key == "pages":
        converted = None if text.lower() in ("none", "inf") else _integer(key, text)
    elif key in ("throttle-above", "fault-attempts"):
        converted = None if text.lower() in ("none", "off") else _integer(key, text)
    elif key in ("links", "cross-links", "throttle-status", "status"):
        converted = _integer(key, text)
    elif key == "body-size":
        converted = _size(key, text)
    elif key in _FLAGS:
        converted = _boolean(key, text)
    elif key == "fault-rate":
        converted = _fraction(key, text)
    elif key == "fault":
        converted = None if text.lower() == "none" else text
    else:  # retry-after: verbatim
        converted = None if text.lower() == "none" else text
    return {field: converted}


def _split(text: str, separator: str) -> list[str]:
    """Split on ``separator`` outside double quotes."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == separator and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if quoted:
        raise SpecError(f"unbalanced double quote in {text.strip()!r}")
    parts.append("".join(current))
    return parts


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    if '"' in text:
        raise SpecError(f"a quoted value must be quoted as a whole, got {text!r}")
    return text


def parse_spec(text: str) -> HostSpec:
    """Parse the items of one host (``latency=10ms,links=3``) into a HostSpec."""
    kwargs: dict[str, Any] = {}
    seen: set[str] = set()
    for raw_item in _split(text, ","):
        item = raw_item.strip()
        if not item:
            continue
        key, has_value, value = item.partition("=")
        key = key.strip().lower().replace("_", "-")
        value = value.strip()
        quoted = value.startswith('"')
        value = _unquote(value)
        if key not in _KEYS:
            raise SpecError(f"unknown key {key!r} (known: {', '.join(_KEYS)})")
        if key in seen:
            raise SpecError(f"key {key!r} given twice")
        if (key == "throttle" and seen & {"throttle-above", "throttle-status"}) or (
            key in ("throttle-above", "throttle-status") and "throttle" in seen
        ):
            raise SpecError("give either throttle=STATUS>COUNT or throttle-above/-status")
        seen.add(key)
        if not has_value:
            if key not in _FLAGS:
                raise SpecError(f"{key} needs a value: {key}=...")
            value = "yes"
        elif not value:
            raise SpecError(f"{key} has an empty value")
        kwargs.update(_value(key, value, quoted=quoted))
    return HostSpec(**kwargs)


def parse_specs(text: str) -> list[HostSpec]:
    """Parse a whole spec string (groups separated by ``;``) into one spec per host.

    Raises :class:`SpecError` with a one-line message naming the bad group and item.
    """
    specs: list[HostSpec] = []
    groups = _split(text, ";")
    for number, group in enumerate(groups, 1):
        if not group.strip():
            if len(groups) == 1:
                raise SpecError("empty host spec")
            raise SpecError(f"host group {number} is empty (stray ';'?)")
        count = 1
        body = group
        match = _COUNT.match(group)
        if match is not None:
            count = int(match["count"])
            body = group[match.end() :]
            if not 1 <= count <= MAX_HOSTS_PER_GROUP:
                raise SpecError(
                    f"host group {number} ({group.strip()!r}): count must be "
                    f"1..{MAX_HOSTS_PER_GROUP}, got {count}"
                )
        try:
            spec = parse_spec(body)
        except SpecError as error:
            raise SpecError(f"host group {number} ({group.strip()!r}): {error}") from None
        specs.extend([spec] * count)
    return specs


def _trim(number: float) -> str:
    # Plain notation (the language has no exponents); repr's digits round-trip.
    text = format(Decimal(repr(float(number))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _format_seconds(value: float) -> str:
    if 0 < value < 1:
        millis = f"{_trim(value * 1000)}ms"
        if _duration("", millis) == value:
            return millis
    return f"{_trim(value)}s"


def format_spec(spec: HostSpec) -> str:
    """Mini-language text that :func:`parse_spec` turns back into ``spec``.

    Exact for every spec except a ``retry_after`` holding a double quote, which the
    language cannot express.
    """
    default = HostSpec()
    items: list[str] = []
    for key, field in _KEYS.items():
        if field is None or field in ("throttle_above", "throttle_status"):
            if key == "throttle" and spec.throttle_above is not None:
                items.append(f"throttle={spec.throttle_status}>{spec.throttle_above}")
            elif key == "throttle" and spec.throttle_status != default.throttle_status:
                items.append(f"throttle-status={spec.throttle_status}")
            continue
        value = getattr(spec, field)
        if value == getattr(default, field):
            continue
        if value is None:
            text = "none"
        elif key in _FLAGS:
            text = "yes" if value else "no"
        elif key in ("latency", "crawl-delay", "trickle"):
            text = _format_seconds(value)
        else:
            text = str(value)
        if (
            any(char in text for char in ',;"')
            or text != text.strip()
            or (key == "retry-after" and text.lower() == "none")
        ):
            text = f'"{text}"'
        items.append(f"{key}={text}")
    return ",".join(items)
