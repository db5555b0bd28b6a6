"""The times a saved log's lines print, as seconds since the epoch: journalctl's, RFC 3339's, and each engine's own
layouts, which its grammar holds (`[[time]]`), dates without a year moving on at New Year."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo

from exporter.core import grammar

# journalctl prints the month in the locale's words (strftime's %b): the common ones, lower case and
# without a final dot; 中文 and 日本語 write `8月`. A month it does not know leaves the line untimed.
MONTHS = {
    name.encode(): number
    for names in (
        "jan feb mar apr may jun jul aug sep oct nov dec",  # English, and the default C locale
        "jan feb mär apr mai jun jul aug sep okt nov dez",  # German
        "janv févr mars avr mai juin juil août sept oct nov déc",  # French
        "ene feb mar abr may jun jul ago sep oct nov dic",  # Spanish
        "gen feb mar apr mag giu lug ago set ott nov dic",  # Italian
        "jan fev mar abr mai jun jul ago set out nov dez",  # Portuguese
        "янв фев мар апр мая июн июл авг сен окт ноя дек",  # Russian (genitive, as %b gives it)
        "1月 2月 3月 4月 5月 6月 7月 8月 9月 10月 11月 12月",  # Chinese, Japanese
    )
    for number, name in enumerate(names.split(), 1)
} | {"май".encode(): 5}
# Times a timeline can print (report.iso: datetime's years 1 to 9999, a day's margin for any zone). A
# date at the edge in a far zone ("0001-01-01T00:00:00+23:59") or a realtime of 30 digits is garbage,
# read as no time: report.iso raised ValueError on it and `replay` died (found by tests/test_fuzz.py).
MIN_TIME, MAX_TIME = -62135596800.0 + 86400, 253402300799.0 - 86400

ZONE = rb"(Z|[+-]\d\d:?\d\d)"
FRACTION = rb"(?:[.,](\d{1,9}))?"
RFC3339 = rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)" + FRACTION + ZONE
_WHOLE_RFC3339 = re.compile(RFC3339)


def zone_of(raw: bytes | None, default: tzinfo | None) -> tzinfo | None:
    if not raw:
        return default
    if raw == b"Z":
        return UTC
    sign = -1 if raw[:1] == b"-" else 1
    digits = raw[1:].replace(b":", b"")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:4])))


def fraction(raw: bytes | None) -> float:
    return int(raw) / 10 ** len(raw) if raw else 0.0


def epoch(year: int, month: int, day: int, hms: tuple[int, int, int], tz: tzinfo | None) -> float | None:
    """Seconds since the epoch; a naive time (tz None) is local time. None for an impossible date."""
    try:
        t = datetime(year, month, day, *hms, tzinfo=tz).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return t if MIN_TIME <= t <= MAX_TIME else None


def stamp(groups: tuple[bytes | None, ...], default: tzinfo | None) -> float | None:
    """Regex groups year, month, day, hour, minute, second, fraction[, zone] as seconds since the
    epoch, in `default` when the zone is absent; None for an impossible time or zone."""
    y, mo, d, hh, mm, ss, part, *offset = groups
    try:
        tz = zone_of(offset[0] if offset else None, default)
    except ValueError:  # an offset of 24 hours or more
        return None
    t = epoch(int(y or 0), int(mo or 0), int(d or 0), (int(hh or 0), int(mm or 0), int(ss or 0)), tz)
    return t + fraction(part) if t is not None else None


def rfc3339(text: str | bytes) -> float | None:
    """Seconds since the epoch of an RFC 3339 time with a zone ("2026-11-29T12:00:01.48291Z"); None otherwise."""
    raw = text.encode("ascii", "replace") if isinstance(text, str) else text
    # the fraction apart from the whole second, which the lines of one second share: one date computed a second
    head, rest = raw[:19], raw[19:]
    digits = b""
    if rest[:1] in (b".", b","):
        zone_at = len(rest) - 1 if rest.endswith(b"Z") else max(rest.rfind(b"+"), rest.rfind(b"-"), 1)
        digits, rest = rest[1:zone_at], rest[zone_at:]
        if not (0 < len(digits) <= 9 and digits.isdigit()):
            return None
    whole = _whole_second(head, rest)
    return whole + fraction(digits) if whole is not None else None


@functools.lru_cache(maxsize=1024)
def _whole_second(head: bytes, offset: bytes) -> float | None:
    found = _WHOLE_RFC3339.fullmatch(head + offset)
    return stamp(found.groups(), None) if found and offset else None


class Years:
    """Dates without a year: start in `year`, move to the next when the time jumps back past New Year."""

    ROLLOVER = 7 * 86400.0  # a jump back this far can only be a new year
    STRAGGLER = 300 * 86400.0  # this far ahead of the newest line: a line from just before New Year

    def __init__(self, year: int, tz: tzinfo | None) -> None:
        self.year = year
        self.zone = tz
        self.newest: float | None = None
        self._cache: tuple[tuple[int, ...], float | None] = ((), None)

    def at(self, month: int, day: int, hms: tuple[int, int, int], part: float) -> float | None:
        t = self._whole(self.year, month, day, hms)
        if t is not None and self.newest is not None:
            if t < self.newest - self.ROLLOVER:
                later = self._whole(self.year + 1, month, day, hms)
                if later is not None:
                    self.year, t = self.year + 1, later
            elif t > self.newest + self.STRAGGLER:
                earlier = self._whole(self.year - 1, month, day, hms)
                if earlier is not None and earlier > self.newest - self.ROLLOVER:
                    t = earlier
        if t is None:
            return None
        t += part
        self.newest = t if self.newest is None else max(self.newest, t)
        return t

    def _whole(self, year: int, month: int, day: int, hms: tuple[int, int, int]) -> float | None:
        key = (year, month, day, *hms)
        if self._cache[0] != key:  # consecutive lines mostly share their second
            self._cache = (key, epoch(year, month, day, hms, self.zone))
        return self._cache[1]


# ---- the engines' own layouts ----

PARTS = ("year", "month", "day", "hour", "minute", "second", "fraction", "zone")


@functools.cache
def layouts() -> tuple[grammar.Layout, ...]:
    """Every grammar's time layouts, in grammar.ENGINES order (an engine's before the shared ones of `generic`)."""
    return tuple(layout for g in grammar.load_all().values() for layout in g.times)


def printed_time(head: bytes) -> re.Match[bytes] | None:
    """The time a line of an engine's own output starts with (its colour codes gone), in one of the layouts."""
    return next((found for layout in layouts() if (found := layout.pattern.match(head))), None)


def engine_own(head: bytes) -> bool:
    """Whether a line starts with a head only an engine prints (TGI's `TIME  LEVEL target: `), which a reader
    must not take for a journal's or a container runtime's prefix."""
    return any(layout.own and layout.pattern.match(head) for layout in layouts())


def time_of(found: re.Match[bytes], years: Years, tz: tzinfo | None) -> float | None:
    """Seconds since the epoch of a layout's match: without a year, in `years`' year; without a zone, in `tz`."""
    y, mo, d, hh, mm, ss, part, offset = map(found.groupdict().get, PARTS)
    if y is None:
        return years.at(int(mo or 0), int(d or 0), (int(hh or 0), int(mm or 0), int(ss or 0)), fraction(part))
    return stamp((y, mo, d, hh, mm, ss, part, offset), tz)
