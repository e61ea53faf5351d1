"""Entry points of the load-generator process (picklable top-level functions).

The orchestrator runs one `ProcessPoolExecutor(max_workers=1)` per system under test: the
worker is pinned to the client core, runs uvloop (the same loop for every client), and builds
the system's adapter from `ADAPTERS` for each call.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from bench._load import (
    Adapter,
    ConsumeResult,
    ConsumeSpec,
    StepResult,
    StepSpec,
    consume_step,
    produce_step,
)
from bench._procs import CLIENT_CORE, pin_self

ADAPTERS = {
    "nats": "bench._peers:nats_adapter",
    "redis": "bench._peers:redis_adapter",
    "ours": "bench._ours:ours_adapter",
    "ours-auth": "bench._auth:ours_auth_adapter",
}

T = TypeVar("T")


def init(pin: bool) -> None:
    if pin:
        pin_self(CLIENT_CORE)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _adapter(system: str, endpoint: dict[str, Any]) -> Adapter:
    module, _, name = ADAPTERS[system].partition(":")
    factory = getattr(importlib.import_module(module), name)
    adapter: Adapter = await factory(endpoint)
    return adapter


def reset(system: str, endpoint: dict[str, Any]) -> None:
    async def go() -> None:
        adapter = await _adapter(system, endpoint)
        await adapter.reset()

    _run(go())


def produce(spec: StepSpec) -> StepResult:
    async def go() -> StepResult:
        return await produce_step(await _adapter(spec.system, spec.endpoint), spec)

    return _run(go())


def consume(spec: ConsumeSpec) -> ConsumeResult:
    async def go() -> ConsumeResult:
        return await consume_step(await _adapter(spec.system, spec.endpoint), spec)

    return _run(go())
