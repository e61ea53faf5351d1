"""Latency-vs-throughput curves (PNG, matplotlib's Agg backend) for the benchmark report.

One figure per payload: for every system, p50 (solid) and p99 (dashed) publish latency against
the achieved throughput of its open-loop steps, in the order of their offered rate, so a reader
sees where each system's latency turns up (its knee). Both axes are logarithmic: the systems'
capacities and latencies differ by an order of magnitude or more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class CurvePoint:
    offered: float
    achieved: float
    p50_ms: float
    p99_ms: float


def latency_figure(curves: Mapping[str, Sequence[CurvePoint]], *, title: str) -> Figure:
    """The figure of `curves` (system label -> its steps); the caller closes it.

    Raises ValueError when no system has a step with a positive throughput and latency: an empty
    plot would read as "measured, nothing to see".
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    usable = {
        label: sorted(
            (p for p in points if p.achieved > 0 and p.p50_ms > 0 and p.p99_ms > 0),
            key=lambda p: (p.offered, p.achieved),
        )
        for label, points in curves.items()
    }
    usable = {label: points for label, points in usable.items() if points}
    if not usable:
        raise ValueError(f"no step with a positive throughput and latency for {title!r}")
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for index, (label, points) in enumerate(sorted(usable.items())):
        color = f"C{index % 10}"
        xs = [p.achieved for p in points]
        ax.plot(xs, [p.p50_ms for p in points], "o-", color=color, label=f"{label} p50")
        ax.plot(xs, [p.p99_ms for p in points], "s--", color=color, label=f"{label} p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("achieved throughput (msg/s)")
    ax.set_ylabel("publish latency (ms, from the intended send time)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", ncols=2)
    fig.tight_layout()
    return fig


def plot_latency_curves(
    curves: Mapping[str, Sequence[CurvePoint]], path: Path, *, title: str
) -> Path:
    """Write :func:`latency_figure` of `curves` to `path` as a PNG."""
    from matplotlib import pyplot as plt

    fig = latency_figure(curves, title=title)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
