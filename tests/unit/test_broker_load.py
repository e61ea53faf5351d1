"""Load accounting of the segment broker: rolling rates, the 25 % rule, the load history."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from scalable_topics.core.hashing import segment_hash
from segment_broker.load import (
    HIST_BINS,
    HistoryWriter,
    LoadRecord,
    LoadTracker,
    SegmentRates,
    ThresholdReporter,
    hist_bin,
)

T0 = datetime(2026, 11, 22, 23, 59, 45, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class CountingReporter:
    """Test double: remembers every write; optionally fails the next N writes."""

    def __init__(self, fail: int = 0) -> None:
        self.writes: list[tuple[str, str, int, SegmentRates]] = []
        self.fail = fail
        self.forgotten: list[tuple[str, str, int]] = []
        self.wrote = asyncio.Event()

    async def write(self, namespace: str, topic: str, segment_id: int, rates: SegmentRates) -> None:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("apiserver unavailable")
        self.writes.append((namespace, topic, segment_id, rates))
        self.wrote.set()

    def forget(self, namespace: str, topic: str, segment_id: int) -> None:
        self.forgotten.append((namespace, topic, segment_id))


def make_tracker(
    clock: Clock,
    reporter: CountingReporter | ThresholdReporter | None = None,
    *,
    history: HistoryWriter | None = None,
    window: float = 60.0,
    interval: float = 10.0,
) -> LoadTracker:
    return LoadTracker(
        reporter if reporter is not None else CountingReporter(),
        history,
        clock=clock,
        window=window,
        interval=interval,
        registry=CollectorRegistry(),
    )


# --- rolling window -------------------------------------------------------------------------


def test_rates_over_a_young_segment_use_its_age_not_the_window() -> None:
    clock = Clock(T0)
    tracker = make_tracker(clock)
    seg = tracker.segment("ns", "orders", 0, "0000-ffff-0", (0, 0xFFFF))
    seg.record_in(100, 10_000, None)
    seg.record_out(50, 5_000)
    [rec] = tracker.tick(T0 + 10)
    assert rec.rates == SegmentRates(10.0, 1000.0, 5.0, 500.0)
    assert rec.messages_in == 100
    seg.record_in(300, 30_000, None)
    [rec] = tracker.tick(T0 + 20)
    assert rec.rates.msg_rate_in == pytest.approx(400 / 20)
    assert rec.rates.bytes_rate_in == pytest.approx(40_000 / 20)
    assert rec.rates.msg_rate_out == pytest.approx(50 / 20)
    assert rec.messages_in == 300


def test_rates_roll_over_the_last_six_ten_second_buckets() -> None:
    clock = Clock(T0)
    tracker = make_tracker(clock)
    seg = tracker.segment("ns", "t", 3, "0000-7fff-3", (0, 0x7FFF))
    rates = []
    for i in range(1, 10):
        seg.record_in(600 * i, 1000 * i, None)
        [rec] = tracker.tick(T0 + 10 * i)
        rates.append(rec.rates.msg_rate_in)
    # After 9 buckets the window holds buckets 4..9: 600*(4+...+9) messages over 60 s.
    assert rates[-1] == pytest.approx(600 * sum(range(4, 10)) / 60)
    assert rates[5] == pytest.approx(600 * sum(range(1, 7)) / 60)
    # An idle minute decays the rate to exactly zero.
    for i in range(10, 16):
        [rec] = tracker.tick(T0 + 10 * i)
    assert rec.rates == SegmentRates()
    assert rec.messages_in == 0


def test_a_late_tick_stretches_the_window_instead_of_inflating_the_rate() -> None:
    clock = Clock(T0)
    tracker = make_tracker(clock)
    seg = tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF))
    for i in range(1, 7):
        seg.record_in(1000, 0, None)
        tracker.tick(T0 + 10 * i)
    seg.record_in(1000, 0, None)
    [rec] = tracker.tick(T0 + 60 + 30)  # event loop stalled for 20 s
    # Kept buckets: 2..7, spanning [T0+10, T0+90] with 6000 messages.
    assert rec.rates.msg_rate_in == pytest.approx(6000 / 80)


def test_a_tick_at_creation_time_reports_zero_rates() -> None:
    clock = Clock(T0)
    tracker = make_tracker(clock)
    tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF)).record_in(5, 5, None)
    [rec] = tracker.tick(T0)
    assert rec.rates == SegmentRates()
    assert rec.messages_in == 5


def test_segment_is_idempotent_and_remove_forgets_everything() -> None:
    clock = Clock(T0)
    reporter = CountingReporter()
    registry = CollectorRegistry()
    tracker = LoadTracker(reporter, None, clock=clock, registry=registry)
    a = tracker.segment("ns", "t", 1, "0000-7fff-1", (0, 0x7FFF))
    assert tracker.segment("ns", "t", 1, "0000-7fff-1", (0, 0x7FFF)) is a
    a.record_in(10, 100, None)
    tracker.export(tracker.tick(T0 + 10))
    labels = {"namespace": "ns", "topic": "t", "segment": "1"}
    assert registry.get_sample_value("segment_broker_msg_rate_in", labels) == 1.0
    assert registry.get_sample_value("segment_broker_bytes_rate_in", labels) == 10.0
    tracker.remove("ns", "t", 1)
    tracker.remove("ns", "t", 1)
    assert len(tracker) == 0
    assert tracker.tick(T0 + 20) == []
    assert registry.get_sample_value("segment_broker_msg_rate_in", labels) is None
    assert reporter.forgotten == [("ns", "t", 1)]


def test_gauges_follow_the_rates_when_only_moved_ones_are_set_again() -> None:
    """An idle segment's gauges are not set again at every step, yet every gauge holds the
    segment's current rates: up, steady, back to zero, and again after the segment was removed
    and came back (its series gone in between)."""
    clock = Clock(T0)
    registry = CollectorRegistry()
    tracker = LoadTracker(CountingReporter(), None, clock=clock, registry=registry)
    labels = {"namespace": "ns", "topic": "t", "segment": "0"}

    def rate() -> float | None:
        return registry.get_sample_value("segment_broker_msg_rate_in", labels)

    load = tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF))
    tracker.export(tracker.tick(T0 + 10))
    assert rate() == 0.0
    load.record_in(60, 600, None)
    tracker.export(tracker.tick(T0 + 20))
    assert rate() == pytest.approx(60 / 20)
    for step in range(3, 12):
        tracker.export(tracker.tick(T0 + 10 * step))
    assert rate() == 0.0, "the busy bucket left the 60 s window"
    tracker.remove("ns", "t", 0)
    assert rate() is None
    tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF))
    tracker.export(tracker.tick(T0 + 130))
    assert rate() == 0.0, "a segment that came back gets its series again"


def test_invalid_arguments_are_rejected() -> None:
    clock = Clock(T0)
    tracker = make_tracker(clock)
    with pytest.raises(ValueError):
        tracker.segment("ns", "t", 0, "x", (5, 4))
    with pytest.raises(ValueError):
        tracker.segment("ns", "t", 0, "x", (0, 0x10000))
    with pytest.raises(ValueError):
        make_tracker(clock, window=5.0, interval=10.0)
    with pytest.raises(ValueError):
        ThresholdReporter(CountingReporter(), threshold=-0.1)


def test_trackers_may_share_a_registry() -> None:
    registry = CollectorRegistry()
    LoadTracker(CountingReporter(), None, registry=registry)
    LoadTracker(CountingReporter(), None, registry=registry)


# --- histogram ------------------------------------------------------------------------------


def test_hist_bin_boundaries_follow_the_contract() -> None:
    start, end = 0x8000, 0xBFFF  # 16384 hashes: 1024 per bin
    size = end - start + 1
    for i in range(HIST_BINS):
        lo = start + i * size // HIST_BINS
        hi = start + (i + 1) * size // HIST_BINS - 1
        assert hist_bin(lo, start, end) == i
        assert hist_bin(hi, start, end) == i
    assert hist_bin(start - 1, start, end) is None
    assert hist_bin(end + 1, start, end) is None


@pytest.mark.parametrize(("start", "end"), [(0, 0xFFFF), (0x1234, 0x1234 + 99), (7, 7), (10, 20)])
def test_hist_bin_matches_the_bin_definition_for_uneven_ranges(start: int, end: int) -> None:
    size = end - start + 1
    lows = [start + i * size // HIST_BINS for i in range(HIST_BINS + 1)]
    for h in range(start, end + 1, max(1, size // 997)):
        expected = max(i for i in range(HIST_BINS) if lows[i] <= h)
        assert hist_bin(h, start, end) == expected
        assert lows[expected] <= h < lows[expected + 1]


def test_histogram_is_weighted_by_messages_and_reset_each_interval() -> None:
    clock = Clock(T0)
    tracker = make_tracker(clock)
    start, end = 0x4000, 0x7FFF
    seg = tracker.segment("ns", "t", 2, "4000-7fff-2", (start, end))
    seg.record_in(10, 1000, 0x4000)  # bin 0
    seg.record_in(3, 300, 0x7FFF)  # bin 15
    seg.record_in(2, 200, 0x4000 + 1024 * 5)  # first hash of bin 5
    seg.record_in(1, 100, 0x4000 + 1024 * 5 - 1)  # last hash of bin 4
    seg.record_in(7, 700, None)  # unkeyed: counted, not binned
    seg.record_in(4, 400, 0x8000)  # outside the range: counted, not binned
    [rec] = tracker.tick(T0 + 10)
    expected = [0] * HIST_BINS
    expected[0], expected[15], expected[5], expected[4] = 10, 3, 2, 1
    assert list(rec.key_hist) == expected
    assert rec.messages_in == 27
    [rec] = tracker.tick(T0 + 20)
    assert rec.key_hist == (0,) * HIST_BINS


def test_histogram_of_real_keys_matches_their_segment_hash() -> None:
    clock = Clock(T0)
    tracker = make_tracker(clock)
    seg = tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF))
    keys = [f"key-{i}" for i in range(2000)]
    for k in keys:
        seg.record_in(1, 10, segment_hash(k))
    [rec] = tracker.tick(T0 + 10)
    expected = [0] * HIST_BINS
    for k in keys:
        expected[segment_hash(k) // 4096] += 1
    assert list(rec.key_hist) == expected
    assert sum(rec.key_hist) == 2000


# --- the 25 % rule ----------------------------------------------------------------------------


def rates(msg_in: float, bytes_in: float = 0.0, out: float = 0.0) -> SegmentRates:
    return SegmentRates(msg_in, bytes_in, out, out * 100)


async def test_threshold_forwards_first_sample_and_moves_above_25_percent() -> None:
    inner = CountingReporter()
    rep = ThresholdReporter(inner)
    await rep.write("ns", "t", 0, rates(100.0))
    await rep.write("ns", "t", 0, rates(125.0))  # exactly 25 %: not more than 25 %
    await rep.write("ns", "t", 0, rates(75.0))  # exactly -25 %
    await rep.write("ns", "t", 0, rates(124.0))
    assert [w[3].msg_rate_in for w in inner.writes] == [100.0]
    await rep.write("ns", "t", 0, rates(125.5))
    assert [w[3].msg_rate_in for w in inner.writes] == [100.0, 125.5]
    # The reference is the last write (125.5), not the last sample: 100 is -20 % of it.
    await rep.write("ns", "t", 0, rates(100.0))
    await rep.write("ns", "t", 0, rates(94.0))
    assert [w[3].msg_rate_in for w in inner.writes] == [100.0, 125.5, 94.0]


async def test_threshold_watches_every_rate_and_every_segment_separately() -> None:
    inner = CountingReporter()
    rep = ThresholdReporter(inner)
    await rep.write("ns", "t", 0, rates(100.0, 1000.0, 10.0))
    await rep.write("ns", "t", 1, rates(100.0, 1000.0, 10.0))
    await rep.write("ns", "t", 0, rates(100.0, 1300.0, 10.0))  # bytes in +30 %
    await rep.write("ns", "t", 1, rates(100.0, 1000.0, 13.0))  # out rates +30 %
    await rep.write("ns", "u", 0, rates(100.0, 1000.0, 10.0))  # another topic: first sample
    assert [(w[1], w[2]) for w in inner.writes] == [
        ("t", 0),
        ("t", 1),
        ("t", 0),
        ("t", 1),
        ("u", 0),
    ]


async def test_threshold_zero_rules() -> None:
    inner = CountingReporter()
    rep = ThresholdReporter(inner)
    await rep.write("ns", "t", 0, SegmentRates())
    await rep.write("ns", "t", 0, SegmentRates())  # zero -> zero: never
    assert len(inner.writes) == 1
    await rep.write("ns", "t", 0, SegmentRates(0.0167, 1.0, 0.0, 0.0))  # zero -> any positive
    assert len(inner.writes) == 2
    await rep.write("ns", "t", 0, SegmentRates(0.0167, 1.0, 0.0, 0.0))
    assert len(inner.writes) == 2
    await rep.write("ns", "t", 0, SegmentRates())  # non-zero -> zero
    assert len(inner.writes) == 3


async def test_threshold_retries_after_a_failed_write_and_forgets_removed_segments() -> None:
    inner = CountingReporter(fail=1)
    rep = ThresholdReporter(inner)
    with pytest.raises(RuntimeError):
        await rep.write("ns", "t", 0, rates(100.0))
    await rep.write("ns", "t", 0, rates(100.0))
    assert len(inner.writes) == 1
    rep.forget("ns", "t", 0)
    assert inner.forgotten == [("ns", "t", 0)]
    await rep.write("ns", "t", 0, rates(100.0))  # treated as a first sample again
    assert len(inner.writes) == 2


class BacklogRecorder(CountingReporter):
    """A reporter of rates and backlogs (as the Kubernetes one is): remembers each backlog."""

    def __init__(self) -> None:
        super().__init__()
        self.backlogs: list[dict[str, int]] = []

    async def write_backlog(
        self, namespace: str, topic: str, segment_id: int, backlog: Mapping[str, int]
    ) -> None:
        self.backlogs.append(dict(backlog))


async def test_backlog_is_reported_by_the_25_percent_rule_and_steady_writes_nothing() -> None:
    clock = Clock(T0)
    inner = BacklogRecorder()
    tracker = make_tracker(clock, ThresholdReporter(inner))
    backlog = {"billing": 4}
    tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF)).backlog_source = lambda: backlog

    async def step(**counts: int) -> None:
        backlog.clear()
        backlog.update(counts)
        clock.t += 10
        await tracker.step()

    await step(billing=4)  # the first sample
    await step(billing=4)  # steady: nothing
    await step(billing=5)  # +25 %: not more than 25 %
    await step(billing=6)  # +50 %
    await step(billing=6, audit=0)  # a subscription appeared
    await step(billing=6, audit=0)
    await step(billing=0, audit=0)  # consumed: n -> 0 always counts
    await step(billing=0, audit=0)  # 0 -> 0 never does
    await step(audit=0)  # a subscription went
    assert inner.backlogs == [
        {"billing": 4},
        {"billing": 6},
        {"billing": 6, "audit": 0},
        {"billing": 0, "audit": 0},
        {"audit": 0},
    ]


class StatusRecorder(CountingReporter):
    """A reporter that takes rates and backlog in one call, as the Kubernetes one does."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[tuple[SegmentRates | None, dict[str, int] | None]] = []

    async def write_status(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        rates: SegmentRates | None,
        backlog: Mapping[str, int] | None,
    ) -> None:
        self.statuses.append((rates, None if backlog is None else dict(backlog)))


