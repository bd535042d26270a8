"""Time expressions in a search query, turned into a window of time.

"What did Maria donate in December 2023?", "the week before August 3, 2023",
"what did I say yesterday": the words name a time, not a topic. Conversation
search turns them into a window (memory/search/conversation.py boosts the
messages said in it, never filters: a date in a question is a hint, and the
thing asked about may have been mentioned a little later) and leaves them out
of the keyword query ("may", "2023" and "last" match nothing useful).

Understood, case-insensitively: a day ("3 June, 2023", "June 3rd 2023",
"2023-06-03"), a month ("May 2023", "in May": May of any year), a season
("summer 2021"), a year ("in 2023"), the span before or after one of those
("the week before August 3, 2023", "two weeks before ...", "after May 2023"),
and times relative to now ("yesterday", "today", "last week", "last weekend",
"this month", "last summer", "3 days ago"). Anything else is left to the
meaning and keyword parts of the ranking.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

MONTHS = {
    name: n
    for n, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
# Season -> (first month, months long); winter starts in December of the year named.
SEASONS = {"spring": (3, 3), "summer": (6, 3), "autumn": (9, 3), "fall": (9, 3), "winter": (12, 3)}
NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "few": 3, "couple": 2}
UNITS = {"day": 1, "night": 1, "weekend": 3, "week": 7, "fortnight": 14, "month": 31, "year": 366}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

_MONTH = r"(?P<month>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_SEASON = r"(?P<season>" + "|".join(SEASONS) + r")"
_COUNT = r"(?P<count>\d+|" + "|".join(NUMBERS) + r")"
_UNIT = r"(?P<unit>" + "|".join(UNITS) + r")s?"

# Absolute anchors, most specific first; "may" alone is a month only after a
# preposition ("in May"), never the verb ("may I ask").
_ANCHORS = [
    ("day", r"\b(?P<year>(?:19|20)\d\d)-(?P<mnum>[01]\d)-(?P<day>[0-3]\d)\b"),
    ("day", rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b"),
    ("day", rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b"),
    ("month", rf"\b{_MONTH},?\s+{_YEAR}\b"),
    ("season", rf"\b{_SEASON}\s+(?:of\s+)?{_YEAR}\b"),
    ("dayany", rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\b"),
    ("dayany", rf"\b{_MONTH}\s+{_DAY}\b(?!\s*(?:,\s*)?(?:19|20)\d\d)"),
    ("monthany", rf"\b(?:in|during|since|until|of|early|late|mid|mid-|last|this|next)\s+{_MONTH}\b"),
    ("year", rf"\b(?:in|during|since|of|until|by)\s+{_YEAR}\b"),
]
_BEFORE = re.compile(
    rf"\b(?:(?:the|a|last)\s+)?(?:(?P<weekday>{'|'.join(WEEKDAYS)})|(?:{_COUNT}\s+)?{_UNIT})\s+(?P<dir>before|after)\s*$"
)
_BARE_DIRECTION = re.compile(r"\b(?P<dir>before|after|by|since|until)\s*$")
_RELATIVE: list[tuple[re.Pattern[str], Callable[[datetime], tuple[datetime, datetime]]]] = [
    (re.compile(r"\byesterday\b"), lambda now: (now - timedelta(days=1), now)),
    (re.compile(r"\b(?:today|tonight|this morning|this evening)\b"), lambda now: (now, now + timedelta(days=1))),
    (re.compile(r"\blast night\b"), lambda now: (now - timedelta(days=1), now + timedelta(days=1))),
    (re.compile(r"\bthis week\b"), lambda now: (now - timedelta(days=now.weekday()), now + timedelta(days=1))),
    (re.compile(r"\blast weekend\b"), lambda now: _last_weekend(now)),
    (re.compile(r"\b(?:last|past|previous) week\b"), lambda now: (now - timedelta(days=7 + now.weekday()), now)),
    (re.compile(r"\bthis month\b"), lambda now: (now.replace(day=1), now + timedelta(days=1))),
    (re.compile(r"\b(?:last|past|previous) month\b"), lambda now: (_month_start(now, -1), now)),
    (re.compile(r"\bthis year\b"), lambda now: (now.replace(month=1, day=1), now + timedelta(days=1))),
    (re.compile(r"\b(?:last|past|previous) year\b"), lambda now: (now.replace(year=now.year - 1, month=1, day=1), now)),
]
_AGO = re.compile(rf"\b{_COUNT}\s+{_UNIT}\s+ago\b")
_LAST_SEASON = re.compile(rf"\b(?:last|this)\s+{_SEASON}\b")


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """[start, end) in UTC; `any_year` windows repeat every year (a month or a
    day named without its year). `span` is what the phrase named (the grace
    for things mentioned after they happened scales with it)."""

    start: datetime
    end: datetime
    any_year: bool = False

    def contains(self, moment: datetime, grace: timedelta = timedelta(0)) -> bool:
        """Whether `moment` falls in the window, or up to `grace` after its end."""
        if not self.any_year:
            return self.start <= moment < self.end + grace
        # The window moved into the moment's year (and the year before, for
        # windows that cross New Year or whose grace does).
        for year in (moment.year, moment.year - 1):
            shift = year_shift(self.start, year)
            if shift is not None and self.start + shift <= moment < self.end + shift + grace:
                return True
        return False


def year_shift(start: datetime, year: int) -> timedelta | None:
    try:
        return start.replace(year=year) - start
    except ValueError:  # 29 February
        return None


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _month_start(moment: datetime, delta: int) -> datetime:
    index = moment.year * 12 + moment.month - 1 + delta
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def _last_weekend(now: datetime) -> tuple[datetime, datetime]:
    today = _midnight(now.date())
    saturday = today - timedelta(days=(today.weekday() - 5) % 7 or 7)
    return saturday - timedelta(days=1), saturday + timedelta(days=2)


def _count(text: str | None) -> int:
    if not text:
        return 1
    return int(text) if text.isdigit() else NUMBERS.get(text, 1)


def _anchor(kind: str, found: re.Match[str]) -> TimeWindow | None:
    groups = found.groupdict()
    try:
        if kind in ("day", "dayany"):
            month = MONTHS[groups["month"]] if groups.get("month") else int(groups["mnum"])
            year = int(groups["year"]) if kind == "day" else 2000  # a leap year, for 29 February
            start = _midnight(date(year, month, int(groups["day"])))
            return TimeWindow(start, start + timedelta(days=1), any_year=kind == "dayany")
        if kind in ("month", "monthany"):
            year = int(groups["year"]) if kind == "month" else 2000
            start = datetime(year, MONTHS[groups["month"]], 1, tzinfo=UTC)
            return TimeWindow(start, _month_start(start, 1), any_year=kind == "monthany")
        if kind == "season":
            first, months = SEASONS[groups["season"]]
            start = datetime(int(groups["year"]), first, 1, tzinfo=UTC)
            return TimeWindow(start, _month_start(start, months))
        if kind == "year":
            year = int(groups["year"])
            return TimeWindow(datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC))
    except ValueError:  # "31 February"
        return None
    return None


def _around(window: TimeWindow, prefix: str) -> tuple[TimeWindow, int]:
    """The window moved by what precedes the anchor ("the week before", "after"),
    and where that phrase starts in `prefix` (len(prefix) if nothing)."""
    found = _BEFORE.search(prefix)
    if found is not None:
        days = 7 if found.group("weekday") else UNITS[found.group("unit")] * _count(found.group("count"))
        span = timedelta(days=days)
        if found.group("dir") == "before":
            return TimeWindow(window.start - span, window.start + timedelta(days=1), window.any_year), found.start()
        return TimeWindow(window.end - timedelta(days=1), window.end + span, window.any_year), found.start()
    bare = _BARE_DIRECTION.search(prefix)
    if bare is not None:
        # "before May 2023": a month back; "after"/"since": a month on.
        month = timedelta(days=31)
        if bare.group("dir") in ("before", "by", "until"):
            return TimeWindow(window.start - month, window.end, window.any_year), bare.start()
        return TimeWindow(window.start, window.end + month, window.any_year), bare.start()
    return window, len(prefix)


@dataclass(frozen=True, slots=True)
class TimedQuery:
    """A query split into its time window (None: it names no time) and the rest of its words."""

    window: TimeWindow | None
    text: str


def parse(query: str, now: datetime) -> TimedQuery:
    """The first time expression of `query` as a window, anchored at `now`
    for relative ones, and the query without it."""
    lowered = query.lower()
    for kind, pattern in _ANCHORS:
        found = re.search(pattern, lowered)
        if found is None:
            continue
        window = _anchor(kind, found)
        if window is None:
            continue
        window, start = _around(window, lowered[: found.start()])
        return TimedQuery(window, _cut(query, start, found.end()))
    moment = now.astimezone(UTC)
    for relative, make in _RELATIVE:
        found = relative.search(lowered)
        if found is not None:
            start_at, end_at = make(moment)
            return TimedQuery(TimeWindow(start_at, end_at), _cut(query, found.start(), found.end()))
    found = _AGO.search(lowered)
    if found is not None:
        span = timedelta(days=UNITS[found.group("unit")] * _count(found.group("count")))
        # "3 weeks ago": around that day, half a unit either side.
        half = timedelta(days=max(1, UNITS[found.group("unit")] // 2))
        return TimedQuery(TimeWindow(moment - span - half, moment - span + half), _cut(query, *found.span()))
    found = _LAST_SEASON.search(lowered)
    if found is not None:
        first, months = SEASONS[found.group("season")]
        year = moment.year if (moment.month, moment.day) >= (first, 1) else moment.year - 1
        if (
            found.group(0).startswith("last")
            and year == moment.year
            and moment < _month_start(datetime(year, first, 1, tzinfo=UTC), months)
        ):
            year -= 1  # still in that season: "last summer" is the one before
        season = datetime(year, first, 1, tzinfo=UTC)
        return TimedQuery(TimeWindow(season, _month_start(season, months)), _cut(query, *found.span()))
    return TimedQuery(None, query)


def _cut(text: str, start: int, end: int) -> str:
    return " ".join((text[:start] + " " + text[end:]).split())
