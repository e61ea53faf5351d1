"""Set-up shared by the kubelet integration tests: an embedded cluster plus a tuned kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from scalable_topics.localcluster.cluster import LocalCluster
from scalable_topics.localcluster.kubelet import Kubelet
from scalable_topics.localcluster.restclient import PODS, RestClient

T = TypeVar("T")
JsonObj = dict[str, Any]
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
STATE_SERVER = FIXTURES / "kubelet_state_server.py"


@dataclass
class FakeClock:
    """Real time plus an offset the test moves forward (for the CronJob controller)."""

    offset: timedelta = field(default_factory=timedelta)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


@dataclass
class Harness:
    cluster: LocalCluster
    kubelet: Kubelet
    client: RestClient
    clock: FakeClock
    data_dir: Path

    async def pod(self, namespace: str, name: str) -> JsonObj | None:
        return await self.client.get_or_none(PODS, namespace, name)


async def eventually(
    probe: Callable[[], Awaitable[T | None]], within: float = 30.0, what: str = "condition"
) -> T:
    """Poll ``probe`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = await probe()
        except AssertionError as exc:
            value, last = None, exc
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} not reached within {within}s (last: {last})")


@contextlib.asynccontextmanager
async def running_cluster(tmp_path: Path) -> AsyncIterator[Harness]:
    data_dir = tmp_path / "cluster"
    clock = FakeClock()
    async with LocalCluster(data_dir, kubelet=False) as cluster:
        kubelet = Kubelet(
            cluster.url,
            cluster.token,
            data_dir,
            cluster.kubeconfig,
            backoff_base=0.2,
            backoff_cap=1.0,
            clock=clock,
            stop_grace=3.0,
            resync_seconds=2.0,
        )
        await kubelet.start()
        client = RestClient(cluster.url, cluster.token)
        try:
            yield Harness(cluster, kubelet, client, clock, data_dir)
        finally:
            await client.close()
            await kubelet.stop()


def free_port() -> int:
    """A port below the ephemeral range, unlikely to be used by concurrent test runs."""
    return random.randint(20000, 32000)


def state_server_container(port: int, mount: str = "/var/lib/state") -> JsonObj:
    return {
        "name": "server",
        "image": "python:3.11",
        "command": ["python3", str(STATE_SERVER)],
        "args": ["--bind", "$(POD_IP)", "--port", str(port), "--dir", mount],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
        "volumeMounts": [{"name": "state", "mountPath": mount}],
    }


def sleeper_container(seconds: float = 3600, exit_code: int = 0) -> JsonObj:
    return {
        "name": "main",
        "image": "busybox",
        "command": ["python", "-c"],
        "args": [f"import time, sys; time.sleep({seconds}); sys.exit({exit_code})"],
    }


def is_ready(pod: JsonObj | None) -> bool:
    if not pod:
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


PYTHON = sys.executable
