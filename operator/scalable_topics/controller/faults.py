"""Fault injection for the crash tests of the split/merge protocol and of moves.

``SCALABLE_TOPICS_FAULT=crash-after:<point>`` makes the operator SIGKILL itself right after the
step ``point`` has been recorded, so a test can check that the next leader completes or rolls
back from exactly there (tests/integration/test_operator_crash.py, test_operator_move.py).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence

log = logging.getLogger(__name__)

FAULT_ENV = "SCALABLE_TOPICS_FAULT"


def fault_point(points: Sequence[str]) -> str | None:
    """The point of ``points`` the environment asks to crash after (``None``: none of them)."""
    value = os.environ.get(FAULT_ENV, "")
    if value.startswith("crash-after:"):
        point = value.split(":", 1)[1]
        if point in points:
            return point
    return None


def crash_after(fault: str | None, point: str) -> None:
    """SIGKILL this process when ``point`` is the injected ``fault``."""
    if fault == point:
        log.critical("fault injection: SIGKILL after %s", point)
        os.kill(os.getpid(), signal.SIGKILL)
