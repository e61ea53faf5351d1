"""What the demo is waiting for, in one line, from the topic's and its Segments' real status.

Pure functions of the resources (as the API returns them), the effective auto-scale policy and
the time, so they are tested without a cluster. The rules they explain are the operator's
(``core.evaluator``): a segment splits when a rate exceeds its split threshold or when a stream
subscription has more consumers than there are active segments; two neighbours merge once both
have been below every merge threshold for ``mergeWindow`` (``updatedAt`` of a load sample is
when its rates last changed materially), unless ``mergeCooldown`` or ``minSegments`` holds them
back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.evaluator import METRICS, LoadSample
from ..core.jsontypes import JsonView
from ..core.policy import AutoScalePolicy
from ..core.resources import (
    ConditionType,
    SegmentPhase,
    SubscriptionType,
    get_condition,
    parse_time,
)

Explain = Callable[[Sequence[JsonView], AutoScalePolicy, JsonView, float], str]
"""A phase's explanation: (the topic's Segments, its policy, the topic, Unix time) → text."""


def progress_line(what: str, detail: str, elapsed: float, within: float) -> str:
    """``waiting for <what>: <detail> [<elapsed> of <within>]``."""
    state = f": {detail}" if detail else ""
    return f"  waiting for {what}{state} [{elapsed:.0f} s of {within:.0f} s]"


def leftover_shape(topic: JsonView) -> str:
    """Why ``topic`` is not in its initial shape (empty when it is): a previous run split or
    merged it, an operation is in flight, or it is being deleted."""
    meta = topic.get("metadata") or {}
    status = topic.get("status") or {}
    initial = (topic.get("spec") or {}).get("initialSegments")
    if meta.get("deletionTimestamp"):
        return "being deleted"
    operation = status.get("operation")
    if operation:
        return f"a {operation.get('kind', 'DAG')} operation in flight"
    epoch, active = status.get("epoch"), status.get("activeSegments")
    if epoch or (active is not None and active != initial):
        return f"epoch {epoch or 0}, {active} active segments"
    return ""


def is_ready(topic: JsonView) -> bool:
    """``Ready=True`` for the topic's current generation."""
    ready = get_condition((topic.get("status") or {}).get("conditions"), ConditionType.READY)
    observed = (topic.get("status") or {}).get("observedGeneration")
    generation = (topic.get("metadata") or {}).get("generation")
    return bool(ready and ready.get("status") == "True" and observed == generation)


def ready_detail(topic: JsonView) -> str:
    ready = get_condition((topic.get("status") or {}).get("conditions"), ConditionType.READY)
    if not ready:
        return "no Ready condition yet (the operator has not reconciled it)"
    message = f": {ready['message']}" if ready.get("message") else ""
    return f"Ready={ready.get('status')} ({ready.get('reason')}{message})"


@dataclass(frozen=True)
class ActiveSegment:
    segment_id: int
    start: int
    load: LoadSample | None

    @property
    def label(self) -> str:
        return f"#{self.segment_id}"


def active_segments(segments: Sequence[JsonView]) -> list[ActiveSegment]:
    """The Active segments in hash-range order (neighbours are adjacent in the list)."""
    # The operator's own reading of Segment.status.load (imported here: the controller package
    # costs a quarter of a second to import, and every `stopic` command imports this module).
    from ..controller.autoscale import load_samples

    by_id = {int(s["spec"]["segmentId"]): dict(s) for s in segments}
    loads = load_samples(by_id)
    active = [
        ActiveSegment(sid, int(s["spec"]["range"]["start"]), loads.get(sid))
        for sid, s in by_id.items()
        if (s.get("status") or {}).get("state") == SegmentPhase.ACTIVE
    ]
    return sorted(active, key=lambda s: s.start)


def _seconds(value: float) -> str:
    return f"{value:.0f} s"


def _status_time(topic: JsonView, field: str) -> float | None:
    value = (topic.get("status") or {}).get(field)
    try:
        return parse_time(str(value)) if value else None
    except ValueError:
        return None


