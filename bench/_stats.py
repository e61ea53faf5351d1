"""Percentiles of a benchmark's samples, one definition for every benchmark."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0..1) of ``values``, NaN samples left out; NaN when
    nothing is left."""
    ordered = sorted(v for v in values if v == v)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
