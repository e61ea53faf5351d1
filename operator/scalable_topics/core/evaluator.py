"""The auto split/merge decision (DESIGN §3, PIP-483, with PIP-486's rebucket rollover).

:func:`decide` is a pure function of a snapshot: the layout, the per-segment load samples, the
stream subscriptions' consumer counts, the resolved policy and the clock. It returns at most one
action. :func:`decide_explained` returns the same action together with the gates that held back
an action the evaluator would otherwise have taken, so the operator can count them in metrics
without re-deriving the rules.

The rules, in order:

1. Disabled policy → nothing.
2. **Split pass**, skipped when ``active >= max_segments`` or ``now - last_split_at <
   split_cooldown``.

   - Consumer-driven: when the largest stream-subscription consumer count exceeds the number of
     active segments, split the active segment with the highest ``msg_rate_in`` (no sample counts
     as 0; ties go to the lowest id). Reason ``consumer-count``. With the bucket counts known
     (PIP-486, "segments first, ``N`` once segments are capped"): nothing when the consumers do
     not outnumber the active segments' buckets (``buckets-suffice``: the controller spreads the
     buckets over them); a rebucket instead of the split when the busiest segment's
     ``msg_rate_in`` is below ``merge_msg_rate_in_threshold`` (its children would be cold and
     merge back).
   - Otherwise load-driven: a segment's score is the largest of its four ``rate / split
     threshold`` ratios; segments scoring strictly above 1 qualify and the highest score is split
     (ties: lowest id). The reason names the metric of that ratio (``msg-rate-in``,
     ``bytes-rate-in``, ``msg-rate-out``, ``bytes-rate-out``; ties between metrics go to that
     order).

   A segment whose range holds a single hash cannot split and is never chosen.
3. **Rebucket** (PIP-486), in place of a consumer-driven split that ``max_segments`` forbids:
   see :func:`_rebucket`. A rollover seals segments exactly like a split, so it is held back by
   ``split_cooldown`` too, and the operator records it as a split (``last_split_at``).
4. **Merge pass**, only when nothing above fired, ``active > min_segments`` and ``now -
   last_merge_at >= merge_cooldown``: see :func:`_merge_candidates` and :func:`_merge_pass`.
   As DESIGN §3 states it, the consumer count does not gate merges: a cold pair merges even
   while a consumer-driven split is held back by the cooldown or by ``max_segments``. The
   merge window (new children report fresh samples) bounds how often that can alternate.
5. **Rebucket down** (PIP-486 "raise fast, lower lazily"), only when nothing above fired and
   the topic's bucket budget is given: see :func:`_rebucket_down`. Reason ``idle-buckets``.

The consumer count is, per subscription, the ordered consumers that need buckets: stream and
checkpoint consumers, and the ordered workers of a Queue subscription (issue 14: "ordered queue
workers outnumbering buckets trigger the same rule"); the largest one is the demand.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .layout import SegmentInfo, SegmentLayout
from .policy import AutoScalePolicy

__all__ = [
    "METRICS",
    "Action",
    "Decision",
    "LoadSample",
    "Merge",
    "Rebucket",
    "Split",
    "Suppression",
    "decide",
    "decide_explained",
    "zero_load_status",
]

# (field of LoadSample and policy, reason string, camelCase name for messages)
METRICS: tuple[tuple[str, str, str], ...] = (
    ("msg_rate_in", "msg-rate-in", "msgRateIn"),
    ("bytes_rate_in", "bytes-rate-in", "bytesRateIn"),
    ("msg_rate_out", "msg-rate-out", "msgRateOut"),
    ("bytes_rate_out", "bytes-rate-out", "bytesRateOut"),
)


def zero_load_status(updated_at: str) -> dict[str, Any]:
    """``Segment.status.load`` of a segment that has had no traffic since ``updated_at``: what
    the operator records with a new segment's placement (its broker then writes only a move
    from zero)."""
    return {**{camel: 0.0 for _, _, camel in METRICS}, "updatedAt": updated_at}


REASON_CONSUMER_COUNT = "consumer-count"
REASON_COLD = "cold"
REASON_IDLE_BUCKETS = "idle-buckets"


@dataclass(frozen=True, slots=True)
class LoadSample:
    """A segment's last reported rates (per second) and when that report last changed.

    ``modified_at`` is the Unix time of the last *material* change (PIP-483 reporters rewrite only
    on a significant change), so a sample that is still cold and old proves the segment has been
    cold for ``now - modified_at``.
    """

    msg_rate_in: float
    bytes_rate_in: float
    msg_rate_out: float
    bytes_rate_out: float
    modified_at: float

    def __post_init__(self) -> None:
        for name, _, _ in METRICS:
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"load sample {name} must be a finite rate >= 0, got {value!r}")
        if not isinstance(self.modified_at, int | float) or not math.isfinite(self.modified_at):
            raise ValueError(
                f"load sample modified_at must be a finite time, got {self.modified_at!r}"
            )

    def rate(self, metric: str) -> float:
        return float(getattr(self, metric))


@dataclass(frozen=True, slots=True)
class Split:
    """Split ``segment_id`` (at its midpoint unless ``at`` is given). ``detail`` is for humans
    and does not take part in equality."""

    segment_id: int
    reason: str
    at: int | None = None
    detail: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Merge:
    """Merge the adjacent ``segment_ids``, given in hash-range order (lower range first)."""

    segment_ids: tuple[int, ...]
    reason: str
    detail: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Rebucket:
    """Roll each of ``segment_ids`` (hash-range order) over to a successor with ``buckets``."""

    segment_ids: tuple[int, ...]
    buckets: int
    reason: str
    detail: str = field(default="", compare=False)


Action = Split | Merge | Rebucket


class Suppression(enum.StrEnum):
    """Why an action the rules asked for was not taken (values are metric label values)."""

    DISABLED = "disabled"
    """The policy is disabled (reported on every call)."""
    MAX_SEGMENTS = "max-segments"
    """A split was wanted but the topic has ``max_segments`` active segments."""
    SPLIT_COOLDOWN = "split-cooldown"
    """A split (or rebucket) was wanted but the last split is within ``split_cooldown``."""
    UNSPLITTABLE = "unsplittable"
    """A split was wanted but every candidate's range holds a single hash."""
    BUCKETS_UNKNOWN = "buckets-unknown"
    """A rebucket was wanted but the active segments' bucket counts were not all given."""
    BUCKET_MAX = "bucket-max"
    """A rebucket was wanted but every active segment already has ``bucket_max`` buckets."""
    MIN_SEGMENTS = "min-segments"
    """A cold pair could merge but the topic has only ``min_segments`` active segments."""
    MERGE_COOLDOWN = "merge-cooldown"
    """A cold pair could merge but the last merge is within ``merge_cooldown``."""
    MAX_DAG_DEPTH = "max-dag-depth"
    """Cold adjacent pairs exist but every one of them would exceed ``max_dag_depth``."""
    BUCKETS_SUFFICE = "buckets-suffice"
    """More stream consumers than active segments, but no more than the active segments'
    entry buckets: the controller spreads the buckets over them (PIP-486 key-shared), so no
    split or rebucket is needed for them."""
    REBUCKET_DOWN_WINDOW = "rebucket-down-window"
    """Cold segments hold more buckets than the consumers need and than the budget's share,
    but have not been cold for ``rebucket_down_window`` yet (lowered lazily, PIP-486)."""
    MODE_OFF = "mode-off"
    """The cluster master switch (ConfigMap ``scalable-topics-autoscale-defaults``, ``mode:
    off``) stops every decision; reported by the operator, which then does not evaluate."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The action :func:`decide` returns, and every :class:`Suppression` met on the way."""

    action: Action | None
    suppressed: tuple[Suppression, ...] = ()