def split_progress(
    segments: Sequence[JsonView], policy: AutoScalePolicy, topic: JsonView, now: float
) -> str:
    """Phase 1: how close the hottest active segment is to a split threshold."""
    active = active_segments(segments)
    if len(active) >= policy.max_segments:
        return f"{len(active)} active segments = maxSegments: no further split is possible"
    best: tuple[float, ActiveSegment, str, float, float] | None = None
    for seg in active:
        if seg.load is None:
            continue
        for name, _, camel in METRICS:
            rate, threshold = seg.load.rate(name), policy.split_threshold(name)
            if best is None or rate / threshold > best[0]:
                best = (rate / threshold, seg, camel, rate, threshold)
    if best is None:
        line = f"no load reported yet by the {len(active)} active segments"
    else:
        _, seg, camel, rate, threshold = best
        line = (
            f"hottest segment {seg.label} {camel} {rate:.0f}/s of the {threshold:g}/s "
            f"split threshold"
        )
    return line + _split_cooldown(policy, topic, now)


def _split_cooldown(policy: AutoScalePolicy, topic: JsonView, now: float) -> str:
    last_split = _status_time(topic, "lastSplitAt")
    if last_split is None or now - last_split >= policy.split_cooldown:
        return ""
    return (
        f"; splitCooldown: last split {_seconds(now - last_split)} ago, "
        f"{_seconds(policy.split_cooldown)} needed"
    )


def stream_consumers(topic: JsonView) -> int:
    """The most consumers any Stream subscription has, as the operator's status lists them."""
    counts = [
        len(sub.get("consumers") or [])
        for sub in (topic.get("status") or {}).get("subscriptions") or []
        if sub.get("type") == SubscriptionType.STREAM
    ]
    return max(counts, default=0)


def consumer_split_progress(
    segments: Sequence[JsonView], policy: AutoScalePolicy, topic: JsonView, now: float
) -> str:
    """Phase 2: stream consumers against active segments."""
    active = len(active_segments(segments))
    consumers = stream_consumers(topic)
    if active >= policy.max_segments:
        return f"{active} active segments = maxSegments: no consumer-count split is possible"
    line = f"{consumers} stream consumer(s) registered, {active} active segments"
    if consumers <= active:
        return f"{line} (a split comes when consumers outnumber active segments)"
    return line + (_split_cooldown(policy, topic, now) or "; the split is due now")


def cold_for(sample: LoadSample | None, policy: AutoScalePolicy, now: float) -> float | None:
    """Seconds the segment has been below every merge threshold, ``None`` if it is not."""
    if sample is None:
        return None
    if any(sample.rate(name) >= policy.merge_threshold(name) for name, _, _ in METRICS):
        return None
    return max(0.0, now - sample.modified_at)


def merge_progress(
    segments: Sequence[JsonView], policy: AutoScalePolicy, topic: JsonView, now: float
) -> str:
    """Phase 3: the coldest pair of neighbours and the gates between it and a merge."""
    active = active_segments(segments)
    if len(active) <= policy.min_segments:
        return f"{len(active)} active segments = minSegments: no merge is possible"
    pairs: list[tuple[float, ActiveSegment, ActiveSegment]] = []
    for left, right in itertools.pairwise(active):
        left_cold, right_cold = cold_for(left.load, policy, now), cold_for(right.load, policy, now)
        if left_cold is not None and right_cold is not None:
            pairs.append((min(left_cold, right_cold), left, right))
    if not pairs:
        warm = [s for s in active if cold_for(s.load, policy, now) is None]
        names = " ".join(s.label for s in warm)
        return f"no two neighbours are below the merge thresholds yet (still warm: {names})"
    cold, left, right = max(pairs, key=lambda p: (p[0], -p[1].segment_id))
    line = f"segments {left.label} {right.label} cold for {_seconds(cold)}"
    if cold < policy.merge_window:
        return f"{line} of the {_seconds(policy.merge_window)} mergeWindow"
    line += f" (mergeWindow {_seconds(policy.merge_window)} passed)"
    last_merge = _status_time(topic, "lastMergeAt")
    if last_merge is not None and now - last_merge < policy.merge_cooldown:
        return (
            f"{line}; mergeCooldown: last merge {_seconds(now - last_merge)} ago, "
            f"{_seconds(policy.merge_cooldown)} needed"
        )
    return f"{line}; the operator evaluates every {_seconds(policy.evaluation_interval)}"
