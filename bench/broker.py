"""Segment broker produce/consume benchmark against NATS JetStream, Redis Streams and Kafka.

All servers run side by side (pinned to core 0); each has its own load-generator process
(pinned to core 1). Kafka (`bench/_kafka.py`, two rows: default flush and `flush.messages=1`)
is driven by its own tools instead, one JVM per step on core 1, through the same phases. Every
phase **interleaves** the systems (ours, NATS, Redis, Kafka, ours, …) so that the background
load of a shared machine hits them alike, and each payload size (100 B, 1 KB) has its own fresh
stream/segment/topic:

1. **capacity**: closed-loop probes keep the in-flight window full, `repeats` interleaved
   rounds;
2. **latency**: per system, one more probe, then an open-loop sweep (wrk2 style,
   `bench/_load.py`) at fractions of the lower of that probe's throughput and the median of all
   probes, 80 % first (80 % and 50 % three times each in full mode, with one 110 % step); it
   measures achieved throughput and publish→ack latency (p50/p99/p99.9/max) from the *intended* send
   time. The 80 % and 50 % steps (the median p99 of each) are the latency-target figures.
   Saturation = the median of all probes;
3. **consume**: read back from the start (batched fetch + one cumulative ack per batch). In full
   mode it runs right after the capacity probes (they wrote more than the read needs), and each
   system's data of a payload is dropped after its latency sweep (Kafka's is bounded by its
   retention instead, `_kafka.server_properties`): a full run otherwise kept every step of
   every system on disk to the end, about 100 GB, and filled a 65 GB disk. Quick mode (no
   capacity rounds) reads what its sweep wrote, at the end.

Between the consume and the latency phases (quick mode: after the capacity probe), phase 1b
measures the cost of authentication in blocks of A B B A closed-loop probes (`_auth_blocks`);
in full mode both systems' logs are freed before and after each block, whose 1 KB probes alone
write about 15 GB.

Every system but Kafka gets the same client shape: one uvloop process, batches of up to `BATCH`
messages, at most `WINDOW` messages in flight. Server and client CPU use are recorded per step;
≥ 85 % of a core is flagged (client-bound / server-bound).

`ours-go-auth` is our broker with authentication on (`bench/_auth.py`: TokenReview and
SubjectAccessReview against a real kube-apiserver), driven by the Go client; its cost is measured
against `ours-go` in blocks of A B B A probes (phase 1b): a server-bound pair, where a cost in
the broker shows. `ours-auth` is the same broker through the Python load generator (client-bound,
so its pair with `ours` measures the client; not run unless named).

NATS and Redis are also driven by their projects' own benchmark clients (`nats-go`,
`redis-native`: `bench/_native.py`), and RabbitMQ streams by its Java stream client
(`rabbitmq-stream`: `bench/_rabbitmq.py`), closed loop, capacity and consume only. Our broker
is driven by a Go client of its protocol as well (`ours-go`: `bench/_ours_go.py`, every phase,
open loop included); that row is ours in the comparisons and the targets, and the Python load
generator's row (`ours`) is kept next to it, as the peers' Python rows are.

Set `BENCH_BROKER_SYSTEMS` to a subset of
`ours-go,ours-go-auth,ours,ours-auth,nats-go,redis-native,rabbitmq-stream,nats,redis,kafka,kafka-sync`
to run fewer (or, with `ours-auth`, other) systems;
the SDK's own path (`ScalableTopicProducer` over 4 segments to `StreamConsumer`s) is measured
next to this raw path by `bench/sdk.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Collection
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import _hiccup, _kafka, _native, _ours_go, _rabbitmq, _worker
from bench._load import ConsumeResult, ConsumeSpec, StepResult, StepSpec
from bench._peers import NATS_DURABILITY, REDIS_DURABILITY, start_nats, start_redis
from bench._procs import Server, can_pin, memory_kb
from bench.report import Cell, Report, Section, Table

PAYLOADS = (100, 1024)
BATCH = 256
WINDOW = 4096
BOUND = 0.85

TARGET_RATIO = 2.0
TARGET_100B = 150_000.0
TARGET_P99_MS = 25.0
TARGET_P99_AT50_MS = 10.0


@dataclass(frozen=True)
class Mode:
    probe: float
    probe_warmup: float
    repeats: int
    step: float
    step_warmup: float
    fractions: tuple[float, ...]
    consume: float
    equal_load: float = 0.0
    """> 0: one more open-loop step for every system at this fraction of the *slowest* system's
    saturation, so latencies compare at the same offered load."""
    e2e_records: int = 100
    """Kafka's EndToEndLatency: messages sent one at a time per payload and durability."""


QUICK = Mode(2.0, 0.5, 0, 2.5, 0.5, (0.8, 0.5), 1.5)
FULL = Mode(
    5.0,
    1.0,
    2,
    6.0,
    1.5,
    (0.8, 0.5, 0.8, 0.5, 1.1, 0.8, 0.5),
    5.0,
    equal_load=0.5,
    e2e_records=1000,
)


@dataclass
class Step:
    kind: str  # "probe" | "80%" | "50%" | "sweep" | "equal"
    result: StepResult
    server_cpu: float
    client_cpu: float
    server: dict[str, float] = field(default_factory=dict)
    server_wait: float = 0.0
    """Share of the step the server's threads were runnable but waiting for a CPU."""

    @property
    def flag(self) -> str:
        flags = []
        if self.client_cpu >= BOUND:
            flags.append("client-bound")
        if self.server_cpu >= BOUND:
            flags.append("server-bound")
        if self.result.errors:
            flags.append(f"{self.result.errors} errors")
        if self.result.unfinished:
            flags.append(f"{self.result.unfinished} unacked at end")
        return ", ".join(flags)