def decide(
    layout: SegmentLayout,
    load: Mapping[int, LoadSample],
    stream_consumers: Mapping[str, int],
    policy: AutoScalePolicy,
    now: float,
    last_split_at: float | None,
    last_merge_at: float | None,
    *,
    buckets: Mapping[int, int] | None = None,
    bucket_max: int = 1024,
    bucket_budget: int | None = None,
) -> Split | Merge | Rebucket | None:
    """The one action to take now, or ``None`` (see the module docstring for the rules).

    ``stream_consumers`` maps subscriptions to their ordered consumers (stream, checkpoint,
    ordered queue workers). ``buckets`` maps segment ids to their entry-bucket counts; without
    it no rebucket is ever proposed. ``bucket_max`` is PIP-486's per-segment ``N_max``;
    ``bucket_budget`` the topic's budget ``T`` (``spec.entryBuckets``): without it ``N`` is
    never lowered.
    """
    return decide_explained(
        layout,
        load,
        stream_consumers,
        policy,
        now,
        last_split_at,
        last_merge_at,
        buckets=buckets,
        bucket_max=bucket_max,
        bucket_budget=bucket_budget,
    ).action


def decide_explained(
    layout: SegmentLayout,
    load: Mapping[int, LoadSample],
    stream_consumers: Mapping[str, int],
    policy: AutoScalePolicy,
    now: float,
    last_split_at: float | None,
    last_merge_at: float | None,
    *,
    buckets: Mapping[int, int] | None = None,
    bucket_max: int = 1024,
    bucket_budget: int | None = None,
) -> Decision:
    """:func:`decide` plus the gates that held back a wanted action.

    A suppression is reported only when the rules wanted an action: ``max-segments`` and
    ``split-cooldown`` when a consumer-driven or load-driven split was called for; the merge
    gates (``min-segments``, ``merge-cooldown``, ``max-dag-depth``) only when the merge pass is
    reached and at least one adjacent pair is cold. Several may be reported at once.
    """
    if not isinstance(bucket_max, int) or isinstance(bucket_max, bool) or bucket_max < 1:
        raise ValueError(f"bucket_max must be a positive integer, got {bucket_max!r}")
    if bucket_budget is not None and (
        not isinstance(bucket_budget, int) or isinstance(bucket_budget, bool) or bucket_budget < 1
    ):
        raise ValueError(f"bucket_budget must be a positive integer, got {bucket_budget!r}")
    if not policy.enabled:
        return Decision(None, (Suppression.DISABLED,))
    active = layout.active()
    suppressed: list[Suppression] = []

    action: Action | None = _split_pass(
        active, load, stream_consumers, policy, now, last_split_at, buckets, bucket_max, suppressed
    )
    if action is None:
        action = _merge_pass(layout, active, load, policy, now, last_merge_at, suppressed)
    if action is None and bucket_budget is not None and buckets is not None:
        action = _rebucket_down(
            active,
            load,
            max(stream_consumers.values(), default=0),
            policy,
            now,
            last_split_at,
            buckets,
            bucket_budget,
            suppressed,
        )
    return Decision(action, tuple(suppressed))


