"""The ownership-transfer state machine (core.transfer): each decision, and property tests that
any interleaving of publishes, leader steps and crashes of the leader, the source and the
destination ends, once the brokers are back, in one owner holding every acknowledged entry."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scalable_topics.core.transfer import (
    Action,
    BrokerView,
    Endpoint,
    SegmentRate,
    ShedPolicy,
    Transfer,
    TransferPhase,
    TransferView,
    broker_loads,
    choose_shed,
    is_orphan_copy,
    next_action,
)

SRC = Endpoint("broker-0", "ws://127.0.0.10:18080")
DST = Endpoint("broker-1", "ws://127.0.0.11:18080")


def transfer(phase: TransferPhase = TransferPhase.RELEASING) -> Transfer:
    return Transfer(id="t-1", segment_id=3, source=SRC, destination=DST, phase=phase)


RB = Action.RECORD_ROLLING_BACK
F5 = BrokerView(up=True, present=True, last_position=5, fenced=True)


def up(last: int, *, fenced: bool = False, present: bool = True) -> BrokerView:
    return BrokerView(up=True, present=present, last_position=last, fenced=fenced)


DOWN = BrokerView(up=False)


def test_status_round_trip_and_malformed() -> None:
    t = Transfer(
        id="t-9",
        segment_id=7,
        source=SRC,
        destination=DST,
        phase=TransferPhase.ASSIGNED,
        trigger="drain",
        reason="broker-0 drained",
        request_id="r-1",
        started_at="2026-01-01T00:00:00Z",
    )
    assert Transfer.from_status(t.to_status()) == t
    with pytest.raises(ValueError, match=r"malformed status\.transfer"):
        Transfer.from_status({"id": "x", "segmentId": 1, "source": {"pod": "a"}})
    with pytest.raises(ValueError, match="must differ"):
        Transfer(id="x", segment_id=1, source=SRC, destination=SRC)


def test_phases_only_go_forward_and_roll_back_only_before_owned() -> None:
    t = transfer()
    assert t.advanced(TransferPhase.ASSIGNED).phase is TransferPhase.ASSIGNED
    with pytest.raises(ValueError, match="cannot go from"):
        t.advanced(TransferPhase.OWNED)
    owned = t.advanced(TransferPhase.ASSIGNED).advanced(TransferPhase.OWNED)
    with pytest.raises(ValueError, match="cannot roll back"):
        owned.advanced(TransferPhase.ROLLING_BACK)
    back = t.advanced(TransferPhase.ROLLING_BACK)
    with pytest.raises(ValueError, match="rolling back"):
        back.advanced(TransferPhase.ASSIGNED)


@pytest.mark.parametrize(
    ("phase", "source", "destination", "lag", "expected"),
    [
        # catch up while the source serves, fence once the lag is small, copy the tail
        (TransferPhase.RELEASING, up(100), up(-1, fenced=True, present=False), 0, Action.COPY),
        (TransferPhase.RELEASING, up(100), up(60, fenced=True), 10, Action.COPY),
        (TransferPhase.RELEASING, up(100), up(95, fenced=True), 10, Action.FENCE_SOURCE),
        (TransferPhase.RELEASING, up(101, fenced=True), up(95, fenced=True), 10, Action.COPY),
        (
            TransferPhase.RELEASING,
            up(101, fenced=True),
            up(101, fenced=True),
            10,
            Action.RECORD_ASSIGNED,
        ),
        # destination away before the commit: roll back; source away: wait
        (TransferPhase.RELEASING, up(5, fenced=True), DOWN, 0, Action.RECORD_ROLLING_BACK),
        (TransferPhase.RELEASING, DOWN, up(5, fenced=True), 0, Action.WAIT),
        (TransferPhase.ASSIGNED, up(5, fenced=True), up(5, fenced=True), 0, Action.COMMIT),
        (TransferPhase.ASSIGNED, DOWN, up(5, fenced=True), 0, Action.COMMIT),
        (TransferPhase.ASSIGNED, up(5, fenced=True), DOWN, 0, Action.RECORD_ROLLING_BACK),
        (TransferPhase.ASSIGNED, F5, up(3, fenced=True), 0, RB),
        # committed: only forward
        (TransferPhase.OWNED, F5, F5, 0, Action.ACTIVATE_DESTINATION),
        (TransferPhase.OWNED, up(5, fenced=True), DOWN, 0, Action.WAIT),
        (TransferPhase.OWNED, up(5, fenced=True), up(5), 0, Action.RELEASE_SOURCE),
        (TransferPhase.OWNED, DOWN, up(5), 0, Action.WAIT),
        (TransferPhase.OWNED, up(-1, present=False), up(5), 0, Action.FINISH),
        # rolling back: un-fence first, then drop the destination's copy
        (TransferPhase.ROLLING_BACK, F5, F5, 0, Action.UNFENCE_SOURCE),
        (TransferPhase.ROLLING_BACK, up(5), up(5, fenced=True), 0, Action.DELETE_DESTINATION),
        (TransferPhase.ROLLING_BACK, up(5), DOWN, 0, Action.FINISH),
        (TransferPhase.ROLLING_BACK, DOWN, up(5, fenced=True), 0, Action.WAIT),
    ],
)
def test_next_action(
    phase: TransferPhase, source: BrokerView, destination: BrokerView, lag: int, expected: Action
) -> None:
    view = TransferView(source=source, destination=destination)
    assert next_action(transfer(phase), view, catch_up_lag=lag) is expected


def test_orphan_copies() -> None:
    t = transfer()
    owner = "broker-0"
    assert not is_orphan_copy(broker_pod="broker-1", owner_pod=owner, transfer=t, fenced=True)
    assert is_orphan_copy(broker_pod="broker-1", owner_pod=owner, transfer=None, fenced=True)
    assert not is_orphan_copy(broker_pod="broker-1", owner_pod=owner, transfer=None, fenced=False)
    assert not is_orphan_copy(broker_pod=owner, owner_pod=owner, transfer=None, fenced=True)


# -- simulation -------------------------------------------------------------------------------


@dataclass
class Broker:
    pod: str
    up: bool = True
    present: bool = False
    fenced: bool = False
    log: list[int] = field(default_factory=list)

    def view(self) -> BrokerView:
        if not self.up:
            return BrokerView(up=False)
        return BrokerView(
            up=True,
            present=self.present,
            last_position=len(self.log) - 1 if self.present else -1,
            fenced=self.fenced,
        )

    @property
    def writable(self) -> bool:
        return self.up and self.present and not self.fenced


@dataclass
class World:
    """Brokers' durable state, the Segment's status, and the producer's acknowledged entries."""

    source: Broker
    destination: Broker
    owner: str
    record: Transfer | None
    chunk: int
    lag: int
    next_seq: int = 0
    acked: list[int] = field(default_factory=list)

    def broker(self, pod: str) -> Broker:
        return self.source if pod == self.source.pod else self.destination

    def check_one_owner(self) -> None:
        writable = [b.pod for b in (self.source, self.destination) if b.writable]
        assert len(writable) <= 1, f"two brokers accept writes: {writable}"

    def publish(self) -> None:
        # The producer is connected wherever it is; only a writable broker stores and acks.
        for b in (self.source, self.destination):
            if b.writable:
                b.log.append(self.next_seq)
                self.acked.append(self.next_seq)
        self.next_seq += 1

    def leader_step(self) -> Action:
        if self.record is None:
            return Action.FINISH
        t = self.record
        src, dst = self.broker(t.source.pod), self.broker(t.destination.pod)
        action = next_action(
            t, TransferView(source=src.view(), destination=dst.view()), catch_up_lag=self.lag
        )
        if action is Action.COPY:
            if src.up and dst.up:
                if not dst.present:
                    dst.present, dst.fenced = True, True
                n = min(len(src.log), len(dst.log) + self.chunk)
                assert dst.log == src.log[: len(dst.log)], "destination diverged from source"
                dst.log = src.log[:n]
        elif action is Action.FENCE_SOURCE:
            src.fenced = True
        elif action is Action.RECORD_ASSIGNED:
            self.record = t.advanced(TransferPhase.ASSIGNED)
        elif action is Action.COMMIT:
            self.record = t.advanced(TransferPhase.OWNED)
            self.owner = dst.pod
        elif action is Action.ACTIVATE_DESTINATION:
            dst.fenced = False
        elif action is Action.RELEASE_SOURCE:
            assert dst.present and not dst.fenced, "source released before the destination owns"
            src.present, src.log, src.fenced = False, [], False
        elif action is Action.RECORD_ROLLING_BACK:
            self.record = t.advanced(TransferPhase.ROLLING_BACK)
        elif action is Action.UNFENCE_SOURCE:
            src.fenced = False
        elif action is Action.DELETE_DESTINATION:
            dst.present, dst.log, dst.fenced = False, [], False
        elif action is Action.FINISH:
            self.record = None
        return action

    def cleanup_orphans(self) -> None:
        for b in (self.source, self.destination):
            if (
                b.up
                and b.present
                and is_orphan_copy(
                    broker_pod=b.pod, owner_pod=self.owner, transfer=self.record, fenced=b.fenced
                )
            ):
                b.present, b.log, b.fenced = False, [], False


