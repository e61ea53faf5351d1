"""The key-shared chaos run (PIP-486, issue 14): stream and checkpoint consumers scaling
1 → 12 → 3 on a 2-segment topic through a split, a rebucket rollover and a merge, with consumers
SIGKILLed, on the embedded control plane. Shared by ``tests/integration/test_chaos_keyshared.py``.

Stack: ``operator_stack`` (the real operator and broker pods, real processes). A topic of two
segments of one entry bucket each (``entryBuckets: 2``, ``maxSegments: 3``) with two Stream
subscriptions: ``ordered`` read by stream consumers (broker acknowledgements), ``checkpointed``
read by checkpoint consumers (positions kept by the application, in a checkpoint store the
consumers of the subscription share). Every consumer is a process of its own
(:mod:`tests.chaos.consumer`), the keyed open-loop producer too (:mod:`tests.chaos.writer`).

Steps, each followed by a settle (every key acknowledged and read on both subscriptions past
the step's end):

1. **split** of the lowest segment, by the request annotation (one consumer per subscription),
   while the consumers are paused until 240 messages behind (the parent holds unread entries of
   keys its children receive at once: a child read too early is a reordering);
2. **scale to 12** per subscription; once all 24 are registered they pause until 240 messages
   behind (the children's buckets go to other consumers, which must wait for the parents'
   backlog) and the auto-scaler is turned on
   (``autoScale.enabled``, off otherwise): 12 consumers outnumber the 3 active segments' 3
   buckets at ``maxSegments``, so the evaluator rolls every active segment over to 4 buckets
   (:func:`~scalable_topics.core.evaluator.decide`: the one rollover path, the request
   annotation takes split, merge and move only); the step waits for that rollover (same ranges,
   more buckets), turns the auto-scaler off, and waits for every one of the 24 consumers to
   receive messages;
3. **SIGKILL** of one stream consumer (not restarted: its buckets are held for the grace period,
   then handed on; what it had not acknowledged is redelivered) and of one checkpoint consumer,
   restarted under the same name from the shared checkpoint store (a restore: what it read
   after its last stored checkpoint comes again);
4. **scale to 3** per subscription (the others leave: SIGTERM, finish the message in hand,
   unregister);
5. **merge** of two adjacent active segments, by the request annotation, with the consumers
   240 messages behind again.

Then the writer stops, both subscriptions drain, and :func:`~tests.chaos.checker.check` judges
the history: on ``ordered`` a duplicate is explained only by the SIGKILLed consumer (it had the
earlier delivery); on ``checkpointed`` only by the session's checkpoint (a checkpoint session
that re-reads what its checkpoint covers is a failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from scalable_topics.core.layout import SegmentLayout
from tests.integration.operator_harness import Stack, operator_stack

from .checker import CheckReport, History, Outcome, check
from .consumer import ConsumerProcess
from .nemesis import Nemesis, Step
from .scenario import _settled, _unread, _until, _wait_dag, service_url
from .workload import Recorder
from .writer import WriterProcess

__all__ = ["CHECKPOINT_SUB", "STREAM_SUB", "KeySharedConfig", "KeySharedResult", "run_keyshared"]

log = logging.getLogger("tests.chaos.keyshared")

TOPIC = "keyshared-chaos"
NAMESPACE = "default"
STREAM_SUB = "ordered"
CHECKPOINT_SUB = "checkpointed"
KINDS = {STREAM_SUB: "stream", CHECKPOINT_SUB: "checkpoint"}


@dataclass
class KeySharedConfig:
    keys: int = 256
    """Enough that every entry bucket of the rollover (down to 1/16 of the ring) holds keys."""
    rate: float = 120.0
    peak: int = 12
    final: int = 3
    backlog: int = 240
    """Acknowledged messages the consumers fall behind by before the split and the merge."""
    per_process: int = 4
    """Consumers per process (the SIGKILLed ones run alone): 24 processes do not start within
    a minute on a loaded 2-core machine."""
    warmup_reads: int = 100
    settle_reads: int = 150
    settle_within: float = 60.0
    drain_within: float = 60.0
    grace: str = "3s"
    pad: int = 16


@dataclass
class KeySharedResult:
    config: KeySharedConfig
    report: CheckReport
    steps: list[Step]
    readers_at_peak: dict[str, int]
    """Per subscription: consumers that received messages after the rollover, at 12."""
    buckets_at_peak: dict[int, int]
    """Active segment -> entry buckets after the rollover."""
    acked: int
    drained: bool
    history_path: Path
    longest_waits: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Per subscription: the longest time an acknowledged message waited from its
    acknowledgement to its first delivery, and which (liveness: the pauses account for ~2 s)."""
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"acknowledged {self.acked} sends; drained={self.drained}"]
        out.extend(f"step {s.name}: {s.seconds:.2f} s — {s.detail}" for s in self.steps)
        out.append(
            f"readers at {self.config.peak}: {self.readers_at_peak}; buckets after the rollover "
            f"{self.buckets_at_peak}"
        )
        out.extend(
            f"longest wait ack -> first delivery on {sub}: {wait:.1f} s ({what})"
            for sub, (wait, what) in self.longest_waits.items()
        )
        out.extend(self.notes)
        out.append(self.report.summary())
        return out


def longest_waits(history: History) -> dict[str, tuple[float, str]]:
    """See :attr:`KeySharedResult.longest_waits`."""
    acked = {
        (s.key, s.value): s.completed
        for s in history.sends
        if s.outcome is Outcome.OK and s.completed is not None
    }
    start = min((d.time for d in history.deliveries), default=0.0)
    seen: set[tuple[str, str, int]] = set()
    worst: dict[str, tuple[float, str]] = {}
    for d in sorted(history.deliveries, key=lambda d: d.time):
        slot = (d.subscription, d.key, d.value)
        at = acked.get((d.key, d.value))
        if slot in seen or at is None:
            continue
        seen.add(slot)
        wait = d.time - at
        if wait > worst.get(d.subscription, (-1.0, ""))[0]:
            worst[d.subscription] = (
                wait,
                f"{d.key}={d.value} acknowledged at +{at - start:.1f} s, first read by "
                f"{d.consumer} from segment {d.segment}",
            )
    return worst


def topic_spec(grace: str) -> dict[str, Any]:
    return {
        "apiVersion": "scalabletopics.io/v1alpha1",
        "kind": "ScalableTopic",
        "metadata": {"name": TOPIC, "namespace": NAMESPACE},
        "spec": {
            "initialSegments": 2,
            "subscriptions": [
                {"name": STREAM_SUB, "type": "Stream"},
                {"name": CHECKPOINT_SUB, "type": "Stream"},
            ],
            "consumerGracePeriod": grace,
            "entryBuckets": 2,
            # The auto-scaler is off but for the rollover step (see _rollover) and acts only on
            # consumer counts: load thresholds far above the rate, merges never qualify
            # (nothing is below a zero threshold); with the split, the topic is at
            # maxSegments, where consumers beyond the buckets roll segments over.
            "autoScale": {
                "enabled": False,
                "minSegments": 1,
                "maxSegments": 3,
                "splitCooldown": "1s",
                "evaluationInterval": "2s",
                "mergeMsgRateInThreshold": 0,
                "mergeBytesRateInThreshold": 0,
                "mergeMsgRateOutThreshold": 0,
                "mergeBytesRateOutThreshold": 0,
            },
        },
    }


async def _settle_failure(topic: dict[str, Any] | None, consumers_log: Path, stack: Stack) -> str:
    """What a failed settle leaves in the test's output, for a CI run whose files are gone: the
    subscriptions' status (owners, shares, hand-offs, drains), the consumers' last log lines and
    the operator pods' lines about leadership and consumers."""
    status = (topic or {}).get("status") or {}
    lines = ["-- settle failed; topic status.subscriptions:"]
    lines.append(json.dumps(status.get("subscriptions"), indent=1, sort_keys=True))
    lines.append("-- consumers.log, last 60 lines:")
    text = await asyncio.to_thread(consumers_log.read_text, errors="replace")
    lines.extend(text.splitlines()[-60:])
    result = await stack.kubectl(
        "logs",
        "-n",
        "scalable-topics",
        "-l",
        "app.kubernetes.io/name=scalable-topics-operator",
        "--prefix",
        "--tail=5000",
        check=False,
    )
    wanted = ("lease", "leader", "consumer", "drain", "release", "withheld", "subscription")
    found = [ln for ln in result.stdout.splitlines() if any(w in ln.lower() for w in wanted)]
    lines.append("-- the operator pods' last 40 lines about leadership and consumers:")
    lines.extend(found[-40:])
    return "\n".join(lines)