# -- split ------------------------------------------------------------------------------------


def _split_pass(
    active: Sequence[SegmentInfo],
    load: Mapping[int, LoadSample],
    stream_consumers: Mapping[str, int],
    policy: AutoScalePolicy,
    now: float,
    last_split_at: float | None,
    buckets: Mapping[int, int] | None,
    bucket_max: int,
    suppressed: list[Suppression],
) -> Split | Rebucket | None:
    at_max = len(active) >= policy.max_segments
    cooling = last_split_at is not None and now - last_split_at < policy.split_cooldown
    splittable = [s for s in active if s.hash_range.size > 1]
    demand = max(stream_consumers.values(), default=0)

    known = buckets is not None and all(s.segment_id in buckets for s in active)
    capacity = sum(buckets[s.segment_id] for s in active) if buckets is not None and known else 0
    if demand > len(active) and known and demand <= capacity:
        # PIP-486: the controller spreads the buckets over the consumers; nothing to do for
        # them (the load rule below still applies).
        suppressed.append(Suppression.BUCKETS_SUFFICE)
    elif demand > len(active):
        if at_max:
            suppressed.append(Suppression.MAX_SEGMENTS)
        if cooling:
            suppressed.append(Suppression.SPLIT_COOLDOWN)
            return None
        if at_max:
            return _rebucket(active, demand, policy, buckets, bucket_max, suppressed)
        if not splittable:
            suppressed.append(Suppression.UNSPLITTABLE)
            return None
        busiest = min(splittable, key=lambda s: (-_msg_rate_in(load, s), s.segment_id))
        rate = _msg_rate_in(load, busiest)
        if known and rate < policy.merge_msg_rate_in_threshold:
            # Segments first only where throughput justifies a physical segment: children of
            # a segment below the merge threshold would be cold and merge back (use case 2).
            # When no segment can take more buckets (all at bucket_max), only a split gives
            # the consumers work, so it is split after all.
            rebucket = _rebucket(
                active,
                demand,
                policy,
                buckets,
                bucket_max,
                [],
                why=(
                    f"busiest segment {busiest.descriptor} msgRateIn {rate:g}/s is below the "
                    f"merge threshold {policy.merge_msg_rate_in_threshold:g}/s"
                ),
            )
            if rebucket is not None:
                return rebucket
        return Split(
            busiest.segment_id,
            REASON_CONSUMER_COUNT,
            detail=(
                f"{demand} ordered consumers on a subscription exceed {len(active)} active "
                f"segments; busiest segment {busiest.descriptor} "
                f"(msgRateIn {_msg_rate_in(load, busiest):g}/s)"
            ),
        )

    hot = [s for s in active if s.segment_id in load and _score(load[s.segment_id], policy)[0] > 1]
    if not hot:
        return None
    if at_max:
        suppressed.append(Suppression.MAX_SEGMENTS)
    if cooling:
        suppressed.append(Suppression.SPLIT_COOLDOWN)
    if at_max or cooling:
        return None
    candidates = [s for s in hot if s.hash_range.size > 1]
    if not candidates:
        suppressed.append(Suppression.UNSPLITTABLE)
        return None
    hottest = min(candidates, key=lambda s: (-_score(load[s.segment_id], policy)[0], s.segment_id))
    score, metric = _score(load[hottest.segment_id], policy)
    name, reason, camel = next(m for m in METRICS if m[0] == metric)
    rate = load[hottest.segment_id].rate(name)
    threshold = policy.split_threshold(name)
    return Split(
        hottest.segment_id,
        reason,
        detail=(
            f"segment {hottest.descriptor} {camel} {rate:g}/s is {score:.3g}x the split "
            f"threshold {threshold:g}/s"
        ),
    )


