"""The peers driven by the clients their own projects benchmark with, not by our Python process.

- Redis Streams: `redis-benchmark` (C, from Debian's redis-tools, the package that ships
  redis-server's companion tools) in custom-command mode, pipelined `XADD key * f <payload>`;
  consume = `XREADGROUP ... COUNT <batch>` one request at a time (each one takes the next batch
  of the group), counted as `requests x batch` up to the stream's length.
- NATS JetStream: `bench/nats-go` (the official nats.go client, pinned in its go.mod, built by
  bench/go-tool-build.sh into a cache directory outside the repository): `PublishAsync` with
  `PublishAsyncMaxPending(window)`, file storage, R1, and a pull consumer (Fetch + AckAll).

All are closed-loop tools: the orchestrator uses them for the capacity probes and the consume
phase; the open-loop latency sweep stays with the load generator (see bench/broker.py). Each
runs pinned to the client core when there are two, and its CPU comes from wait4
(`_kafka.run_tool`).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from bench._kafka import ToolRun, run_tool
from bench._load import ConsumeResult, StepResult
from bench._procs import CLIENT_CORE, can_pin, ensure_debian_package
from bench._rabbitmq import bench_command

SYSTEMS = ("nats-go", "redis-native", "rabbitmq-stream")
"""The system keys of bench/broker.py that this module drives."""
NATS_GO_DIR = Path(__file__).resolve().parent / "nats-go"
GO_TOOL_BUILD = Path(__file__).resolve().parent / "go-tool-build.sh"
REDIS_PIPELINE = 256
"""`-P`: commands per pipeline, like our batches of up to 256 messages."""
REDIS_CONCURRENCY = 16
"""`-c`: connections; 16 x 256 = 4096 messages in flight, our window."""
REDIS_CONSUME_BATCH = 1000


class NativeUnavailable(RuntimeError):
    """The peer's own benchmark client cannot be had here (the message says why)."""


def pinned(argv: list[str]) -> list[str]:
    taskset = shutil.which("taskset")
    return [taskset, "-c", str(CLIENT_CORE), *argv] if can_pin() and taskset else argv


def checked(run: ToolRun, name: str) -> ToolRun:
    # redis-benchmark prints "Error from server" and still exits 0.
    if run.returncode != 0 or "Error from server" in run.stdout + run.stderr:
        raise RuntimeError(
            f"{name} failed (exit {run.returncode}): {(run.stderr or run.stdout)[-2000:]}"
        )
    return run


# --- NATS: bench/nats-go ------------------------------------------------------------------------


