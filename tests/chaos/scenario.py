"""The chaos run on the embedded control plane, shared by ``tests/integration/test_chaos.py``
and ``bench/chaos.py``.

Stack: ``operator_stack`` (CRDs, ``manifests/overlays/local``: three broker pods, two operator
replicas, all real processes). A topic with two segments, a Stream and a Queue subscription;
one producer writes ``keys`` keys open-loop at ``rate`` msg/s; two stream consumers and one
queue consumer read and acknowledge. After a warm-up the nemesis runs, one after another, each
followed by a settle (every key acknowledged and read on both subscriptions past the fault's
end): split, merge, rebucket rollover, SIGKILL of the broker hosting most active segments,
SIGKILL of the operator leader, restart of a stream consumer under the same name. Then writing
stops, the subscriptions drain, and the checker runs on the history.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalable_topics.client import (
    DagWatcher,
    QueueConsumer,
    StreamConsumer,
    TopicNotFoundError,
)
from scalable_topics.core.layout import SegmentLayout
from tests.integration.operator_harness import Stack, operator_stack

from .checker import (
    CheckReport,
    KeyWindow,
    Outcome,
    Summary,
    check,
    handoff_windows,
    segment_gap,
    summarize,
)
from .nemesis import Nemesis, Step
from .workload import ConsumerRunner, ReadingConsumer, Recorder, Registration
from .writer import WriterProcess

__all__ = ["FAULTS", "RECORD_FAULTS", "ChaosConfig", "ChaosResult", "run_chaos"]

log = logging.getLogger("tests.chaos.scenario")

TOPIC = "chaos"
NAMESPACE = "default"
STREAM_SUB = "ordered"
QUEUE_SUB = "shared"
OPERATOR_LABEL = "app.kubernetes.io/name=scalable-topics-operator"
FAULTS = (
    "split",
    "merge",
    "rebucket",
    "kill-broker",
    "kill-operator-leader",
    "restart-consumer",
)
RECORD_FAULTS = ("lose-status", "lose-status-and-segments")
"""Faults on the records rather than the processes (not in the default run): the topic's status
replaced with an empty one, then also every Segment deleted (docs/correctness.md, "Lost
status")."""
REBUCKET_HOW = (
    "automatic: the request annotation accepts only split and merge "
    "(core.resources.ManualRequestOp), so extra stream consumers are registered until they "
    "outnumber the entry buckets of the topic at maxSegments (PIP-486 rollover)"
)


@dataclass
class ChaosConfig:
    keys: int = 64
    rate: float = 400.0
    stream_consumers: int = 2
    faults: tuple[str, ...] = FAULTS
    warmup_reads: int = 400
    """Deliveries per subscription before the first fault."""
    settle_reads: int = 800
    """Deliveries per subscription after a fault before the next one (besides every key being
    acknowledged and read past the fault)."""
    settle_within: float = 60.0
    drain_within: float = 60.0
    queue_ordered: bool = True
    """Queue workers are ordered by default (per-key order through controller-assigned entry
    buckets, docs/client.md); check it."""
    pad: int = 64


@dataclass
class ChaosResult:
    config: ChaosConfig
    report: CheckReport
    steps: list[Step]
    windows: dict[str, list[KeyWindow]]
    segment_gaps: dict[str, float | None]
    """Per operation: first ack on a child minus last ack on a parent, any key."""
    stalls: dict[str, Summary]
    """Per fault: ack latency (intended → ack) of the sends invoked while it ran."""
    registrations: list[Registration]
    latency: Summary
    """Acknowledgement latency (intended send time → ack) of every acknowledged send."""
    quiet_latency: Summary
    """The same, for sends invoked away from any fault (the baseline for the windows)."""
    sent: int
    acked: int
    unanswered: int
    write_seconds: float
    drained: bool
    history_path: Path
    generator_lag: float
    notes: list[str] = field(default_factory=list)

    def blocked(self, step: str) -> Summary:
        return summarize(w.blocked for w in self.windows.get(step, []))

    def gaps(self, step: str) -> Summary:
        return summarize(w.gap for w in self.windows.get(step, []))

    def lines(self) -> list[str]:
        out = [
            f"wrote {self.sent} messages ({self.acked} acknowledged, {self.unanswered} "
            f"unanswered) over {self.write_seconds:.1f} s at {self.config.rate:g}/s, "
            f"{self.config.keys} keys; generator lag max {self.generator_lag * 1e3:.1f} ms; "
            f"drained={self.drained}",
        ]
        for step in self.steps:
            out.append(
                f"step {step.name}: {step.seconds:.2f} s — {step.detail}; ack latency of sends "
                f"meanwhile {self.stalls[step.name].ms()}"
            )
        for name in self.windows:
            gap = self.segment_gaps.get(name)
            whole = "-" if gap is None else f"{gap * 1e3:.1f} ms"
            out.append(
                f"producer-blocked window of {name}: {self.blocked(name).ms()} "
                f"(ack-to-ack gap {self.gaps(name).ms()}; segment: last parent ack -> first "
                f"child ack {whole})"
            )
        out.append(
            f"ack latency (intended -> ack): all {self.latency.ms()}; away from faults "
            f"{self.quiet_latency.ms()}"
        )
        for r in self.registrations:
            out.append(
                f"registration -> own segment: {r.consumer}#{r.session} "
                f"{_seconds(r.assigned)} (segments {r.segments}), first message "
                f"{_seconds(r.first_message)}"
            )
        out.extend(self.notes)
        out.append(self.report.summary())
        return out


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def topic_spec() -> dict[str, Any]:
    return {
        "apiVersion": "scalabletopics.io/v1alpha1",
        "kind": "ScalableTopic",
        "metadata": {"name": TOPIC, "namespace": NAMESPACE},
        "spec": {
            "initialSegments": 2,
            "subscriptions": [
                {"name": STREAM_SUB, "type": "Stream"},
                {"name": QUEUE_SUB, "type": "Queue"},
            ],
            "consumerGracePeriod": "60s",
            # Two initial segments of one entry bucket each. The auto-scaler acts only on
            # consumer counts: the load thresholds are far above the run's rate, merges never
            # qualify (nothing is below a zero threshold), and at maxSegments a consumer-driven
            # split becomes a rebucket rollover (the rebucket step).
            "entryBuckets": 2,
            "autoScale": {
                "enabled": True,
                "minSegments": 1,
                "maxSegments": 2,
                "splitCooldown": "1s",
                "evaluationInterval": "2s",
                "mergeMsgRateInThreshold": 0,
                "mergeBytesRateInThreshold": 0,
                "mergeMsgRateOutThreshold": 0,
                "mergeBytesRateOutThreshold": 0,
            },
        },
    }


async def _until(
    what: str, within: float, probe: Callable[[], list[str]], clock: Callable[[], float]
) -> None:
    """Wait until ``probe`` reports nothing outstanding; fail with what is still missing."""
    deadline = clock() + within
    while True:
        outstanding = probe()
        if not outstanding:
            return
        if clock() > deadline:
            shown = "; ".join(outstanding[:8])
            raise AssertionError(
                f"{what}: not reached within {within:g} s ({len(outstanding)} outstanding: {shown})"
            )
        await asyncio.sleep(0.1)


def _warm(recorder: Recorder, config: ChaosConfig) -> Callable[[], list[str]]:
    def probe() -> list[str]:
        return [
            f"{sub}: {recorder.read_count(sub)}/{config.warmup_reads} read"
            for sub in recorder.ordered
            if recorder.read_count(sub) < config.warmup_reads
        ]

    return probe


def _unread(recorder: Recorder) -> Callable[[], list[str]]:
    def probe() -> list[str]:
        return [
            f"{sub}: {recorder.unread(sub)} acknowledged and unread"
            for sub in recorder.ordered
            if recorder.unread(sub)
        ]

    return probe


def _settled(recorder: Recorder, since: float, reads: int) -> Callable[[], list[str]]:
    counts = {sub: recorder.read_count(sub) for sub in recorder.ordered}

    def probe() -> list[str]:
        short = [
            f"{sub}: {recorder.read_count(sub) - n}/{reads} read since"
            for sub, n in counts.items()
            if recorder.read_count(sub) - n < reads
        ]
        return short + recorder.lagging(since)

    return probe


async def _wait_dag(url: str, within: float, topic: str = TOPIC) -> None:
    """Until the replica at ``url`` serves the topic's DAG (a follower's cache may lag)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        watcher = DagWatcher(url, NAMESPACE, topic)
        try:
            dag = await watcher.start(within=10)
            if dag.segments and len(dag.brokers()) == len(dag.segments):
                return
        except TopicNotFoundError:
            pass
        finally:
            await watcher.close()
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{url} did not serve the DAG of {topic} within {within:g} s")
        await asyncio.sleep(0.2)


async def service_url(stack: Stack) -> str:
    """The clients' service URL: a replica that is *not* the leader serves their DAG watches
    (as a Service would route to any replica), so the leader's kill tests fail-over alone."""
    leader = await stack.leader()
    pods = await stack.ready_pods(OPERATOR_LABEL)
    others = [p for p in pods if p["metadata"]["name"] != leader] or pods
    pod = sorted(others, key=lambda p: str(p["metadata"]["name"]))[0]
    ports = [
        int(port["containerPort"])
        for container in pod["spec"]["containers"]
        for port in container.get("ports") or []
        if port.get("name") == "http"
    ]
    assert ports, f"operator pod {pod['metadata']['name']} names no http port"
    return f"http://{pod['status']['podIP']}:{ports[0]}"


async def run_chaos(tmp_path: Path, config: ChaosConfig | None = None) -> ChaosResult:
    config = config or ChaosConfig()
    async with operator_stack(tmp_path, operator_replicas=2, brokers=3) as stack:
        await stack.apply_topic(topic_spec())
        await stack.wait_ready(TOPIC, 90)
        return await _run(stack, tmp_path, config)


async def _run(stack: Stack, tmp_path: Path, config: ChaosConfig) -> ChaosResult:
    recorder = Recorder({STREAM_SUB: True, QUEUE_SUB: config.queue_ordered})
    clock = recorder.clock
    url = await service_url(stack)
    await _wait_dag(url, config.settle_within)
    nemesis = Nemesis(stack, recorder, TOPIC, NAMESPACE)

    def stream_runner(name: str) -> ConsumerRunner:
        async def open_() -> ReadingConsumer:
            consumer = StreamConsumer(url, NAMESPACE, TOPIC, STREAM_SUB, name)
            await consumer.start()
            return consumer

        async def own_segment(consumer: ReadingConsumer, within: float) -> list[int]:
            assert isinstance(consumer, StreamConsumer)
            return await consumer.wait_assignment(bool, within)

        async def leave(consumer: ReadingConsumer) -> None:
            assert isinstance(consumer, StreamConsumer)
            await consumer.close(unregister=True)

        return ConsumerRunner(
            name,
            STREAM_SUB,
            recorder,
            open_,
            assignment=own_segment if name in initial else None,
            leave=leave,
        )

    async def open_queue() -> ReadingConsumer:
        consumer = QueueConsumer(url, NAMESPACE, TOPIC, QUEUE_SUB, "queue-0")
        await consumer.start()
        return consumer

    initial = {f"stream-{i}" for i in range(config.stream_consumers)}
    streams = [stream_runner(name) for name in sorted(initial)]
    queue = ConsumerRunner("queue-0", QUEUE_SUB, recorder, open_queue)
    runners = [*streams, queue]
    writer: WriterProcess | None = None
    steps: list[Step] = []
    notes: list[str] = []
    started = clock()
    unanswered = 0
    drained = False
    try:
        try:
            with (tmp_path / "chaos-writer.log").open("wb") as writer_log:
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
            started = await writer.wait_started(config.settle_within)
            await queue.start()
            for runner in streams:
                await runner.start()
            await _until("warm-up", config.settle_within, _warm(recorder, config), clock)
            for fault in config.faults:
                step = await _fault(fault, nemesis, streams, steps, stream_runner)
                steps.append(step)
                log.info("chaos: %s done in %.2f s: %s", step.name, step.seconds, step.detail)
                await _until(
                    f"settle after {step.name}",
                    config.settle_within,
                    _settled(recorder, step.finished, config.settle_reads),
                    clock,
                )
                for runner in runners:
                    assert runner.error is None, f"{runner.name} failed: {runner.error!r}"
                assert writer.running, "the writer process died (see chaos-writer.log)"
        finally:
            write_seconds = clock() - started
            if writer is not None:
                unanswered = await writer.stop(60.0)
        try:
            await _until("drain", config.drain_within, _unread(recorder), clock)
            drained = True
        except AssertionError as exc:
            notes.append(str(exc))
    finally:
        for runner in runners:
            await runner.stop()

    history = recorder.history()
    acked = [s for s in history.sends if s.outcome is Outcome.OK and s.completed is not None]
    away = [
        s
        for s in acked
        if not any(step.started - 0.5 <= s.invoked <= step.finished + 1.0 for step in steps)
    ]
    history_path = tmp_path / "chaos-history.json"
    history.dump(history_path)
    windows = {
        step.name: handoff_windows(history.sends, step.parents, step.children)
        for step in steps
        if step.children
    }
    return ChaosResult(
        config=config,
        report=check(history),
        steps=steps,
        windows=windows,
        segment_gaps={
            step.name: segment_gap(history.sends, step.parents, step.children)
            for step in steps
            if step.children
        },
        stalls={
            step.name: summarize(
                s.completed - s.invoked
                for s in acked
                if s.completed is not None and step.started <= s.invoked <= step.finished
            )
            for step in steps
        },
        registrations=[r for runner in streams for r in runner.registrations],
        latency=summarize(s.completed - s.invoked for s in acked if s.completed is not None),
        quiet_latency=summarize(s.completed - s.invoked for s in away if s.completed is not None),
        sent=recorder.sent,
        acked=recorder.acked,
        unanswered=unanswered,
        write_seconds=write_seconds,
        drained=drained,
        history_path=history_path,
        generator_lag=writer.behind_max if writer is not None else 0.0,
        notes=notes,
    )


def _assignment(runner: ConsumerRunner) -> list[int]:
    consumer = runner.consumer
    assert isinstance(consumer, StreamConsumer), f"{runner.name} is not an open stream consumer"
    return sorted(consumer.assignment)


async def _rebucket(
    nemesis: Nemesis, streams: list[ConsumerRunner], make: Callable[[str], ConsumerRunner]
) -> Step:
    """Register stream consumers until they outnumber the active segments' entry buckets,
    wait for the automatic rollover, then let the extra consumers leave."""
    before = await nemesis.layout()
    buckets = await nemesis.buckets()
    needed = sum(buckets.values()) + 1 - len(streams)
    extra = [make(f"stream-extra-{i}") for i in range(max(0, needed))]
    for runner in extra:
        await runner.start()
    try:
        step = await nemesis.wait_layout_change(before)
    finally:
        for runner in extra:
            await runner.stop(leave=True)
    step.name = "rebucket"
    after: SegmentLayout = step.data.pop("layout")
    ranges = {after.get(c).hash_range for c in step.children}
    assert ranges == {before.get(p).hash_range for p in step.parents}, (
        f"expected a rebucket rollover (same ranges), got {step.detail}"
    )
    step.detail = (
        f"rebucket {list(step.parents)} -> {list(step.children)} with {len(streams) + len(extra)} "
        f"stream consumers over {sum(buckets.values())} buckets {buckets}; {REBUCKET_HOW}"
    )
    return step


async def _fault(
    fault: str,
    nemesis: Nemesis,
    streams: list[ConsumerRunner],
    done: list[Step],
    make_stream: Callable[[str], ConsumerRunner],
) -> Step:
    if fault == "split":
        return await nemesis.split()
    if fault == "merge":
        split = next((s for s in reversed(done) if s.name == "split"), None)
        assert split is not None and len(split.children) == 2, "merge needs a split before it"
        return await nemesis.merge(list(split.children))
    if fault == "rebucket":
        return await _rebucket(nemesis, streams, make_stream)
    if fault == "kill-broker":
        return await nemesis.kill_broker()
    if fault in RECORD_FAULTS:
        return await nemesis.lose_status(segments=fault == "lose-status-and-segments")
    if fault == "kill-operator-leader":
        return await nemesis.kill_leader()
    if fault == "restart-consumer":
        runner = streams[0]
        step = Step("restart-consumer", nemesis.recorder.clock())
        before = _assignment(runner)
        await runner.restart()
        step.finished = nemesis.recorder.clock()
        after = _assignment(runner)
        step.data = {"before": before, "after": after}
        step.detail = (
            f"closed and re-opened {runner.name} (session {runner.session}): segments "
            f"{before} before, {after} after (within the grace period: unchanged)"
        )
        return step
    raise ValueError(f"unknown fault {fault!r}; known: {', '.join((*FAULTS, *RECORD_FAULTS))}")