async def run_keyshared(tmp_path: Path, config: KeySharedConfig | None = None) -> KeySharedResult:
    config = config or KeySharedConfig()
    async with operator_stack(tmp_path, operator_replicas=1, brokers=2) as stack:
        await stack.apply_topic(topic_spec(config.grace))
        await stack.wait_ready(TOPIC, 90)
        return await _run(stack, tmp_path, config)


class _Group:
    """The consumers of one subscription, by name, in processes of up to ``per_process``."""

    def __init__(
        self,
        subscription: str,
        recorder: Recorder,
        url: str,
        store: Path | None,
        logs: IO[bytes],
        per_process: int,
    ) -> None:
        self.subscription = subscription
        self.kind = KINDS[subscription]
        self.recorder = recorder
        self.url = url
        self.store = store
        self.logs = logs
        self.per_process = per_process
        self.where: dict[str, ConsumerProcess] = {}
        """Running consumer -> its process."""
        self.procs: list[ConsumerProcess] = []
        self.sessions: dict[str, int] = {}

    async def spawn(self, names: list[str], within: float = 90.0) -> ConsumerProcess:
        sessions = {n: self.sessions.get(n, 0) + 1 for n in names}
        self.sessions.update(sessions)
        proc = await ConsumerProcess.spawn(
            self.recorder,
            kind=self.kind,
            url=self.url,
            namespace=NAMESPACE,
            topic=TOPIC,
            subscription=self.subscription,
            sessions=sessions,
            store=self.store,
            stderr=self.logs,
        )
        self.procs.append(proc)
        self.where.update(dict.fromkeys(names, proc))
        await proc.wait_started(within)
        return proc

    async def scale(self, count: int) -> None:
        """To ``count`` running consumers: the highest names leave, or new names start (the
        last one in a process of its own, so that it can be SIGKILLed alone)."""
        names = sorted(self.where)
        if len(names) > count:
            await asyncio.gather(*(self.where.pop(n).leave(n) for n in names[count:]))
            return
        new: list[str] = []
        i = 0
        while len(names) + len(new) < count:
            candidate = f"{self.kind}-{i:02d}"
            if candidate not in self.sessions:
                new.append(candidate)
            i += 1
        body, k = new[:-1], self.per_process
        chunks = [body[j : j + k] for j in range(0, len(body), k)] + ([new[-1:]] if new else [])
        await asyncio.gather(*(self.spawn(chunk) for chunk in chunks))

    async def pause(self, pause: bool) -> None:
        """Every running consumer stops (``True``) or resumes taking messages."""
        verb = "pause" if pause else "resume"
        await asyncio.gather(*(p.command(verb, n) for n, p in self.where.items()))

    def reads(self, name: str) -> int:
        return self.where[name].reads[name]

    async def kill(self, name: str) -> list[int]:
        proc = self.where[name]
        assert list(proc.sessions) == [name], f"{name} shares its process: {list(proc.sessions)}"
        del self.where[name]
        return await proc.kill()

    async def stop(self) -> None:
        for proc in self.procs:
            await proc.stop()


async def _collect_buckets(nemesis: Nemesis, recorder: Recorder) -> None:
    """Remember every segment's bucket count (the checker places keys in a checkpoint's bucket
    positions with it)."""
    for sid, segment in (await nemesis.stack.segments(TOPIC, NAMESPACE)).items():
        recorder.buckets[sid] = int(segment["spec"].get("buckets") or 1)