async def test_rates_and_backlog_that_moved_together_are_one_write() -> None:
    clock = Clock(T0)
    inner = StatusRecorder()
    tracker = make_tracker(clock, ThresholdReporter(inner))
    backlog = {"billing": 4}
    seg = tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF))
    seg.backlog_source = lambda: backlog

    clock.t += 10
    await tracker.step()  # a new segment: its rates and backlog in one write
    [(first_rates, first_backlog)] = inner.statuses
    assert first_rates is not None and first_backlog == {"billing": 4}
    clock.t += 10
    await tracker.step()  # steady: nothing
    assert len(inner.statuses) == 1
    backlog["billing"] = 9
    clock.t += 10
    await tracker.step()  # the backlog alone moved: load (and its updatedAt) stay as they are
    assert inner.statuses[1] == (None, {"billing": 9})
    seg.record_in(1000, 100_000, 0x10)
    clock.t += 10
    await tracker.step()  # the rates alone moved
    rates_only, no_backlog = inner.statuses[2]
    assert rates_only is not None and rates_only.msg_rate_in > 0 and no_backlog is None
    assert inner.writes == [], "the separate write is not used"


async def test_a_segment_whose_zero_load_the_operator_recorded_is_written_only_when_it_moves() -> (
    None
):
    """A new segment the operator placed with a zero ``load`` (``zeroLoadRecorded``): the
    broker's first samples write nothing while idle, the first traffic and the first backlog
    do. A tracker restarted (a new reporter) writes its first sample as ever: the Segment may
    hold any load from before."""
    clock = Clock(T0)
    inner = StatusRecorder()
    registry = CollectorRegistry()
    tracker = LoadTracker(ThresholdReporter(inner), None, clock=clock, registry=registry)
    backlog = {"billing": 0}
    seg = tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF))
    seg.backlog_source = lambda: backlog
    tracker.zero_recorded("ns", "t", 0, ["billing"])

    for _ in range(3):
        clock.t += 10
        await tracker.step()
    assert inner.statuses == []
    # the pass counter the integration tests wait on
    assert registry.get_sample_value("segment_broker_load_samples_total") == 3
    seg.record_in(100, 10_000, 0x10)
    backlog["billing"] = 100
    clock.t += 10
    await tracker.step()
    [(rates, moved_backlog)] = inner.statuses
    assert rates is not None and rates.msg_rate_in > 0 and moved_backlog == {"billing": 100}

    restarted = StatusRecorder()
    again = make_tracker(clock, ThresholdReporter(restarted))
    again.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF)).backlog_source = lambda: {}
    clock.t += 10
    await again.step()
    [(first, _)] = restarted.statuses
    assert first == SegmentRates()


