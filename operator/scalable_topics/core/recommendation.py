"""Whether the controller may act on the recommender's ``status.recommendation`` (DESIGN §8).

The recommender (a batch job) plans from an hour of history; the controller decides now. It
takes a recommended action only when all of these hold:

- the recommendation is **fresh**: ``now - computedAt <= freshness`` (default 20 min, twice the
  job's 10-minute schedule, so one missed run does not silence it);
- it was computed on the **current layout**: ``basedOnEpoch == layout.epoch`` (any split, merge or
  rollover since then makes every action in it stale);
- the action passes the **same guards** as the evaluator's own decisions: the policy is enabled;
  a split needs ``active < maxSegments`` and no split within ``splitCooldown``; a merge needs
  ``active - (k - 1) >= minSegments``, no merge within ``mergeCooldown``, and a child whose
  ``merge_depth`` is at most ``maxDagDepth``; a rebucket is held by ``splitCooldown`` (as the
  evaluator's) and must raise each segment's bucket count within ``bucket_max``; and the named
  segments must still be active (and, for a merge, adjacent; for a split, ``at`` inside the
  range). The layout itself checks the structural part: an action is accepted only if applying
  it to the layout succeeds;
- the action passes the **thresholds of the policy in force** (the controller's resolution:
  topic, namespace annotation, cluster ConfigMap, defaults), re-checked on the window figures
  the recommender wrote in the action's ``stats``: a load split needs a rate above its split
  threshold (``msgRateIn`` is the larger of the window mean and the trend's estimate now, as
  the recommender plans), a merge needs every named segment's p95 rates below the merge
  thresholds. The recommender may have planned with another policy (an older run, another
  level); without the figures the action cannot be checked and is refused.

Actions are tried in the recommendation's order and the first acceptable one is returned; the
verdict's ``reason`` says why each earlier one (or all of them) was refused, so the operator's
events can say which source decided and why a recommendation was ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .buckets import N_MAX
from .evaluator import METRICS, Merge, Rebucket, Split
from .layout import SegmentLayout
from .policy import AutoScalePolicy, format_duration
from .resources import parse_time

__all__ = ["DEFAULT_FRESHNESS", "SOURCE", "Verdict", "accept"]

DEFAULT_FRESHNESS = 1200.0
SOURCE = "recommendation"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The action to take (``None`` when the recommendation is ignored) and why.

    ``index`` is the accepted action's position in ``actions``; ``rejected`` lists ``(index,
    reason)`` for every action refused before it (or all of them).
    """

    action: Split | Merge | Rebucket | None
    reason: str
    index: int | None = None
    rejected: tuple[tuple[int, str], ...] = ()
    source: str = SOURCE


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, Sequence) or isinstance(value, str):
        return None
    result = []
    for item in value:
        if not isinstance(item, int) or isinstance(item, bool):
            return None
        result.append(item)
    return result


def _ago(seconds: float) -> str:
    return format_duration(max(0, round(seconds)))


def _check_cooldown(kind: str, last_at: float | None, cooldown: float, now: float) -> str | None:
    if last_at is not None and now - last_at < cooldown:
        return (
            f"last {kind} {_ago(now - last_at)} ago is within the {kind} cooldown "
            f"{format_duration(cooldown)}"
        )
    return None


_LOAD_REASONS = {reason: (name, camel) for name, reason, camel in METRICS}


def _rates(figures: Any) -> dict[str, float] | None:
    """``{"msgRateIn": …, …}`` with all four rates as finite numbers, else ``None``."""
    if not isinstance(figures, Mapping):
        return None
    rates = {}
    for _, _, camel in METRICS:
        value = figures.get(camel)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            return None
        rates[camel] = float(value)
    return rates


