"""Faults for the chaos run, against the operator's integration stack
(``tests/integration/operator_harness.py``): manual split/merge requests through the topic's
request annotation, and SIGKILL of a pod's process (a broker, the operator's leader), which the
local kubelet restarts like a container runtime would.

Every fault returns a :class:`Step` with its monotonic start/end, and the restarts are recorded
in the :class:`~tests.chaos.workload.Recorder` so that the checker can tell redeliveries they
cause from unexplained duplicates.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scalable_topics.core.layout import SegmentLayout
from scalable_topics.localcluster.restclient import PODS
from tests.integration.operator_harness import (
    NAMESPACE,
    SEGMENTS,
    JsonObj,
    Stack,
    condition_of,
    eventually,
)

from .checker import RestartKind
from .workload import Recorder

__all__ = ["Nemesis", "Step"]

BROKER_LABEL = "app.kubernetes.io/name=segment-broker"


@dataclass
class Step:
    name: str
    started: float
    finished: float = 0.0
    detail: str = ""
    parents: tuple[int, ...] = ()
    children: tuple[int, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.finished - self.started


def _layout(topic: JsonObj | None) -> SegmentLayout:
    assert topic is not None, "topic vanished"
    return SegmentLayout.from_metadata(topic["status"]["layout"])


def _container(pod: JsonObj) -> JsonObj:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    assert statuses, f"pod {pod['metadata']['name']} has no container status"
    return dict(statuses[0])


def _pid(pod: JsonObj) -> int:
    container_id = str(_container(pod).get("containerID") or "")
    assert container_id.startswith("local://"), f"no local process for {container_id!r}"
    return int(container_id.removeprefix("local://"))


def _micro_time(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Nemesis:
    def __init__(
        self, stack: Stack, recorder: Recorder, topic: str, namespace: str = "default"
    ) -> None:
        self.stack = stack
        self.recorder = recorder
        self.topic = topic
        self.namespace = namespace

    async def layout(self) -> SegmentLayout:
        return _layout(await self.stack.topic(self.topic, self.namespace))

    # -- split / merge ----------------------------------------------------------------------------

    async def _request(self, name: str, op: str, segments: list[int], within: float = 60) -> Step:
        step = Step(name, self.recorder.clock())
        before = await self.layout()
        request_id = f"chaos-{op}-{uuid.uuid4().hex[:8]}"
        await self.stack.request(
            self.topic, {"id": request_id, "op": op, "segments": segments}, self.namespace
        )
        topic = await self.stack.wait_request(self.topic, request_id, within, self.namespace)
        step.finished = self.recorder.clock()
        last = topic["status"]["lastRequest"]
        assert last.get("result") == "Succeeded", f"{op} {segments}: {last}"
        after = _layout(topic)
        step.parents = tuple(segments)
        step.children = tuple(sorted(set(after.segments) - set(before.segments)))
        assert step.children, f"{op} {segments} created no segment: epoch {after.epoch}"
        step.detail = f"{op} {list(step.parents)} -> {list(step.children)} (epoch {after.epoch})"
        return step

    async def split(self, segment: int | None = None) -> Step:
        """Split ``segment`` (default: the active segment with the lowest range start)."""
        if segment is None:
            active = (await self.layout()).active()
            segment = min(active, key=lambda s: s.hash_range.start).segment_id
        return await self._request("split", "split", [segment])

    async def merge(self, segments: list[int]) -> Step:
        return await self._request("merge", "merge", segments)

    async def wait_layout_change(self, before: SegmentLayout, within: float = 60) -> Step:
        """Until an operation the test did not request (an automatic one) is committed and
        finished; the step names its parents (sealed since ``before``) and children."""
        step = Step("auto", self.recorder.clock())

        async def changed() -> SegmentLayout | None:
            topic = await self.stack.topic(self.topic, self.namespace)
            layout = _layout(topic)
            if layout.epoch > before.epoch and not (topic or {})["status"].get("operation"):
                return layout
            return None

        after = await eventually(changed, within, f"an automatic operation on {self.topic}")
        step.finished = self.recorder.clock()
        was_active = {s.segment_id for s in before.active()}
        step.parents = tuple(sorted(was_active - {s.segment_id for s in after.active()}))
        step.children = tuple(sorted(set(after.segments) - set(before.segments)))
        step.detail = f"{list(step.parents)} -> {list(step.children)} (epoch {after.epoch})"
        step.data["layout"] = after
        return step

    async def buckets(self) -> dict[int, int]:
        """Entry-bucket count of every active segment (from the Segment resources)."""
        active = {s.segment_id for s in (await self.layout()).active()}
        segments = await self.stack.segments(self.topic, self.namespace)
        return {
            sid: int(seg["spec"].get("buckets") or 1)
            for sid, seg in segments.items()
            if sid in active
        }

    # -- lost records ----------------------------------------------------------------------------

    async def lose_status(self, *, segments: bool = False, within: float = 90) -> Step:
        """Replace the topic's status with an empty one while the clients run (a restore from a
        backup without status); with ``segments`` every Segment resource is deleted first (the
        topic restored alone). Returns once the topic is Ready again; ``data`` has the layout
        and the broker of every segment the brokers hold, before and after."""
        name = "lose-status-and-segments" if segments else "lose-status"
        step = Step(name, self.recorder.clock())
        before = await self.layout()
        held = await self.stack.broker_segments(self.topic, self.namespace)
        if segments:
            for sid in sorted(await self.stack.segments(self.topic, self.namespace)):
                await self.stack.api.delete(SEGMENTS, self.namespace, f"{self.topic}-{sid}")
        await self.stack.lose_status(self.topic, self.namespace)
        topic = await self.stack.wait_ready(self.topic, within, self.namespace)
        step.finished = self.recorder.clock()
        after = _layout(topic)
        step.data = {
            "before": before,
            "after": after,
            "held": held,
            "heldAfter": await self.stack.broker_segments(self.topic, self.namespace),
        }
        lost = "status and Segments" if segments else "status"
        step.detail = (
            f"{lost} lost at epoch {before.epoch}; rebuilt at epoch {after.epoch} with "
            f"{len(after.segments)} segments ({len(after.active())} active)"
        )
        return step

    # -- process kills ----------------------------------------------------------------------------

    async def _pod(self, name: str) -> JsonObj:
        pod = await self.stack.api.get_or_none(PODS, NAMESPACE, name)
        assert pod is not None, f"pod {name} not found"
        return pod

    async def kill_pod(
        self, name: str, kind: RestartKind, within: float = 90, segments: tuple[int, ...] = ()
    ) -> Step:
        """SIGKILL the pod's container process; returns once the kubelet restarted it and it is
        Ready again. ``segments``: those the pod hosts (recorded with the restart)."""
        step = Step(f"kill-{kind.value}", self.recorder.clock())

        async def running() -> JsonObj | None:
            current = await self._pod(name)
            status = _container(current)
            if "running" in (status.get("state") or {}) and status.get("containerID"):
                return current
            return None

        pod = await eventually(running, within, f"pod {name} running with a process")
        restarts = int(_container(pod).get("restartCount") or 0)
        pid = _pid(pod)
        handle = self.recorder.restart(kind, name, segments=segments)
        os.kill(pid, signal.SIGKILL)

        async def back() -> bool:
            current = await self._pod(name)
            status = _container(current)
            return int(status.get("restartCount") or 0) > restarts and (
                (condition_of(current, "Ready") or {}).get("status") == "True"
            )

        await eventually(back, within, f"pod {name} restarted and Ready")
        self.recorder.restarted(handle)
        step.finished = self.recorder.clock()
        step.detail = f"SIGKILL {name} (pid {pid}); restarted and Ready"
        step.data = {"pod": name, "pid": pid}
        return step

    async def hosted(self) -> dict[str, set[int]]:
        """Broker pod → the topic's segments it hosts (all states)."""
        hosting: dict[str, set[int]] = {}
        for segment_id, segment in (await self.stack.segments(self.topic, self.namespace)).items():
            pod = ((segment.get("status") or {}).get("broker") or {}).get("pod")
            if pod:
                hosting.setdefault(str(pod), set()).add(segment_id)
        return hosting

    async def kill_broker(self, pod: str | None = None) -> Step:
        """SIGKILL ``pod`` (default: the broker hosting the most active segments)."""
        hosting = await self.hosted()
        if pod is None:
            active = {s.segment_id for s in (await self.layout()).active()}
            counts = {p: len(ids & active) for p, ids in hosting.items() if ids & active}
            assert counts, "no active segment has a broker"
            pod = max(sorted(counts), key=lambda p: counts[p])
        segments = tuple(sorted(hosting.get(pod, set())))
        step = await self.kill_pod(pod, RestartKind.BROKER, segments=segments)
        step.name = "kill-broker"
        step.detail += f"; it hosted segments {list(segments)}"
        return step

    async def kill_leader(self, within: float = 90) -> Step:
        """SIGKILL the operator replica holding the shard Lease; returns once the Lease is held
        and renewed after the kill (by the other replica or by the restarted one)."""
        holder = await self.stack.leader()
        assert holder, "no shard leader"
        killed_at = time.time()
        step = await self.kill_pod(holder, RestartKind.OPERATOR, within)

        async def led() -> str | None:
            lease = await self.stack.lease()
            spec = (lease or {}).get("spec") or {}
            renewed = _micro_time(spec.get("renewTime"))
            who = str(spec.get("holderIdentity") or "")
            return who if who and renewed > killed_at else None

        new_holder = await eventually(led, within, "the shard Lease renewed after the kill")
        step.name = "kill-operator-leader"
        step.finished = self.recorder.clock()
        step.detail = f"SIGKILL leader {holder}; Lease now held by {new_holder}"
        step.data["newLeader"] = new_holder
        return step

    async def broker_pods(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in await self.stack.pods(BROKER_LABEL))