async def test_a_reporter_without_backlogs_gets_rates_only() -> None:
    clock = Clock(T0)
    inner = CountingReporter()
    rep = ThresholdReporter(inner)
    tracker = make_tracker(clock, rep)
    tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF)).backlog_source = lambda: {"s": 3}
    clock.t += 10
    records = await tracker.step()
    assert records[0].backlog == {"s": 3}
    assert len(inner.writes) == 1
    assert "backlog" not in records[0].to_json()  # the history's schema is unchanged


# --- history ----------------------------------------------------------------------------------


def jsonl_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.jsonl"))


def read_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_step_writes_history_by_utc_hour_and_reports_through_threshold(
    tmp_path: Path,
) -> None:
    clock = Clock(T0)  # 23:59:45 UTC: the second tick crosses midnight
    inner = CountingReporter()
    history = HistoryWriter(tmp_path, broker_id="segment-broker-1")
    tracker = make_tracker(clock, ThresholdReporter(inner), history=history)
    a = tracker.segment("prod", "orders", 4, "0000-7fff-4", (0, 0x7FFF))
    b = tracker.segment("prod", "orders", 5, "8000-ffff-5", (0x8000, 0xFFFF))
    a.record_in(100, 102_400, 0x0800)
    b.record_in(10, 1000, 0xF000)
    b.record_out(10, 1000)
    clock.t = T0 + 10
    await tracker.step()
    a.record_in(100, 102_400, 0x0800)
    clock.t = T0 + 20
    await tracker.step()

    first = tmp_path / "dt=2026-11-22" / "hour=23" / "segment-broker-1.jsonl"
    second = tmp_path / "dt=2026-11-23" / "hour=00" / "segment-broker-1.jsonl"
    assert jsonl_files(tmp_path) == [first, second]
    lines = read_lines(first)
    assert lines[0] == {
        "ts": T0 + 10,
        "namespace": "prod",
        "topic": "orders",
        "segmentId": 4,
        "descriptor": "0000-7fff-4",
        "rangeStart": 0,
        "rangeEnd": 0x7FFF,
        "msgRateIn": 10.0,
        "bytesRateIn": 10240.0,
        "msgRateOut": 0.0,
        "bytesRateOut": 0.0,
        "messagesIn": 100,
        "keyHist": [0, 100] + [0] * 14,
    }
    assert lines[1]["segmentId"] == 5
    assert lines[1]["keyHist"] == [0] * 14 + [10, 0]
    assert lines[1]["msgRateOut"] == 1.0
    later = read_lines(second)
    assert [(r["segmentId"], r["messagesIn"]) for r in later] == [(4, 100), (5, 0)]
    assert later[0]["msgRateIn"] == pytest.approx(10.0)  # 200 over 20 s: unchanged
    assert later[1]["msgRateIn"] == pytest.approx(0.5)  # 10 over 20 s: -50 %
    # Segment 4 stayed at 10 msg/s: no second write; segment 5 halved: written again.
    assert [(w[2], w[3].msg_rate_in) for w in inner.writes] == [(4, 10.0), (5, 1.0), (5, 0.5)]