EVENTS = st.sampled_from(
    [
        "publish",
        "publish",
        "step",
        "step",
        "step",
        "crash-source",
        "restart-source",
        "crash-destination",
        "restart-destination",
        "crash-leader",
    ]
)


def run(world: World, events: list[str]) -> None:
    for event in events:
        if event == "publish":
            world.publish()
        elif event == "step":
            world.leader_step()
        elif event == "crash-source":
            world.source.up = False
        elif event == "restart-source":
            world.source.up = True
        elif event == "crash-destination":
            world.destination.up = False
        elif event == "restart-destination":
            world.destination.up = True
        # "crash-leader": the leader keeps nothing but the record; the next one starts from it
        world.check_one_owner()
    world.source.up = world.destination.up = True
    for i in range(400):
        if i % 3 == 0:  # the copy outruns the producers, as a move needs
            world.publish()
        world.check_one_owner()
        if world.leader_step() is Action.FINISH and world.record is None:
            break
    assert world.record is None, f"transfer never ended: {world.record}"
    world.cleanup_orphans()
    owner = world.broker(world.owner)
    other = world.source if owner is world.destination else world.destination
    assert owner.writable, "the recorded owner does not accept writes"
    assert not other.present, "a second copy survived the transfer"
    assert owner.log == world.acked, "an acknowledged entry was lost or reordered"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(EVENTS, max_size=60),
    preload=st.integers(min_value=0, max_value=20),
    chunk=st.integers(min_value=1, max_value=8),
    lag=st.integers(min_value=0, max_value=5),
)
def test_any_interleaving_of_crashes_ends_with_one_owner_and_every_ack(
    events: list[str], preload: int, chunk: int, lag: int
) -> None:
    world = World(
        source=Broker(SRC.pod, present=True),
        destination=Broker(DST.pod),
        owner=SRC.pod,
        record=transfer(),
        chunk=chunk,
        lag=lag,
    )
    for _ in range(preload):
        world.publish()
    run(world, events)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(EVENTS, max_size=40), preload=st.integers(min_value=0, max_value=10))
