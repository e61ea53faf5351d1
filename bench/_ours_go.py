"""Our segment broker driven by `bench/ours-go` (segment-bench, a Go client of the segment
protocol), as the peers are driven by their projects' own clients (bench/_native.py).

The Python load generator (bench/_ours.py) spends a full core at a few hundred thousand
messages per second and stalls its own event loop for tens of milliseconds: its latency figures
measure the generator as much as the broker. segment-bench sends the same frames (one entry of
up to `BATCH` keyed messages per SEND frame, at most `WINDOW` messages in flight) from a process
that spends a fraction of that CPU, open loop at a fixed rate or closed loop, and consumes by
walking every message of every entry. The setup (segment, subscription) is the Python adapter's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._kafka import ToolRun, run_tool
from bench._load import ConsumeResult, StepResult
from bench._native import build_go_tool, checked, pinned, windowed_result
from bench._ours import NAMESPACE, SUBSCRIPTION, TOPIC, OursAdapter, start_ours
from bench._procs import Server

TOOL_DIR = Path(__file__).resolve().parent / "ours-go"
TOOL = "bench/ours-go (segment-bench, Go)"


Started = tuple[Server, dict[str, Any], str]


def _with_segment_bench(start: Callable[[Path], Started], workdir: Path) -> Started:
    binary = build_go_tool(TOOL_DIR, "segment-bench")
    server, endpoint, version = start(workdir)
    return server, {**endpoint, "segment_bench": binary}, version


def start_ours_go(workdir: Path) -> Started:
    return _with_segment_bench(start_ours, workdir)


def start_ours_go_auth(workdir: Path) -> Started:
    """The broker with ``--auth kubernetes`` (bench/_auth.py); segment-bench presents the
    client ServiceAccount's token."""
    from bench._auth import start_ours_auth

    return _with_segment_bench(start_ours_auth, workdir)


def reset(endpoint: dict[str, Any]) -> None:
    asyncio.run(OursAdapter(endpoint).reset())


def _args(endpoint: dict[str, Any], mode: str) -> list[str]:
    token = endpoint.get("tokenFile")
    return [
        str(endpoint["segment_bench"]),
        *("-url", str(endpoint["url"]), "-namespace", NAMESPACE, "-topic", TOPIC),
        *("-segment", str(int(endpoint.get("run", 0))), "-mode", mode),
        *(("-token-file", str(token)) if token else ()),
    ]


def _run(argv: list[str], timeout: float, what: str) -> ToolRun:
    return checked(run_tool(pinned(argv), timeout), f"segment-bench {what}")


def produce(
    endpoint: dict[str, Any],
    payload: int,
    rate: float | None,
    duration: float,
    warmup: float,
    batch: int,
    window: int,
    drain: float = 5.0,
) -> StepResult:
    argv = [
        *_args(endpoint, "produce"),
        *("-payload", str(payload), "-batch", str(batch), "-window", str(window)),
        *("-rate", str(rate or 0), "-duration", str(duration), "-warmup", str(warmup)),
        *("-drain", str(drain)),
    ]
    run = _run(argv, duration + drain + 120, "produce")
    return windowed_result(run, TOOL, offered=rate)


def consume(endpoint: dict[str, Any], duration: float, permits: int = 1000) -> ConsumeResult:
    argv = [
        *_args(endpoint, "consume"),
        *("-subscription", SUBSCRIPTION, "-permits", str(permits), "-duration", str(duration)),
    ]
    run = _run(argv, duration + 120, "consume")
    d = json.loads(run.stdout.strip().splitlines()[-1])
    return ConsumeResult(int(d["received"]), float(d["seconds"]), run.cpu, run.wall)