async def test_history_appends_to_existing_file(tmp_path: Path) -> None:
    history = HistoryWriter(tmp_path, broker_id="b0")
    rec = LoadRecord(T0, "ns", "t", 0, "0000-ffff-0", 0, 0xFFFF, SegmentRates(), 0, (0,) * 16)
    history.write([rec])
    history.write([rec, rec])
    assert len(read_lines(history.path_for(T0))) == 3


def test_history_broker_id_defaults_to_pod_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "segment-broker-2")
    assert HistoryWriter(tmp_path).path_for(T0).name == "segment-broker-2.jsonl"
    with pytest.raises(ValueError):
        HistoryWriter(tmp_path, broker_id="a/b")


async def test_reporter_failure_does_not_stop_history_or_other_segments(tmp_path: Path) -> None:
    clock = Clock(T0)
    inner = CountingReporter(fail=1)
    history = HistoryWriter(tmp_path, broker_id="b0")
    tracker = make_tracker(clock, inner, history=history)
    tracker.segment("ns", "t", 0, "0000-7fff-0", (0, 0x7FFF))
    tracker.segment("ns", "t", 1, "8000-ffff-1", (0x8000, 0xFFFF))
    clock.t = T0 + 10
    await tracker.step()
    assert [w[2] for w in inner.writes] == [1]
    assert len(read_lines(history.path_for(T0 + 10))) == 2


