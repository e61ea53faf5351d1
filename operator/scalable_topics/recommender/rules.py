"""From per-segment window aggregates to a topic's recommendation (pure; no Spark, no I/O).

The decisions are the core evaluator's (:func:`scalable_topics.core.evaluator.decide`), not a
second copy of the policy. What the recommender adds is what only a window of history can give:

- **Rates.** A segment's :class:`LoadSample` carries its window means, except ``msg_rate_in``,
  which is ``max(mean, trend estimate at now)``: the least-squares line through the window's
  samples, evaluated at ``now``. A segment ramping up is split before its mean catches up,
  and a segment that cooled off is not split for its past.
- **Coldness.** ``modified_at`` is the start of the segment's cold stretch: the last sample in the
  window with any rate at or above its merge threshold, else the start of the window (when the
  segment has samples from its start), else its first sample. The plan runs the evaluator with
  ``merge_window`` raised to the window length, so a pair merges only when both sides were cold
  for the whole window.
- **Split points.** A split lands at the traffic median of the segment's key histogram summed
  over the window (:func:`balanced_split_point`) when that differs from the midpoint by more
  than a tolerance.
- **A plan, not one step.** The evaluator is applied repeatedly to a simulated layout (cooldowns
  off: they are the controller's to enforce when it accepts an action), with split children
  inheriting their share of the parent's load from the histogram. ``recommendedSegments`` is the
  size of the final simulated layout. Only actions on segments of the current layout (each
  segment at most once) are emitted, since only those can be checked against ``basedOnEpoch``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scalable_topics.core.buckets import N_MAX, rebucket
from scalable_topics.core.evaluator import (
    METRICS,
    LoadSample,
    Merge,
    Rebucket,
    Split,
    decide,
)
from scalable_topics.core.hashing import RING_MAX
from scalable_topics.core.layout import HashRange, SegmentInfo, SegmentLayout
from scalable_topics.core.policy import AutoScalePolicy, format_duration

HIST_BINS = 16
DEFAULT_TOLERANCE = 1 / 16
RATE_NAMES = tuple(camel for _, _, camel in METRICS)  # msgRateIn, bytesRateIn, ...


@dataclass(frozen=True)
class SegmentStats:
    """What the Spark job computes for one segment over the window (small; sent to the driver).

    ``mean``/``p95`` are keyed by the record field names (``msgRateIn`` …); ``slope`` is the
    least-squares slope of ``msgRateIn`` in messages/s per second, ``fit_at_mid``/``mid_ts`` the
    fitted value at the mean sample time. ``last_hot_ts`` is the time of the last sample with any
    rate at or above its merge threshold (``None`` when there is none in the window).
    """

    namespace: str
    topic: str
    segment_id: int
    range_start: int
    range_end: int
    samples: int
    first_ts: float
    last_ts: float
    mean: Mapping[str, float]
    p95: Mapping[str, float]
    slope: float
    mid_ts: float
    last_hot_ts: float | None
    hist: Sequence[int]
    messages_in: int = 0

    @property
    def hash_range(self) -> HashRange:
        return HashRange(self.range_start, self.range_end)

    @property
    def descriptor(self) -> str:
        return f"{self.range_start:04x}-{self.range_end:04x}-{self.segment_id}"

    def estimate_at(self, ts: float) -> float:
        """The least-squares line of ``msgRateIn`` evaluated at ``ts`` (never below 0)."""
        return max(0.0, self.mean["msgRateIn"] + self.slope * (ts - self.mid_ts))


@dataclass(frozen=True)
class Window:
    """The analysed window ``(start, end]`` and the sampling interval of the history."""

    start: float
    end: float
    interval: float = 10.0

    @property
    def length(self) -> float:
        return self.end - self.start


# -- histograms -------------------------------------------------------------------------------


def _edges(hash_range: HashRange) -> list[int]:
    size = hash_range.size
    return [hash_range.start + i * size // HIST_BINS for i in range(HIST_BINS + 1)]


def _check_hist(hist: Sequence[int | float]) -> list[float]:
    if len(hist) != HIST_BINS:
        raise ValueError(f"a key histogram has {HIST_BINS} bins, got {len(hist)}")
    values = [float(v) for v in hist]
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"key histogram counts must be finite and >= 0, got {list(hist)}")
    return values


def weight_below(hash_range: HashRange, hist: Sequence[int | float], point: float) -> float:
    """Histogram weight of the hashes ``< point`` (uniform within a bin; hash ``h`` spans
    ``[h, h+1)``)."""
    values = _check_hist(hist)
    edges = _edges(hash_range)
    total = 0.0
    for i, weight in enumerate(values):
        lo, hi = edges[i], edges[i + 1]
        if hi <= lo or weight == 0:
            continue
        covered = min(max(point - lo, 0.0), hi - lo)
        total += weight * covered / (hi - lo)
    return total


def traffic_median(hash_range: HashRange, hist: Sequence[int | float]) -> float | None:
    """The point ``m`` (a real in ``[start, end+1]``) with half the weight below it, or
    ``None`` for an empty histogram. Linear interpolation inside the bin that crosses half."""
    values = _check_hist(hist)
    total = sum(values)
    if total <= 0:
        return None
    edges = _edges(hash_range)
    half, cumulative = total / 2, 0.0
    for i, weight in enumerate(values):
        lo, hi = edges[i], edges[i + 1]
        if hi <= lo or weight == 0:
            continue
        if cumulative + weight >= half:
            return lo + (hi - lo) * (half - cumulative) / weight
        cumulative += weight
    return float(hash_range.end + 1)


def balanced_split_point(
    hash_range: HashRange,
    hist: Sequence[int | float],
    tolerance: float = DEFAULT_TOLERANCE,
) -> int | None:
    """The ``at`` of a traffic-balanced split, or ``None`` to split at the midpoint.

    ``at`` is the last hash of the lower child, so the lower child ``[start, at]`` holds the hashes
    below the rounded traffic median. It is ``None`` when the histogram is empty, the range holds
    one hash, or the balanced point is within ``tolerance * size`` of the midpoint (a split at
    the midpoint is then as good, and keeps ranges aligned).
    """
    if not 0 <= tolerance < 1:
        raise ValueError(f"split tolerance must be in [0, 1), got {tolerance!r}")
    if hash_range.size == 1:
        return None
    median = traffic_median(hash_range, hist)
    if median is None:
        return None
    at = min(max(round(median) - 1, hash_range.start), hash_range.end - 1)
    if abs(at - hash_range.midpoint()) <= tolerance * hash_range.size:
        return None
    return at


def rebin(hash_range: HashRange, hist: Sequence[int | float], sub_range: HashRange) -> list[float]:
    """The histogram of ``sub_range`` (inside ``hash_range``) implied by ``hist``, assuming keys
    are uniform within each of ``hist``'s bins. Used to carry a split parent's key distribution
    to its simulated children."""
    if not (hash_range.start <= sub_range.start and sub_range.end <= hash_range.end):
        raise ValueError(f"{sub_range.hex()} is not inside {hash_range.hex()}")
    sub_edges = _edges(sub_range)
    return [
        weight_below(hash_range, hist, sub_edges[i + 1])
        - weight_below(hash_range, hist, sub_edges[i])
        for i in range(HIST_BINS)
    ]


# -- load samples -----------------------------------------------------------------------------


def cold_since(stats: SegmentStats, window: Window) -> float:
    """Start of the segment's current cold stretch (see the module docstring)."""
    if stats.last_hot_ts is not None:
        return stats.last_hot_ts
    if stats.first_ts <= window.start + 1.5 * window.interval:
        return window.start
    return stats.first_ts


