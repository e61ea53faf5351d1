"""Helpers shared by the kubelet integration tests (test_real_kubelet*.py): polling, ports, and
the state-server container."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from scalable_topics.core.jsontypes import JsonObj

T = TypeVar("T")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
STATE_SERVER = FIXTURES / "kubelet_state_server.py"


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


def is_ready(pod: JsonObj | None) -> bool:
    if not pod:
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )
