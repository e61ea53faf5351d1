"""Five-field cron matching used by the local CronJob controller."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scalable_topics.localcluster.cron import CronError, CronSchedule


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_every_n_minutes() -> None:
    s = CronSchedule.parse("*/15 * * * *")
    assert s.minutes == frozenset({0, 15, 30, 45})
    assert s.next_after(at("2026-11-22 04:14:59")) == at("2026-11-22 04:15:00")
    assert s.next_after(at("2026-11-22 04:15:00")) == at("2026-11-22 04:30:00")
    assert s.next_after(at("2026-11-22 23:50:00")) == at("2026-11-23 00:00:00")


def test_lists_ranges_steps_and_names() -> None:
    s = CronSchedule.parse("5,10-12,50-59/4 9-17/2 * jan-mar,DEC mon-fri")
    assert s.minutes == frozenset({5, 10, 11, 12, 50, 54, 58})
    assert s.hours == frozenset({9, 11, 13, 15, 17})
    assert s.months == frozenset({1, 2, 3, 12})
    assert s.weekdays == frozenset({1, 2, 3, 4, 5})
    assert CronSchedule.parse("0 0 * * 7").weekdays == frozenset({0})
    assert CronSchedule.parse("30/10 * * * *").minutes == frozenset({30, 40, 50})


def test_matches() -> None:
    s = CronSchedule.parse("30 2 * * 0")
    assert s.matches(at("2026-11-22 02:30:00"))  # a Sunday
    assert not s.matches(at("2026-11-23 02:30:00"))
    assert not s.matches(at("2026-11-22 02:31:00"))


def test_day_of_month_or_day_of_week_when_both_restricted() -> None:
    s = CronSchedule.parse("0 0 13 * 5")  # the 13th, or any Friday
    assert s.matches(at("2026-11-13 00:00:00"))  # Friday the 13th
    assert s.matches(at("2026-11-20 00:00:00"))  # a Friday
    assert s.matches(at("2026-12-13 00:00:00"))  # a Sunday the 13th
    assert not s.matches(at("2026-11-21 00:00:00"))
    only_dow = CronSchedule.parse("0 0 * * 5")
    assert not only_dow.matches(at("2026-12-13 00:00:00"))


def test_macros_and_month_rollover() -> None:
    assert CronSchedule.parse("@hourly").next_after(at("2026-11-22 04:20:00")) == at(
        "2026-11-22 05:00:00"
    )
    yearly = CronSchedule.parse("@yearly")
    assert yearly.next_after(at("2026-11-22 04:20:00")) == at("2027-01-01 00:00:00")
    leap = CronSchedule.parse("0 12 29 2 *")
    assert leap.next_after(at("2026-03-01 00:00:00")) == at("2028-02-29 12:00:00")


def test_time_zone_prefix() -> None:
    s = CronSchedule.parse("CRON_TZ=Europe/Berlin 0 9 * * *")
    assert s.next_after(at("2026-11-22 00:00:00")) == at("2026-11-22 08:00:00")
    same = CronSchedule.parse("0 9 * * *", "Europe/Berlin")
    assert same.next_after(at("2026-07-01 00:00:00")) == at("2026-07-01 07:00:00")


def test_last_between_picks_the_most_recent_missed_time() -> None:
    s = CronSchedule.parse("*/1 * * * *")
    latest, count = s.last_between(at("2026-11-22 04:00:00"), at("2026-11-22 04:05:30"))
    assert (latest, count) == (at("2026-11-22 04:05:00"), 5)
    assert s.last_between(at("2026-11-22 04:05:00"), at("2026-11-22 04:05:59")) == (None, 0)
    latest, count = s.last_between(at("2026-11-01 00:00:00"), at("2026-11-22 04:05:30"))
    assert latest == at("2026-11-22 04:05:00") and count == 100


@pytest.mark.parametrize(
    "bad",
    [
        "* * * *",
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "*/0 * * * *",
        "5-1 * * * *",
        "a * * * *",
        "1,,2 * * * *",
    ],
)
def test_invalid_expressions(bad: str) -> None:
    with pytest.raises(CronError):
        CronSchedule.parse(bad)


def test_unknown_zone() -> None:
    with pytest.raises(CronError):
        CronSchedule.parse("* * * * *", "Mars/Olympus")


def test_next_after_is_consistent_with_matches() -> None:
    s = CronSchedule.parse("7,37 */3 1-10 * mon")
    moment = at("2026-01-01 00:00:00")
    for _ in range(20):
        nxt = s.next_after(moment)
        assert s.matches(nxt) and nxt > moment
        probe = moment + timedelta(minutes=1)
        while probe < nxt:
            assert not s.matches(probe.replace(second=0))
            probe += (
                timedelta(minutes=1) if (nxt - probe) < timedelta(hours=3) else timedelta(hours=1)
            )
        moment = nxt