async def test_run_samples_until_stopped(tmp_path: Path) -> None:
    inner = CountingReporter()
    tracker = LoadTracker(inner, None, window=0.06, interval=0.01, registry=CollectorRegistry())
    tracker.segment("ns", "t", 0, "0000-ffff-0", (0, 0xFFFF))
    stop = asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    async with asyncio.timeout(30):
        while len(inner.writes) < 3:
            inner.wrote.clear()
            await inner.wrote.wait()
    stop.set()
    await asyncio.wait_for(task, timeout=30)
    assert len(inner.writes) >= 3


async def test_a_segment_removed_during_publish_is_not_reported_again() -> None:
    clock = Clock(T0)
    inner = CountingReporter()
    tracker = make_tracker(clock, ThresholdReporter(inner))
    tracker.segment("ns", "t", 0, "0000-7fff-0", (0, 0x7FFF))
    tracker.segment("ns", "t", 1, "8000-ffff-1", (0x8000, 0xFFFF))
    records = tracker.tick(T0 + 10)
    tracker.remove("ns", "t", 1)
    await tracker.publish(records)
    assert [w[2] for w in inner.writes] == [0]
    assert inner.forgotten == [("ns", "t", 1)]


# --- idle segments cost little, and report what a full computation gives ----------------------

_STEPS = st.lists(
    st.tuples(
        st.integers(0, 3),  # entries written in the interval
        st.integers(0, 2),  # dispatches in the interval
        st.floats(0.0, 25.0),  # seconds until the tick
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_STEPS)
def test_rates_of_quiet_and_busy_intervals_match_a_full_computation(
    steps: list[tuple[int, int, float]],
) -> None:
    """Whatever mix of quiet and busy intervals: the rates and histogram of each tick are the
    sums over the retained buckets divided by their span, as if nothing were skipped."""
    clock = Clock(T0)
    tracker = make_tracker(clock)
    seg = tracker.segment("ns", "t", 0, "d", (0, 0xFFFF))
    buckets: list[tuple[float, float, int, int, int, int]] = []
    opened = T0
    for written, dispatched, seconds in steps:
        for i in range(written):
            seg.record_in(2, 100, i * 4096)
        for _ in range(dispatched):
            seg.record_out(1, 30)
        clock.t += seconds
        rates, messages_in, hist = seg.close_bucket(clock.t)
        buckets = [
            *buckets,
            (opened, clock.t, 2 * written, 100 * written, dispatched, 30 * dispatched),
        ][-6:]
        opened = clock.t
        span = clock.t - buckets[0][0]
        sums = [sum(b[k] for b in buckets) for k in range(2, 6)]
        expected = SegmentRates(*(s / span for s in sums)) if span > 0 else SegmentRates()
        assert rates == pytest.approx(expected)
        assert messages_in == 2 * written
        assert list(hist) == [2 if b * 4096 < written * 4096 else 0 for b in range(HIST_BINS)]


_NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=63)
_RATE = st.floats(0.0, 1e9, allow_nan=False) | st.just(0.0)


