"""The latency-vs-throughput plot of the broker benchmark (bench/_plot.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from matplotlib import pyplot as plt

from bench._plot import CurvePoint, latency_figure, plot_latency_curves

CURVES = {
    "ours": [
        CurvePoint(offered=160_000, achieved=158_000, p50_ms=30.0, p99_ms=110.0),
        CurvePoint(offered=100_000, achieved=99_500, p50_ms=2.0, p99_ms=8.0),
    ],
    "NATS JetStream": [
        CurvePoint(offered=20_000, achieved=19_900, p50_ms=3.0, p99_ms=9.0),
        CurvePoint(offered=30_000, achieved=26_000, p50_ms=80.0, p99_ms=300.0),
        CurvePoint(offered=0, achieved=0, p50_ms=0.0, p99_ms=0.0),
    ],
}


def test_each_system_gets_p50_and_p99_in_offered_order_with_labelled_axes() -> None:
    fig = latency_figure(CURVES, title="Publish latency vs throughput, 100 B messages")
    try:
        [ax] = fig.axes
        assert ax.get_xlabel() == "achieved throughput (msg/s)"
        assert ax.get_ylabel().startswith("publish latency (ms")
        assert ax.get_title() == "Publish latency vs throughput, 100 B messages"
        lines = {str(line.get_label()): line for line in ax.get_lines()}
        assert set(lines) == {"NATS JetStream p50", "NATS JetStream p99", "ours p50", "ours p99"}
        assert np.asarray(lines["ours p50"].get_xdata()).tolist() == [99_500, 158_000]
        assert np.asarray(lines["ours p99"].get_ydata()).tolist() == [8.0, 110.0]
        assert np.asarray(lines["NATS JetStream p50"].get_ydata()).tolist() == [3.0, 80.0]
        assert ax.get_xscale() == ax.get_yscale() == "log"
    finally:
        plt.close(fig)


def test_the_file_is_a_png(tmp_path: Path) -> None:
    path = plot_latency_curves(CURVES, tmp_path / "sub" / "curve.png", title="t")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (880, 550)


def test_no_usable_step_is_an_error_not_an_empty_plot(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no step"):
        plot_latency_curves({"x": [CurvePoint(0, 0, 0, 0)]}, tmp_path / "empty.png", title="empty")
    assert not (tmp_path / "empty.png").exists()