def _reading(groups: list[_Group], since: dict[str, int]) -> Callable[[], list[str]]:
    """Every running consumer received something since ``since`` (reads per name)."""

    def probe() -> list[str]:
        return [
            f"{n} has not read since"
            for g in groups
            for n in g.where
            if g.reads(n) <= since.get(n, 0)
        ]

    return probe


async def _behind(
    nemesis: Nemesis, groups: list[_Group], config: KeySharedConfig, operation: Awaitable[Step]
) -> Step:
    """Run a split or merge while every consumer is ``config.backlog`` acknowledged messages
    behind: the parents hold unread entries of keys that the children receive at once, so a
    child read before its parents are drained shows as a reordering (with consumers keeping
    up, a broken hand-off could go unnoticed)."""
    recorder = nemesis.recorder
    await asyncio.gather(*(g.pause(True) for g in groups))
    try:
        target = recorder.acked + config.backlog
        await _until(
            f"{config.backlog} messages written while the consumers pause",
            config.settle_within,
            lambda: [f"{recorder.acked}/{target} acknowledged"] if recorder.acked < target else [],
            recorder.clock,
        )
        step = await operation
    finally:
        await asyncio.gather(*(g.pause(False) for g in groups))
    step.detail += f"; consumers {config.backlog} messages behind"
    return step


async def _autoscale(stack: Stack, enabled: bool) -> None:
    patch = {"spec": {"autoScale": {"enabled": enabled}}}
    await stack.kubectl(
        "patch", "-n", NAMESPACE, "stopic", TOPIC, "--type=merge", "-p", json.dumps(patch)
    )


async def _rollover(nemesis: Nemesis, before: SegmentLayout) -> Step:
    """Turn the auto-scaler on for one rollover and off again (on while the consumers
    registered, it would roll over once per evaluation as their count grew)."""
    await _autoscale(nemesis.stack, True)
    try:
        return await nemesis.wait_layout_change(before, within=60)
    finally:
        await _autoscale(nemesis.stack, False)


async def _scale_out(
    nemesis: Nemesis, groups: list[_Group], config: KeySharedConfig, peak: int
) -> Step:
    """Register ``peak`` consumers per subscription, then the rollover while they are behind:
    the children's buckets go to consumers that must not read them before the parents'
    backlog is drained."""
    before = await nemesis.layout()
    started = nemesis.recorder.clock()
    await asyncio.gather(*(g.scale(peak) for g in groups))
    step = await _behind(nemesis, groups, config, _rollover(nemesis, before))
    step.started = started
    step.name = f"scale-to-{peak}"
    after = step.data.pop("layout")
    ranges = {after.get(c).hash_range for c in step.children}
    assert ranges == {before.get(p).hash_range for p in step.parents}, (
        f"expected a rebucket rollover (same ranges), got {step.detail}"
    )
    buckets = await nemesis.buckets()
    step.data["buckets"] = buckets
    step.detail = (
        f"{peak} consumers per subscription over {len(before.active())} segments of one bucket, "
        f"auto-scaler on: rollover {list(step.parents)} -> {list(step.children)}, buckets now "
        f"{buckets}; consumers {config.backlog} messages behind"
    )
    return step


