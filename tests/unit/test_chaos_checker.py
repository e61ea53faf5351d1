"""The chaos checker on hand-made histories: each anomaly class is shown to be detected, and the
allowed ones (duplicates after a restart, recovered unknown sends, hand-offs) to be allowed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from scalable_topics.client import Message, MessageId
from scalable_topics.core.buckets import bucket_of
from scalable_topics.core.hashing import bucket_hash
from tests.chaos.checker import (
    CHECKPOINT_RESTORE,
    CheckpointStart,
    Delivery,
    History,
    Outcome,
    Restart,
    RestartKind,
    Send,
    check,
    handoff_windows,
    segment_gap,
    summarize,
)
from tests.chaos.workload import Recorder, decode_value, encode_value

STREAM, QUEUE = "stream", "queue"


def ok(key: str, value: int, segment: int = 0, position: int | None = None) -> Send:
    return Send(key, value, float(value), Outcome.OK, float(value) + 0.5, segment, position)


def read(
    value: int,
    time: float,
    *,
    key: str = "k",
    consumer: str = "c1",
    session: int = 1,
    sub: str = STREAM,
    segment: int | None = 0,
    position: int | None = None,
) -> Delivery:
    return Delivery(sub, consumer, session, key, value, time, segment, position)


def history(sends: list[Send], deliveries: list[Delivery], **kw: list[Restart]) -> History:
    return History({STREAM: True, QUEUE: False}, sends, deliveries, kw.get("restarts", []))


def both(values: list[int], key: str = "k") -> list[Delivery]:
    """Every value read once, in order, on both subscriptions."""
    out = [read(v, 10.0 + v, key=key) for v in values]
    out += [read(v, 10.0 + v, key=key, sub=QUEUE, consumer="q1") for v in values]
    return out


def test_clean_history_is_valid() -> None:
    sends = [ok("k", v) for v in range(5)] + [ok("j", v, segment=1) for v in range(3)]
    report = check(history(sends, both([0, 1, 2, 3, 4]) + both([0, 1, 2], key="j")))
    assert report.valid, report.summary()
    assert report.sends == {"ok": 8, "fail": 0, "info": 0}
    assert report.subscriptions[STREAM].distinct == 8
    assert report.subscriptions[QUEUE].deliveries == 8
    assert (report.lost, report.reordered, report.skips, report.unexpected) == (0, 0, 0, 0)


def test_lost_is_per_subscription() -> None:
    sends = [ok("k", v) for v in range(3)]
    deliveries = both([0, 1, 2])
    deliveries = [d for d in deliveries if not (d.subscription == QUEUE and d.value == 2)]
    report = check(history(sends, deliveries))
    assert report.lost == 1
    assert report.subscriptions[QUEUE].lost == 1
    assert report.subscriptions[STREAM].lost == 0
    assert not report.valid
    assert "lost k=2" in report.summary()


def test_unacknowledged_unread_values_are_not_lost() -> None:
    sends = [ok("k", 0), Send("k", 1, 1.0, Outcome.INFO), Send("k", 2, 2.0, Outcome.FAIL)]
    report = check(history(sends, both([0])))
    assert report.valid, report.summary()
    assert (report.lost, report.unknown_unread, report.recovered) == (0, 1, 0)


def test_unknown_sends_read_are_recovered() -> None:
    sends = [ok("k", 0), Send("k", 1, 1.0, Outcome.INFO)]
    report = check(history(sends, both([0, 1])))
    assert report.valid
    assert (report.recovered, report.unknown_unread) == (1, 0)


def test_failed_send_read_is_an_anomaly() -> None:
    sends = [ok("k", 0), Send("k", 1, 1.0, Outcome.FAIL)]
    report = check(history(sends, both([0, 1])))
    assert report.failed_but_read == 1
    assert not report.valid


def test_unexpected_value() -> None:
    sends = [ok("k", 0)]
    report = check(history(sends, [*both([0]), read(7, 20.0)]))
    assert report.unexpected == 1
    assert not report.valid
    assert "unexpected k=7" in report.summary()


def test_duplicate_without_restart_is_unexplained() -> None:
    sends = [ok("k", v) for v in range(3)]
    deliveries = [*both([0, 1, 2]), read(1, 30.0)]
    report = check(history(sends, deliveries))
    assert report.duplicates_unexplained == 1
    assert report.duplicates_after_restart == 0
    assert report.reordered == 0, "a redelivery is a duplicate, not a reordering"
    assert not report.valid


def test_duplicate_after_the_consumers_restart_is_allowed() -> None:
    sends = [ok("k", v) for v in range(4)]
    deliveries = [
        read(0, 1.0),
        read(1, 2.0),
        read(2, 3.0),
        # restart at 4.0: 1 and 2 were not acknowledged yet, the new session gets them again
        read(1, 5.0, session=2),
        read(2, 6.0, session=2),
        read(3, 7.0, session=2),
        *[read(v, 1.0 + v, sub=QUEUE, consumer="q1") for v in range(4)],
    ]
    restarts = [Restart(4.0, RestartKind.CONSUMER, "c1", STREAM)]
    report = check(history(sends, deliveries, restarts=restarts))
    assert report.valid, report.summary()
    assert report.duplicates_after_restart == 2
    assert report.subscriptions[STREAM].duplicates_by_cause == {"consumer": 2}
    assert report.subscriptions[STREAM].sessions == 2


def test_restart_of_another_consumer_does_not_excuse() -> None:
    sends = [ok("k", v) for v in range(2)]
    deliveries = [*both([0, 1]), read(1, 30.0, consumer="c2")]
    restarts = [Restart(20.0, RestartKind.CONSUMER, "c2", STREAM)]
    report = check(history(sends, deliveries, restarts=restarts))
    assert report.duplicates_unexplained == 1


def test_restart_outside_the_window_does_not_excuse() -> None:
    sends = [ok("k", v) for v in range(2)]
    deliveries = [*both([0, 1]), read(1, 30.0)]
    restarts = [Restart(5.0, RestartKind.CONSUMER, "c1", STREAM)]  # before the first delivery
    assert check(history(sends, deliveries, restarts=restarts)).duplicates_unexplained == 1


def test_broker_restart_excuses_unless_excluded() -> None:
    sends = [ok("k", v) for v in range(2)]
    deliveries = [*both([0, 1]), read(1, 30.0)]
    restarts = [Restart(20.0, RestartKind.BROKER, "segment-broker-1")]
    h = history(sends, deliveries, restarts=restarts)
    report = check(h)
    assert report.duplicates_after_restart == 1
    assert report.subscriptions[STREAM].duplicates_by_cause == {"broker": 1}
    assert check(h, excusing=[RestartKind.CONSUMER]).duplicates_unexplained == 1


def test_delivery_during_a_broker_outage_is_excused() -> None:
    """Entries already on the wire when the broker was killed still arrive; their acks are lost
    with the connection, so they come again once the broker is back."""
    sends = [ok("k", v) for v in range(2)]
    deliveries = [*both([0, 1]), read(1, 30.0)]  # first delivery of 1 at 11.0
    during = [Restart(10.5, RestartKind.BROKER, "segment-broker-1", until=12.0)]
    report = check(history(sends, deliveries, restarts=during))
    assert report.duplicates_after_restart == 1
    over = [Restart(10.0, RestartKind.BROKER, "segment-broker-1", until=10.9)]
    assert check(history(sends, deliveries, restarts=over)).duplicates_unexplained == 1


def test_broker_restart_excuses_only_its_segments() -> None:
    sends = [ok("k", v) for v in range(2)]
    deliveries = [*both([0, 1]), read(1, 30.0)]  # segment 0
    elsewhere = [Restart(20.0, RestartKind.BROKER, "segment-broker-2", segments=(3, 4))]
    assert check(history(sends, deliveries, restarts=elsewhere)).duplicates_unexplained == 1
    hosting = [Restart(20.0, RestartKind.BROKER, "segment-broker-0", segments=(0,))]
    assert check(history(sends, deliveries, restarts=hosting)).duplicates_after_restart == 1


def test_value_stored_twice_is_never_excused() -> None:
    sends = [ok("k", 0, position=0), ok("k", 1, position=1)]
    deliveries = [
        read(0, 1.0, position=0),
        read(1, 2.0, position=1),
        read(1, 4.0, position=2, session=2),
        *[read(v, 1.0 + v, sub=QUEUE, consumer="q1", position=v) for v in range(2)],
    ]
    restarts = [Restart(3.0, RestartKind.CONSUMER, "c1", STREAM)]
    report = check(history(sends, deliveries, restarts=restarts))
    assert report.double_writes == 1
    assert report.duplicates_unexplained == 1
    assert report.duplicates_after_restart == 0
    assert report.inconsistent_positions == 1  # acknowledged at 1, read at 2
    assert not report.valid


def test_reordering_within_a_session() -> None:
    sends = [ok("k", v) for v in range(3)]
    deliveries = [read(0, 1.0), read(2, 2.0), read(1, 3.0)]
    deliveries += [read(v, 1.0 + v, sub=QUEUE, consumer="q1") for v in range(3)]
    report = check(history(sends, deliveries))
    sub = report.subscriptions[STREAM]
    assert (sub.reordered, sub.reordered_across_sessions) == (1, 0)
    assert report.skips == 0, "the gap was filled by the same session, counted as reordered"
    assert report.lost == 0
    assert not report.valid


def test_reordering_across_a_split_handoff() -> None:
    """The child's consumer got value 3 before the parent's consumer got 2."""
    sends = [ok("k", 0), ok("k", 1), ok("k", 2), ok("k", 3, segment=2)]
    deliveries = [
        read(0, 1.0),
        read(1, 2.0),
        read(3, 3.0, consumer="c2", segment=2),
        read(2, 4.0),
        *[read(v, 1.0 + v, sub=QUEUE, consumer="q1") for v in range(4)],
    ]
    report = check(history(sends, deliveries))
    sub = report.subscriptions[STREAM]
    assert (sub.reordered, sub.reordered_across_sessions) == (1, 1)
    assert "after 3 went to c2#1" in report.summary()


def test_clean_handoff_is_not_a_reordering() -> None:
    sends = [ok("k", 0), ok("k", 1), ok("k", 2, segment=2), ok("k", 3, segment=2)]
    deliveries = [
        read(0, 1.0),
        read(1, 2.0),
        read(2, 3.0, consumer="c2", segment=2),
        read(3, 4.0, consumer="c2", segment=2),
        *[read(v, 1.0 + v, sub=QUEUE, consumer="q1") for v in range(4)],
    ]
    assert check(history(sends, deliveries)).valid


def test_queue_subscription_has_no_order_check() -> None:
    sends = [ok("k", v) for v in range(3)]
    deliveries = [read(v, 1.0 + v) for v in range(3)]
    deliveries += [read(v, t, sub=QUEUE, consumer="q1") for v, t in ((2, 1.0), (0, 2.0), (1, 3.0))]
    report = check(history(sends, deliveries))
    assert report.valid, report.summary()
    assert report.subscriptions[QUEUE].reordered == 0


def test_skip_is_a_hole_in_what_a_session_read() -> None:
    sends = [ok("k", v) for v in range(4)]
    deliveries = [read(0, 1.0), read(2, 2.0), read(3, 3.0)]
    deliveries += [read(v, 1.0 + v, sub=QUEUE, consumer="q1") for v in range(4)]
    report = check(history(sends, deliveries))
    assert report.skips == 1
    assert report.subscriptions[STREAM].lost == 1
    assert "c1#1 read 0 then 2; 1 was acknowledged" in report.summary()
    assert not report.valid


def test_gap_filled_by_another_session_is_a_handoff() -> None:
    sends = [ok("k", v) for v in range(3)]
    deliveries = [read(0, 1.0), read(1, 2.0, consumer="c2"), read(2, 3.0)]
    deliveries += [read(v, 1.0 + v, sub=QUEUE, consumer="q1") for v in range(3)]
    report = check(history(sends, deliveries))
    assert report.valid, report.summary()
    assert report.subscriptions[STREAM].skips_handed_off == 1


def test_gap_over_unacknowledged_value_is_not_a_skip() -> None:
    sends = [ok("k", 0), Send("k", 1, 1.0, Outcome.INFO), ok("k", 2)]
    report = check(history(sends, both([0, 2])))
    assert report.valid
    assert report.skips == 0


def test_write_reorder_in_the_log() -> None:
    sends = [ok("k", 0, position=1), ok("k", 1, position=0)]
    deliveries = [read(1, 1.0, position=0), read(0, 2.0, position=1)]
    deliveries += [read(v, 1.0 + v, sub=QUEUE, consumer="q1") for v in range(2)]
    report = check(history(sends, deliveries))
    assert report.write_reorders == 1
    assert report.subscriptions[STREAM].reordered == 1
    assert report.reordered == 2


def test_deliveries_are_analysed_in_time_order() -> None:
    sends = [ok("k", v) for v in range(3)]
    deliveries = [read(2, 3.0), read(0, 1.0), read(1, 2.0)]
    deliveries += [read(v, 1.0 + v, sub=QUEUE, consumer="q1") for v in range(3)]
    assert check(history(sends, deliveries)).valid


def test_malformed_histories_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        check(history([ok("k", 0), ok("k", 0)], []))
    with pytest.raises(ValueError, match="missing from 'ordered'"):
        check(history([ok("k", 0)], [read(0, 1.0, sub="other")]))


def test_history_round_trips_through_json(tmp_path: Path) -> None:
    h = history(
        [ok("k", 0, position=3), Send("k", 1, 1.0, Outcome.INFO)],
        [read(0, 1.0, position=3)],
        restarts=[Restart(2.0, RestartKind.BROKER, "segment-broker-0", segments=(0, 2))],
    )
    path = tmp_path / "history.json"
    h.dump(path)
    assert History.load(path) == h
    assert check(History.load(path)).to_json() == check(h).to_json()


def test_handoff_windows() -> None:
    sends = [
        # key a: last parent ack at 1.0; next value invoked at 1.2, acked on the child at 1.23
        Send("a", 0, 0.9, Outcome.OK, 1.0, 0, 0),
        Send("a", 1, 1.2, Outcome.OK, 1.23, 2, 0),
        Send("a", 2, 1.4, Outcome.OK, 1.41, 2, 1),
        # key b: the child's first value was in flight when the parent was sealed
        Send("b", 0, 0.95, Outcome.OK, 1.1, 0, 1),
        Send("b", 1, 1.05, Outcome.OK, 1.18, 3, 0),
        # key c: only on the parent; key d: a failed send does not count
        Send("c", 0, 1.0, Outcome.OK, 1.01, 0, 2),
        Send("d", 0, 1.0, Outcome.OK, 1.02, 0, 3),
        Send("d", 1, 1.1, Outcome.INFO),
    ]
    windows = {w.key: w for w in handoff_windows(sends, parents={0}, children={2, 3})}
    assert set(windows) == {"a", "b"}
    assert (windows["a"].parent, windows["a"].child) == (0, 2)
    assert math.isclose(windows["a"].gap, 0.23)
    assert math.isclose(windows["a"].blocked, 0.03)
    assert math.isclose(windows["b"].gap, 0.08)
    assert math.isclose(windows["b"].blocked, 0.08)


def test_segment_gap() -> None:
    sends = [
        Send("a", 0, 0.9, Outcome.OK, 1.0, 0, 0),
        Send("b", 0, 0.95, Outcome.OK, 1.02, 0, 1),
        Send("a", 1, 1.03, Outcome.OK, 1.06, 2, 0),
        Send("b", 1, 1.04, Outcome.OK, 1.08, 3, 0),
        Send("c", 0, 1.05, Outcome.INFO),
    ]
    gap = segment_gap(sends, parents={0}, children={2, 3})
    assert gap is not None and math.isclose(gap, 0.04)
    assert segment_gap(sends, parents={0}, children={7}) is None


def test_summarize_nearest_rank() -> None:
    s = summarize(float(v) for v in range(1, 101))
    assert (s.count, s.p50, s.p99, s.max) == (100, 50.0, 99.0, 100.0)
    assert summarize([0.004]).ms() == "n=1 p50 4.0 ms, p99 4.0 ms, max 4.0 ms"
    assert summarize([]).count == 0
    assert summarize([]).ms() == "n=0"


# -- the recorder (tests/chaos/workload.py) builds the histories the checker reads ---------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def message(key: str, value: int, segment: int = 0, position: int = 0) -> Message:
    return Message(key, encode_value(value, pad=3), segment, position)


def test_payload_round_trip() -> None:
    assert decode_value(encode_value(42, pad=10)) == 42
    assert decode_value(b"garbage") == -1
    assert decode_value(b"x|") == -1


def test_recorder_builds_the_history_and_tracks_progress() -> None:
    clock = FakeClock()
    rec = Recorder({STREAM: True}, clock=clock)
    rec.invoke("k", 0, 100.0)
    rec.invoke("k", 1, 100.1)
    rec.invoke("k", 2, 100.2)
    with pytest.raises(ValueError, match="in order"):
        rec.invoke("k", 5, 100.3)
    clock.now = 100.15
    rec.ok("k", 0, MessageId(0, 7))
    rec.ok("k", 1, MessageId(0, 8), at=100.16)
    rec.fail("k", 1)  # a late second outcome is ignored
    assert (rec.sent, rec.acked, rec.unread(STREAM)) == (3, 2, 2)
    assert rec.lagging(100.05) == ["k: value 1 not read on stream"]
    rec.delivered(STREAM, "c1", 1, message("k", 0, position=7))
    rec.delivered(STREAM, "c1", 1, message("k", 1, position=8))
    assert rec.lagging(100.05) == []
    assert rec.lagging(100.3) == ["k: nothing invoked since"]
    assert (rec.unread(STREAM), rec.read_count(STREAM)) == (0, 2)

    handle = rec.restart(RestartKind.CONSUMER, "c1", STREAM)
    clock.now = 101.0
    rec.restarted(handle)
    h = rec.history()
    assert [s.outcome for s in h.sends] == [Outcome.OK, Outcome.OK, Outcome.INFO]
    assert (h.sends[0].completed, h.sends[1].completed) == (100.15, 100.16)
    assert (h.sends[0].segment, h.sends[0].position) == (0, 7)
    assert h.restarts == [Restart(100.15, RestartKind.CONSUMER, "c1", STREAM, until=101.0)]
    report = check(h)
    assert report.valid, report.summary()
    assert report.unknown_unread == 1


# -- checkpoint sessions (key-shared chaos, PIP-486) ------------------------------------------


def checkpoint_json(
    positions: dict[int, int] | None = None, buckets: dict[tuple[int, int], int] | None = None
) -> dict[str, object]:
    return {
        "positions": {
            str(s): {"position": p, "batchIndex": 0} for s, p in (positions or {}).items()
        },
        "bucketPositions": {
            f"{s}/{b}": {"position": p, "batchIndex": 0} for (s, b), p in (buckets or {}).items()
        },
        "drained": [],
    }


def checkpointed(
    deliveries: list[Delivery], starts: list[CheckpointStart], buckets: dict[int, int] | None = None
) -> History:
    sends = [ok("k", v, position=v) for v in range(4)]
    queue = [read(v, 1.0 + v, sub=QUEUE, consumer="q1", position=v) for v in range(4)]
    return History(
        {STREAM: True, QUEUE: False},
        sends,
        [*deliveries, *queue],
        checkpoints=starts,
        buckets=buckets or {},
    )


def test_a_checkpoint_session_re_reading_past_its_checkpoint_is_a_restore() -> None:
    deliveries = [read(v, 1.0 + v, position=v) for v in range(3)]
    # killed after 2; its checkpoint says position 0: 1 and 2 come again, then 3
    deliveries += [read(v, 5.0 + v, session=2, position=v) for v in (1, 2, 3)]
    starts = [
        CheckpointStart(STREAM, "c1", 1, checkpoint_json()),
        CheckpointStart(STREAM, "c1", 2, checkpoint_json({0: 0})),
    ]
    report = check(checkpointed(deliveries, starts))
    assert report.valid, report.summary()
    assert report.subscriptions[STREAM].duplicates_by_cause == {CHECKPOINT_RESTORE: 2}


def test_a_checkpoint_session_re_reading_what_its_checkpoint_covers_is_unexplained() -> None:
    deliveries = [read(v, 1.0 + v, position=v) for v in range(3)]
    deliveries += [read(v, 5.0 + v, session=2, position=v) for v in (1, 2, 3)]
    starts = [
        CheckpointStart(STREAM, "c1", 1, checkpoint_json()),
        CheckpointStart(STREAM, "c1", 2, checkpoint_json({0: 1})),
    ]
    # a consumer restart does not excuse it: the checkpoint says it was processed
    restarts = [Restart(4.0, RestartKind.CONSUMER, "c1", STREAM)]
    h = checkpointed(deliveries, starts)
    h.restarts = restarts
    report = check(h)
    assert report.duplicates_unexplained == 1, report.summary()
    assert report.subscriptions[STREAM].duplicates_by_cause == {CHECKPOINT_RESTORE: 1}
    assert "covering segment 0 position 1" in str(report.examples["duplicate"][0])


def test_a_checkpoint_session_reading_a_value_twice_is_unexplained() -> None:
    deliveries = [read(v, 1.0 + v, position=v) for v in range(4)] + [read(2, 9.0, position=2)]
    starts = [CheckpointStart(STREAM, "c1", 1, checkpoint_json())]
    report = check(checkpointed(deliveries, starts))
    assert report.duplicates_unexplained == 1
    assert "had delivered it already" in str(report.examples["duplicate"][0])


def test_a_checkpoint_covers_by_bucket_when_the_segment_was_shared() -> None:
    key_bucket = bucket_of(bucket_hash("k"), 2)
    deliveries = [read(v, 1.0 + v, position=v) for v in range(4)]
    deliveries += [read(v, 10.0 + v, consumer="c2", position=v) for v in (2, 3)]
    for covered, unexplained in ((key_bucket, 1), (1 - key_bucket, 0)):
        starts = [
            CheckpointStart(STREAM, "c1", 1, checkpoint_json()),
            CheckpointStart(STREAM, "c2", 1, checkpoint_json(buckets={(0, covered): 2})),
        ]
        report = check(checkpointed(deliveries, starts, buckets={0: 2}))
        assert report.duplicates_unexplained == unexplained, (covered, report.summary())


def test_checkpoint_history_round_trips_through_json(tmp_path: Path) -> None:
    starts = [CheckpointStart(STREAM, "c1", 2, checkpoint_json({0: 1}, {(0, 1): 3}))]
    h = checkpointed([read(0, 1.0, position=0)], starts, buckets={0: 2, 3: 4})
    path = tmp_path / "history.json"
    h.dump(path)
    assert History.load(path) == h