def _msg_rate_in(load: Mapping[int, LoadSample], segment: SegmentInfo) -> float:
    sample = load.get(segment.segment_id)
    return 0.0 if sample is None else sample.msg_rate_in


def _score(sample: LoadSample, policy: AutoScalePolicy) -> tuple[float, str]:
    """The largest ``rate / split threshold`` ratio and its metric (first metric on ties)."""
    best_ratio, best_metric = -1.0, METRICS[0][0]
    for name, _, _ in METRICS:
        ratio = sample.rate(name) / policy.split_threshold(name)
        if ratio > best_ratio:
            best_ratio, best_metric = ratio, name
    return best_ratio, best_metric


# -- rebucket ---------------------------------------------------------------------------------


def _rebucket(
    active: Sequence[SegmentInfo],
    demand: int,
    policy: AutoScalePolicy,
    buckets: Mapping[int, int] | None,
    bucket_max: int,
    suppressed: list[Suppression],
    why: str | None = None,
) -> Rebucket | None:
    """PIP-486's lever beyond ``max_segments`` (or below it when throughput does not justify a
    split, ``why``): raise the smallest bucket counts.

    With ``C`` the largest stream-subscription consumer count and ``b_s`` the bucket count of
    active segment ``s``, nothing is needed when ``sum(b_s) >= C``. Otherwise the target is the
    smallest integer ``K`` in ``(min b_s, bucket_max]`` with ``sum(max(b_s, K)) >= C`` — or
    ``bucket_max`` itself when even that falls short — and every active segment with
    ``b_s < K`` is rolled over to ``K`` buckets. So exactly the segments with the smallest counts
    are rebucketed, all to one count, as few buckets are added as a single common level allows,
    and no segment ever goes above ``bucket_max``. Returns ``None`` when ``buckets`` does not
    cover every active segment (``buckets-unknown``) or every segment already has
    ``bucket_max`` buckets or more (``bucket-max``).
    """
    if buckets is None or any(s.segment_id not in buckets for s in active):
        suppressed.append(Suppression.BUCKETS_UNKNOWN)
        return None
    counts = {s.segment_id: buckets[s.segment_id] for s in active}
    for segment_id, count in counts.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"bucket count of segment {segment_id} must be >= 1, got {count!r}")
    total = sum(counts.values())
    if total >= demand:
        return None
    smallest = min(counts.values())
    if smallest >= bucket_max:
        suppressed.append(Suppression.BUCKET_MAX)
        return None

    def total_at(level: int) -> int:
        return sum(max(count, level) for count in counts.values())

    low, high = smallest + 1, bucket_max
    if total_at(high) >= demand:
        while low < high:
            mid = (low + high) // 2
            if total_at(mid) >= demand:
                high = mid
            else:
                low = mid + 1
    level = high
    targets = tuple(s.segment_id for s in active if counts[s.segment_id] < level)
    return Rebucket(
        targets,
        level,
        REASON_CONSUMER_COUNT,
        detail=(
            f"{demand} ordered consumers on a subscription exceed {len(active)} active segments "
            f"{why or f'at maxSegments {policy.max_segments}'} and their {total} buckets; "
            f"buckets {total} -> {total_at(level)}"
        ),
    )