async def _run(stack: Stack, tmp_path: Path, config: KeySharedConfig) -> KeySharedResult:
    recorder = Recorder({STREAM_SUB: True, CHECKPOINT_SUB: True})
    clock = recorder.clock
    url = await service_url(stack)
    await _wait_dag(url, config.settle_within, TOPIC)
    nemesis = Nemesis(stack, recorder, TOPIC, NAMESPACE)
    store = tmp_path / "checkpoints"
    store.mkdir()
    steps: list[Step] = []
    notes: list[str] = []
    writer: WriterProcess | None = None
    drained = False
    readers_at_peak: dict[str, int] = {}
    buckets_at_peak: dict[int, int] = {}
    with (
        (tmp_path / "writer.log").open("wb") as writer_log,
        (tmp_path / "consumers.log").open("wb") as consumer_log,
    ):
        groups = [
            _Group(STREAM_SUB, recorder, url, None, consumer_log, config.per_process),
            _Group(CHECKPOINT_SUB, recorder, url, store, consumer_log, config.per_process),
        ]
        stream, checkpoint = groups

        async def settle(step: Step) -> None:
            steps.append(step)
            log.info("keyshared chaos: %s done in %.2f s: %s", step.name, step.seconds, step.detail)
            try:
                await _until(
                    f"settle after {step.name}",
                    config.settle_within,
                    _settled(recorder, step.finished, config.settle_reads),
                    clock,
                )
            except AssertionError:
                topic = await stack.topic(TOPIC, NAMESPACE)
                (tmp_path / "topic-at-failure.json").write_text(json.dumps(topic, indent=1))
                print(await _settle_failure(topic, tmp_path / "consumers.log", stack))
                raise
            await _collect_buckets(nemesis, recorder)
            assert writer is not None and writer.running, "the writer died (writer.log)"

        try:
            try:
                writer = await WriterProcess.spawn(
                    recorder,
                    url=url,
                    namespace=NAMESPACE,
                    topic=TOPIC,
                    keys=config.keys,
                    rate=config.rate,
                    pad=config.pad,
                    stderr=writer_log,
                )
                await writer.wait_started(config.settle_within)
                await asyncio.gather(*(g.scale(1) for g in groups))
                await _until(
                    "warm-up",
                    config.settle_within,
                    lambda: [
                        f"{s}: {recorder.read_count(s)} read"
                        for s in recorder.ordered
                        if recorder.read_count(s) < config.warmup_reads
                    ],
                    clock,
                )

                await settle(await _behind(nemesis, groups, config, nemesis.split()))

                step = await _scale_out(nemesis, groups, config, config.peak)
                buckets_at_peak = step.data["buckets"]
                since = {n: g.reads(n) for g in groups for n in g.where}
                await _until(
                    f"all {config.peak} consumers per subscription reading",
                    config.settle_within,
                    _reading(groups, since),
                    clock,
                )
                step.finished = clock()
                readers_at_peak = {
                    g.subscription: sum(g.reads(n) > since[n] for n in g.where) for g in groups
                }
                await settle(step)

                step = Step("sigkill", clock())
                victim = max(stream.where)
                await stream.kill(victim)
                restored = max(checkpoint.where)
                (handle,) = await checkpoint.kill(restored)
                await checkpoint.spawn([restored])
                recorder.restarted(handle)
                step.finished = clock()
                step.detail = (
                    f"SIGKILL {victim} ({STREAM_SUB}, not restarted: held for the grace "
                    f"period, then handed on) and {restored} ({CHECKPOINT_SUB}, restarted from "
                    f"the checkpoint store)"
                )
                await settle(step)

                step = Step(f"scale-to-{config.final}", clock())
                await asyncio.gather(*(g.scale(config.final) for g in groups))
                step.finished = clock()
                step.detail = f"{config.final} consumers per subscription (the others left)"
                await settle(step)

                active = sorted((await nemesis.layout()).active(), key=lambda s: s.hash_range.start)
                pair = next(
                    [a.segment_id, b.segment_id]
                    for a, b in itertools.pairwise(active)
                    if a.hash_range.end + 1 == b.hash_range.start
                )
                await settle(await _behind(nemesis, groups, config, nemesis.merge(pair)))
            finally:
                if writer is not None:
                    await writer.stop(60.0)
            try:
                await _until("drain", config.drain_within, _unread(recorder), clock)
                drained = True
            except AssertionError as exc:
                notes.append(str(exc))
            await _collect_buckets(nemesis, recorder)
        finally:
            for group in groups:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(group.scale(0), 30)
                await group.stop()

    history = recorder.history()
    history_path = tmp_path / "keyshared-history.json"
    history.dump(history_path)
    return KeySharedResult(
        config=config,
        report=check(history),
        steps=steps,
        readers_at_peak=readers_at_peak,
        buckets_at_peak=buckets_at_peak,
        acked=sum(1 for s in history.sends if s.outcome is Outcome.OK),
        drained=drained,
        history_path=history_path,
        longest_waits=longest_waits(history),
        notes=notes,
    )