def _split_thresholds_problem(action: Mapping[str, Any], policy: AutoScalePolicy) -> str | None:
    """Why a load split is not above any split threshold of ``policy`` (``None``: it is, or
    the split is not load-driven)."""
    if action.get("reason") not in _LOAD_REASONS:
        return None
    stats = action.get("stats")
    rates = _rates(stats.get("mean")) if isinstance(stats, Mapping) else None
    if rates is None:
        return "no window rates (stats.mean) to check against the split thresholds"
    estimate = stats.get("msgRateInEstimateNow") if isinstance(stats, Mapping) else None
    if isinstance(estimate, int | float) and not isinstance(estimate, bool):
        rates["msgRateIn"] = max(rates["msgRateIn"], float(estimate))
    if any(rates[camel] > policy.split_threshold(name) for name, _, camel in METRICS):
        return None
    shown = ", ".join(
        f"{camel} {rates[camel]:g} <= {policy.split_threshold(name):g}"
        for name, _, camel in METRICS
    )
    return f"no rate is above the policy's split threshold ({shown})"


def _merge_thresholds_problem(
    action: Mapping[str, Any], segments: list[int], policy: AutoScalePolicy
) -> str | None:
    """Why a merge's segments are not all below the merge thresholds of ``policy``."""
    stats = action.get("stats")
    figures = stats.get("segments") if isinstance(stats, Mapping) else None
    if not isinstance(figures, Sequence) or len(figures) != len(segments):
        return "no window figures (stats.segments) to check against the merge thresholds"
    for figure in figures:
        rates = _rates(figure.get("p95")) if isinstance(figure, Mapping) else None
        if rates is None:
            return "no window figures (stats.segments[].p95) to check the merge thresholds"
        for name, _, camel in METRICS:
            if rates[camel] >= policy.merge_threshold(name):
                return (
                    f"segment {figure.get('segment')}'s p95 {camel} {rates[camel]:g} is not "
                    f"below the policy's merge threshold {policy.merge_threshold(name):g}"
                )
    return None


def _check_split(
    action: Mapping[str, Any],
    segments: list[int],
    layout: SegmentLayout,
    policy: AutoScalePolicy,
    now: float,
    last_split_at: float | None,
) -> str | Split:
    if len(segments) != 1:
        return f"a split names exactly one segment, got {segments}"
    at = action.get("at")
    if at is not None and (not isinstance(at, int) or isinstance(at, bool)):
        return f"split point {at!r} is not an integer"
    active = len(layout.active())
    if active >= policy.max_segments:
        return f"{active} active segments already at maxSegments {policy.max_segments}"
    cooling = _check_cooldown("split", last_split_at, policy.split_cooldown, now)
    if cooling:
        return cooling
    below = _split_thresholds_problem(action, policy)
    if below:
        return below
    try:
        layout.split(segments[0], at)
    except ValueError as exc:
        return str(exc)
    return Split(segments[0], str(action.get("reason") or ""), at=at)


def _check_merge(
    action: Mapping[str, Any],
    segments: list[int],
    layout: SegmentLayout,
    policy: AutoScalePolicy,
    now: float,
    last_merge_at: float | None,
) -> str | Merge:
    if len(segments) < 2:
        return f"a merge names two or more segments, got {segments}"
    active = len(layout.active())
    if active - (len(segments) - 1) < policy.min_segments:
        return (
            f"merging {len(segments)} of {active} active segments would go below minSegments "
            f"{policy.min_segments}"
        )
    cooling = _check_cooldown("merge", last_merge_at, policy.merge_cooldown, now)
    if cooling:
        return cooling
    above = _merge_thresholds_problem(action, segments, policy)
    if above:
        return above
    try:
        merged = layout.merge(*segments)
    except ValueError as exc:
        return str(exc)
    depth = merged.merge_depth(layout.next_segment_id)
    if depth > policy.max_dag_depth:
        return (
            f"the merged segment's DAG depth {depth} would exceed maxDagDepth "
            f"{policy.max_dag_depth}"
        )
    return Merge(tuple(segments), str(action.get("reason") or ""))


def _check_rebucket(
    action: Mapping[str, Any],
    segments: list[int],
    layout: SegmentLayout,
    policy: AutoScalePolicy,
    now: float,
    last_split_at: float | None,
    buckets: Mapping[int, int] | None,
    bucket_max: int,
) -> str | Rebucket:
    target = action.get("buckets")
    if not isinstance(target, int) or isinstance(target, bool) or not 1 <= target <= bucket_max:
        return f"bucket count {target!r} is not between 1 and {bucket_max}"
    if not segments or len(set(segments)) != len(segments):
        return f"a rebucket names distinct segments, got {segments}"
    cooling = _check_cooldown("split", last_split_at, policy.split_cooldown, now)
    if cooling:
        return cooling
    for segment_id in segments:
        info = layout.segments.get(segment_id)
        if info is None or not info.active:
            return f"segment {segment_id} is not active in layout epoch {layout.epoch}"
        if buckets is not None and segment_id in buckets and buckets[segment_id] >= target:
            return f"segment {info.descriptor} already has {buckets[segment_id]} buckets"
    return Rebucket(tuple(segments), target, str(action.get("reason") or ""))


def accept(
    recommendation: Mapping[str, Any] | None,
    *,
    layout: SegmentLayout,
    now: float,
    freshness: float = DEFAULT_FRESHNESS,
    policy: AutoScalePolicy,
    last_split_at: float | None,
    last_merge_at: float | None,
    buckets: Mapping[int, int] | None = None,
    bucket_max: int = N_MAX,
) -> Verdict:
    """The first action of ``recommendation`` the controller may take now (see the module
    docstring), as an evaluator action whose ``detail`` names the recommendation; or ``None``
    with the reason it is ignored."""
    if not recommendation:
        return Verdict(None, "no recommendation")
    if not policy.enabled:
        return Verdict(None, "auto-scaling is disabled for this topic")
    computed_text = recommendation.get("computedAt")
    try:
        computed_at = parse_time(str(computed_text))
    except ValueError:
        return Verdict(None, f"recommendation has no valid computedAt ({computed_text!r})")
    age = now - computed_at
    if not math.isfinite(age) or age > freshness:
        return Verdict(
            None,
            f"recommendation computed at {computed_text} is stale: {_ago(age)} old, "
            f"freshness {format_duration(freshness)}",
        )
    epoch = recommendation.get("basedOnEpoch")
    if epoch != layout.epoch:
        return Verdict(
            None,
            f"recommendation was computed for layout epoch {epoch}, the layout is at epoch "
            f"{layout.epoch}",
        )
    actions = recommendation.get("actions") or []
    if not actions:
        return Verdict(None, f"recommendation computed at {computed_text} proposes no action")

    rejected: list[tuple[int, str]] = []
    for index, raw in enumerate(actions):
        if not isinstance(raw, Mapping):
            rejected.append((index, f"malformed action {raw!r}"))
            continue
        kind = raw.get("kind")
        segments = _int_list(raw.get("segments"))
        outcome: str | Split | Merge | Rebucket
        if segments is None:
            outcome = f"segments {raw.get('segments')!r} are not a list of ids"
        elif kind == "split":
            outcome = _check_split(raw, segments, layout, policy, now, last_split_at)
        elif kind == "merge":
            outcome = _check_merge(raw, segments, layout, policy, now, last_merge_at)
        elif kind == "rebucket":
            outcome = _check_rebucket(
                raw, segments, layout, policy, now, last_split_at, buckets, bucket_max
            )
        else:
            outcome = f"unknown action kind {kind!r}"
        if isinstance(outcome, str):
            rejected.append((index, f"{kind} {raw.get('segments')}: {outcome}"))
            continue
        detail = (
            f"recommendation computed at {computed_text} ({_ago(age)} ago) on epoch "
            f"{layout.epoch}: {raw.get('detail') or outcome.reason}"
        )
        if isinstance(outcome, Split):
            action: Split | Merge | Rebucket = Split(
                outcome.segment_id, outcome.reason, at=outcome.at, detail=detail
            )
        elif isinstance(outcome, Merge):
            action = Merge(outcome.segment_ids, outcome.reason, detail=detail)
        else:
            action = Rebucket(outcome.segment_ids, outcome.buckets, outcome.reason, detail=detail)
        skipped = "; ".join(f"action {i + 1} refused ({why})" for i, why in rejected)
        reason = f"action {index + 1} of {len(actions)} accepted" + (
            f"; {skipped}" if skipped else ""
        )
        return Verdict(action, reason, index=index, rejected=tuple(rejected))
    return Verdict(
        None,
        "every recommended action was refused: "
        + "; ".join(f"action {i + 1} ({why})" for i, why in rejected),
        rejected=tuple(rejected),
    )