@dataclass
class PayloadRun:
    payload: int
    probes: list[Step] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    pairs: list[Step] = field(default_factory=list)
    """Closed-loop probes of an authentication pair's blocks (`AUTH_PAIRS`); not in the
    saturation."""
    consume: ConsumeResult | None = None
    consume_server_cpu: float = 0.0
    e2e: _kafka.E2ELine | None = None

    @property
    def saturation(self) -> float:
        """Median closed-loop throughput over the capacity rounds."""
        return statistics.median(s.result.achieved for s in self.probes) if self.probes else 0.0

    @property
    def max_achieved(self) -> float:
        return max((s.result.achieved for s in self.probes + self.steps), default=0.0)

    @property
    def equal(self) -> Step | None:
        marked = [s for s in self.steps if s.kind == "equal"]
        return marked[-1] if marked else None

    @property
    def at80(self) -> Step | None:
        """The 80 % step with the median p99 (full mode runs three, and three 50 % steps)."""
        return self._median_step("80%")

    @property
    def at50(self) -> Step | None:
        return self._median_step("50%")

    def _median_step(self, kind: str) -> Step | None:
        marked = sorted((s for s in self.steps if s.kind == kind), key=lambda s: s.result.p99_ms)
        return marked[(len(marked) - 1) // 2] if marked else None


@dataclass(frozen=True)
class System:
    key: str
    label: str
    durability: str
    start: Callable[[Path], tuple[Server, dict[str, Any], str]]
    stats: Callable[[dict[str, Any]], dict[str, float]] | None = None
    stats_delta: Callable[[dict[str, float], dict[str, float], float], dict[str, float]] | None = (
        None
    )
    tools: bool = False
    """Driven by its own benchmark tools (Kafka), not by our load-generator process."""
    native: bool = False
    """Driven by its project's own closed-loop benchmark client (`bench/_native.py`): capacity
    probes and consume only, no open-loop steps."""
    go_client: bool = False
    """Our broker driven by `bench/ours-go` (all phases, open loop included)."""
    default: bool = True
    """Run unless `BENCH_BROKER_SYSTEMS` names the systems."""


@dataclass
class SystemRun:
    key: str
    label: str
    durability: str
    version: str = ""
    server_pid: int = 0
    runs: dict[int, PayloadRun] = field(default_factory=dict)
    error: str | None = None
    unavailable: bool = False
    """Not run because a prerequisite is missing (the error says which); not a failure."""
    rss_rest_kb: int = 0
    rss_peak_kb: int = 0


def _start_nats_go(workdir: Path) -> tuple[Server, dict[str, Any], str]:
    binary = _native.build_nats_go()
    server, endpoint, version = start_nats(workdir)
    return server, {**endpoint, "nats_bench": binary}, version


def _start_redis_native(workdir: Path) -> tuple[Server, dict[str, Any], str]:
    tool = _native.redis_benchmark()
    server, endpoint, version = start_redis(workdir)
    return server, {**endpoint, "redis_benchmark": tool}, version


def _systems() -> list[System]:
    """All systems, or those named in `BENCH_BROKER_SYSTEMS` (comma-separated keys)."""
    from bench import _auth, _ours

    kafka = _kafka.SharedKafka()
    every = [
        System(
            "ours-go",
            "segment broker (Go client)",
            _ours.DURABILITY,
            _ours_go.start_ours_go,
            _ours.fsync_stats,
            _ours.fsync_delta,
            go_client=True,
        ),
        System(
            "ours-go-auth",
            "segment broker (Go client), --auth kubernetes",
            _ours.DURABILITY,
            _ours_go.start_ours_go_auth,
            _ours.fsync_stats,
            _ours.fsync_delta,
            go_client=True,
        ),
        System(
            "ours",
            "segment broker (Python client)",
            _ours.DURABILITY,
            _ours.start_ours,
            _ours.fsync_stats,
            _ours.fsync_delta,
        ),
        System(
            "ours-auth",
            "segment broker, --auth kubernetes",
            _ours.DURABILITY,
            _auth.start_ours_auth,
            _ours.fsync_stats,
            _ours.fsync_delta,
            default=False,
        ),
        System(
            "nats-go",
            "NATS JetStream (nats.go PublishAsync)",
            NATS_DURABILITY,
            _start_nats_go,
            native=True,
        ),
        System(
            "redis-native",
            "Redis Streams (redis-benchmark, pipelined XADD)",
            REDIS_DURABILITY,
            _start_redis_native,
            native=True,
        ),
        System(
            "rabbitmq-stream",
            "RabbitMQ streams (Java stream client, confirms)",
            _rabbitmq.DURABILITY,
            _rabbitmq.start_rabbitmq,
            native=True,
        ),
        System("nats", "NATS JetStream (Python nats-py)", NATS_DURABILITY, start_nats),
        System("redis", "Redis Streams (Python redis-py)", REDIS_DURABILITY, start_redis),
        System(
            "kafka",
            "Kafka, default flush (ack before fsync)",
            _kafka.DURABILITY["default"],
            kafka.starter("default"),
            tools=True,
        ),
        System(
            "kafka-sync",
            "Kafka, flush.messages=1 (ack after fsync)",
            _kafka.DURABILITY["sync"],
            kafka.starter("sync"),
            tools=True,
        ),
    ]
    wanted = os.environ.get("BENCH_BROKER_SYSTEMS")
    if not wanted:
        return [s for s in every if s.default]
    keys = {k.strip() for k in wanted.split(",")}
    return [s for s in every if s.key in keys]


class _Runner:
    """One system under test: its server, its load-generator process, its results."""

    def __init__(
        self,
        system: System,
        server: Server,
        pool: ProcessPoolExecutor | None,
        endpoint: dict[str, Any],
    ) -> None:
        self.system = system
        self.server = server
        self.pool = pool
        self.endpoint = endpoint
        self.out = SystemRun(system.key, system.label, system.durability, server_pid=server.pid)
        self.profile_dir: Path | None = None
        self.profiles: dict[int, Path] = {}

    def _endpoint(self, payload: int) -> dict[str, Any]:
        return {**self.endpoint, "run": payload}

    def _check_alive(self) -> None:
        if not self.server.alive():
            raise RuntimeError(f"{self.system.key} server died:\n{self.server.log_tail()}")

    def reset(self, payload: int) -> None:
        self._reset(payload)
        self.out.runs[payload] = PayloadRun(payload)

    def drop(self, payload: int) -> None:
        """Free the disk the payload's data takes (a fresh stream, segment or key), keeping the
        results measured so far."""
        self._reset(payload)

    def _reset(self, payload: int) -> None:
        assert self.pool is not None
        self.pool.submit(_worker.reset, self.system.key, self._endpoint(payload)).result(120)

    def _produce(self, spec: StepSpec) -> StepResult:
        assert self.pool is not None
        return self.pool.submit(_worker.produce, spec).result(spec.duration + spec.drain + 240)

    def _consume(self, spec: ConsumeSpec) -> ConsumeResult:
        assert self.pool is not None
        return self.pool.submit(_worker.consume, spec).result(spec.duration + 120)

    def produce(self, payload: int, rate: float | None, kind: str, mode: Mode) -> Step:
        """One step. A capacity probe whose acknowledgements all fell outside its measured
        window (the whole window stalled: a shared machine's hiccup, not a capacity) is not
        recorded and runs once more."""
        step = self._step(payload, rate, kind, mode)
        if rate is None and step.result.acked and not step.result.achieved:
            print(
                f"[bench]   {self.system.key}: nothing acknowledged inside the probe's measured "
                "window; probing again",
                flush=True,
            )
            step = self._step(payload, rate, kind, mode)
        run = self.out.runs[payload]
        if kind == "pair":
            run.pairs.append(step)
        else:
            (run.steps if rate is not None else run.probes).append(step)
        return step

    def _step(self, payload: int, rate: float | None, kind: str, mode: Mode) -> Step:
        probe = rate is None
        spec = StepSpec(
            self.system.key,
            self._endpoint(payload),
            payload,
            rate,
            mode.probe if probe else mode.step,
            mode.probe_warmup if probe else mode.step_warmup,
            BATCH,
            WINDOW,
        )
        stats, delta = self.system.stats, self.system.stats_delta
        before = stats(self.endpoint) if stats else {}
        spy = self._profiler(payload, kind, spec.duration)
        c0, w0, t0 = self.server.cpu(), self.server.runqueue(), time.monotonic()
        result = self._produce(spec)
        if spy is not None:
            spy.wait(60)
        wall = max(1e-9, time.monotonic() - t0)
        server_cpu = (self.server.cpu() - c0) / wall
        client_cpu = result.client_cpu / result.wall if result.wall else 0.0
        server = delta(before, stats(self.endpoint), wall) if stats and delta else {}
        server_wait = (self.server.runqueue() - w0) / wall
        step = Step(kind, result, server_cpu, client_cpu, server, server_wait)
        offered = "closed loop" if probe else f"{rate:,.0f}/s"
        print(
            f"[bench]   {self.system.key:5} {payload:4} B {kind:5} {offered:>12}: "
            f"{result.achieved:>9,.0f} msg/s  p50 {result.p50_ms:8.2f}  p99 {result.p99_ms:8.2f} ms"
            f"  cpu srv {server_cpu:4.0%} cli {client_cpu:4.0%} {step.flag}",
            flush=True,
        )
        self._check_alive()
        if probe and result.acked == 0:
            raise RuntimeError(f"nothing acknowledged in the probe ({result.first_error})")
        return step

    def _profiler(self, payload: int, kind: str, duration: float) -> subprocess.Popen[bytes] | None:
        """py-spy on our server during the 80 % steps when `BENCH_PROFILE` is set."""
        profiled = self.system.key in OURS_AT_BEST
        if not (os.environ.get("BENCH_PROFILE") and profiled and kind == "80%"):
            return None
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists() or self.profile_dir is None:
            print("[bench] BENCH_PROFILE: py-spy not found (pip install py-spy)", flush=True)
            return None
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        out = self.profile_dir / f"profile-{self.system.key}-{payload}B.txt"
        self.profiles[payload] = out
        cmd = [
            spy,
            "record",
            "-p",
            str(self.server.pid),
            "-d",
            str(max(1, int(duration))),
            "-r",
            "200",
            "-f",
            "raw",
            "-o",
            str(out),
            "--nonblocking",
        ]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def consume(self, payload: int, mode: Mode) -> None:
        spec = ConsumeSpec(self.system.key, self._endpoint(payload), 1000, 50_000_000, mode.consume)
        c0, t0 = self.server.cpu(), time.monotonic()
        result = self._consume(spec)
        run = self.out.runs[payload]
        run.consume = result
        run.consume_server_cpu = (self.server.cpu() - c0) / max(1e-9, time.monotonic() - t0)
        print(
            f"[bench]   {self.system.key:5} {payload:4} B consume: {result.received:,} msgs in "
            f"{result.seconds:.2f} s = {result.rate:,.0f} msg/s",
            flush=True,
        )
        self._check_alive()


class _KafkaRunner(_Runner):
    """Kafka driven by its own tools, one JVM per step on the client core: ProducerPerformance
    for the produce steps (a fixed record count: the step's rate times its duration, the
    warm-up share as `--warmup-records`), ConsumerPerformance, then EndToEndLatency."""

    TOPIC = "org.apache.kafka.tools.TopicCommand"
    PRODUCER = "org.apache.kafka.tools.ProducerPerformance"
    CONSUMER = "org.apache.kafka.tools.ConsumerPerformance"
    E2E = "org.apache.kafka.tools.EndToEndLatency"
    TOOL_WARMUP = 2.0
    """Seconds of each step's records added to its warm-up: a fresh tool JVM needs them to reach
    its steady rate (the measured part keeps the other systems' length)."""
    CALIBRATION_WINDOWS = 8
    """Before the first probe: seconds of unthrottled sending (warms the server's JIT and sizes
    the probes' record count)."""

    def __init__(self, system: System, server: Server, endpoint: dict[str, Any]) -> None:
        super().__init__(system, server, None, endpoint)
        self.durability = str(endpoint["durability"])
        self.produced: dict[int, int] = {}
        self.estimate: dict[int, float] = {}
        self.e2e_records = 200

    def _topic(self, payload: int, kind: str = "bench") -> str:
        return f"{kind}-{self.durability}-{payload}"

    def _tool(self, main: str, args: list[str], timeout: float) -> _kafka.ToolRun:
        run = _kafka.run_tool(_kafka.tool_command(self.endpoint, main, args), timeout)
        return _kafka.checked(run, main.rsplit(".", 1)[1])

    def _perf(
        self, payload: int, records: int, warmup: int, rate: float | None
    ) -> tuple[_kafka.ProducerLine, _kafka.ToolRun]:
        args = _kafka.producer_perf_args(
            str(self.endpoint["bootstrap"]), self._topic(payload), records, warmup, payload, rate
        )
        expected = records / rate if rate else records / self.estimate.get(payload, 1000.0)
        run = self._tool(self.PRODUCER, args, 4 * expected + 180)
        if self.produced.get(payload, 0) >= 0:
            self.produced[payload] = self.produced.get(payload, 0) + records
        return _kafka.parse_producer_perf(run.stdout), run

    def drop(self, payload: int) -> None:
        """Nothing: the topics exist (a second create fails), and the server's retention
        (``log.retention.bytes``) bounds what they keep."""

    def _reset(self, payload: int) -> None:
        bootstrap = str(self.endpoint["bootstrap"])
        configs = _kafka.TOPIC_CONFIG[self.durability]
        for kind in ("bench", "e2e"):
            args = _kafka.topic_create_args(bootstrap, self._topic(payload, kind), 1, configs)
            self._tool(self.TOPIC, args, 120)
        args = _kafka.producer_perf_args(
            bootstrap, self._topic(payload), 10**9, 0, payload, None, report_ms=1000
        )
        argv = _kafka.tool_command(self.endpoint, self.PRODUCER, args)
        self.estimate[payload] = _kafka.calibrate(argv, self.CALIBRATION_WINDOWS, 120)
        # How much the stopped calibration wrote is unknown: the consumer reads what saturation
        # produces in its duration.
        self.produced[payload] = -1

    def _produce(self, spec: StepSpec) -> StepResult:
        rate = spec.rate if spec.rate is not None else self.estimate[spec.payload]
        records = max(1000, int(rate * (spec.duration + self.TOOL_WARMUP)))
        warmup = int(rate * (spec.warmup + self.TOOL_WARMUP))
        line, run = self._perf(spec.payload, records, warmup, spec.rate)
        if spec.rate is None:
            self.estimate[spec.payload] = max(line.rate, self.estimate[spec.payload] / 2)
        return StepResult(
            offered=spec.rate,
            achieved=line.rate,
            sent=records,
            acked=records,
            p50_ms=line.p50_ms,
            p99_ms=line.p99_ms,
            p999_ms=line.p999_ms,
            max_ms=line.max_ms,
            mean_ms=line.avg_ms,
            recorded=line.records,
            client_cpu=run.cpu,
            wall=run.wall,
            extra={
                "tool": "ProducerPerformance",
                "p95_ms": line.p95_ms,
                "mbPerSec": line.mb_per_sec,
            },
        )

    def _consume(self, spec: ConsumeSpec) -> ConsumeResult:
        payload = int(spec.endpoint["run"])
        saturation = self.out.runs[payload].saturation or self.estimate.get(payload, 0.0)
        records = max(1, int(saturation * spec.duration))
        if self.produced.get(payload, -1) >= 0:
            records = min(records, self.produced[payload])
        args = _kafka.consumer_perf_args(
            str(self.endpoint["bootstrap"]), self._topic(payload), records
        )
        run = self._tool(self.CONSUMER, args, spec.duration * 10 + 120)
        line = _kafka.parse_consumer_perf(run.stdout)
        return ConsumeResult(line.records, line.fetch_seconds, run.cpu, run.wall)

    def consume(self, payload: int, mode: Mode) -> None:
        super().consume(payload, mode)
        args = _kafka.e2e_args(
            str(self.endpoint["bootstrap"]), self._topic(payload, "e2e"), self.e2e_records, payload
        )
        run = self._tool(self.E2E, args, self.e2e_records + 120)
        e2e = _kafka.parse_e2e(run.stdout, self.e2e_records)
        self.out.runs[payload].e2e = e2e
        print(
            f"[bench]   {self.system.key:5} {payload:4} B EndToEndLatency: p50 {e2e.p50_ms:.0f} "
            f"p99 {e2e.p99_ms:.0f} p99.9 {e2e.p999_ms:.0f} ms",
            flush=True,
        )


class _NativeRunner(_Runner):
    """A peer driven by its project's own closed-loop benchmark client (`bench/_native.py`),
    one process per step on the client core. redis-benchmark sends a fixed request count:
    the step's duration times the last estimate (a calibration run first), warm-up included."""

    CALIBRATION_REQUESTS = 20_000

    def __init__(self, system: System, server: Server, endpoint: dict[str, Any]) -> None:
        super().__init__(system, server, None, endpoint)
        self.estimate: dict[int, float] = {}

    def _reset(self, payload: int) -> None:
        if self.system.key == "nats-go":
            _native.nats_reset(self.endpoint, payload)
            return
        if self.system.key == "rabbitmq-stream":
            _native.rabbit_reset(self.endpoint, payload)
            return
        _native.redis_reset(self.endpoint, payload)
        calibration = _native.redis_produce(self.endpoint, payload, self.CALIBRATION_REQUESTS)
        self.estimate[payload] = max(1000.0, calibration.achieved)

    def _produce(self, spec: StepSpec) -> StepResult:
        if spec.rate is not None:
            raise RuntimeError(f"{self.system.key} is closed-loop only")
        if self.system.key == "nats-go":
            return _native.nats_produce(
                self.endpoint, spec.payload, spec.duration, spec.warmup, WINDOW
            )
        if self.system.key == "rabbitmq-stream":
            return _native.rabbit_produce(
                self.endpoint, spec.payload, spec.duration, spec.warmup, WINDOW
            )
        requests = int(self.estimate[spec.payload] * (spec.duration + spec.warmup))
        result = _native.redis_produce(self.endpoint, spec.payload, max(1000, requests))
        self.estimate[spec.payload] = max(1000.0, result.achieved)
        return result

    def _consume(self, spec: ConsumeSpec) -> ConsumeResult:
        payload = int(spec.endpoint["run"])
        if self.system.key == "nats-go":
            return _native.nats_consume(self.endpoint, payload, spec.batch, spec.duration)
        if self.system.key == "rabbitmq-stream":
            return _native.rabbit_consume(self.endpoint, payload, spec.duration)
        saturation = self.out.runs[payload].saturation or self.estimate.get(payload, 0.0)
        limit = max(_native.REDIS_CONSUME_BATCH, int(saturation * spec.duration))
        return _native.redis_consume(self.endpoint, payload, limit)


class _OursGoRunner(_Runner):
    """Our broker driven by segment-bench (`bench/_ours_go.py`), one process per step on the
    client core, in every phase: the same frames as the Python load generator sends, from a
    client that leaves the measurement to the broker."""

    def __init__(self, system: System, server: Server, endpoint: dict[str, Any]) -> None:
        super().__init__(system, server, None, endpoint)

    def _reset(self, payload: int) -> None:
        _ours_go.reset(self._endpoint(payload))

    def _produce(self, spec: StepSpec) -> StepResult:
        return _ours_go.produce(
            spec.endpoint,
            spec.payload,
            spec.rate,
            spec.duration,
            spec.warmup,
            spec.batch,
            spec.window,
            spec.drain,
        )

    def _consume(self, spec: ConsumeSpec) -> ConsumeResult:
        return _ours_go.consume(spec.endpoint, spec.duration)


def _disk_fsync_ms(directory: Path, seconds: float = 1.0) -> float:
    """Median latency of a 64 KiB append + fdatasync here: the machine's durability cost now."""
    path = directory / "fsync-probe.bin"
    buf = os.urandom(64 * 1024)
    samples: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(samples) < 2000:
            t0 = time.perf_counter()
            os.write(fd, buf)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(samples) * 1000


class _Bench:
    def __init__(self, mode: Mode, pin: bool, profile_dir: Path | None = None) -> None:
        self.mode = mode
        self.pin = pin
        self.profile_dir = profile_dir
        self.live: list[_Runner] = []
        self.all_runners: list[_Runner] = []
        self.results: list[SystemRun] = []
        self.errors: list[str] = []

    def start(self, stack: contextlib.ExitStack) -> None:
        ctx = multiprocessing.get_context("spawn")
        for system in _systems():
            try:
                tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
                server, endpoint, version = system.start(tmp)
                stack.callback(server.stop)
                runner: _Runner
                if system.tools:
                    runner = _KafkaRunner(system, server, endpoint)
                    runner.e2e_records = self.mode.e2e_records
                elif system.native:
                    runner = _NativeRunner(system, server, endpoint)
                elif system.go_client:
                    runner = _OursGoRunner(system, server, endpoint)
                else:
                    pool = stack.enter_context(
                        ProcessPoolExecutor(
                            1, mp_context=ctx, initializer=_worker.init, initargs=(self.pin,)
                        )
                    )
                    runner = _Runner(system, server, pool, endpoint)
            except (
                _kafka.KafkaUnavailable,
                _native.NativeUnavailable,
                _rabbitmq.RabbitUnavailable,
            ) as e:
                out = SystemRun(system.key, system.label, system.durability, unavailable=True)
                out.error = str(e)
                self.results.append(out)
                print(f"[bench] {system.key} not run: {e}", flush=True)
                continue
            except Exception as e:
                self._failed(SystemRun(system.key, system.label, system.durability), e)
                continue
            runner.out.rss_rest_kb = memory_kb(server.pid)
            runner.profile_dir = self.profile_dir
            runner.out.version = version
            self.results.append(runner.out)
            self.live.append(runner)
            self.all_runners.append(runner)
            print(f"[bench] {system.key}: {version}, pid {server.pid}, {endpoint}", flush=True)

    def _failed(self, out: SystemRun, e: BaseException) -> None:
        out.error = f"{type(e).__name__}: {e}"
        if out not in self.results:
            self.results.append(out)
        self.errors.append(f"{out.key}: {traceback.format_exc()}")
        print(f"[bench] {out.key} failed: {out.error}", flush=True)

    def each(self, fn: Callable[[_Runner], object], rotate: int = 0) -> None:
        """Apply `fn` to every live system in turn, starting `rotate` places further down the
        list; a system that fails leaves the run."""
        live = list(self.live)
        shift = rotate % len(live) if live else 0
        for runner in live[shift:] + live[:shift]:
            self._guarded(fn, runner)

    def _guarded(self, fn: Callable[[_Runner], object], runner: _Runner) -> None:
        """``fn(runner)`` unless the system already left the run; one that fails leaves it."""
        if runner not in self.live:
            return
        try:
            fn(runner)
        except (Exception, asyncio.CancelledError) as e:
            self.live.remove(runner)
            self._failed(runner.out, e)

    def run(self) -> None:
        mode = self.mode
        for payload in PAYLOADS:
            self.each(functools.partial(_Runner.reset, payload=payload))
        print("[bench] phase 1: capacity (closed loop)", flush=True)
        for round_ in range(mode.repeats):
            for payload in PAYLOADS:
                # Each round starts with another system: no system always follows the same one
                # (e.g. right after the heaviest writer, while its dirty pages are flushed).
                self.each(
                    functools.partial(
                        _Runner.produce, payload=payload, rate=None, kind="probe", mode=mode
                    ),
                    rotate=round_,
                )
        consumed_early = mode.repeats > 0
        if consumed_early:
            print("[bench] phase 3: consume (what the capacity probes wrote)", flush=True)
            for payload in PAYLOADS:
                self.each(functools.partial(_consume, payload=payload, mode=mode))
        self._auth_blocks(drop=consumed_early)
        print("[bench] phase 2: latency (open loop)", flush=True)
        for payload in PAYLOADS:
            self.each(
                functools.partial(_latency_sweep, payload=payload, mode=mode, drop=consumed_early)
            )
        if mode.equal_load > 0:
            print("[bench] phase 2b: latency at equal offered load", flush=True)
            for payload in PAYLOADS:
                open_loop = [r for r in self.live if not r.system.native]
                sats = [r.out.runs[payload].saturation for r in open_loop if payload in r.out.runs]
                if len(sats) < 2 or min(sats) <= 0:
                    continue
                rate = mode.equal_load * min(sats)
                self.each(functools.partial(_equal_step, payload=payload, rate=rate, mode=mode))
        if not consumed_early:
            print("[bench] phase 3: consume", flush=True)
            for payload in PAYLOADS:
                self.each(functools.partial(_consume, payload=payload, mode=mode))
        for runner in self.all_runners:
            if runner.server.alive():
                runner.out.rss_peak_kb = memory_kb(runner.server.pid, "VmHWM")

    def _auth_blocks(self, drop: bool) -> None:
        """Authentication off (A) and on (B) in blocks of A B B A closed-loop probes, back to
        back: the order within a block cancels both the machine's drift and any advantage of
        going first (the second of two back-to-back probes measured 5-7 % lower, whichever
        system it was), which the capacity rounds' pairs do not.

        ``drop`` (the capacity probes' data was consumed already): both systems' logs are
        freed before the blocks and after each one. A block of 1 KB probes writes about 15 GB
        at this machine's rates, and full mode's two blocks per payload on top of the
        capacity rounds' data filled its disk."""
        by = {r.system.key: r for r in self.live}
        keys = _auth_pair(by)
        if keys is None:
            return
        print("[bench] phase 1b: authentication off/on, A B B A blocks", flush=True)
        off, on = by[keys[0]], by[keys[1]]
        for payload in PAYLOADS:
            probe = functools.partial(
                _Runner.produce, payload=payload, rate=None, kind="pair", mode=self.mode
            )
            free = functools.partial(_drop, payload=payload)
            frees = (off, on) if drop else ()
            for _ in range(max(1, self.mode.repeats)):
                for r in frees:
                    self._guarded(free, r)
                for r in (off, on, on, off):
                    self._guarded(probe, r)
            for r in frees:
                self._guarded(free, r)


def _consume(r: _Runner, payload: int, mode: Mode) -> None:
    r.consume(payload, mode)


def _drop(r: _Runner, payload: int) -> None:
    r.drop(payload)


def _equal_step(r: _Runner, payload: int, rate: float, mode: Mode) -> None:
    if not r.system.native:
        r.produce(payload, rate, "equal", mode)


def _latency_sweep(r: _Runner, payload: int, mode: Mode, drop: bool = False) -> None:
    """A fresh capacity probe, then open-loop steps at fractions of the capacity, 80 % first:
    the disk and CPU of a shared machine drift within minutes, and the latency target is about
    80 % of the capacity the system has now. The probe also counts toward the median, and the
    capacity is the lower of the fresh probe and the median of all probes (the saturation the
    report states): one lucky probe must not put the "80 %" step above what the system
    sustains, where an open-loop queue only grows and the latency measures the overload.
    """
    fresh = r.produce(payload, None, "probe", mode).result.achieved
    if not r.system.native:
        capacity = min(fresh, r.out.runs[payload].saturation)
        for fraction in mode.fractions:
            kind = {0.8: "80%", 0.5: "50%"}.get(fraction, "sweep")
            r.produce(payload, fraction * capacity, kind, mode)
    if drop:
        r.drop(payload)


def _cell_ms(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def _ms(x: float | None) -> Cell:
    return None if x is None else round(x, 2)


def _step_row(s: Step, payload: int) -> list[Cell]:
    r = s.result
    return [
        s.kind,
        "max" if r.offered is None else round(r.offered),
        round(r.achieved),
        round(r.achieved * payload / 1e6, 1),
        _ms(r.p50_ms),
        _ms(r.p99_ms),
        _ms(r.p999_ms),
        _ms(r.max_ms),
        f"{s.server_cpu:.0%}",
        f"{s.client_cpu:.0%}",
        f"{_cell_ms(r.gen_lag_p99_ms)} / {_cell_ms(r.gen_lag_max_ms)}",
        s.flag or "-",
    ]


STEP_COLUMNS = [
    "step",
    "offered msg/s",
    "achieved msg/s",
    "MB/s",
    "p50 ms",
    "p99 ms",
    "p99.9 ms",
    "max ms",
    "server CPU",
    "client CPU",
    "gen lag p99 / max ms",
    "flag",
]


def _bottleneck(s: Step) -> str:
    """Which side limits a step: a CPU at >= BOUND of a core, else the disk when our broker's
    flushes are busy that share of the time, else neither CPU (disk or waiting)."""
    sides = []
    if s.server_cpu >= BOUND:
        sides.append("server CPU")
    if s.client_cpu >= BOUND:
        sides.append("client CPU")
    if s.server.get("fsyncBusy", 0.0) >= BOUND:
        sides.append("disk (fsync)")
    if not sides and s.server_cpu + s.server_wait >= BOUND:
        sides.append("server CPU, starved by other load")
    return " + ".join(sides) or "no CPU saturated (disk or waiting)"


def _curve(section: Section, runs: list[SystemRun]) -> None:
    rows: list[list[Cell]] = []
    for payload in PAYLOADS:
        for sr in runs:
            pr = sr.runs.get(payload)
            if pr is None:
                continue
            for s in sorted(
                (s for s in pr.steps if s.result.offered), key=lambda s: s.result.offered or 0.0
            ):
                rows.append(
                    [
                        payload,
                        sr.label,
                        round(s.result.offered or 0.0),
                        round(s.result.achieved),
                        f"{(s.result.offered or 0.0) / pr.saturation:.0%}"
                        if pr.saturation
                        else None,
                        _ms(s.result.p50_ms),
                        _ms(s.result.p99_ms),
                        f"{s.server_cpu:.0%} / {s.client_cpu:.0%}",
                        _bottleneck(s),
                    ]
                )
    section.table(
        "Latency vs throughput (every open-loop step, offered load ascending per system)",
        [
            "payload B",
            "system",
            "offered msg/s",
            "achieved msg/s",
            "of saturation",
            "p50 ms",
            "p99 ms",
            "CPU server / client",
            "bottleneck",
        ],
        rows,
    )


def _plots(section: Section, runs: list[SystemRun], out_dir: Path | None) -> None:
    """One latency-vs-throughput PNG per payload next to the report, linked from a note."""
    if out_dir is None:
        return
    if importlib.util.find_spec("matplotlib") is None:
        section.note(
            "No latency-vs-throughput plot: matplotlib is not installed "
            "(`pip install -e '.[bench]'`)."
        )
        return
    from bench._plot import CurvePoint, plot_latency_curves

    for payload in PAYLOADS:
        curves = {
            sr.label: [
                CurvePoint(
                    s.result.offered or 0.0, s.result.achieved, s.result.p50_ms, s.result.p99_ms
                )
                for s in sr.runs[payload].steps
                if s.result.offered
            ]
            for sr in runs
            if payload in sr.runs
        }
        if not any(curves.values()):
            continue
        name = f"broker-latency-{payload}B.png"
        plot_latency_curves(
            curves, out_dir / name, title=f"Publish latency vs throughput, {payload} B messages"
        )
        section.note(
            f"Latency vs throughput, {payload} B (p50 solid, p99 dashed, open-loop steps): "
            f"![latency vs throughput {payload} B]({name})"
        )


def _describe(section: Section, runs: list[SystemRun]) -> None:
    summary: list[list[Cell]] = []
    for sr in runs:
        for payload, pr in sr.runs.items():
            at80 = pr.at80
            summary.append(
                [
                    sr.label,
                    payload,
                    round(pr.saturation),
                    round(pr.saturation * payload / 1e6, 1),
                    round(pr.max_achieved),
                    _ms(at80.result.p50_ms) if at80 else None,
                    _ms(at80.result.p99_ms) if at80 else None,
                    _ms(at80.result.p999_ms) if at80 else None,
                    (
                        f"{_cell_ms(pr.equal.result.p99_ms)} @ {pr.equal.result.offered or 0:,.0f}"
                        if pr.equal
                        else None
                    ),
                    round(pr.consume.rate) if pr.consume else None,
                ]
            )
            section.figure(
                "saturation", pr.saturation, "msg/s", system=sr.key, payload=str(payload)
            )
            if pr.consume:
                section.figure(
                    "consume_throughput",
                    pr.consume.rate,
                    "msg/s",
                    system=sr.key,
                    payload=str(payload),
                )
            for s in pr.probes + pr.steps:
                labels = {"system": sr.key, "payload": str(payload), "step": s.kind}
                if s.result.offered:
                    labels["offered"] = str(round(s.result.offered))
                section.figure("produce_throughput", s.result.achieved, "msg/s", **labels)
                section.figure("produce_p99", s.result.p99_ms, "ms", **labels)
    section.table(
        "Summary (saturation = median closed-loop throughput; latency in open loop at 80 % of "
        "the lower of the saturation and the throughput probed just before)",
        [
            "system",
            "payload B",
            "saturation msg/s",
            "MB/s",
            "max seen msg/s",
            "p50 ms @80%",
            "p99 ms @80%",
            "p99.9 ms @80%",
            "p99 ms @ equal load msg/s",
            "consume msg/s",
        ],
        summary,
    )
    section.table(
        "Durability of each system",
        ["system", "version", "durability"],
        [[sr.label, sr.version or "-", sr.durability] for sr in runs],
    )
    section.table(
        "Server memory (resident set: at rest just after start, peak by the end of the run; "
        "both Kafka rows are the same JVM, fixed 1 GiB heap)",
        ["system", "pid", "RSS at rest MB", "peak RSS under load MB"],
        [
            [sr.label, sr.server_pid, round(sr.rss_rest_kb / 1024), round(sr.rss_peak_kb / 1024)]
            for sr in runs
            if sr.rss_rest_kb
        ],
    )
    for sr in runs:
        if sr.rss_rest_kb:
            section.figure("rss_rest", sr.rss_rest_kb / 1024, "MB", system=sr.key)
        if sr.rss_peak_kb:
            section.figure("rss_peak", sr.rss_peak_kb / 1024, "MB", system=sr.key)
    e2e: list[list[Cell]] = [
        [sr.label, payload, pr.e2e.records, pr.e2e.p50_ms, pr.e2e.p99_ms, pr.e2e.p999_ms]
        for sr in runs
        for payload, pr in sr.runs.items()
        if pr.e2e
    ]
    if e2e:
        section.table(
            "Kafka EndToEndLatency (its tool: one message at a time, produce -> consume, whole ms)",
            ["system", "payload B", "messages", "p50 ms", "p99 ms", "p99.9 ms"],
            e2e,
        )
    _curve(section, runs)
    for sr in runs:
        for payload, pr in sr.runs.items():
            rows = [_step_row(s, payload) for s in pr.probes + pr.steps]
            section.table(f"{sr.label}, {payload} B: produce", STEP_COLUMNS, rows)
    commit: list[list[Cell]] = []
    for sr in runs:
        for payload, pr in sr.runs.items():
            for s in pr.probes + pr.steps:
                if not s.server:
                    continue
                commit.append(
                    [
                        f"{payload} B {s.kind}",
                        round(s.result.achieved),
                        round(s.server["fsyncPerSec"]),
                        round(s.result.achieved / s.server["fsyncPerSec"])
                        if s.server["fsyncPerSec"]
                        else None,
                        _ms(s.server["fsyncMeanMs"]),
                        _ms(s.server["fsyncP99LeMs"]),
                        f"{s.server['fsyncBusy']:.0%}",
                        f"{s.server_cpu:.0%}",
                        _ms(s.result.p99_ms),
                    ]
                )
    if commit:
        section.table(
            "Segment broker: where the time goes (group commit per step from /metrics; a flush is "
            "one write + fdatasync of everything staged, `segment_broker_fsync_seconds`)",
            [
                "step",
                "msg/s",
                "flushes/s",
                "msgs per flush",
                "flush mean ms",
                "flush p99 <= ms",
                "flush busy",
                "server CPU",
                "ack p99 ms",
            ],
            commit,
        )
    _stage_table(section, runs)


def _stage_table(section: Section, runs: list[SystemRun]) -> None:
    """Per step, the mean and ~p99 of each stage the broker times on the produce path."""
    from bench._ours import STAGES

    def cell(server: dict[str, float], stage: str) -> str:
        mean, p99 = server.get(f"{stage}MeanMs"), server.get(f"{stage}P99LeMs")
        return "-" if mean is None or p99 is None else f"{_cell_ms(mean)} / {_cell_ms(p99)}"

    rows: list[list[Cell]] = []
    for sr in runs:
        for payload, pr in sr.runs.items():
            for s in pr.probes + pr.steps:
                if f"{STAGES[0]}MeanMs" not in s.server:
                    continue
                rows.append(
                    [
                        f"{sr.key} {payload} B {s.kind}",
                        round(s.result.achieved),
                        *(cell(s.server, st) for st in STAGES),
                        cell(s.server, "lag"),
                        " / ".join(
                            f"{s.server.get(f'gc{g}Count', 0):.0f}: "
                            f"{_cell_ms(s.server.get(f'gc{g}Ms', 0.0))}"
                            for g in range(3)
                        ),
                        _ms(s.result.p50_ms),
                        _ms(s.result.p99_ms),
                    ]
                )
    if rows:
        section.table(
            "Segment broker: where an entry's time goes, by stage (mean / p99 upper bucket bound, "
            "ms; `segment_broker_produce_stage_seconds`: frame = decode and stage one SEND frame; "
            "stage, write, sync, visible = one group-commit chunk from its first entry staged to "
            "the writer thread, written, covered by a finished fdatasync, visible on the event "
            "loop; ack = visible until the acks are encoded). The client's latency adds the "
            "socket and its own event loop on both ways. Loop lag: how late a 50 ms timer "
            "fires on the broker's event loop (`segment_broker_event_loop_lag_seconds`); GC: "
            "collections of the cyclic garbage collector per generation 0 / 1 / 2 in the step, "
            "count: total ms (`segment_broker_gc_pause_seconds`).",
            [
                "step",
                "msg/s",
                *(f"{st} ms" for st in STAGES),
                "loop lag ms",
                "GC count: ms",
                "client p50 ms",
                "client p99 ms",
            ],
            rows,
        )


def _profile_table(section: Section, path: Path, payload: int, label: str, top: int = 15) -> None:
    """Self and inclusive shares of the hottest frames in a py-spy raw (collapsed) profile."""
    if not path.exists():
        return
    leaf: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n_text = line.rpartition(" ")
        if not stack or not n_text.isdigit():
            continue
        n = int(n_text)
        total += n
        frames = stack.split(";")
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    if not total:
        return
    rows: list[list[Cell]] = [
        [f"{n / total:.1%}", f"{incl[f] / total:.1%}", f]
        for f, n in sorted(leaf.items(), key=lambda kv: -kv[1])[:top]
    ]
    section.table(
        f"{label}: profile at 80 % of saturation, {payload} B "
        f"(py-spy, {total} samples, GIL-holding and I/O threads; raw stacks in {path.name})",
        ["self", "inclusive", "frame"],
        rows,
    )


def _metric(sr: SystemRun | None, payload: int, metric: str) -> float | None:
    if sr is None or payload not in sr.runs:
        return None
    pr = sr.runs[payload]
    if metric == "saturation":
        return pr.saturation if pr.probes else None
    return pr.consume.rate if pr.consume else None


PEERS = {
    "nats-go": "JetStream (nats.go)",
    "redis-native": "Redis (redis-benchmark)",
    "rabbitmq-stream": "RabbitMQ streams (Java client)",
    "nats": "JetStream (nats-py)",
    "redis": "Redis (redis-py)",
    "kafka": "Kafka default",
    "kafka-sync": "Kafka flush=1",
}
"""Every peer row, short names for the ratio tables: own benchmark clients first."""
OWN_CLIENT = {"ours": "ours-go", "nats": "nats-go", "redis": "redis-native"}
"""Python-client row -> the same server driven by its project's own benchmark client."""
CLIENT_NAMES = {
    **PEERS,
    "ours-go": "segment broker (Go client)",
    "ours": "segment broker (Python client)",
}
AUTH_PAIRS = (("ours-go", "ours-go-auth"), ("ours", "ours-auth"))
"""Authentication off and on, same client, in order of preference: the Go client's pair is
server-bound, so what authentication costs the broker shows in it."""


def _auth_pair(present: Collection[str]) -> tuple[str, str] | None:
    """The first of `AUTH_PAIRS` whose two systems are both in `present`."""
    return next(((a, b) for a, b in AUTH_PAIRS if a in present and b in present), None)


OURS_AT_BEST = ("ours-go", "ours")
"""Our row in the comparisons and targets: the Go client when it ran (the peers are measured
through their own native clients too), else the Python load generator."""


def _ours_at_best(by: dict[str, SystemRun]) -> SystemRun | None:
    return next((by[k] for k in OURS_AT_BEST if k in by and by[k].runs), None)


def _ours_name(ours: SystemRun | None) -> str:
    """How the tables name our column: the client that measured it."""
    return CLIENT_NAMES.get(ours.key, ours.label) if ours else "segment broker"


def _median_probe(pr: PayloadRun) -> Step | None:
    """The capacity probe whose throughput is the saturation (the lower middle one)."""
    probes = sorted(pr.probes, key=lambda s: s.result.achieved)
    return probes[(len(probes) - 1) // 2] if probes else None


def _side(sr: SystemRun | None, payload: int) -> str | None:
    pr = sr.runs.get(payload) if sr else None
    probe = _median_probe(pr) if pr else None
    if probe is None:
        return None
    return (
        f"{_bottleneck(probe)} (server {probe.server_cpu:.0%} + {probe.server_wait:.0%} waiting "
        f"for a core, client {probe.client_cpu:.0%})"
    )


def _best_peer(
    section: Section, by: dict[str, SystemRun], ours: SystemRun | None
) -> dict[int, str]:
    """Ours against the best peer row per payload and metric, with each side's bottleneck at
    saturation (the median capacity probe's CPU shares). Returns the best peer by saturation
    per payload."""
    rows: list[list[Cell]] = []
    best_by_payload: dict[int, str] = {}
    for payload in PAYLOADS:
        for metric in ("saturation", "consume"):
            o = _metric(ours, payload, metric)
            measured = [(p, key) for key in PEERS if (p := _metric(by.get(key), payload, metric))]
            if not measured:
                continue
            value, key = max(measured)
            if metric == "saturation":
                best_by_payload[payload] = key
            ratio = o / value if o is not None and value else None
            if ratio is not None:
                section.figure(f"ratio_best_{metric}", ratio, "x", peer=key, payload=str(payload))
            rows.append(
                [
                    payload,
                    f"{metric} msg/s",
                    None if o is None else round(o),
                    PEERS[key],
                    round(value),
                    None if ratio is None else f"{ratio:.2f}x",
                    _side(ours, payload) if metric == "saturation" else None,
                    _side(by.get(key), payload) if metric == "saturation" else None,
                ]
            )
    section.tables.insert(
        1,
        Table(
            "Ours / best peer (same run; each peer at its best client; bottleneck = what is at "
            f">= {BOUND:.0%} of a core in the median capacity probe, else disk or waiting)",
            [
                "payload B",
                "metric",
                _ours_name(ours),
                "best peer",
                "best peer msg/s",
                "ours/best",
                "our bottleneck",
                "best peer's bottleneck",
            ],
            rows,
        ),
    )
    clients: list[list[Cell]] = []
    for py_key, own_key in OWN_CLIENT.items():
        for payload in PAYLOADS:
            own, py = by.get(own_key), by.get(py_key)
            if not ((own and payload in own.runs) or (py and payload in py.runs)):
                continue
            clients.append(
                [
                    payload,
                    CLIENT_NAMES[own_key],
                    _round(_metric(own, payload, "saturation")),
                    _side(own, payload),
                    CLIENT_NAMES[py_key],
                    _round(_metric(py, payload, "saturation")),
                    _side(py, payload),
                    _round(_metric(own, payload, "consume")),
                    _round(_metric(py, payload, "consume")),
                ]
            )
    if clients:
        section.table(
            "Each server through its own benchmark client (ours: bench/ours-go) vs through our "
            "Python load generator (the Python-client figures of earlier reports)",
            [
                "payload B",
                "own client",
                "saturation msg/s",
                "bottleneck",
                "Python client",
                "saturation msg/s",
                "bottleneck",
                "consume msg/s (own)",
                "consume msg/s (Python)",
            ],
            clients,
        )
    return best_by_payload


def _round(x: float | None) -> int | None:
    return None if x is None else round(x)


AUTH_COST_TARGET = 0.05


def _auth_pair_cost(off: PayloadRun, on: PayloadRun) -> tuple[float, str] | None:
    """``(cost, how it was measured)``: 1 - the ratio of the geometric means of the A B B A
    blocks' probes (`_Bench._auth_blocks`). Without blocks (a system left the run) it is not
    measured: the capacity rounds' pairs favour whichever system went first."""
    a = [s.result.achieved for s in off.pairs]
    b = [s.result.achieved for s in on.pairs]
    if not (a and b and min(a + b) > 0):
        return None
    ga, gb = statistics.geometric_mean(a), statistics.geometric_mean(b)
    return 1.0 - gb / ga, (
        f"{ga:,.0f} -> {gb:,.0f} msg/s over A B B A blocks of {len(a)} + {len(b)} probes"
    )


def _auth_cost(section: Section, off: SystemRun | None, on: SystemRun | None) -> None:
    """Throughput and p99 at 80 % with authentication off and on, same run, same client."""
    rows: list[list[Cell]] = []
    for payload in PAYLOADS:
        a, b = _metric(off, payload, "saturation"), _metric(on, payload, "saturation")
        measured = (
            _auth_pair_cost(off.runs[payload], on.runs[payload])
            if off and on and payload in off.runs and payload in on.runs
            else None
        )
        cost = measured[0] if measured else None
        p99 = [
            s.result.p99_ms if s else None
            for s in (
                off.runs[payload].at80 if off and payload in off.runs else None,
                on.runs[payload].at80 if on and payload in on.runs else None,
            )
        ]
        rows.append(
            [
                payload,
                None if a is None else round(a),
                None if b is None else round(b),
                None if cost is None else f"{cost:+.1%}",
                _ms(p99[0]),
                _ms(p99[1]),
            ]
        )
        if cost is not None:
            section.figure("auth_throughput_cost", cost * 100, "%", payload=str(payload))
        section.target(
            f"authentication costs < {AUTH_COST_TARGET:.0%} throughput, {payload} B",
            cost is not None and cost < AUTH_COST_TARGET,
            f"cost {measured[0]:+.1%}: {measured[1]}" if measured else "not measured",
            f"< {AUTH_COST_TARGET:.0%}",
        )
    section.table(
        "Authentication cost (same run, interleaved; decisions per connection; "
        f"{on.label if on else 'not run'} against authentication off)",
        [
            "payload B",
            "msg/s auth off",
            "msg/s auth on",
            "cost (A B B A blocks)",
            "p99 80 % off",
            "p99 80 % on",
        ],
        rows,
    )


def _ratios_and_targets(section: Section, runs: list[SystemRun]) -> None:
    by = {sr.key: sr for sr in runs}
    ours = _ours_at_best(by)
    who = _ours_name(ours)
    present = [key for key in PEERS if key in by and by[key].runs]
    rows: list[list[Cell]] = []
    for payload in PAYLOADS:
        for metric in ("saturation", "consume"):
            o = _metric(ours, payload, metric)
            row: list[Cell] = [payload, f"{metric} msg/s", None if o is None else round(o)]
            for peer in present:
                p = _metric(by.get(peer), payload, metric)
                row.append(None if p is None else round(p))
                ratio = o / p if o is not None and p else None
                row.append(None if ratio is None else f"{ratio:.2f}x")
                if ratio is not None:
                    section.figure(f"ratio_{metric}", ratio, "x", peer=peer, payload=str(payload))
            rows.append(row)
    section.tables.insert(
        1,
        Table(
            "Ours / every peer (same run, interleaved)",
            [
                "payload B",
                "metric",
                _ours_name(ours),
                *(c for key in present for c in (PEERS[key], f"ours/{PEERS[key]}")),
            ],
            rows,
        ),
    )
    _best_peer(section, by, ours)

    keys = _auth_pair([k for k, sr in by.items() if sr.runs])
    _auth_cost(section, *((by[keys[0]], by[keys[1]]) if keys else (None, None)))

    kb = ours.runs.get(1024) if ours else None
    for peer, name in (("nats", "JetStream"), ("redis", "Redis Streams")):
        # The peer at its best: its own benchmark client or the Python one, whichever is faster.
        candidates = [
            by[k].runs[1024]
            for k in (OWN_CLIENT[peer], peer)
            if k in by and 1024 in by[k].runs and by[k].runs[1024].probes
        ]
        pr = max(candidates, key=lambda r: r.saturation, default=None)
        title = f">= {TARGET_RATIO:.0f}x {name} at 1 KB (saturation, best client)"
        if kb and kb.probes and pr and pr.probes and pr.saturation > 0:
            ratio = kb.saturation / pr.saturation
            section.target(
                title,
                ratio >= TARGET_RATIO,
                f"{kb.saturation:,.0f} vs {pr.saturation:,.0f} msg/s = {ratio:.2f}x ({who})",
                f">= {TARGET_RATIO:.1f}x",
            )
        else:
            section.target(title, False, "not measured", f">= {TARGET_RATIO:.1f}x")
    small = ours.runs.get(100) if ours else None
    section.target(
        ">= 150k msg/s at 100 B (saturation)",
        bool(small and small.saturation >= TARGET_100B),
        f"{small.saturation:,.0f} msg/s ({who})" if small and small.probes else "not measured",
        f">= {TARGET_100B:,.0f} msg/s",
    )
    for payload in PAYLOADS:
        pr = ours.runs.get(payload) if ours else None
        for share, step, bound in (
            (80, pr.at80 if pr else None, TARGET_P99_MS),
            (50, pr.at50 if pr else None, TARGET_P99_AT50_MS),
        ):
            section.target(
                f"p99 <= {bound:.0f} ms at {share} % of saturation, {payload} B",
                bool(step and step.result.p99_ms <= bound),
                f"p99 {step.result.p99_ms:.2f} ms at {step.result.achieved:,.0f} msg/s "
                f"(offered {step.result.offered or 0:,.0f}; {who})"
                if step
                else "not measured",
                f"<= {bound:.0f} ms",
            )


def run(report: Report, quick: bool) -> None:
    section = report.section("broker", "Segment broker vs NATS JetStream vs Redis Streams")
    mode = QUICK if quick else FULL
    bench = _Bench(mode, can_pin(), report.out_dir)
    disk: dict[str, float] = {}
    load: dict[str, list[float]] = {"start": list(os.getloadavg())}
    with contextlib.ExitStack() as stack:
        probe_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-disk-")))
        disk["start"] = _disk_fsync_ms(probe_dir)
        stalls = {"start": _hiccup.probe()}
        bench.start(stack)
        bench.run()
        disk["end"] = _disk_fsync_ms(probe_dir)
        stalls["end"] = _hiccup.probe()
    load["end"] = list(os.getloadavg())

    runs = bench.results
    _describe(section, [sr for sr in runs if sr.runs])
    _plots(section, [sr for sr in runs if sr.runs], report.out_dir)
    missing: list[list[Cell]] = [[sr.label, sr.error] for sr in runs if sr.error]
    if missing:
        section.table("Systems not measured (and why)", ["system", "reason"], missing)
    for runner in bench.all_runners:
        for payload, path in runner.profiles.items():
            _profile_table(section, path, payload, runner.out.label)
    _ratios_and_targets(section, runs)
    section.note(
        f"Client: one Python process (uvloop) per system; batches of <= {BATCH} messages "
        f"(ours: one entry; Redis: one pipeline; NATS: {BATCH} publish_async calls), <= {WINDOW} "
        "messages in flight. Latency runs from the intended send time to the ack (open loop, "
        "1 ms ticks; each tick's messages are recorded once with their count: +-0.5 ms). "
        "ours-go (bench/ours-go, segment-bench) sends the same frames from Go with the same "
        "batches, window, ticks and recording, one process per step; its consumer walks every "
        "message of every entry and acknowledges once per DELIVER frame."
    )
    if any(sr.key in _native.SYSTEMS for sr in runs):
        section.note(
            "NATS and Redis rows marked nats.go / redis-benchmark are driven by their projects' "
            "own benchmark clients (bench/_native.py; one process per step on the client core, "
            "closed loop: capacity probes and consume only, no open-loop steps): nats.go "
            f"PublishAsync with PublishAsyncMaxPending({WINDOW}), pull consumer Fetch(1000) + "
            f"AckAll; redis-benchmark -c {_native.REDIS_CONCURRENCY} -P {_native.REDIS_PIPELINE} "
            "XADD (latency per request, its own percentiles, warm-up included), consume = "
            f"XREADGROUP COUNT {_native.REDIS_CONSUME_BATCH} one request at a time without XACK. "
            "RabbitMQ streams: bench/rabbitmq-stream/StreamBench.java on RabbitMQ's Java stream "
            f"client (maxUnconfirmedMessages({WINDOW}), publisher confirms, a consumer from the "
            "first offset; its stream-perf-test is not on Maven Central), Debian's "
            "rabbitmq-server with the rabbitmq_stream plugin. The Python-client rows (nats-py, "
            "redis-py) are kept in their own table."
        )
    section.note(
        "Pinning: "
        + (
            "servers on core 0, load generators on core 1."
            if bench.pin
            else "none (fewer than 2 usable cores)."
        )
        + f" CPU per step from /proc (server, all threads) and os.times (client); >= {BOUND:.0%}"
        " of one core is flagged."
    )
    section.note(
        f"Mode {'quick' if quick else 'full'}: {mode.repeats + 1} capacity probe(s) of "
        f"{mode.probe:.0f} s ({mode.probe_warmup:.0f} s warm-up excluded), sweep steps of "
        f"{mode.step:.0f} s ({mode.step_warmup:.0f} s warm-up), systems interleaved. The "
        "anchors ask for >= 60 s runs and the median of 3; that does not fit the time budget, "
        "so treat differences under ~15 % as noise."
    )
    section.note(
        "Machine state: 64 KiB append+fdatasync median "
        f"{disk['start']:.2f} ms at the start, {disk.get('end', float('nan')):.2f} ms at the end; "
        "load average "
        + " -> ".join("/".join(f"{x:.2f}" for x in v) for v in load.values())
        + " (other work shares these 2 cores and this disk)."
    )
    _hiccup.note(section, stalls)
    section.data["systems"] = [
        {
            "key": sr.key,
            "label": sr.label,
            "durability": sr.durability,
            "version": sr.version,
            "serverPid": sr.server_pid,
            "error": sr.error,
            "unavailable": sr.unavailable,
            "rssRestKb": sr.rss_rest_kb,
            "rssPeakKb": sr.rss_peak_kb,
            "runs": {
                str(p): {
                    "saturation": pr.saturation,
                    "maxAchieved": pr.max_achieved,
                    "steps": [
                        {
                            "kind": s.kind,
                            "serverCpu": s.server_cpu,
                            "serverRunqueueWait": s.server_wait,
                            "clientCpu": s.client_cpu,
                            "server": s.server,
                            **asdict(s.result),
                        }
                        for s in pr.probes + pr.steps + pr.pairs
                    ],
                    "consume": asdict(pr.consume) if pr.consume else None,
                    "e2e": asdict(pr.e2e) if pr.e2e else None,
                    "consumeServerCpu": pr.consume_server_cpu,
                }
                for p, pr in sr.runs.items()
            },
        }
        for sr in runs
    ]
    if any(sr.key.startswith("kafka") for sr in runs):
        section.note(
            "Kafka is driven by its own tools (one JVM each on the client core, "
            f"-Xmx{_kafka.TOOL_HEAP}; the server has a fixed {_kafka.SERVER_HEAP} heap and Kafka's "
            "own JVM flags), one partition per topic like our one segment: ProducerPerformance "
            f"with {' '.join(_kafka.PRODUCER_PROPS)} (OMB's Kafka driver), keys cycling over "
            f"{_kafka.KEY_RANGE} like ours (`--key-distribution range`), a fixed record count per "
            "step (rate x duration, warm-up share excluded by `--warmup-records`). Its latency "
            "runs from `send()` to the ack in whole ms and its throttle sleeps instead of "
            "queueing, so it omits the wait a stalled producer would add (coordinated omission): "
            "a lower bound next to ours, from the intended send time. Its closed-loop probes "
            "fill the producer's 32 MB buffer (ours: <= 4096 messages in flight), so their "
            "latency is queueing; compare latency in the open-loop steps. Consume = "
            "ConsumerPerformance's fetch rate (after the group join) over as many messages as "
            "saturation produces in the consume duration. Server and client CPU of a Kafka step "
            "include the tool's JVM start (~1 s)."
        )
    section.data["client"] = {"batch": BATCH, "window": WINDOW, "pinned": bench.pin}
    section.data["machine"] = {"fsync64kMs": disk, "loadAverage": load}
    if bench.errors:
        raise RuntimeError("some systems failed:\n" + "\n".join(bench.errors))
