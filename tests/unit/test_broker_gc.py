"""A serving broker collects with its own thresholds (issue 17)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from segment_broker import __main__ as entry
from segment_broker.config import BrokerConfig


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("thresholds")
async def test_the_thresholds_apply_once_the_broker_serves(tmp_path: Path) -> None:
    gc.set_threshold(700, 10, 10)
    config = BrokerConfig(data_dir=str(tmp_path / "data"), host="127.0.0.1", port=0)
    stop = asyncio.Event()
    serving = asyncio.create_task(entry.serve(config, stop))
    try:
        async with asyncio.timeout(30):
            while gc.get_threshold() != entry.GC_THRESHOLDS:
                assert not serving.done(), serving.exception()
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await serving
    assert gc.get_freeze_count() > 0
    _, middle, full = entry.GC_THRESHOLDS
    assert full > 10 and middle == 10