def _rebucket_down(
    active: Sequence[SegmentInfo],
    load: Mapping[int, LoadSample],
    demand: int,
    policy: AutoScalePolicy,
    now: float,
    last_split_at: float | None,
    buckets: Mapping[int, int],
    bucket_budget: int,
    suppressed: list[Suppression],
) -> Rebucket | None:
    """Lower ``N`` lazily (PIP-486): the mirror of :func:`_rebucket`.

    A segment has *surplus* buckets when it has more than the budget's share ``max(1, T //
    active)`` (what a new segment gets: the standing fan-out headroom is kept). It is *idle*
    when its sample is cold (all four rates below the merge thresholds) and has been for
    ``rebucket_down_window`` (``now - modified_at``). Nothing happens while the buckets are
    all needed (``sum(b_s) <= C``). Otherwise the target is the smallest level ``K >= share``
    with ``sum over idle surplus segments of min(b_s, K)`` plus every other segment's count
    ``>= C``, and the idle surplus segments above ``K`` are rolled over to ``K`` - so the
    consumers keep a bucket each and no raise is undone while they need it. A rollover seals
    segments: ``split_cooldown`` holds it back too. Surplus on cold segments not idle long
    enough is reported as ``rebucket-down-window``.
    """
    if any(s.segment_id not in buckets for s in active) or not active:
        return None
    counts = {s.segment_id: buckets[s.segment_id] for s in active}
    total = sum(counts.values())
    share = max(1, bucket_budget // len(active))
    surplus = [s for s in active if counts[s.segment_id] > share]
    if total <= demand or not surplus:
        return None
    window = policy.rebucket_down_window
    cold = [s for s in surplus if _is_cold(load.get(s.segment_id), policy, now, window=0.0)]
    idle = [s for s in cold if _is_cold(load.get(s.segment_id), policy, now, window=window)]
    if not idle:
        if cold:
            suppressed.append(Suppression.REBUCKET_DOWN_WINDOW)
        return None
    idle_ids = {s.segment_id for s in idle}
    others = sum(n for i, n in counts.items() if i not in idle_ids)
    highest = max(counts[i] for i in idle_ids)

    def total_at(level: int) -> int:
        return others + sum(min(counts[i], level) for i in idle_ids)

    level = next((k for k in range(share, highest) if total_at(k) >= demand), None)
    if level is None:
        return None
    if last_split_at is not None and now - last_split_at < policy.split_cooldown:
        suppressed.append(Suppression.SPLIT_COOLDOWN)
        return None
    targets = tuple(
        s.segment_id for s in active if s.segment_id in idle_ids and counts[s.segment_id] > level
    )
    return Rebucket(
        targets,
        level,
        REASON_IDLE_BUCKETS,
        detail=(
            f"{len(targets)} segment(s) cold for rebucketDownWindow {window:g}s hold more "
            f"buckets than {demand} ordered consumers need (budget share {share}); buckets "
            f"{total} -> {total_at(level)}"
        ),
    )


# -- merge ------------------------------------------------------------------------------------


def _is_cold(
    sample: LoadSample | None, policy: AutoScalePolicy, now: float, window: float | None = None
) -> bool:
    """All four rates below the merge thresholds, for at least ``window`` (default
    ``merge_window``)."""
    span = policy.merge_window if window is None else window
    if sample is None or now - sample.modified_at < span:
        return False
    return all(sample.rate(name) < policy.merge_threshold(name) for name, _, _ in METRICS)


def _merge_ancestry(layout: SegmentLayout, segment_id: int) -> frozenset[int]:
    """Merge-created segments among ``segment_id`` and its ancestors (``merge_depth`` counts
    them)."""
    ids = layout.ancestors(segment_id) | {segment_id}
    return frozenset(i for i in ids if len(layout.segments[i].parent_ids) >= 2)


def _merge_candidates(
    layout: SegmentLayout,
    active: Sequence[SegmentInfo],
    load: Mapping[int, LoadSample],
    policy: AutoScalePolicy,
    now: float,
) -> tuple[list[tuple[SegmentInfo, SegmentInfo]], bool]:
    """Adjacent cold pairs that may merge, and whether any cold pair was refused for depth.

    A pair is cold when both segments have a sample at least ``merge_window`` old (``now -
    modified_at >= merge_window``) with all four rates strictly below the merge thresholds.
    DESIGN's depth rule is "neither side's ``merge_depth >= max_dag_depth``"; PIP-483 adds that
    "the result respects ``maxDagDepth``". The rule alone does not imply the second: the child's
    depth is one plus the merge-created segments in *both* lineages, e.g. two sides of depth 2
    with disjoint histories give a child of depth 5. So a pair is refused unless the child's
    depth, ``1 + len(merges(a) | merges(b))``, is at most ``max_dag_depth``; that also implies the
    side rule, since each side's depth is below the child's.
    """
    cold_pairs = [
        (left, right)
        for left, right in itertools.pairwise(active)
        if _is_cold(load.get(left.segment_id), policy, now)
        and _is_cold(load.get(right.segment_id), policy, now)
    ]
    allowed = []
    for left, right in cold_pairs:
        left_merges = _merge_ancestry(layout, left.segment_id)
        right_merges = _merge_ancestry(layout, right.segment_id)
        if (
            len(left_merges) < policy.max_dag_depth
            and len(right_merges) < policy.max_dag_depth
            and 1 + len(left_merges | right_merges) <= policy.max_dag_depth
        ):
            allowed.append((left, right))
    return allowed, bool(cold_pairs) and not allowed


def _merge_pass(
    layout: SegmentLayout,
    active: Sequence[SegmentInfo],
    load: Mapping[int, LoadSample],
    policy: AutoScalePolicy,
    now: float,
    last_merge_at: float | None,
    suppressed: list[Suppression],
) -> Merge | None:
    """Merge the coldest allowed pair.

    "Coldest" orders pairs by the sum of both segments' ``msg_rate_in + msg_rate_out``, then by
    the sum of their ``bytes_rate_in + bytes_rate_out``, then by the lower id of the pair and the
    higher id. The merge names the pair in hash-range order, which becomes the child's
    ``parentIds`` order.
    """
    allowed, depth_refused = _merge_candidates(layout, active, load, policy, now)
    if depth_refused:
        suppressed.append(Suppression.MAX_DAG_DEPTH)
    if not allowed:
        return None
    blocked = False
    if len(active) <= policy.min_segments:
        suppressed.append(Suppression.MIN_SEGMENTS)
        blocked = True
    if last_merge_at is not None and now - last_merge_at < policy.merge_cooldown:
        suppressed.append(Suppression.MERGE_COOLDOWN)
        blocked = True
    if blocked:
        return None

    def coldness(pair: tuple[SegmentInfo, SegmentInfo]) -> tuple[float, float, int, int]:
        samples = [load[s.segment_id] for s in pair]
        msgs = sum(s.msg_rate_in + s.msg_rate_out for s in samples)
        data = sum(s.bytes_rate_in + s.bytes_rate_out for s in samples)
        low_id, high_id = sorted(s.segment_id for s in pair)
        return msgs, data, low_id, high_id

    left, right = min(allowed, key=coldness)
    msgs, data, _, _ = coldness((left, right))
    return Merge(
        (left.segment_id, right.segment_id),
        REASON_COLD,
        detail=(
            f"segments {left.descriptor} and {right.descriptor} cold for at least "
            f"{policy.merge_window:g}s: {msgs:g} msg/s, {data:g} bytes/s together"
        ),
    )
