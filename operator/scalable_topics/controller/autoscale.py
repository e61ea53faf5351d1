"""Auto split/merge (PIP-483) driven by the leader: a periodic tick per topic plus an immediate
evaluation when stream consumers come or go.

The decision itself is the pure ``core.evaluator``; a fresh recommendation from the recommender
(``core.recommendation.accept``) is preferred when it passes the same guards, because it carries
traffic-balanced split points. Whatever decides, the action runs through the same protocol as a
manual request, and events say which source decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.buckets import DEFAULT_BUCKET_BUDGET
from ..core.evaluator import LoadSample, Merge, Rebucket, Split, Suppression, decide_explained
from ..core.jsontypes import JsonObj
from ..core.layout import SegmentLayout
from ..core.policy import ClusterMode, Resolution
from ..core.recommendation import accept
from ..core.resources import AutoScaleDecision, ScalableTopicStatus, format_time, parse_time
from ..core.topicstatus import with_decision, with_evaluation
from . import metrics
from .autoscalestatus import (
    ACTED,
    IDLE,
    OFF,
    RECOMMENDED,
    SUPPRESSED,
    Outcome,
    mode_message,
    suppression_message,
)
from .cache import TopicCache, layout_of
from .kube import KubeApi
from .protocol import EventSink, OperationExecutor, OperationRejected
from .requests import Planner
from .status import TopicGone, change_topic_status
from .topics import ResolvedPolicies, TopicLocks

log = logging.getLogger(__name__)

Key = tuple[str, str]


def load_samples(segments: Mapping[int, JsonObj]) -> dict[int, LoadSample]:
    """``Segment.status.load`` as evaluator samples; ``updatedAt`` is the modification time."""
    samples: dict[int, LoadSample] = {}
    for sid, seg in segments.items():
        load = (seg.get("status") or {}).get("load")
        if not load:
            continue
        try:
            samples[sid] = LoadSample(
                msg_rate_in=float(load.get("msgRateIn", 0.0)),
                bytes_rate_in=float(load.get("bytesRateIn", 0.0)),
                msg_rate_out=float(load.get("msgRateOut", 0.0)),
                bytes_rate_out=float(load.get("bytesRateOut", 0.0)),
                modified_at=parse_time(str(load["updatedAt"])),
            )
        except (KeyError, ValueError):
            continue
    return samples


def _time(status: Mapping[str, Any], field: str) -> float | None:
    value = status.get(field)
    try:
        return parse_time(str(value)) if value else None
    except ValueError:
        return None


@dataclass(frozen=True)
class _Verdict:
    """An evaluation's decision: ``quiet``, the outcome to record when nothing is to be done;
    else ``action`` and its ``source`` (``"recommendation"`` or ``"auto"``). ``suppressed``: the
    evaluator's suppressions (one count each); ``recommendation``: whether the status's
    recommendation was accepted (``None``: there was none)."""

    quiet: Outcome | None
    suppressed: tuple[Suppression, ...]
    action: Split | Merge | Rebucket | None = None
    source: str = "auto"
    recommendation: bool | None = None


class AutoScaler:
    def __init__(
        self,
        cache: TopicCache,
        kube: KubeApi,
        executor: OperationExecutor,
        *,
        locks: TopicLocks,
        policies: ResolvedPolicies,
        plan: Planner,
        events: EventSink,
        leads: Callable[[str, str], bool],
        stream_consumers: Callable[[str, str], dict[str, int]],
        recommendation_freshness: float = 1200.0,
        tick: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.kube = kube
        self.executor = executor
        self.locks = locks
        self.policies = policies
        """Each topic's resolved policy, written by its reconcile pass."""
        self.plan = plan
        self.events = events
        self.leads = leads
        self.stream_consumers = stream_consumers
        self.freshness = recommendation_freshness
        self.tick = tick
        self.clock = clock
        self._due: dict[Key, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._triggered: set[Key] = set()
        self._wakeup = asyncio.Event()
        self._running: tuple[Key, asyncio.Task[str | None]] | None = None
        self._deferred: dict[Key, asyncio.Task[None]] = {}
        """Topics whose evaluation found the lock held, each with the task that re-triggers
        it once the holder lets go (one per topic, however many requests came meanwhile)."""
        self._recommended: dict[Key, tuple[Any, ...]] = {}
        """The last recommendation announced per topic (recommend mode): one event each."""

    def trigger(self, namespace: str, name: str) -> None:
        """Evaluate now (a stream consumer registered or left)."""
        self._triggered.add((namespace, name))
        self._wakeup.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="autoscaler")

    async def stop(self) -> None:
        if self._running is not None:
            self._running[1].cancel()
        for waiter in list(self._deferred.values()):
            waiter.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=self.tick)
            self._wakeup.clear()
            now = self.clock()
            keys = set(self._triggered)
            self._triggered.clear()
            for key, resolution in self.policies.items():
                if key not in self.cache.topics:
                    self.policies.drop(key)
                    continue
                if now >= self._due.get(key, 0.0):
                    self._due[key] = now + resolution.policy.evaluation_interval
                    keys.add(key)
            for key in keys:
                task = asyncio.create_task(self.evaluate(key), name=f"autoscale-{key[0]}/{key[1]}")
                self._running = (key, task)
                try:
                    await asyncio.wait({task})
                finally:
                    self._running = None
                if task.cancelled():
                    log.info("%s/%s: auto-scale operation cancelled (leadership lost)", *key)
                elif task.exception() is not None:
                    log.error(
                        "%s/%s: auto-scale evaluation failed",
                        *key,
                        exc_info=task.exception(),
                    )

    def cancel(self, predicate: Callable[[Key], bool]) -> int:
        """Cancel the evaluation (and the operation it runs) of a topic matching ``predicate``:
        its shard was lost, and only the leader may go on mutating the topic."""
        running = self._running
        if running is not None and predicate(running[0]) and not running[1].done():
            running[1].cancel()
            return 1
        return 0

    async def evaluate(self, key: Key) -> str | None:
        """One evaluation; returns the id of the operation it started, if any."""
        namespace, name = key
        if not self.leads(namespace, name):
            return None
        lock = self.locks(key)
        if lock.locked():
            self._defer(key, lock)
            return None
        async with lock:
            return await self._evaluate(namespace, name)

    def _defer(self, key: Key, lock: asyncio.Lock) -> None:
        """Evaluate ``key`` again once ``lock`` is released instead of dropping the request: a
        stream consumer that registers during a reconcile pass would otherwise wait a whole
        ``evaluationInterval`` for the split it calls for."""
        if key in self._deferred:
            return

        async def after_release() -> None:
            try:
                async with lock:
                    pass
            finally:
                self._deferred.pop(key, None)
            self.trigger(*key)

        self._deferred[key] = asyncio.create_task(
            after_release(), name=f"autoscale-deferred-{key[0]}/{key[1]}"
        )

    def first_outcome(
        self, topic: JsonObj, layout: SegmentLayout, resolution: Resolution
    ) -> Outcome | None:
        """What the first evaluation of a new topic would record when it calls for no action
        (``None`` when it would act): the reconcile pass that makes the topic Ready writes it
        with that status, and the evaluation that follows finds it there and writes nothing
        (one topic status write less per new topic). Counts nothing: the evaluation does."""
        return self._decide(topic, layout, resolution, self.clock()).quiet

    def _decide(
        self, topic: JsonObj, layout: SegmentLayout, resolution: Resolution, now: float
    ) -> _Verdict:
        """The evaluation's decision, without effects (no write, event or metric)."""
        meta = topic["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        policy = resolution.policy
        status = topic.get("status") or {}
        if resolution.mode is ClusterMode.OFF:
            off = suppression_message((Suppression.MODE_OFF,), resolution)
            return _Verdict(
                Outcome(OFF, (Suppression.MODE_OFF.value,), off), (Suppression.MODE_OFF,)
            )
        last_split = _time(status, "lastSplitAt")
        last_merge = _time(status, "lastMergeAt")
        buckets = self.cache.segment_buckets(namespace, name)
        verdict = accept(
            status.get("recommendation"),
            layout=layout,
            now=now,
            freshness=self.freshness,
            policy=policy,
            last_split_at=last_split,
            last_merge_at=last_merge,
            buckets=buckets,
            bucket_max=resolution.bucket_max,
        )
        recommendation = None if not status.get("recommendation") else verdict.action is not None
        if verdict.action is not None:
            return _Verdict(None, (), verdict.action, "recommendation", recommendation)
        decision = decide_explained(
            layout,
            load_samples(self.cache.segments.get((namespace, name), {})),
            self.stream_consumers(namespace, name),
            policy,
            now,
            last_split,
            last_merge,
            buckets=buckets,
            bucket_max=resolution.bucket_max,
            bucket_budget=int(
                (topic.get("spec") or {}).get("entryBuckets") or DEFAULT_BUCKET_BUDGET
            ),
        )
        suppressed = tuple(decision.suppressed)
        if decision.action is not None:
            return _Verdict(None, suppressed, decision.action, "auto", recommendation)
        reasons = tuple(dict.fromkeys(decision.suppressed))
        if Suppression.DISABLED in reasons:
            result = OFF
        elif reasons:
            result = SUPPRESSED
        else:
            result = IDLE
        message = suppression_message(reasons, resolution) or (
            "nothing called for: no segment above a split threshold, no cold adjacent "
            "pair, no stream consumers beyond the segments"
        )
        quiet = Outcome(result, tuple(r.value for r in reasons), message)
        return _Verdict(quiet, suppressed, None, "auto", recommendation)

    async def _evaluate(self, namespace: str, name: str) -> str | None:
        key = (namespace, name)
        topic = self.cache.topics.get(key)
        resolution = self.policies.get(key)
        if topic is None or resolution is None:
            return None
        layout = layout_of(topic)
        if layout is None or (topic.get("status") or {}).get("operation"):
            return None
        now = self.clock()
        decided_by = self._decide(topic, layout, resolution, now)
        if decided_by.recommendation is not None:
            metrics.RECOMMENDATIONS.labels(
                namespace, name, "accepted" if decided_by.recommendation else "ignored"
            ).inc()
        for suppression in decided_by.suppressed:
            metrics.AUTOSCALE_SUPPRESSED.labels(namespace, name, suppression.value).inc()
        if decided_by.quiet is not None:
            await self._record(topic, decided_by.quiet, now)
            self._recommended.pop(key, None)
            return None
        action, source = decided_by.action, decided_by.source
        assert action is not None
        if isinstance(action, Split):
            op, segments, at, n = "split", [action.segment_id], action.at, None
        elif isinstance(action, Merge):
            op, segments, at, n = "merge", list(action.segment_ids), None, None
        else:
            assert isinstance(action, Rebucket)
            op, segments, at, n = "rebucket", list(action.segment_ids), None, action.buckets
        detail = action.detail or action.reason
        decided = {
            "action": op,
            "segments": segments,
            "source": source,
            "executed": False,
            "reason": detail,
            "decidedAt": format_time(now),
        }
        if resolution.mode is ClusterMode.RECOMMEND:
            metrics.AUTOSCALE_EVALUATIONS.labels(namespace, name, RECOMMENDED).inc()
            signature = (op, tuple(segments), at, n, source)
            if self._recommended.get(key) != signature:
                # One event per distinct recommendation, not one per evaluation.
                self._recommended[key] = signature
                await self.events(
                    topic,
                    "Normal",
                    "ScalingRecommended",
                    f"{op} {segments} ({source}: {detail}); not executed in recommend mode",
                )
                await self._record(
                    topic,
                    Outcome(RECOMMENDED, (), f"{op} {segments}: {mode_message(resolution)}"),
                    now,
                    decided,
                )
            return None
        self._recommended.pop(key, None)
        operation = self.plan(
            topic, layout, op, segments, at, source=source, reason=detail, buckets=n
        )
        counter = {
            "split": metrics.AUTO_SPLITS,
            "merge": metrics.AUTO_MERGES,
            "rebucket": metrics.AUTO_REBUCKETS,
        }[op]
        # Recorded before the operation runs: its commit changes the layout, and whoever sees
        # the new layout sees the decision that made it.
        decided.update(executed=True, operation=operation.id)
        await self._record(topic, Outcome(ACTED, (), f"{op} {segments} ({source})"), now, decided)
        await self.events(
            topic,
            "Normal",
            "ScalingDecided",
            f"{op} {segments} ({source}: {detail}); starting operation {operation.id}",
        )
        try:
            fresh = await self.kube.get_topic(namespace, name)
            if fresh is None:
                return None
            await self.executor.start(fresh, operation)
        except OperationRejected as exc:
            log.info("%s/%s: %s not started: %s", namespace, name, op, exc)
            decided["executed"] = False
            decided.pop("operation")
            why = f"{op} {segments} ({source}) not started: {exc}"
            await self._record(
                topic, Outcome(SUPPRESSED, (), why), now, decided, fresh=False, count=False
            )
            return None
        counter.labels(namespace, name).inc()
        return operation.id

    async def _record(
        self,
        topic: JsonObj,
        outcome: Outcome,
        now: float,
        decision: dict[str, Any] | None = None,
        *,
        fresh: bool = True,
        count: bool = True,
    ) -> None:
        """``status.autoScale``'s decision and outcome, written only when they changed
        (``fresh``: the cached topic is current enough to compare against first), and the
        evaluation counted by outcome (``count``; recommend mode counts its own)."""
        meta = topic["metadata"]
        if count and outcome.result != RECOMMENDED:
            metrics.AUTOSCALE_EVALUATIONS.labels(
                meta["namespace"], meta["name"], outcome.result
            ).inc()

        decided = None if decision is None else AutoScaleDecision.model_validate(decision)

        def change(status: ScalableTopicStatus, _: JsonObj) -> ScalableTopicStatus:
            status = with_evaluation(status, outcome.result, outcome.reasons, outcome.message, now)
            return status if decided is None else with_decision(status, decided)

        try:
            written = await change_topic_status(
                self.kube,
                meta["namespace"],
                meta["name"],
                change,
                topic=topic if fresh else None,
            )
        except TopicGone:
            return
        self.cache.put_topic(written)
