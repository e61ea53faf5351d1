"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest


@pytest.fixture
async def executor() -> AsyncIterator[ThreadPoolExecutor]:
    """The I/O thread pool a broker ``Segment`` runs its blocking work on."""
    pool = ThreadPoolExecutor(4)
    yield pool
    pool.shutdown(wait=True)