def build_go_tool(directory: Path, binary: str) -> str:
    """Path of a benchmark Go tool built from `directory` (bench/go-tool-build.sh; a no-op once
    built)."""
    if not shutil.which("go"):
        raise NativeUnavailable(f"no Go toolchain (`go`) on PATH to build {directory.name}")
    r = subprocess.run(
        ["bash", str(GO_TOOL_BUILD), str(directory), binary],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        raise NativeUnavailable(f"building bench/{directory.name} failed: {r.stderr[-1500:]}")
    return lines[-1]


def build_nats_go() -> str:
    """Path of the built nats-bench binary."""
    return build_go_tool(NATS_GO_DIR, "nats-bench")


def nats_args(endpoint: dict[str, Any], payload: int, mode: str) -> list[str]:
    return [
        str(endpoint["nats_bench"]),
        "-url",
        str(endpoint["url"]),
        "-stream",
        f"NATIVE{payload}",
        "-subject",
        f"native.{payload}",
        "-mode",
        mode,
    ]


def nats_reset(endpoint: dict[str, Any], payload: int) -> None:
    checked(run_tool(pinned(nats_args(endpoint, payload, "reset")), 60), "nats-bench reset")


def nats_produce(
    endpoint: dict[str, Any], payload: int, duration: float, warmup: float, window: int
) -> StepResult:
    extra = ["-payload", str(payload), "-duration", str(duration), "-warmup", str(warmup)]
    argv = pinned([*nats_args(endpoint, payload, "produce"), *extra, "-window", str(window)])
    run = checked(run_tool(argv, duration + warmup + 120), "nats-bench produce")
    return windowed_result(run, "bench/nats-go (nats.go PublishAsync)")


def windowed_result(run: ToolRun, tool: str, offered: float | None = None) -> StepResult:
    """The JSON line of a windowed publisher (nats-bench, StreamBench, segment-bench) as a
    step's result; `unfinished` and the generator's tick lag are segment-bench's alone."""
    d = json.loads(run.stdout.strip().splitlines()[-1])
    return StepResult(
        offered=offered,
        achieved=float(d["rate"]),
        sent=int(d["sent"]),
        acked=int(d["acked"]),
        errors=int(d["errors"]),
        unfinished=int(d.get("unfinished", 0)),
        gen_lag_p99_ms=float(d.get("gen_lag_p99_ms", 0.0)),
        gen_lag_max_ms=float(d.get("gen_lag_max_ms", 0.0)),
        p50_ms=float(d["p50_ms"]),
        p99_ms=float(d["p99_ms"]),
        p999_ms=float(d["p999_ms"]),
        max_ms=float(d["max_ms"]),
        mean_ms=float(d["mean_ms"]),
        recorded=int(d["samples"]),
        client_cpu=run.cpu,
        wall=run.wall,
        first_error=d["first_error"] or None,
        extra={"tool": tool},
    )


def nats_consume(
    endpoint: dict[str, Any], payload: int, batch: int, duration: float
) -> ConsumeResult:
    extra = ["-batch", str(batch), "-duration", str(duration)]
    argv = pinned([*nats_args(endpoint, payload, "consume"), *extra])
    run = checked(run_tool(argv, duration + 120), "nats-bench consume")
    d = json.loads(run.stdout.strip().splitlines()[-1])
    return ConsumeResult(int(d["received"]), float(d["seconds"]), run.cpu, run.wall)


# --- RabbitMQ streams: bench/rabbitmq-stream ------------------------------------------------------


def rabbit_stream(payload: int) -> str:
    return f"native{payload}"


def rabbit_reset(endpoint: dict[str, Any], payload: int) -> None:
    argv = pinned(bench_command(endpoint, "-stream", rabbit_stream(payload), "-mode", "reset"))
    checked(run_tool(argv, 120), "StreamBench reset")


def rabbit_produce(
    endpoint: dict[str, Any], payload: int, duration: float, warmup: float, window: int
) -> StepResult:
    argv = bench_command(
        endpoint,
        *("-stream", rabbit_stream(payload), "-mode", "produce", "-payload", str(payload)),
        *("-duration", str(duration), "-warmup", str(warmup), "-window", str(window)),
    )
    run = checked(run_tool(pinned(argv), duration + warmup + 120), "StreamBench produce")
    return windowed_result(run, "bench/rabbitmq-stream (stream-client, confirms)")


def rabbit_consume(endpoint: dict[str, Any], payload: int, duration: float) -> ConsumeResult:
    argv = bench_command(
        endpoint, "-stream", rabbit_stream(payload), "-mode", "consume", "-duration", str(duration)
    )
    run = checked(run_tool(pinned(argv), duration + 120), "StreamBench consume")
    d = json.loads(run.stdout.strip().splitlines()[-1])
    return ConsumeResult(int(d["received"]), float(d["seconds"]), run.cpu, run.wall)


# --- Redis: redis-benchmark ---------------------------------------------------------------------


def redis_benchmark() -> str:
    try:
        return ensure_debian_package("redis-benchmark", "redis-tools")
    except RuntimeError as e:
        raise NativeUnavailable(str(e)) from e


def _resp(endpoint: dict[str, Any], *args: str) -> bytes:
    """One command over RESP, the reply's first line (no client library: the peer's own tool
    does the load, this only sets up)."""
    cmd = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection((str(endpoint["host"]), int(endpoint["port"])), 10) as s:
        s.sendall(cmd.encode())
        reply = s.recv(4096)
    if reply.startswith(b"-"):
        raise RuntimeError(f"redis {' '.join(args[:2])}: {reply.decode().strip()}")
    return reply.split(b"\r\n", 1)[0]


def redis_key(payload: int) -> str:
    return f"native{payload}"


def redis_reset(endpoint: dict[str, Any], payload: int) -> None:
    _resp(endpoint, "DEL", redis_key(payload))


def parse_redis_csv(stdout: str) -> dict[str, float]:
    """The last data row of `redis-benchmark --csv`: rps and latency columns."""
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith('"')]
    if len(lines) < 2:
        raise RuntimeError(f"redis-benchmark printed no result: {stdout[-500:]!r}")
    header = [h.strip('"') for h in lines[0].split(",")]
    row = [c.strip('"') for c in lines[-1].rsplit(",", len(header) - 1)]
    return {h: float(v) for h, v in zip(header[1:], row[1:], strict=True)}


