"""Setting the demo up on a running cluster: the CRDs and the stack, the clients' credentials,
and the topic in its initial shape."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from kubernetes_asyncio import client as k8s

from ..core.auth import AUDIENCE
from . import demo_progress
from .demo_base import NAMESPACE, SETUP_TIMEOUT, TOPIC, DemoBase

DEMO_CLIENT = "demo-client"
"""The ServiceAccount the demo's producer and consumers present (docs/security.md)."""
DEMO_TOKEN_SECONDS = 3600


class DemoSetup(DemoBase):
    """The stack and the topic, ready for the phases."""

    async def start_stack(self, api: k8s.ApiClient) -> str:
        """Apply the CRDs and the local overlay; wait for the brokers and an operator; return
        the operator's URL."""
        await self.kubectl("apply", "-f", str(self.root / "crds"))
        await self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=30s")

        async def served() -> bool:
            # Established comes before the API server's storage for the new resources is up
            # (a list then gets 429 "storage is (re)initializing"); the operator's first lists
            # must not meet that.
            out = await self.kubectl("get", "stopic,seg", "-A", "-o", "name", check=False)
            return "storage is (re)initializing" not in out and "error" not in out.lower()

        await self.wait_for("the API server to serve the CRDs", served, SETUP_TIMEOUT)
        await self.apply_stack()

        async def ready() -> bool:
            brokers, want, operators, _ = await self.stack_state(api)
            return (
                want > 0
                and brokers >= want
                and operators > 0
                and bool(await self.operator_url(api))
            )

        async def detail() -> str:
            brokers, want, operators, want_ops = await self.stack_state(api)
            return f"brokers ready {brokers}/{want}, operator replicas ready {operators}/{want_ops}"

        await self.wait_for("the brokers and an operator", ready, SETUP_TIMEOUT, detail)
        return await self.operator_url(api)

    async def apply_stack(self) -> None:
        """The operator and the brokers: here the local overlay with authentication on."""
        await self.kubectl("apply", "-k", str(self.root / "manifests/overlays/local-secure"))

    async def client_credentials(self, api: k8s.ApiClient) -> float:
        """The demo's clients are ServiceAccount ``demo-client`` of ``NAMESPACE``, bound to the
        producer and consumer ClusterRoles (docs/security.md): write a token of it for audience
        scalabletopics.io (TokenRequest through the admin kubeconfig) to
        ``DIR/demo-client.token``, which the demo's clients present (re-read for each new
        connection); returns the token's lifetime."""
        core = k8s.CoreV1Api(api)
        rbac = k8s.RbacAuthorizationV1Api(api)
        meta = k8s.V1ObjectMeta
        await _created_or_exists(
            core.create_namespaced_service_account(
                NAMESPACE, k8s.V1ServiceAccount(metadata=meta(name=DEMO_CLIENT))
            )
        )
        for role in ("scalable-topics-producer", "scalable-topics-consumer"):
            binding = k8s.V1RoleBinding(
                metadata=meta(name=f"{DEMO_CLIENT}-{role.rsplit('-', 1)[1]}"),
                role_ref=k8s.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role
                ),
                subjects=[
                    k8s.RbacV1Subject(kind="ServiceAccount", name=DEMO_CLIENT, namespace=NAMESPACE)
                ],
            )
            await _created_or_exists(rbac.create_namespaced_role_binding(NAMESPACE, binding))
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=DEMO_TOKEN_SECONDS)
        )
        answer = await core.create_namespaced_service_account_token(DEMO_CLIENT, NAMESPACE, request)
        path = self.data_dir / "demo-client.token"
        fresh = path.with_suffix(".new")
        fresh.touch(mode=0o600)
        fresh.write_text(answer.status.token)
        fresh.replace(path)  # atomic, as the kubelet rotates a projected token
        self.token_file = path
        return float(DEMO_TOKEN_SECONDS)

    async def renew_credentials(self, api: k8s.ApiClient, lifetime: float) -> None:
        """A new token at 80 % of the last one's lifetime (the kubelet's schedule); clients
        re-read the file for their next connection."""
        while not self.stop.is_set():
            await self.pause(0.8 * lifetime)
            if not self.stop.is_set():
                lifetime = await self.client_credentials(api)

    async def fresh_topic(self, api: k8s.ApiClient) -> None:
        """Bring ``orders`` to its initial shape (see 'Start state' in :mod:`.demo`) and wait
        for Ready."""
        manifest = self.root / "manifests/examples/orders.yaml"
        topic = await self.topic_or_none(api)
        if topic is not None:
            shape = demo_progress.leftover_shape(topic)
            if shape:
                self.say(
                    f"topic {TOPIC} is left from an earlier run ({shape}): deleting it and its "
                    "segments so the demo starts from its initial shape"
                )
                await self.kubectl(
                    "delete",
                    "-n",
                    self.namespace,
                    f"stopic/{TOPIC}",
                    "--wait=false",
                    "--ignore-not-found",
                )

                async def gone() -> bool:
                    return await self.topic_or_none(api) is None and not await self.segments(api)

                async def left() -> str:
                    present = "present" if await self.topic_or_none(api) else "gone"
                    return f"topic {present}, {len(await self.segments(api))} segment(s) left"

                await self.wait_for(
                    f"the operator to delete the old {TOPIC}", gone, SETUP_TIMEOUT, left
                )
        await self.kubectl("apply", "-n", self.namespace, "-f", str(manifest))

        async def ready() -> bool:
            current = await self.topic_or_none(api)
            return current is not None and demo_progress.is_ready(current)

        async def condition() -> str:
            current = await self.topic_or_none(api)
            return demo_progress.ready_detail(current) if current else "not created yet"

        await self.wait_for(f"topic {TOPIC} to be Ready", ready, SETUP_TIMEOUT, condition)


async def _created_or_exists(create: Awaitable[Any]) -> None:
    """Create an object an earlier run may have made (409 Conflict is fine)."""
    try:
        await create
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
