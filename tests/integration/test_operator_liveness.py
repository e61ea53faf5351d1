"""Liveness tied to progress on real operator processes (docs/operations.md, "Probes"): the
brokers stop answering (SIGSTOP), so the leader's single worker hangs in a reconcile that
creates segments (each broker call waits for the admin timeout) while new topics wait behind
it; the leader's ``/healthz`` turns 500 naming ``workqueue`` within the stall bound, the replica
that does not lead stays 200, and once the brokers answer again the leader is healthy again.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator

import pytest

from tests.chaos.nemesis import _pid

from .operator_harness import (
    OperatorProcess,
    Stack,
    eventually,
    operator_stack,
    topic_body,
)

STALL = 2.0
BROKERS = "app.kubernetes.io/name=segment-broker"


@pytest.fixture
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(tmp_path_factory.mktemp("liveness"), operator_replicas=0) as s:
        yield s


async def healthz(stack: Stack, op: OperatorProcess) -> tuple[int, str]:
    async with stack.http.get(op.url + "/healthz") as response:
        return response.status, await response.text()


async def healthy_metric(stack: Stack, op: OperatorProcess, check: str) -> float | None:
    async with stack.http.get(op.url + "/metrics") as response:
        text = await response.text()
    prefix = f'scalable_topic_operator_healthy{{check="{check}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.removeprefix(prefix))
    return None


async def test_a_stalled_queue_fails_healthz_on_the_leader_only(stack: Stack) -> None:
    args = ("--workers", "1", "--liveness-stall", str(STALL))
    leader = await stack.start_operator("live-a", extra=args)

    async def a_leads() -> bool:
        return await stack.leader() == "live-a"

    await eventually(a_leads, 60, "live-a leading")
    follower = await stack.start_operator("live-b", extra=args)

    async def both_healthy() -> bool:
        statuses = [(await healthz(stack, op))[0] for op in (leader, follower)]
        return statuses == [200, 200]

    await eventually(both_healthy, 60, "both replicas healthy")
    assert await healthy_metric(stack, leader, "workqueue") == 1.0

    pids = [_pid(pod) for pod in await stack.pods(BROKERS)]
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        for i in range(3):
            await stack.apply_topic(topic_body(f"wedge-{i}", segments=2))

        async def leader_unhealthy() -> str | None:
            status, text = await healthz(stack, leader)
            return text if status == 500 else None

        body = await eventually(leader_unhealthy, 30, "leader /healthz 500")
        assert time.monotonic() - stopped_at >= STALL
        assert '"check": "workqueue"' in body and "waiting" in body, body
        assert await healthy_metric(stack, leader, "workqueue") == 0.0
        assert (await healthz(stack, follower))[0] == 200
        assert await healthy_metric(stack, follower, "workqueue") == 1.0
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    async def leader_healthy() -> bool:
        return (await healthz(stack, leader))[0] == 200

    await eventually(leader_healthy, 90, "leader healthy again")
    assert await healthy_metric(stack, leader, "workqueue") == 1.0
