"""Five-field cron schedules as Kubernetes CronJobs use them (``robfig/cron`` standard parser).

Fields: minute, hour, day of month, month, day of week. Each is ``*``, ``?``, a value, a range
``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n`` (``a`` to the field's maximum), or a comma list of
those; months and weekdays also accept three-letter names, and weekday 7 is Sunday. The macros
``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/``@midnight`` and ``@hourly`` are
accepted. When both day of month and day of week are restricted, a day matches if either does
(classic cron). A ``CRON_TZ=<zone>`` or ``TZ=<zone>`` prefix sets the time zone, as does
``spec.timeZone``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class CronError(ValueError):
    """The schedule is not a valid five-field cron expression."""


def _value(token: str, lo: int, hi: int, names: dict[str, int] | None) -> int:
    if names is not None and token.lower() in names:
        return names[token.lower()]
    try:
        value = int(token)
    except ValueError as exc:
        raise CronError(f"bad value {token!r}") from exc
    if not lo <= value <= hi:
        raise CronError(f"value {value} out of range {lo}-{hi}")
    return value


def _field(text: str, lo: int, hi: int, names: dict[str, int] | None = None) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"empty list item in {text!r}")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            try:
                step = int(step_text)
            except ValueError as exc:
                raise CronError(f"bad step {step_text!r}") from exc
            if step <= 0:
                raise CronError(f"step must be positive in {part!r}")
        if base in ("*", "?"):
            start, end = lo, hi
        elif "-" in base:
            a, b = base.split("-", 1)
            start, end = _value(a, lo, hi, names), _value(b, lo, hi, names)
            if start > end:
                raise CronError(f"range {base!r} is backwards")
        else:
            start = _value(base, lo, hi, names)
            end = hi if slash else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronSchedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    dom_star: bool
    dow_star: bool
    tz: tzinfo

    @classmethod
    def parse(cls, expression: str, time_zone: str | None = None) -> CronSchedule:
        text = expression.strip()
        zone_name = time_zone
        if text.startswith(("CRON_TZ=", "TZ=")):
            prefix, _, text = text.partition(" ")
            zone_name = prefix.split("=", 1)[1]
            text = text.strip()
        tz: tzinfo = UTC
        if zone_name:
            try:
                tz = ZoneInfo(zone_name)
            except (ZoneInfoNotFoundError, ValueError) as exc:
                raise CronError(f"unknown time zone {zone_name!r}") from exc
        text = _MACROS.get(text.lower(), text)
        fields = text.split()
        if len(fields) != 5:
            raise CronError(f"expected 5 fields, got {len(fields)} in {expression!r}")
        minute, hour, dom, month, dow = fields
        weekdays = _field(dow, 0, 7, _DAYS)
        if 7 in weekdays:
            weekdays = (weekdays - {7}) | {0}
        return cls(
            minutes=_field(minute, 0, 59),
            hours=_field(hour, 0, 23),
            days=_field(dom, 1, 31),
            months=_field(month, 1, 12, _MONTHS),
            weekdays=weekdays,
            dom_star=dom.startswith(("*", "?")),
            dow_star=dow.startswith(("*", "?")),
            tz=tz,
        )

    def _day_matches(self, moment: datetime) -> bool:
        dom_ok = moment.day in self.days
        dow_ok = (moment.isoweekday() % 7) in self.weekdays
        if self.dom_star or self.dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def matches(self, moment: datetime) -> bool:
        local = moment.astimezone(self.tz)
        return (
            local.minute in self.minutes
            and local.hour in self.hours
            and local.month in self.months
            and self._day_matches(local)
        )

    def next_after(self, moment: datetime) -> datetime:
        """The first scheduled minute strictly after ``moment`` (an aware datetime)."""
        local = moment.astimezone(self.tz).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = local + timedelta(days=366 * 5)
        while local < limit:
            if local.month not in self.months:
                year, month = (
                    (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
                )
                local = local.replace(year=year, month=month, day=1, hour=0, minute=0)
                continue
            if not self._day_matches(local):
                local = (local + timedelta(days=1)).replace(hour=0, minute=0)
                continue
            if local.hour not in self.hours:
                local = (local + timedelta(hours=1)).replace(minute=0)
                continue
            if local.minute not in self.minutes:
                local += timedelta(minutes=1)
                continue
            return local.astimezone(UTC)
        raise CronError("schedule never fires")

    def last_between(self, after: datetime, until: datetime) -> tuple[datetime | None, int]:
        """The latest scheduled time in ``(after, until]`` and how many fell in that window.

        The count stops at 100 like the CronJob controller's "too many missed start times".
        """
        latest: datetime | None = None
        count = 0
        current = after
        while count < 100:
            nxt = self.next_after(current)
            if nxt > until:
                break
            latest, current = nxt, nxt
            count += 1
        if count < 100:
            return latest, count
        # Too many to walk one by one: search ever larger windows that end at `until`.
        for window in (
            timedelta(hours=1),
            timedelta(days=1),
            timedelta(days=32),
            timedelta(days=367),
        ):
            candidate: datetime | None = None
            cursor = max(current, until - window)
            while (nxt := self.next_after(cursor)) <= until:
                candidate = cursor = nxt
            if candidate is not None:
                return candidate, count
        return latest, count