@settings(max_examples=300, deadline=None)
@given(
    ts=st.floats(0.0, 4e9, allow_nan=False) | st.integers(0, 4_000_000_000),
    namespace=_NAME,
    topic=_NAME,
    segment_id=st.integers(0, 2**40),
    descriptor=st.text(min_size=1, max_size=30),
    start=st.integers(0, 0xFFFF),
    rates=st.tuples(_RATE, _RATE, _RATE, _RATE) | st.just((0.0, 0.0, 0.0, 0.0)),
    messages_in=st.integers(0, 10**9) | st.just(0),
    hist=st.lists(st.integers(0, 10**6), min_size=HIST_BINS, max_size=HIST_BINS)
    | st.just([0] * HIST_BINS),
)
def test_the_history_line_is_the_record_in_compact_json(
    ts: float,
    namespace: str,
    topic: str,
    segment_id: int,
    descriptor: str,
    start: int,
    rates: tuple[float, float, float, float],
    messages_in: int,
    hist: list[int],
) -> None:
    record = LoadRecord(
        ts,
        namespace,
        topic,
        segment_id,
        descriptor,
        start,
        0xFFFF,
        SegmentRates(*rates),
        messages_in,
        tuple(hist),
    )
    assert record.to_line() == json.dumps(record.to_json(), separators=(",", ":")) + "\n"
