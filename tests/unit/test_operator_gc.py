"""The operator process runs with its own cyclic-collector thresholds (issue 17)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from scalable_topics.controller import __main__ as entry


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("thresholds")
def test_main_sets_the_thresholds_before_the_operator_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc.set_threshold(700, 10, 10)
    seen: list[tuple[int, int, int]] = []

    def run(coroutine: Coroutine[Any, Any, None]) -> None:
        coroutine.close()
        seen.append(gc.get_threshold())

    monkeypatch.setattr(asyncio, "run", run)
    entry.main([])
    assert seen == [entry.GC_THRESHOLDS]
    young, _, _ = entry.GC_THRESHOLDS
    assert young > 700
