"""What the auto-scaler says in ``status.autoScale``: the outcome of an evaluation and the
messages that explain it. The writes themselves are ``core.topicstatus.with_evaluation`` and
``with_decision`` (and ``with_policy``, the reconcile pass's): each changes only its own keys,
and ``since`` moves only when the outcome does, so repeated evaluations write nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.evaluator import Suppression
from ..core.policy import (
    CLUSTER_DEFAULTS_CONFIGMAP,
    AutoScalePolicy,
    ClusterMode,
    PolicyLevel,
    Resolution,
    knob_alias,
    level_text,
)

ACTED = "Acted"
RECOMMENDED = "Recommended"
SUPPRESSED = "Suppressed"
IDLE = "Idle"
OFF = "Off"


@dataclass(frozen=True)
class Outcome:
    """What an evaluation came to: ``result`` (Acted, Recommended, Suppressed, Idle, Off), the
    suppression ``reasons`` and a ``message`` that does not change while the outcome does not
    (no rates in it), so that repeated evaluations write nothing."""

    result: str
    reasons: tuple[str, ...] = ()
    message: str = ""


def _from(resolution: Resolution, name: str) -> str:
    return f"{knob_alias(name)} from {level_text(resolution.sources[name])}"


def suppression_message(reasons: Sequence[Suppression], resolution: Resolution) -> str:
    """Each suppression reason with the knob that held the action back and where it is set."""
    policy: AutoScalePolicy = resolution.policy
    texts = {
        Suppression.DISABLED: f"auto-scaling is disabled ({_from(resolution, 'enabled')})",
        Suppression.MAX_SEGMENTS: f"a split is wanted but the topic is at maxSegments "
        f"{policy.max_segments} ({_from(resolution, 'max_segments')})",
        Suppression.SPLIT_COOLDOWN: "a split is wanted but the last one is within splitCooldown "
        f"({_from(resolution, 'split_cooldown')})",
        Suppression.UNSPLITTABLE: "a split is wanted but every candidate holds a single hash",
        Suppression.BUCKETS_UNKNOWN: "a rebucket is wanted but bucket counts are not all known",
        Suppression.BUCKET_MAX: f"a rebucket is wanted but every active segment has maxBuckets "
        f"{resolution.bucket_max}",
        Suppression.MIN_SEGMENTS: f"a cold pair could merge but the topic is at minSegments "
        f"{policy.min_segments} ({_from(resolution, 'min_segments')})",
        Suppression.MERGE_COOLDOWN: "a cold pair could merge but the last merge is within "
        f"mergeCooldown ({_from(resolution, 'merge_cooldown')})",
        Suppression.MAX_DAG_DEPTH: "cold pairs exist but each merge would exceed maxDagDepth "
        f"{policy.max_dag_depth} ({_from(resolution, 'max_dag_depth')})",
        Suppression.BUCKETS_SUFFICE: "more ordered consumers than segments, but the entry "
        "buckets are spread over them",
        Suppression.REBUCKET_DOWN_WINDOW: "cold segments hold more entry buckets than needed, "
        "lowered once cold for rebucketDownWindow "
        f"({_from(resolution, 'rebucket_down_window')})",
        Suppression.MODE_OFF: f"the master switch is off (mode in the ConfigMap "
        f"{CLUSTER_DEFAULTS_CONFIGMAP}): no decision is made",
    }
    return "; ".join(texts[reason] for reason in reasons)


def mode_message(resolution: Resolution) -> str:
    if resolution.mode is ClusterMode.RECOMMEND:
        where = (
            f"the master switch in the ConfigMap {CLUSTER_DEFAULTS_CONFIGMAP}"
            if resolution.mode_source is PolicyLevel.CLUSTER
            else f"mode from {level_text(resolution.mode_source)}"
        )
        return f"recorded, not executed: recommend mode ({where})"
    return "executed"
