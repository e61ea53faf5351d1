"""A replica that starts while topics exist never tells a client that one of them is not found.

CI found a follower, started next to a leader, answering a producer's DAG watch with the final
``UnknownTopic`` after its ``/readyz`` was already 200: kopf's ready flag is up before its
watches list anything. Here a replica starts beside 40 Ready topics and every DAG request made
from its first accepted connection on is answered 503 ``NotReady`` or with the DAG, never 404;
``/readyz`` is 200 only once it holds all 40, and then a topic that does not exist is 404.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from .operator_harness import Stack, eventually, operator_stack, topic_body

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(300),
]

TOPICS = [f"synced-{i:02d}" for i in range(40)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(
        tmp_path_factory.mktemp("initialsync"), operator_replicas=0, brokers=1
    ) as s:
        yield s


async def test_a_starting_replica_answers_retry_or_the_dag_never_not_found(stack: Stack) -> None:
    leader = await stack.start_operator("s-a")
    items = [topic_body(name, segments=1, autoScale={"enabled": False}) for name in TOPICS]
    await stack.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    for name in TOPICS:
        await stack.wait_ready(name, 120)
    assert await stack.leader() == leader.identity

    replica = await stack.start_operator("s-b")
    answers: Counter[int] = Counter()
    async with aiohttp.ClientSession() as http:

        async def ask(name: str) -> int:
            async with http.get(f"{replica.url}/v1/topics/default/{name}/dag") as response:
                body = await response.json()
                if response.status == 503:
                    assert body["error"] == "NotReady", body
                else:
                    assert response.status == 200, (name, response.status, body)
                    assert body["topic"] == name
                return response.status

        async def listening() -> bool:
            async with http.get(f"{replica.url}/readyz") as response:
                return response.status in (200, 503)

        await eventually(listening, 60, "s-b accepting connections")
        while True:
            async with http.get(f"{replica.url}/readyz") as response:
                ready = response.status == 200
            answers.update(await asyncio.gather(*(ask(name) for name in TOPICS)))
            if ready:
                break
        assert set(answers) <= {200, 503}, answers
        assert answers[200] >= len(TOPICS)  # the round after /readyz turned 200 is all DAGs

        async with http.get(f"{replica.url}/v1/topics/default/absent/dag") as response:
            assert response.status == 404
            assert (await response.json())["error"] == "UnknownTopic"

    async def synced_logged() -> bool:
        return f"initial sync: the cache holds {len(TOPICS)} topics" in replica.log_path.read_text()

    await eventually(synced_logged, 10, "s-b's initial sync logged")
    print("DAG answers while s-b started:", dict(answers))
