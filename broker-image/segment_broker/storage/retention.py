"""Which of a segment's rolled files its retention policy lets go."""

from __future__ import annotations

import time

from .log import LogFile
from .meta import Retention


def beyond_retention(
    candidates: list[LogFile], policy: Retention, total_bytes: int
) -> list[LogFile]:
    """The oldest of ``candidates`` (rolled files below every cursor, oldest first) that
    ``policy`` allows deleting: those older than ``time_ms`` when it is set, then, when
    ``size_bytes`` is set, only as many as bring the log (``total_bytes``) down to it."""
    if policy.time_ms is not None:
        cutoff = time.time() - policy.time_ms / 1000.0
        keep_from = len(candidates)
        for i, lf in enumerate(candidates):
            try:
                mtime = lf.path.stat().st_mtime
            except FileNotFoundError:
                continue
            if mtime >= cutoff:
                keep_from = i
                break
        candidates = candidates[:keep_from]
    if policy.size_bytes is not None:
        total = total_bytes
        allowed: list[LogFile] = []
        for lf in candidates:
            if total <= policy.size_bytes:
                break
            allowed.append(lf)
            total -= lf.size
        candidates = allowed
    return candidates
