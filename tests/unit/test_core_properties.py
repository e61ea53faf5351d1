"""Property tests of the core model: DAG invariants under any sequence of valid operations, and
the evaluator's caps when its decisions are applied in a loop."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Mapping, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalable_topics.core.buckets import (
    N_MAX,
    initial_layout_buckets,
    layout_buckets,
    rebucket,
)
from scalable_topics.core.evaluator import (
    METRICS,
    LoadSample,
    Merge,
    Rebucket,
    Split,
    decide_explained,
)
from scalable_topics.core.hashing import RING_MAX
from scalable_topics.core.layout import SegmentInfo, SegmentLayout
from scalable_topics.core.policy import MIB, AutoScalePolicy

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def merge_count(layout: SegmentLayout, segment_id: int) -> int:
    """``merge_depth`` recomputed by walking parents (independent of ``layout.ancestors``)."""
    seen: set[int] = set()
    stack = [segment_id]
    while stack:
        current = stack.pop()
        if current in seen or current not in layout.segments:
            continue
        seen.add(current)
        stack.extend(layout.segments[current].parent_ids)
    return sum(1 for i in seen if len(layout.segments[i].parent_ids) >= 2)


def check_invariants(layout: SegmentLayout, hashes: list[int]) -> None:
    active = layout.active()
    expected = 0
    for segment in active:
        assert segment.hash_range.start == expected, f"gap/overlap at {expected:#06x}"
        expected = segment.hash_range.end + 1
    assert expected == RING_MAX + 1
    layout.validate()
    for h in hashes:
        assert layout.find_active(h).hash_range.contains(h)
    assert all(i < layout.next_segment_id for i in layout.segments)
    for segment in layout.segments.values():
        if segment.active:
            assert segment.child_ids == () and segment.sealed_at_epoch == 0
        else:
            assert 0 < segment.sealed_at_epoch <= layout.epoch
        for child in segment.child_ids:
            if child in layout.segments:
                assert segment.segment_id in layout.segments[child].parent_ids
        for parent in segment.parent_ids:
            assert segment.segment_id in layout.segments[parent].child_ids
        assert layout.merge_depth(segment.segment_id) == merge_count(layout, segment.segment_id)
    for segment_id in layout.segments:
        lineage = layout.lineage(segment_id)
        assert len(lineage) == len(set(lineage))
        position = {s: k for k, s in enumerate(lineage)}
        for member in lineage:
            for child in layout.segments[member].child_ids:
                if child in position:
                    assert position[member] < position[child]
    data = layout.to_metadata()
    assert SegmentLayout.from_metadata(data) == layout
    assert SegmentLayout.from_metadata(json.loads(json.dumps(data))) == layout


def adjacent_runs(active: list[SegmentInfo], length: int) -> list[list[SegmentInfo]]:
    return [active[k : k + length] for k in range(len(active) - length + 1)]


@SETTINGS
@given(st.data())
def test_any_operation_sequence_keeps_the_ring_partitioned(data: st.DataObject) -> None:
    layout = SegmentLayout.initial(data.draw(st.integers(1, 6), label="initial"))
    budget = data.draw(st.integers(1, 32), label="budget")
    buckets = initial_layout_buckets(layout, budget)
    hashes = data.draw(st.lists(st.integers(0, RING_MAX), max_size=8), label="hashes")
    ever: set[int] = set(layout.segments)
    check_invariants(layout, hashes)
    for _ in range(data.draw(st.integers(0, 20), label="steps")):
        active = layout.active()
        sealed = sorted(i for i, s in layout.segments.items() if not s.active)
        splittable = [s for s in active if s.hash_range.size > 1]
        ops = ["rebucket"]
        ops += ["split", "split-at"] if splittable else []
        ops += ["merge"] if len(active) >= 2 else []
        ops += ["prune"] if sealed else []
        op = data.draw(st.sampled_from(ops), label="op")
        rebucketed: dict[int, int] = {}
        if op in ("split", "split-at"):
            target = data.draw(st.sampled_from(splittable), label="split")
            at = None
            if op == "split-at":
                r = target.hash_range
                at = data.draw(st.integers(r.start, r.end - 1), label="at")
            new = layout.split(target.segment_id, at)
            low, high = (
                new.segments[layout.next_segment_id],
                new.segments[layout.next_segment_id + 1],
            )
            assert low.hash_range.end + 1 == high.hash_range.start
            assert low.hash_range.start == target.hash_range.start
            assert high.hash_range.end == target.hash_range.end
            if at is None:
                assert low.hash_range.end == target.hash_range.midpoint()
            else:
                assert low.hash_range.end == at
        elif op == "merge":
            size = data.draw(st.integers(2, min(3, len(active))), label="size")
            run = data.draw(st.sampled_from(adjacent_runs(active, size)), label="run")
            ids = [s.segment_id for s in data.draw(st.permutations(run), label="order")]
            new = layout.merge(*ids)
            child = new.segments[layout.next_segment_id]
            assert child.parent_ids == tuple(ids)
            assert child.hash_range.start == run[0].hash_range.start
            assert child.hash_range.end == run[-1].hash_range.end
            assert new.merge_depth(child.segment_id) == 1 + len(
                set().union(
                    *(
                        {
                            a
                            for a in layout.ancestors(i) | {i}
                            if len(layout.segments[a].parent_ids) >= 2
                        }
                        for i in ids
                    )
                )
            )
        elif op == "prune":
            target_id = data.draw(st.sampled_from(sealed), label="prune")
            new = layout.prune(target_id)
            assert target_id not in new.segments
        else:
            chosen = data.draw(
                st.lists(
                    st.sampled_from(active),
                    min_size=1,
                    max_size=3,
                    unique_by=lambda s: s.segment_id,
                ),
                label="rebucket",
            )
            new = rebucket(layout, [s.segment_id for s in chosen])
            for offset, old in enumerate(chosen):
                successor = new.segments[layout.next_segment_id + offset]
                assert successor.hash_range == old.hash_range
                assert successor.parent_ids == (old.segment_id,)
                assert new.merge_depth(successor.segment_id) == layout.merge_depth(old.segment_id)
                rebucketed[successor.segment_id] = data.draw(st.integers(1, N_MAX), label="N")
        assert new.epoch == layout.epoch + 1
        assert new.next_segment_id >= layout.next_segment_id
        created = set(new.segments) - set(layout.segments)
        assert not created & ever, "a segment id was reused"
        ever |= created
        check_invariants(new, hashes)
        buckets = layout_buckets(new, buckets, rebucketed=rebucketed)
        assert set(buckets) == set(new.segments)
        assert all(1 <= n <= N_MAX for n in buckets.values())
        layout = new


@SETTINGS
@given(st.data())
def test_invalid_operations_raise_and_change_nothing(data: st.DataObject) -> None:
    layout = SegmentLayout.initial(data.draw(st.integers(1, 4)))
    for _ in range(data.draw(st.integers(0, 4))):
        splittable = [s for s in layout.active() if s.hash_range.size > 1]
        layout = layout.split(data.draw(st.sampled_from(splittable)).segment_id)
    before = layout.to_metadata()
    segment_id = data.draw(st.integers(-1, layout.next_segment_id + 1))
    op = data.draw(st.sampled_from(["split", "merge", "prune", "rebucket"]))
    info = layout.segments.get(segment_id)
    active = layout.active()
    named = [segment_id]
    call: Callable[[], SegmentLayout]
    if op == "split":
        valid = info is not None and info.active and info.hash_range.size > 1
        call = functools.partial(layout.split, segment_id)
    elif op == "merge":
        other = data.draw(st.integers(-1, layout.next_segment_id + 1))
        pair = {segment_id, other}
        named.append(other)
        valid = len(pair) == 2 and any(
            {a.segment_id, b.segment_id} == pair for a, b in itertools.pairwise(active)
        )
        call = functools.partial(layout.merge, segment_id, other)
    elif op == "prune":
        valid = info is not None and not info.active
        call = functools.partial(layout.prune, segment_id)
    else:
        valid = info is not None and info.active
        call = functools.partial(rebucket, layout, [segment_id])
    if valid:
        assert call().epoch == layout.epoch + 1
    else:
        try:
            call()
        except ValueError as exc:
            message = str(exc)
            assert any(
                f"segment {i}" in message or f"-{i}" in message or f"[{i}" in message for i in named
            ), message
            assert any(
                reason in message
                for reason in (
                    "not found",
                    "not ACTIVE",
                    "still ACTIVE",
                    "not adjacent",
                    "size 1",
                    "named twice",
                )
            ), message
        else:
            raise AssertionError(f"{op} {segment_id} should have failed")
    assert layout.to_metadata() == before


# -- the evaluator in a loop -------------------------------------------------------------------


@st.composite
def policies(draw: st.DrawFn) -> AutoScalePolicy:
    max_segments = draw(st.integers(1, 8))
    return AutoScalePolicy(
        enabled=draw(st.sampled_from([True] * 7 + [False])),
        max_segments=max_segments,
        min_segments=draw(st.integers(1, max_segments)),
        max_dag_depth=draw(st.integers(0, 4)),
        split_cooldown=draw(st.sampled_from([0.0, 30.0, 60.0])),
        merge_cooldown=draw(st.sampled_from([0.0, 60.0, 300.0])),
        merge_window=draw(st.sampled_from([0.0, 60.0, 300.0])),
        rebucket_down_window=draw(st.sampled_from([0.0, 300.0, 3600.0])),
    )


# A sample is drawn in one of the interesting bands of the default thresholds: idle, cold,
# exactly at a merge threshold, lukewarm (between merge and split), exactly at a split threshold,
# and hot; its age straddles the merge windows used above.
RATE_BANDS: dict[str, tuple[float, float, float, float]] = {
    "idle": (0.0, 0.0, 0.0, 0.0),
    "cold": (10.0, 1.0 * MIB, 999.0, 5.0 * MIB),
    "at-merge": (1000.0, 5.0 * MIB, 5000.0, 25.0 * MIB),
    "lukewarm": (3000.0, 10.0 * MIB, 20_000.0, 100.0 * MIB),
    "at-split": (10_000.0, 50.0 * MIB, 50_000.0, 250.0 * MIB),
    "hot": (20_000.0, 60.0 * MIB, 75_000.0, 400.0 * MIB),
}
COOL_BANDS = ["idle", "cold", "cold", "at-merge", "lukewarm"]


@st.composite
def samples(draw: st.DrawFn, now: float) -> LoadSample:
    if draw(st.booleans(), label="all-cold"):
        rates = [RATE_BANDS[draw(st.sampled_from(["idle", "cold"]))][m] for m in range(4)]
        age = draw(st.sampled_from([0.0, 299.0, 300.0, 3600.0]), label="age")
        return LoadSample(rates[0], rates[1], rates[2], rates[3], now - age)
    rates = []
    for metric in range(4):
        band = draw(st.sampled_from([*COOL_BANDS, *RATE_BANDS]), label="band")
        if band not in COOL_BANDS[:3] and draw(st.booleans()):
            band = "cold"
        rates.append(RATE_BANDS[band][metric])
    age = draw(st.sampled_from([0.0, 59.0, 60.0, 299.0, 300.0, 3600.0]), label="age")
    return LoadSample(rates[0], rates[1], rates[2], rates[3], now - age)


def is_cold(
    sample: LoadSample | None, policy: AutoScalePolicy, now: float, window: float | None = None
) -> bool:
    return (
        sample is not None
        and now - sample.modified_at >= (policy.merge_window if window is None else window)
        and all(sample.rate(m) < policy.merge_threshold(m) for m, _, _ in METRICS)
    )


def expected_down(
    active: Sequence[SegmentInfo],
    load: Mapping[int, LoadSample],
    demand: int,
    policy: AutoScalePolicy,
    now: float,
    last_split_at: float | None,
    buckets: Mapping[int, int],
    budget: int | None,
) -> Rebucket | None:
    """Issue 14, "lower N lazily after an idle window": segments above the budget's share
    that were cold for ``rebucket_down_window`` go down to the lowest common level that keeps
    a bucket for every ordered consumer, unless a split or rollover is within the cooldown."""
    if budget is None:
        return None
    counts = {s.segment_id: buckets[s.segment_id] for s in active}
    share = max(1, budget // len(active))
    idle = {
        i
        for i, n in counts.items()
        if n > share and is_cold(load.get(i), policy, now, policy.rebucket_down_window)
    }
    if sum(counts.values()) <= demand or not idle:
        return None
    levels = [
        k
        for k in range(share, max(counts[i] for i in idle))
        if sum(min(n, k) if i in idle else n for i, n in counts.items()) >= demand
    ]
    if not levels or (last_split_at is not None and now - last_split_at < policy.split_cooldown):
        return None
    level = levels[0]
    targets = tuple(
        s.segment_id for s in active if s.segment_id in idle and counts[s.segment_id] > level
    )
    return Rebucket(targets, level, "idle-buckets")


def score(sample: LoadSample, policy: AutoScalePolicy) -> float:
    return max(sample.rate(m) / policy.split_threshold(m) for m, _, _ in METRICS)


def merge_set(layout: SegmentLayout, segment_id: int) -> set[int]:
    ids = layout.ancestors(segment_id) | {segment_id}
    return {i for i in ids if len(layout.segments[i].parent_ids) >= 2}


def allowed_merges(
    layout: SegmentLayout, load: Mapping[int, LoadSample], policy: AutoScalePolicy, now: float
) -> list[tuple[int, int]]:
    pairs = []
    for a, b in itertools.pairwise(layout.active()):
        if not (
            is_cold(load.get(a.segment_id), policy, now)
            and is_cold(load.get(b.segment_id), policy, now)
        ):
            continue
        union = merge_set(layout, a.segment_id) | merge_set(layout, b.segment_id)
        if 1 + len(union) <= policy.max_dag_depth:
            pairs.append((a.segment_id, b.segment_id))
    return pairs


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_evaluator_decisions_in_a_loop_respect_the_caps(data: st.DataObject) -> None:
    policy = data.draw(policies(), label="policy")
    layout = SegmentLayout.initial(data.draw(st.integers(1, 10), label="initial"))
    buckets = initial_layout_buckets(layout, data.draw(st.integers(1, 16), label="budget"))
    bucket_max = data.draw(st.integers(1, 16), label="bucket_max")
    with_buckets = data.draw(st.booleans(), label="with_buckets")
    budget = data.draw(st.sampled_from([None, 1, 4, 8]), label="bucket_budget")
    now = 1_000_000.0
    last_split_at: float | None = None
    last_merge_at: float | None = None
    for _ in range(data.draw(st.integers(1, 12), label="ticks")):
        active = layout.active()
        n_active = len(active)
        reporting = [
            s for s in active if data.draw(st.sampled_from([True] * 5 + [False]), label="reports")
        ]
        load = {s.segment_id: data.draw(samples(now), label="sample") for s in reporting}
        consumers = data.draw(
            st.one_of(
                st.just({}),
                st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 14)),
            ),
            label="consumers",
        )
        decision = decide_explained(
            layout,
            load,
            consumers,
            policy,
            now,
            last_split_at,
            last_merge_at,
            buckets=buckets if with_buckets else None,
            bucket_max=bucket_max,
            bucket_budget=budget,
        )
        action = decision.action
        demand = max(consumers.values(), default=0)
        split_open = n_active < policy.max_segments and (
            last_split_at is None or now - last_split_at >= policy.split_cooldown
        )
        hot = [s for s in active if s.segment_id in load and score(load[s.segment_id], policy) > 1]
        capacity = sum(buckets[s.segment_id] for s in active) if with_buckets else 0
        # PIP-486 (issue 14): consumers the buckets can take need nothing; below max_segments
        # a cold busiest segment is rebucketed rather than split while a segment can take
        # more buckets.
        wants_more = demand > n_active and not (with_buckets and demand <= capacity)
        splittable = [s for s in active if s.hash_range.size > 1]
        busiest_rate = max(
            (load[s.segment_id].msg_rate_in if s.segment_id in load else 0.0 for s in splittable),
            default=0.0,
        )
        cold_rebucket = (
            with_buckets
            and busiest_rate < policy.merge_msg_rate_in_threshold
            and any(buckets[s.segment_id] < bucket_max for s in active)
        )
        if not policy.enabled:
            assert action is None
        elif split_open and wants_more and splittable:
            if cold_rebucket:
                assert isinstance(action, Rebucket) and action.reason == "consumer-count"
            else:
                assert isinstance(action, Split) and action.reason == "consumer-count"
        elif split_open and any(s.hash_range.size > 1 for s in hot):
            assert isinstance(action, Split) and action.reason != "consumer-count"
        elif not isinstance(action, Rebucket) or action.reason == "idle-buckets":
            merge_open = n_active > policy.min_segments and (
                last_merge_at is None or now - last_merge_at >= policy.merge_cooldown
            )
            if merge_open and allowed_merges(layout, load, policy, now):
                assert isinstance(action, Merge)
            elif with_buckets:
                down = expected_down(
                    active, load, demand, policy, now, last_split_at, buckets, budget
                )
                assert action == down
            else:
                assert action is None

        if isinstance(action, Split):
            assert policy.enabled
            assert n_active < policy.max_segments
            assert last_split_at is None or now - last_split_at >= policy.split_cooldown
            target = layout.segments[action.segment_id]
            assert target.active and target.hash_range.size > 1
            if action.reason == "consumer-count":
                assert demand > n_active
            else:
                assert score(load[action.segment_id], policy) > 1
                best = max(score(load[s.segment_id], policy) for s in hot if s.hash_range.size > 1)
                assert score(load[action.segment_id], policy) == best
            new = layout.split(action.segment_id, action.at)
            buckets = layout_buckets(new, buckets)
            last_split_at = now
        elif isinstance(action, Merge):
            assert policy.enabled
            assert n_active > policy.min_segments
            assert last_merge_at is None or now - last_merge_at >= policy.merge_cooldown
            assert action.segment_ids in allowed_merges(layout, load, policy, now)
            for segment_id in action.segment_ids:
                assert layout.merge_depth(segment_id) < policy.max_dag_depth
            new = layout.merge(*action.segment_ids)
            assert new.merge_depth(layout.next_segment_id) <= policy.max_dag_depth
            assert len(new.active()) >= policy.min_segments
            buckets = layout_buckets(new, buckets)
            last_merge_at = now
        elif isinstance(action, Rebucket) and action.reason == "idle-buckets":
            assert with_buckets and policy.enabled and budget is not None
            share = max(1, budget // n_active)
            assert action.buckets >= share
            assert all(buckets[i] > action.buckets for i in action.segment_ids)
            after = sum(
                min(buckets[s.segment_id], action.buckets)
                if s.segment_id in action.segment_ids
                else buckets[s.segment_id]
                for s in active
            )
            assert demand <= after < sum(buckets[s.segment_id] for s in active)
            assert last_split_at is None or now - last_split_at >= policy.split_cooldown
            new = rebucket(layout, action.segment_ids)
            successors = {new.segments[i].child_ids[0]: action.buckets for i in action.segment_ids}
            buckets = layout_buckets(new, buckets, rebucketed=successors)
            last_split_at = now
        elif isinstance(action, Rebucket):
            assert with_buckets and policy.enabled
            assert demand > n_active
            at_max = n_active >= policy.max_segments
            assert at_max or busiest_rate < policy.merge_msg_rate_in_threshold
            assert last_split_at is None or now - last_split_at >= policy.split_cooldown
            assert sum(buckets[s.segment_id] for s in active) < demand
            assert 1 <= action.buckets <= bucket_max
            targets = set(action.segment_ids)
            assert targets == {
                s.segment_id for s in active if buckets[s.segment_id] < action.buckets
            }
            after = sum(max(buckets[s.segment_id], action.buckets) for s in active)
            assert after >= demand or action.buckets == bucket_max
            if action.buckets > 1:
                lower = sum(max(buckets[s.segment_id], action.buckets - 1) for s in active)
                assert lower < demand, "the level is not the smallest that covers the demand"
            new = rebucket(layout, action.segment_ids)
            successors = {new.segments[i].child_ids[0]: action.buckets for i in action.segment_ids}
            buckets = layout_buckets(new, buckets, rebucketed=successors)
            last_split_at = now
        else:
            new = layout
        if action is not None:
            assert new.epoch == layout.epoch + 1
        check_invariants(new, [0, 0x7FFF, 0x8000, RING_MAX])
        assert len(new.active()) <= max(policy.max_segments, n_active)
        layout = new
        now += data.draw(st.sampled_from([0.0, 1.0, 30.0, 60.0, 300.0, 600.0]), label="advance")
