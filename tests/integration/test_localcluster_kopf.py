"""A minimal kopf operator, embedded in the test's event loop, reconciles a custom resource
end to end against the local API server: create handler, status patch, event, finalizer,
deletion."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import kopf
import pytest

from scalable_topics.localcluster.cluster import LocalCluster
from scalable_topics.localcluster.errors import ApiError

from .conftest import eventually

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "localcluster"
GROUP, VERSION, PLURAL = "test.stopic.io", "v1", "widgets"


def _registry(cluster: LocalCluster, seen: dict[str, list[str]]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=cluster.url, token=cluster.token, default_namespace="default"
        )

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    def created(
        name: str, spec: Any, meta: Any, body: kopf.Body, patch: kopf.Patch, **_: Any
    ) -> None:
        seen["created"].append(name)
        patch.status["conditions"] = [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Reconciled",
                "message": f"{spec['initialSegments']} segments",
            }
        ]
        patch.status["observedGeneration"] = meta["generation"]
        kopf.info(body, reason="Reconciled", message=f"widget {name} reconciled")

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    def deleted(name: str, **_: Any) -> None:
        seen["deleted"].append(name)

    return registry


async def test_kopf_operator_reconciles_a_widget(local_cluster: LocalCluster) -> None:
    await local_cluster.apply_file(FIXTURES / "widgets-crd.yaml")
    seen: dict[str, list[str]] = {"created": [], "deleted": []}
    settings = kopf.OperatorSettings()
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 30
    stop = asyncio.Event()
    ready = asyncio.Event()
    operator = asyncio.create_task(
        kopf.operator(
            registry=_registry(local_cluster, seen),
            settings=settings,
            standalone=True,
            namespaces=["default"],
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 30)
        await local_cluster.apply_file(FIXTURES / "widget.yaml")
        api = local_cluster.api
        assert api is not None
        rt = api.registry.lookup(GROUP, VERSION, PLURAL)
        assert rt is not None

        def widget() -> dict[str, Any]:
            return api.get(rt, "default", "alpha")

        def is_ready() -> bool:
            conditions = (widget().get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        await eventually(is_ready, within=30)
        obj = widget()
        assert seen["created"] == ["alpha"]
        assert obj["status"]["observedGeneration"] == 1
        assert "kopf.zalando.org/KopfFinalizerMarker" in obj["metadata"]["finalizers"]
        assert "kopf.zalando.org/last-handled-configuration" in obj["metadata"]["annotations"]

        events_rt = api.registry.lookup("", "v1", "events")
        assert events_rt is not None
        selector = f"involvedObject.name=alpha,involvedObject.uid={obj['metadata']['uid']}"

        def posted() -> bool:
            events, _ = api.list(events_rt, "default", field_selector=selector)
            return any(
                e.get("reason") == "Reconciled" and "reconciled" in e.get("message", "")
                for e in events
            )

        await eventually(posted, within=30)

        api.delete(rt, "default", "alpha")
        assert widget()["metadata"]["deletionTimestamp"]

        def gone() -> bool:
            try:
                widget()
            except ApiError as exc:
                return exc.code == 404
            return False

        await eventually(gone, within=30)
        assert seen["deleted"] == ["alpha"]
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(operator, 30)