def _redis_benchmark(
    endpoint: dict[str, Any], clients: int, pipeline: int, requests: int, *command: str
) -> list[str]:
    """``redis-benchmark`` against ``endpoint`` repeating ``command``, CSV output."""
    return [
        str(endpoint["redis_benchmark"]),
        *("-h", str(endpoint["host"]), "-p", str(endpoint["port"])),
        *("-c", str(clients), "-P", str(pipeline), "-n", str(requests), "--csv"),
        *command,
    ]


def redis_produce(endpoint: dict[str, Any], payload: int, requests: int) -> StepResult:
    argv = _redis_benchmark(
        endpoint,
        REDIS_CONCURRENCY,
        REDIS_PIPELINE,
        requests,
        "XADD",
        redis_key(payload),
        "*",
        "f",
        "x" * payload,
    )
    run = checked(run_tool(pinned(argv), 600), "redis-benchmark XADD")
    d = parse_redis_csv(run.stdout)
    return StepResult(
        offered=None,
        achieved=d["rps"],
        sent=requests,
        acked=requests,
        p50_ms=d["p50_latency_ms"],
        p99_ms=d["p99_latency_ms"],
        max_ms=d["max_latency_ms"],
        mean_ms=d["avg_latency_ms"],
        recorded=requests,
        client_cpu=run.cpu,
        wall=run.wall,
        extra={"tool": "redis-benchmark", "p95_ms": d["p95_latency_ms"]},
    )


def redis_consume(endpoint: dict[str, Any], payload: int, max_messages: int) -> ConsumeResult:
    """Reads the stream from its start through a fresh group, `COUNT` batches one request at a
    time (each request must see the previous one's position). No XACK: redis-benchmark repeats
    one command."""
    key = redis_key(payload)
    length = int(_resp(endpoint, "XLEN", key).lstrip(b":"))
    requests = min(length, max_messages) // REDIS_CONSUME_BATCH
    if requests == 0:
        return ConsumeResult(0, 0.0, 0.0, 0.0)
    group = "native"
    _resp(endpoint, "XGROUP", "DESTROY", key, group)
    _resp(endpoint, "XGROUP", "CREATE", key, group, "0")
    argv = _redis_benchmark(
        endpoint,
        1,
        1,
        requests,
        "XREADGROUP",
        "GROUP",
        group,
        "c1",
        "COUNT",
        str(REDIS_CONSUME_BATCH),
        "STREAMS",
        key,
        ">",
    )
    run = checked(run_tool(pinned(argv), 600), "redis-benchmark XREADGROUP")
    d = parse_redis_csv(run.stdout)
    received = requests * REDIS_CONSUME_BATCH
    seconds = requests / d["rps"] if d["rps"] else 0.0
    return ConsumeResult(received, seconds, run.cpu, run.wall)
