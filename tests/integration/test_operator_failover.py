"""Leadership fail-over of the operator Deployment (2 replicas, Lease timings of the local
overlay: 6 s lease, 4 s renew deadline, 1 s retry): SIGKILL the leader's process, the other
replica takes the shard Lease, records itself in the topic's status, restores the consumer
registrations, and keeps executing requests.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from .operator_harness import JsonObj, Stack, eventually, operator_stack, topic_body

pytestmark = pytest.mark.asyncio(loop_scope="module")

LEASE_DURATION = 6.0
RETRY_PERIOD = 1.0
JITTER = 1.2


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(tmp_path_factory.mktemp("failover")) as running:
        yield running


async def register(
    http: aiohttp.ClientSession, url: str, topic: str, consumer: str
) -> tuple[aiohttp.ClientWebSocketResponse, JsonObj]:
    """Open a consumer controller session and return it with the first assignment."""
    ws = await http.ws_connect(f"{url}/v1/topics/default/{topic}/consumers")
    await ws.send_str(
        json.dumps(
            {
                "v": 1,
                "type": "register",
                "subscription": "billing",
                "consumer": consumer,
                "consumerType": "stream",
            }
        )
    )
    while True:
        message = await ws.receive_json(timeout=30)
        if message.get("type") == "assignment":
            return ws, message
        assert message.get("type") != "error", message


def assigned(message: JsonObj) -> list[int]:
    return sorted(int(s["segmentId"]) for s in message.get("segments") or [])


def pod_pid(pod: JsonObj) -> int:
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    assert container_id.startswith("local://"), container_id
    return int(container_id.removeprefix("local://"))


async def test_leader_killed_other_replica_takes_over(stack: Stack) -> None:
    name = "failover"
    await stack.apply_topic(topic_body(name, segments=4, consumerGracePeriod="60s"))
    topic = await stack.wait_ready(name)
    old_leader = await stack.leader()
    assert topic["status"]["controller"]["pod"] == old_leader
    lease = await stack.lease()
    assert lease is not None
    transitions = int(lease["spec"].get("leaseTransitions") or 0)

    old_url = topic["status"]["controller"]["url"]
    async with aiohttp.ClientSession() as http:
        ws_a, first_a = await register(http, old_url, name, "a")
        ws_b, first_b = await register(http, old_url, name, "b")

        async def balanced() -> JsonObj | None:
            t = await stack.topic(name)
            subs = {s["name"]: s for s in (t or {}).get("status", {}).get("subscriptions") or []}
            billing: Any = subs.get("billing") or {}
            consumers = billing.get("consumers") or []
            return billing if len(consumers) == 2 else None

        persisted = await eventually(balanced, 30, "both registrations persisted in status")
        # The latest assignment each consumer holds (later pushes replace the first).
        held: dict[str, list[int]] = {}
        for consumer, ws, first in (("a", ws_a, first_a), ("b", ws_b, first_b)):
            held[consumer] = assigned(first)
            while True:
                try:
                    message = await ws.receive_json(timeout=1.0)
                except TimeoutError:
                    break
                if message.get("type") == "assignment":
                    held[consumer] = assigned(message)
        assert sorted(held["a"] + held["b"]) == [0, 1, 2, 3], (held, persisted)

        pods = {
            p["metadata"]["name"]: p
            for p in await stack.pods("app.kubernetes.io/name=scalable-topics-operator")
        }
        killed_at = time.monotonic()
        os.kill(pod_pid(pods[old_leader]), signal.SIGKILL)

        old_holder = lease["spec"]["holderIdentity"]

        async def new_leader() -> str | None:
            lease = await stack.lease()
            holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
            return holder if holder and holder != old_holder else None

        # Usually the surviving replica; the restarted one (same pod, new process) may win too.
        successor = (await eventually(new_leader, 30, "a new shard leader")).rsplit("_", 1)[0]
        takeover = time.monotonic() - killed_at
        print(f"\nfail-over: Lease taken by {successor} {takeover:.2f}s after SIGKILL")
        # Slack for a shared, loaded machine (the takeover itself is bounded by the Lease).
        assert takeover <= LEASE_DURATION + RETRY_PERIOD * JITTER + 4.0, takeover
        assert successor in pods
        lease = await stack.lease()
        assert lease is not None
        assert int(lease["spec"]["leaseTransitions"]) == transitions + 1

        async def recorded() -> JsonObj | None:
            t = await stack.topic(name)
            controller = (t or {}).get("status", {}).get("controller") or {}
            return t if controller.get("pod") == successor else None

        topic = await eventually(recorded, 30, "status.controller naming the new leader")
        new_url = topic["status"]["controller"]["url"]
        if successor != old_leader:
            assert new_url != old_url
        await ws_a.close()
        await ws_b.close()

        # Within the grace period the consumers get back exactly what they held.
        ws_a, again_a = await register(http, new_url, name, "a")
        ws_b, again_b = await register(http, new_url, name, "b")
        assert assigned(again_a) == held["a"]
        assert assigned(again_b) == held["b"]
        await ws_a.close()
        await ws_b.close()

    # The new leader executes requests.
    await stack.request(name, {"id": "after-failover", "op": "split", "segments": [3]})
    topic = await stack.wait_request(name, "after-failover")
    assert topic["status"]["lastRequest"]["result"] == "Succeeded"
    assert topic["status"]["activeSegments"] == 5

    # The killed replica was restarted by the kubelet and follows.
    async def restarted() -> bool:
        pods = await stack.ready_pods("app.kubernetes.io/name=scalable-topics-operator")
        return len(pods) == 2 and any(
            p["metadata"]["name"] == old_leader
            and p["status"]["containerStatuses"][0]["restartCount"] >= 1
            for p in pods
        )

    await eventually(restarted, 60, "the killed replica restarted")
    assert await stack.leader() == successor
