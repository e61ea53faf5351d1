"""Authentication and authorization on the real control plane (issue 16, docs/security.md).

One operator stack (its own kube-apiserver with RBAC, TokenReview and SubjectAccessReview):
the broker runs as a Pod under the manifests' ServiceAccount with ``SEGMENT_BROKER_AUTH``
switched to ``kubernetes`` (the local overlay turns it off for the other stacks), the operator
runs with ``--auth kubernetes`` under its ServiceAccount's token and presents a projected-style
token of audience ``scalabletopics.io`` to the broker's admin API (every segment it creates goes
through it). Clients are ServiceAccounts of ``default`` bound to the example ClusterRoles of
``manifests/base/client-rbac.yaml``.

Every endpoint (broker admin, produce, consume; operator DAG watch, consumer session) refuses
an anonymous client, a token of another audience (the API server's own), a token whose
ServiceAccount was deleted (TokenReview rejects it: this stands for an expired token, since
TokenRequest cannot mint one that expires within a test), and a valid identity without the
verb, each with the code and a message naming what is missing; it accepts the right identity;
a RoleBinding added or removed takes effect within the cache TTL (2 s here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from scalable_topics.client.dag import DagWatcher
from scalable_topics.client.segment import (
    AccessDeniedError,
    SegmentConsumer,
    SegmentProducer,
)
from scalable_topics.core import sessions as proto
from scalable_topics.core.auth import AUDIENCE
from scalable_topics.core.wire import Message
from scalable_topics.credentials import client_session

from .conftest import metric_samples
from .operator_harness import (
    NAMESPACE,
    OPERATOR_SERVICE_ACCOUNT,
    SERVICE_ACCOUNTS,
    Stack,
    eventually,
    operator_stack,
    topic_body,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

TTL = 2.0
TOPIC = "orders"
BROKER_LABEL = "app.kubernetes.io/name=segment-broker"


class Clients:
    """Token files of the test's identities (``None``: anonymous)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, Path] = {}

    def session(self, who: str | None) -> aiohttp.ClientSession:
        if who is None:
            return aiohttp.ClientSession()
        return client_session(self.files[who])


class Secured:
    def __init__(self, stack: Stack, clients: Clients, operator_url: str, broker_url: str):
        self.stack = stack
        self.clients = clients
        self.operator_url = operator_url
        self.broker_url = broker_url