def load_sample(stats: SegmentStats, window: Window) -> LoadSample:
    return LoadSample(
        msg_rate_in=max(stats.mean["msgRateIn"], stats.estimate_at(window.end)),
        bytes_rate_in=stats.mean["bytesRateIn"],
        msg_rate_out=stats.mean["msgRateOut"],
        bytes_rate_out=stats.mean["bytesRateOut"],
        modified_at=cold_since(stats, window),
    )


def planning_policy(policy: AutoScalePolicy, window: Window) -> AutoScalePolicy:
    """The policy with ``merge_window`` raised to the window: "cold for the whole window".

    A hair below the exact length so that ``now - window.start`` (rounding aside) qualifies.
    """
    needed = max(policy.merge_window, window.length - 1e-6)
    return policy.model_copy(update={"merge_window": needed})


# -- the plan ---------------------------------------------------------------------------------


@dataclass
class _Sim:
    layout: SegmentLayout
    load: dict[int, LoadSample]
    hists: dict[int, list[float]]
    buckets: dict[int, int] | None
    now: float

    def split(self, action: Split, at: int | None) -> tuple[int, int]:
        parent = self.layout.get(action.segment_id)
        self.layout = self.layout.split(action.segment_id, at)
        low_id, high_id = self.layout.get(action.segment_id).child_ids
        hist = self.hists.get(action.segment_id)
        sample = self.load.get(action.segment_id)
        share = 0.5
        if hist is not None and sum(hist) > 0:
            point = self.layout.get(low_id).hash_range.end + 1
            share = weight_below(parent.hash_range, hist, point) / sum(hist)
        for child_id, part in ((low_id, share), (high_id, 1 - share)):
            child = self.layout.get(child_id)
            if hist is not None:
                self.hists[child_id] = rebin(parent.hash_range, hist, child.hash_range)
            if sample is not None:
                # A new segment has no cold history of its own.
                self.load[child_id] = LoadSample(
                    sample.msg_rate_in * part,
                    sample.bytes_rate_in * part,
                    sample.msg_rate_out * part,
                    sample.bytes_rate_out * part,
                    modified_at=self.now,
                )
            if self.buckets is not None and action.segment_id in self.buckets:
                self.buckets[child_id] = max(1, self.buckets[action.segment_id] // 2)
        return low_id, high_id

    def merge(self, action: Merge) -> None:
        child_id = self.layout.next_segment_id
        self.layout = self.layout.merge(*action.segment_ids)
        samples = [self.load[i] for i in action.segment_ids if i in self.load]
        self.load[child_id] = LoadSample(
            sum(s.msg_rate_in for s in samples),
            sum(s.bytes_rate_in for s in samples),
            sum(s.msg_rate_out for s in samples),
            sum(s.bytes_rate_out for s in samples),
            modified_at=self.now,
        )
        if self.buckets is not None and all(i in self.buckets for i in action.segment_ids):
            self.buckets[child_id] = min(N_MAX, sum(self.buckets[i] for i in action.segment_ids))

    def rebucket(self, action: Rebucket) -> None:
        self.layout = rebucket(self.layout, action.segment_ids)
        for old in action.segment_ids:
            (successor,) = self.layout.get(old).child_ids
            if old in self.load:
                self.load[successor] = self.load[old]
            if old in self.hists:
                self.hists[successor] = self.hists[old]
            if self.buckets is not None:
                self.buckets[successor] = action.buckets


@dataclass
class TopicPlan:
    """A topic's recommendation before it is dressed as ``status.recommendation``."""

    recommended_segments: int
    actions: list[dict[str, Any]] = field(default_factory=list)
    follow_ups: int = 0


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _rates_text(stats: SegmentStats, window: Window) -> str:
    slope_h = stats.slope * 3600
    sign = "+" if slope_h >= 0 else "-"
    return (
        f"msgRateIn mean {_fmt(stats.mean['msgRateIn'])}/s, p95 {_fmt(stats.p95['msgRateIn'])}/s, "
        f"trend {sign}{_fmt(abs(slope_h))}/s per hour, "
        f"estimate now {_fmt(stats.estimate_at(window.end))}/s; "
        f"bytesRateIn mean {_fmt(stats.mean['bytesRateIn'])}/s; "
        f"msgRateOut mean {_fmt(stats.mean['msgRateOut'])}/s; "
        f"bytesRateOut mean {_fmt(stats.mean['bytesRateOut'])}/s "
        f"({stats.samples} samples over {format_duration(round(window.length))})"
    )


def _stats_detail(stats: SegmentStats, window: Window) -> dict[str, Any]:
    return {
        "segment": stats.descriptor,
        "samples": stats.samples,
        "mean": {k: round(stats.mean[k], 3) for k in RATE_NAMES},
        "p95": {k: round(stats.p95[k], 3) for k in RATE_NAMES},
        "msgRateInTrendPerHour": round(stats.slope * 3600, 3),
        "msgRateInEstimateNow": round(stats.estimate_at(window.end), 3),
        "coldFor": round(window.end - cold_since(stats, window), 3),
    }


def _split_action(
    action: Split,
    at: int | None,
    stats: SegmentStats | None,
    window: Window,
    share: float | None,
    tolerance: float,
) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if stats is None:
        text = action.detail
    else:
        extra = _stats_detail(stats, window)
        extra["keyHistogram"] = [int(v) for v in stats.hist]
        hash_range = stats.hash_range
        median = traffic_median(hash_range, stats.hist)
        if median is not None:
            extra["trafficMedian"] = round(median, 1)
        if share is not None:
            extra["lowerShare"] = round(share, 4)
        if at is not None and share is not None:
            point = (
                f"at 0x{at:04x}, the traffic median (midpoint 0x{hash_range.midpoint():04x}); "
                f"the lower child takes {share:.0%} of the keyed traffic"
            )
        elif median is not None:
            point = (
                f"at the midpoint 0x{hash_range.midpoint():04x} (the traffic median is within "
                f"{tolerance:.3g} of the range of it)"
            )
        else:
            point = f"at the midpoint 0x{hash_range.midpoint():04x} (no keyed traffic)"
        text = f"{action.detail}; split {point}; {_rates_text(stats, window)}"
    return {
        "kind": "split",
        "segments": [action.segment_id],
        "at": at,
        "buckets": None,
        "reason": action.reason,
        "detail": text,
        "stats": extra,
    }


def _merge_action(
    action: Merge, stats: Mapping[int, SegmentStats], window: Window, policy: AutoScalePolicy
) -> dict[str, Any]:
    parts = []
    extra = []
    for segment_id in action.segment_ids:
        s = stats.get(segment_id)
        if s is None:
            continue
        extra.append(_stats_detail(s, window))
        parts.append(
            f"{s.descriptor} cold for {format_duration(round(window.end - cold_since(s, window)))} "
            f"(msgRateIn mean {_fmt(s.mean['msgRateIn'])}/s, p95 {_fmt(s.p95['msgRateIn'])}/s, "
            f"msgRateOut mean {_fmt(s.mean['msgRateOut'])}/s)"
        )
    thresholds = ", ".join(
        f"{camel} < {_fmt(policy.merge_threshold(name))}" for name, _, camel in METRICS
    )
    return {
        "kind": "merge",
        "segments": list(action.segment_ids),
        "at": None,
        "buckets": None,
        "reason": action.reason,
        "detail": (
            f"{' and '.join(parts)}: every sample of the {format_duration(round(window.length))} "
            f"window had {thresholds}"
        ),
        "stats": {"segments": extra},
    }


def _rebucket_action(action: Rebucket, consumers: Mapping[str, int]) -> dict[str, Any]:
    return {
        "kind": "rebucket",
        "segments": list(action.segment_ids),
        "at": None,
        "buckets": action.buckets,
        "reason": action.reason,
        "detail": action.detail,
        "stats": {"streamConsumers": dict(sorted(consumers.items()))},
    }


def plan_topic(
    stats: Sequence[SegmentStats],
    layout: SegmentLayout,
    policy: AutoScalePolicy,
    window: Window,
    *,
    stream_consumers: Mapping[str, int] | None = None,
    buckets: Mapping[int, int] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    bucket_max: int = N_MAX,
) -> TopicPlan:
    """Run the evaluator to a fixed point on a simulated layout (see the module docstring).

    ``stats`` may include segments that are no longer active (sealed within the window); only the
    layout's active segments are considered. A segment whose stats show a different range than
    the layout's is ignored (the history and the layout disagree on what that id is).
    """
    consumers = dict(stream_consumers or {})
    active_ids = {s.segment_id for s in layout.active()}
    by_id: dict[int, SegmentStats] = {}
    for s in stats:
        info = layout.segments.get(s.segment_id)
        if info is None or s.segment_id not in active_ids:
            continue
        if (info.hash_range.start, info.hash_range.end) != (s.range_start, s.range_end):
            continue
        by_id[s.segment_id] = s
    sim = _Sim(
        layout=layout,
        load={i: load_sample(s, window) for i, s in by_id.items()},
        hists={i: [float(v) for v in s.hist] for i, s in by_id.items()},
        buckets=dict(buckets) if buckets is not None else None,
        now=window.end,
    )
    plan_pol = planning_policy(policy, window)
    plan = TopicPlan(recommended_segments=len(active_ids))
    touched: set[int] = set()
    limit = 4 * policy.max_segments + 4 * len(active_ids) + 16
    for _ in range(limit):
        action = decide(
            sim.layout,
            sim.load,
            consumers,
            plan_pol,
            window.end,
            None,
            None,
            buckets=sim.buckets,
            bucket_max=bucket_max,
        )
        if action is None:
            break
        ids = _segments_of(action)
        emit = all(i in active_ids and i not in touched for i in ids)
        if isinstance(action, Split):
            hist = sim.hists.get(action.segment_id)
            parent_range = sim.layout.get(action.segment_id).hash_range
            at = balanced_split_point(parent_range, hist, tolerance) if hist else None
            share = None
            if hist is not None and sum(hist) > 0:
                point = (at if at is not None else parent_range.midpoint()) + 1
                share = weight_below(parent_range, hist, point) / sum(hist)
            sim.split(action, at)
            if emit:
                plan.actions.append(
                    _split_action(
                        action,
                        at,
                        by_id.get(action.segment_id),
                        window,
                        share,
                        tolerance,
                    )
                )
        elif isinstance(action, Merge):
            sim.merge(action)
            if emit:
                plan.actions.append(_merge_action(action, by_id, window, policy))
        else:
            sim.rebucket(action)
            if emit:
                plan.actions.append(_rebucket_action(action, consumers))
        if emit:
            touched.update(ids)
        else:
            plan.follow_ups += 1
    plan.recommended_segments = len(sim.layout.active())
    return plan


def _segments_of(action: Split | Merge | Rebucket) -> tuple[int, ...]:
    if isinstance(action, Split):
        return (action.segment_id,)
    return tuple(action.segment_ids)


def recommendation(
    plan: TopicPlan,
    *,
    computed_at: str,
    window: Window,
    based_on_epoch: int | None,
    based_on_generation: int | None = None,
) -> dict[str, Any]:
    """The ``status.recommendation`` object (DESIGN §8; ``core.resources.Recommendation``)."""
    result: dict[str, Any] = {
        "computedAt": computed_at,
        "window": format_duration(round(window.length)),
        "basedOnEpoch": based_on_epoch,
        "recommendedSegments": plan.recommended_segments,
        "actions": plan.actions,
    }
    if based_on_generation is not None:
        result["basedOnGeneration"] = based_on_generation
    return result


# -- layouts without a cluster ----------------------------------------------------------------


def infer_layout(stats: Sequence[SegmentStats], window: Window) -> SegmentLayout:
    """A stand-in layout for ``--dry-run`` without a cluster: the segments that reported in the
    topic's last interval (within 1.5 intervals of its latest sample) are the active ones.

    The result may not partition the ring when the history is incomplete; adjacency (and so
    merges) then only holds where ranges touch. ``epoch`` is unknown and set to 0.
    """
    if not stats:
        raise ValueError("cannot infer a layout from no segments")
    latest = max(s.last_ts for s in stats)
    current = [s for s in stats if s.last_ts >= latest - 1.5 * window.interval]
    current.sort(key=lambda s: (s.range_start, s.segment_id))
    segments: dict[int, SegmentInfo] = {}
    covered_to = -1
    for s in current:
        if s.range_start <= covered_to:
            continue  # overlapping report (a stale segment): keep the first in ring order
        segments[s.segment_id] = SegmentInfo(s.segment_id, s.hash_range)
        covered_to = s.range_end
    next_id = max(s.segment_id for s in stats) + 1
    return SegmentLayout(epoch=0, next_segment_id=next_id, segments=segments)


def ring_covered(layout: SegmentLayout) -> bool:
    expected = 0
    for s in layout.active():
        if s.hash_range.start != expected:
            return False
        expected = s.hash_range.end + 1
    return expected == RING_MAX + 1