def test_without_crashes_the_move_completes(events: list[str], preload: int) -> None:
    world = World(
        source=Broker(SRC.pod, present=True),
        destination=Broker(DST.pod),
        owner=SRC.pod,
        record=transfer(),
        chunk=3,
        lag=2,
    )
    for _ in range(preload):
        world.publish()
    run(world, [e for e in events if e in ("publish", "step")])
    assert world.owner == DST.pod


# -- load shedding ------------------------------------------------------------------------------


def rates(*items: tuple[str, float]) -> list[SegmentRate]:
    return [SegmentRate(("ns", "t", i), broker, rate) for i, (broker, rate) in enumerate(items)]


def test_shed_moves_the_hottest_movable_segment_to_the_least_loaded_broker() -> None:
    segments = rates(("b0", 500), ("b0", 300), ("b0", 900), ("b1", 100), ("b2", 200))
    move = choose_shed(["b0", "b1", "b2"], segments, ShedPolicy(), now=1000, last_shed_at=None)
    assert move is not None
    # b0 takes 1700 msg/s against a mean of 667; its 900 msg/s segment is below the 1600 gap
    assert move.key == ("ns", "t", 2) and move.source == "b0" and move.destination == "b1"
    assert "b0 takes 1700 msg/s" in move.reason and "goes to b1" in move.reason


@pytest.mark.parametrize(
    ("policy", "last", "segments", "why"),
    [
        (ShedPolicy(enabled=False), None, rates(("b0", 1000), ("b1", 0)), "off"),
        (ShedPolicy(cooldown=60), 990.0, rates(("b0", 1000), ("b1", 0)), "cooldown"),
        (ShedPolicy(margin=0.25), None, rates(("b0", 110), ("b1", 100)), "within the margin"),
        (ShedPolicy(min_rate=500), None, rates(("b0", 400), ("b1", 0)), "too cold to matter"),
        (
            ShedPolicy(),
            None,
            rates(("b0", 1000), ("b1", 10)),
            "moving its one segment moves the heat",
        ),
    ],
)
def test_shed_does_nothing(
    policy: ShedPolicy, last: float | None, segments: list[SegmentRate], why: str
) -> None:
    assert choose_shed(["b0", "b1"], segments, policy, now=1000, last_shed_at=last) is None, why


@settings(max_examples=300, deadline=None)
@given(
    loads=st.lists(
        st.tuples(st.integers(0, 3), st.floats(0, 5000, allow_nan=False)), min_size=1, max_size=12
    ),
    margin=st.floats(0, 1),
)
# Found by hypothesis: the segment's rate is below hot - cold in floating point, yet cold + rate
# equals hot exactly, so the move only swapped which broker is the hot one.
@example(
    loads=[
        (0, 682.9131588413577),
        (0, 1365.7925253598028),
        (1, 683.0),
        (2, 682.9131588413577),
        (3, 683.0),
    ],
    margin=0.0,
)
def test_a_shed_move_always_narrows_the_spread(
    loads: list[tuple[int, float]], margin: float
) -> None:
    brokers = [f"b{i}" for i in range(4)]
    segments = rates(*((f"b{b}", r) for b, r in loads))
    move = choose_shed(
        brokers, segments, ShedPolicy(margin=margin, min_rate=0), now=0, last_shed_at=None
    )
    if move is None:
        return
    before = broker_loads(brokers, segments)
    moved = next(s for s in segments if s.key == move.key)
    after = dict(before)
    after[move.source] -= moved.rate
    after[move.destination] += moved.rate
    mean = sum(before.values()) / len(before)
    assert before[move.source] > mean * (1 + margin)
    assert before[move.destination] == min(before.values())
    assert after[move.destination] < before[move.source], "the destination becomes no new hot spot"
    assert max(after.values()) - min(after.values()) <= max(before.values()) - min(before.values())