async def _token(stack: Stack, account: str, *, audience: str | None = AUDIENCE) -> str:
    namespace, name = account.split("/")
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if audience is not None:
        spec["audiences"] = [audience]
    review = await stack.api.request(
        "POST",
        SERVICE_ACCOUNTS.path(namespace, name, "token"),
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(review["status"]["token"])


async def _bind(stack: Stack, name: str, role: str, account: str) -> None:
    await stack.kubectl(
        "create", "rolebinding", name, "-n", "default", f"--clusterrole={role}",
        f"--serviceaccount=default:{account}",
    )  # fmt: skip


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    root = tmp_path_factory.mktemp("security")
    async with operator_stack(root, operator_replicas=0, brokers=1) as stack:
        before = {p["metadata"]["uid"] for p in await stack.pods(BROKER_LABEL)}
        await stack.kubectl(
            "set", "env", "-n", NAMESPACE, "statefulset/segment-broker",
            "SEGMENT_BROKER_AUTH=kubernetes", f"SEGMENT_BROKER_AUTH_TTL_S={TTL}",
        )  # fmt: skip

        async def restarted() -> str | None:
            pods = await stack.ready_pods(BROKER_LABEL)
            fresh = [p for p in pods if p["metadata"]["uid"] not in before]
            if len(fresh) != 1:
                return None
            port = stack.broker_port
            return f"http://{fresh[0]['status']['podIP']}:{port}"

        broker_url = await eventually(restarted, 120, "the broker restarted with --auth")
        clients = Clients(root)
        for account in ("writer", "reader", "nobody", "ghost"):
            await stack.kubectl("create", "serviceaccount", account, "-n", "default")
        await _bind(stack, "writer-produces", "scalable-topics-producer", "writer")
        await _bind(stack, "reader-consumes", "scalable-topics-consumer", "reader")
        tokens = {
            "operator": await _token(stack, f"{NAMESPACE}/{OPERATOR_SERVICE_ACCOUNT}"),
            "writer": await _token(stack, "default/writer"),
            "reader": await _token(stack, "default/reader"),
            "nobody": await _token(stack, "default/nobody"),
            "ghost": await _token(stack, "default/ghost"),
            "api-audience": await _token(stack, "default/writer", audience=None),
        }
        await stack.kubectl("delete", "serviceaccount", "ghost", "-n", "default")
        for who, token in tokens.items():
            clients.files[who] = root / f"{who}.token"
            clients.files[who].write_text(token)
        op = await stack.start_operator(
            "op-auth",
            extra=(
                "--auth", "kubernetes", f"--auth-ttl={TTL}",
                "--broker-token-file", str(clients.files["operator"]),
            ),
        )  # fmt: skip

        async def serving() -> bool:
            try:
                async with stack.http.get(op.url + "/readyz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(serving, 90, "the operator serving")
        # Segments are created through the broker's admin API: Ready proves the operator's
        # token opens it.
        await stack.apply_topic(topic_body(TOPIC, segments=1))
        await stack.wait_ready(TOPIC, within=120)
        yield Secured(stack, clients, op.url, broker_url)


REFUSED_IDENTITIES = [
    (None, "Unauthenticated", "no bearer token"),
    ("api-audience", "Unauthenticated", "audience"),
    ("ghost", "Unauthenticated", "token refused"),
]


async def _produce(s: Secured, who: str | None) -> int:
    """Connect as ``who`` and store one message; its position."""
    async with s.clients.session(who) as session:
        producer = await SegmentProducer.connect(
            s.broker_url, "default", TOPIC, 0, f"p-{who}", session=session
        )
        try:
            ack = await (await producer.send_entry([Message(b"hello")]))
            return ack.position
        finally:
            await producer.close()


async def _consume(s: Secured, who: str | None) -> int:
    async with s.clients.session(who) as session:
        consumer = await SegmentConsumer.connect(
            s.broker_url, "default", TOPIC, 0, "billing", f"c-{who}", session=session
        )
        try:
            async with asyncio.timeout(30):
                entry = await consumer.receive()
            assert entry is not None
            return entry.position
        finally:
            await consumer.close()


async def _admin(s: Secured, who: str | None, method: str, path: str) -> tuple[int, Any]:
    url = s.broker_url + "/admin/v1/segments" + path
    async with s.clients.session(who) as session, session.request(method, url) as resp:
        return resp.status, await resp.json(content_type=None)


async def _dag(s: Secured, who: str | None) -> int:
    async with s.clients.session(who) as session:
        watcher = DagWatcher(s.operator_url, "default", TOPIC, session=session)
        try:
            dag = await watcher.start(within=30)
            return dag.epoch
        finally:
            await watcher.close()


async def _consumer_session(s: Secured, who: str | None) -> tuple[Any, int | None]:
    """The first message the operator sends a registering consumer, and the close code."""
    url = s.operator_url + proto.consumers_path("default", TOPIC)
    register = proto.RegisterMessage(subscription="billing", consumer=f"s-{who}")
    async with s.clients.session(who) as session, session.ws_connect(url) as ws:
        with contextlib.suppress(ConnectionError):
            # A refused session may already be closing.
            await ws.send_str(proto.encode(register))
        async with asyncio.timeout(30):
            frame = await ws.receive()
        text = frame.type is aiohttp.WSMsgType.TEXT
        message = proto.parse_server_message(frame.data) if text else None
        if isinstance(message, proto.AssignmentMessage):
            await ws.send_str(proto.encode(proto.UnregisterMessage()))
        async with asyncio.timeout(10):
            while not ws.closed:
                await ws.receive()
        return message, ws.close_code


@pytest.mark.parametrize(("who", "code", "why"), REFUSED_IDENTITIES)
async def test_every_endpoint_refuses_a_missing_or_invalid_token(
    secured: Secured, who: str | None, code: str, why: str
) -> None:
    for call in (_produce, _consume):
        with pytest.raises(AccessDeniedError) as refused:
            await call(secured, who)
        assert refused.value.code == code and why in str(refused.value), refused.value
    for method, path in (("GET", ""), ("DELETE", f"/default/{TOPIC}/0")):
        status, body = await _admin(secured, who, method, path)
        assert status == 401 and body["error"]["code"] == code, body
        assert why in body["error"]["message"]
    with pytest.raises(AccessDeniedError) as dag_refused:
        await _dag(secured, who)
    assert dag_refused.value.code == code and why in str(dag_refused.value)
    message, close = await _consumer_session(secured, who)
    assert isinstance(message, proto.ErrorMessage) and message.code == code
    assert why in message.message and close == proto.CloseCode.UNAUTHENTICATED


async def _forbidden_counts(s: Secured) -> tuple[float, float]:
    forbidden = (("code", "Forbidden"),)
    broker = await metric_samples(s.broker_url)
    operator = await metric_samples(s.operator_url)
    return (
        broker.get(("segment_broker_auth_refusals_total", forbidden), 0.0),
        operator.get(("scalable_topic_auth_refusals_total", forbidden), 0.0),
    )


async def test_each_endpoint_needs_its_verb(secured: Secured) -> None:
    broker_before, operator_before = await _forbidden_counts(secured)
    # The producer may produce and watch the DAG, not consume nor administer.
    assert await _produce(secured, "writer") >= 0
    assert await _dag(secured, "writer") >= 0
    with pytest.raises(AccessDeniedError) as consume:
        await _consume(secured, "writer")
    assert consume.value.code == "Forbidden"
    assert 'needs verb "consume" on scalabletopics.scalabletopics.io "orders"' in str(consume.value)
    message, close = await _consumer_session(secured, "writer")
    assert isinstance(message, proto.ErrorMessage) and message.code == "Forbidden"
    assert close == proto.CloseCode.FORBIDDEN and "consume" in message.message
    status, body = await _admin(secured, "writer", "DELETE", f"/default/{TOPIC}/0")
    assert status == 403 and "only system:serviceaccount:" in body["error"]["message"]
    # The consumer may consume, hold a consumer session and watch the DAG, not produce.
    assert await _consume(secured, "reader") >= 0
    assert await _dag(secured, "reader") >= 0
    message, close = await _consumer_session(secured, "reader")
    assert isinstance(message, proto.AssignmentMessage), message
    with pytest.raises(AccessDeniedError) as produce:
        await _produce(secured, "reader")
    assert produce.value.code == "Forbidden" and 'verb "produce"' in str(produce.value)
    # A checkpoint consumer reads one segment's stats; the list and writes stay the operator's.
    status, body = await _admin(secured, "reader", "GET", f"/default/{TOPIC}/0")
    assert status == 200 and body["segmentId"] == 0
    status, _ = await _admin(secured, "reader", "GET", "")
    assert status == 403
    # Without any binding, not even the DAG.
    with pytest.raises(AccessDeniedError) as dag:
        await _dag(secured, "nobody")
    assert dag.value.code == "Forbidden" and 'verb "get"' in str(dag.value)
    # The operator's identity may administer.
    status, body = await _admin(secured, "operator", "GET", "")
    assert status == 200 and [s["topic"] for s in body["segments"]] == [TOPIC]
    # Each refusal is counted once, by code: 4 by the broker (consume, delete, produce, list),
    # 2 by the operator (consumer session, DAG watch).
    broker_after, operator_after = await _forbidden_counts(secured)
    assert (broker_after - broker_before, operator_after - operator_before) == (4, 2)


async def test_a_role_binding_takes_effect_within_the_cache_ttl(secured: Secured) -> None:
    stack = secured.stack

    async def produces() -> bool:
        try:
            await _produce(secured, "nobody")
        except AccessDeniedError as exc:
            assert exc.code == "Forbidden", exc
            return False
        return True

    assert not await produces()
    await _bind(stack, "nobody-produces", "scalable-topics-producer", "nobody")
    bound = time.monotonic()
    await eventually(produces, 30, "produce allowed after the RoleBinding")
    granted = time.monotonic() - bound
    await stack.kubectl("delete", "rolebinding", "nobody-produces", "-n", "default")
    unbound = time.monotonic()

    async def refused() -> bool:
        return not await produces()

    await eventually(refused, 30, "produce refused after the RoleBinding is gone")
    revoked = time.monotonic() - unbound
    # The cache TTL plus one connection attempt on a loaded machine.
    assert granted < TTL + 5 and revoked < TTL + 5, (granted, revoked)
    print(json.dumps({"granted_s": round(granted, 2), "revoked_s": round(revoked, 2)}))
