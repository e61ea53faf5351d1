"""Apache Kafka as a peer: jars from Maven Central, a single-node KRaft server, Kafka's own tools.

Install: `bench/kafka/pom.xml` pins the Kafka version (``kafka.version``, nowhere else);
``mvn dependency:copy-dependencies`` (runtime scope) copies the broker, the storage tool, the
perf tools and an SLF4J binding into ``~/.cache/scalable-topics/kafka-<version>/lib``, with
Maven's own repository at ``~/.cache/scalable-topics/m2``; a complete copy is reused. Nothing is
downloaded from anywhere but Maven Central and nothing lands in the repository.

Server: ``kafka.tools.StorageTool format --standalone`` formats a combined broker+controller
directory, ``kafka.Kafka`` runs it on 127.0.0.1 with the JVM flags of Kafka's own
``kafka-run-class.sh`` / ``kafka-server-start.sh`` (G1, fixed 1 GiB heap). It is ready when it
logs ``Kafka Server started`` and its port answers.

Load: Kafka's tools (``ProducerPerformance``, ``ConsumerPerformance``, ``EndToEndLatency``,
``TopicCommand``), each a JVM on the client core; their summary lines are parsed here.
"""

from __future__ import annotations

import base64
import os
import re
import selectors
import shutil
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._procs import CLIENT_CORE, Server, can_pin, free_port, start_server, tcp_open
from scalable_topics.recommender.s3a import MavenMissing, pom_property, resolve_into

# The same Maven resolution (cache layout, copy-dependencies) as the recommender's s3a jars.
from scalable_topics.recommender.s3a import cache_root as cache_root
from scalable_topics.recommender.s3a import resolve_command as resolve_command

POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
JAVA_MIN = 17
SERVER_HEAP = "1g"
TOOL_HEAP = "512m"
# KAFKA_JVM_PERFORMANCE_OPTS of kafka-run-class.sh.
JVM_FLAGS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
)
READY_LINE = "Kafka Server started"
# OpenMessaging Benchmark's Kafka driver (latency profile): acks=all, linger 1 ms, 128 KB batches.
PRODUCER_PROPS = ("acks=all", "linger.ms=1", "batch.size=131072")
KEY_RANGE = 1024
"""Keys per run, like our broker's load generator (`bench/_ours.py`)."""

DURABILITY = {
    "default": (
        "topic defaults (`flush.messages` unset): **ack before fsync** (the OS flushes the page "
        "cache; Kafka relies on replication); acks=all, R1"
    ),
    "sync": (
        "`flush.messages=1` on the topic: ack after fsync (one fsync per partition per produce "
        "request, like OMB's kafka-sync driver); acks=all, R1"
    ),
}
TOPIC_CONFIG = {"default": (), "sync": ("flush.messages=1",)}


class KafkaUnavailable(RuntimeError):
    """Java or Maven is missing (or too old): the Kafka rows say why, the rest still runs."""


def kafka_version(pom: Path = POM) -> str:
    return pom_property(pom, "kafka.version", release=True)


def java_major(version_output: str) -> int:
    """Major version in ``java -version`` output (``version "17.0.15"``; ``"1.8.0_4"`` is 8)."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not m:
        raise ValueError(f"cannot read a Java version from {version_output[:200]!r}")
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_jars(names: Sequence[str], version: str, log4j: str) -> None:
    """The resolved lib directory holds this Kafka and a binding that matches its log4j."""
    wanted = [
        f"kafka_2.13-{version}.jar",
        f"kafka-tools-{version}.jar",
        f"log4j-core-{log4j}.jar",
        f"log4j-slf4j-impl-{log4j}.jar",
    ]
    missing = [w for w in wanted if w not in names]
    if not any(n.startswith("slf4j-api-") for n in names):
        missing.append("slf4j-api-*.jar")
    cores = [n for n in names if n.startswith("log4j-core-")]
    if missing or len(cores) != 1:
        raise RuntimeError(
            f"Kafka jars incomplete or mismatched (missing {missing}, log4j-core {cores}); "
            "log4j.version in bench/kafka/pom.xml must be the log4j-core Kafka depends on"
        )


@dataclass(frozen=True)
class Install:
    version: str
    java: str
    lib: Path

    @property
    def classpath(self) -> str:
        return str(self.lib / "*")


def ensure_kafka(pom: Path = POM, cache: Path | None = None) -> Install:
    """Java >= 17 and Kafka's jars in the cache (resolved with Maven once, then reused)."""
    java = shutil.which("java")
    if not java:
        raise KafkaUnavailable(
            "java not found (Kafka 4 needs Java 17+: apt-get install openjdk-17)"
        )
    r = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    major = java_major(r.stderr + r.stdout)
    if major < JAVA_MIN:
        raise KafkaUnavailable(f"java {major} found; Kafka 4 brokers need Java {JAVA_MIN}+")
    version, log4j = kafka_version(pom), pom_property(pom, "log4j.version", release=True)
    home = (cache or cache_root()) / f"kafka-{version}"
    lib = home / "lib"
    marker = home / "complete"
    if not marker.exists():
        print(f"[bench] kafka: resolving Kafka {version} with Maven into {lib}", flush=True)
        try:
            resolve_into(
                pom,
                lib,
                (cache or cache_root()) / "m2",
                timeout=1200,
                check=lambda names: check_jars(names, version, log4j),
            )
        except MavenMissing:
            raise KafkaUnavailable(
                f"mvn not found: Kafka {version}'s jars come from Maven Central through Maven "
                "(apt-get install maven)"
            ) from None
        marker.write_text(version + "\n")
    check_jars(sorted(p.name for p in lib.iterdir()), version, log4j)
    return Install(version, java, lib)


def cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def format_args(props: Path, cid: str) -> list[str]:
    """``StorageTool format`` of a single-node KRaft directory. The id is joined with ``=``:
    a random id may begin with ``-``, which a separate argument would read as an option."""
    return ["format", "--standalone", f"--cluster-id={cid}", f"--config={props}"]


def server_properties(port: int, controller_port: int, data: Path) -> str:
    """A combined broker+controller, R1, on loopback; Kafka's defaults otherwise, except that
    a topic keeps at most about 2 GiB (256 MiB segments, retention checked every 10 s): the
    benchmark never reads back more than that, and a full run of two Kafka rows would
    otherwise keep tens of GB on the machine's disk."""
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={data}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "log.segment.bytes=268435456",
            "log.retention.bytes=2147483648",
            "log.retention.check.interval.ms=10000",
            "",
        ]
    )


LOG4J2 = """status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_ERR
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


def java_command(
    install: Install,
    main: str,
    args: Sequence[str],
    *,
    heap: str,
    log4j: Path,
    fixed_heap: bool = False,
) -> list[str]:
    """``java`` with Kafka's JVM flags; ``fixed_heap`` sets -Xms too (the server's, as
    ``kafka-server-start.sh`` does)."""
    return [
        install.java,
        *([f"-Xms{heap}"] if fixed_heap else []),
        f"-Xmx{heap}",
        *JVM_FLAGS,
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        install.classpath,
        main,
        *args,
    ]


@dataclass
class Kafka:
    install: Install
    server: Server
    bootstrap: str
    log4j: Path

    def endpoint(self, durability: str) -> dict[str, Any]:
        return {
            "bootstrap": self.bootstrap,
            "durability": durability,
            "java": self.install.java,
            "lib": str(self.install.lib),
            "version": self.install.version,
            "log4j": str(self.log4j),
        }


def start_kafka(workdir: Path, install: Install | None = None) -> Kafka:
    install = install or ensure_kafka()
    port, controller = free_port(), free_port()
    data = workdir / "data"
    props = workdir / "server.properties"
    props.write_text(server_properties(port, controller, data))
    log4j = workdir / "log4j2.properties"
    log4j.write_text(LOG4J2)
    fmt = java_command(
        install,
        "kafka.tools.StorageTool",
        format_args(props, cluster_id()),
        heap=TOOL_HEAP,
        log4j=log4j,
    )
    r = subprocess.run(fmt, capture_output=True, text=True, timeout=120, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"kafka storage format failed:\n{(r.stdout + r.stderr)[-3000:]}")
    argv = java_command(
        install, "kafka.Kafka", [str(props)], heap=SERVER_HEAP, log4j=log4j, fixed_heap=True
    )
    log_path = workdir / "kafka.log"

    def ready() -> bool:
        return READY_LINE in log_path.read_text(errors="replace") and tcp_open(port)

    server = start_server("kafka", argv, workdir, port, ready, timeout=120)
    return Kafka(install, server, f"127.0.0.1:{port}", log4j)


class SharedKafka:
    """One Kafka server for both durability settings (each gets its own topics)."""

    def __init__(self) -> None:
        self.kafka: Kafka | None = None

    def starter(self, durability: str) -> Callable[[Path], tuple[Server, dict[str, Any], str]]:
        def start(workdir: Path) -> tuple[Server, dict[str, Any], str]:
            if self.kafka is None or not self.kafka.server.alive():
                self.kafka = start_kafka(workdir)
            k = self.kafka
            return k.server, k.endpoint(durability), f"Apache Kafka {k.install.version} (KRaft)"

        return start


# --- Kafka's tools ----------------------------------------------------------------------------


@dataclass
class ToolRun:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    cpu: float
    wall: float


def tool_command(endpoint: dict[str, Any], main: str, args: Sequence[str]) -> list[str]:
    """A Kafka tool's JVM, pinned to the client core when the machine has two."""
    install = Install(str(endpoint["version"]), str(endpoint["java"]), Path(endpoint["lib"]))
    cmd = java_command(install, main, args, heap=TOOL_HEAP, log4j=Path(endpoint["log4j"]))
    taskset = shutil.which("taskset")
    return [taskset, "-c", str(CLIENT_CORE), *cmd] if can_pin() and taskset else cmd


def run_tool(argv: list[str], timeout: float) -> ToolRun:
    """Run a tool to completion; its CPU (user + system, all threads) comes from wait4."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = _communicate(proc, timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"{argv[-1]!r}... timed out after {timeout:.0f} s") from None
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return ToolRun(argv, proc.returncode, stdout, stderr, cpu, time.monotonic() - t0)


def _communicate(proc: subprocess.Popen[bytes], timeout: float) -> tuple[str, str]:
    """Read both pipes to EOF without reaping the child (so that wait4 gets its rusage)."""
    import threading

    chunks: dict[str, bytes] = {}

    def drain(name: str, stream: Any) -> None:
        chunks[name] = stream.read()

    readers = [
        threading.Thread(target=drain, args=("out", proc.stdout), daemon=True),
        threading.Thread(target=drain, args=("err", proc.stderr), daemon=True),
    ]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout
    for t in readers:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            raise subprocess.TimeoutExpired(proc.args, timeout)
    return (
        chunks.get("out", b"").decode(errors="replace"),
        chunks.get("err", b"").decode(errors="replace"),
    )


def checked(run: ToolRun, what: str) -> ToolRun:
    if run.returncode != 0:
        raise RuntimeError(
            f"{what} exited with {run.returncode}:\n{(run.stdout + run.stderr)[-3000:]}"
        )
    return run


def topic_create_args(
    bootstrap: str, topic: str, partitions: int, configs: Sequence[str]
) -> list[str]:
    args = [
        "--bootstrap-server",
        bootstrap,
        "--create",
        "--topic",
        topic,
        "--partitions",
        str(partitions),
        "--replication-factor",
        "1",
    ]
    for c in configs:
        args += ["--config", c]
    return args


def topic_alter_args(bootstrap: str, topic: str, partitions: int) -> list[str]:
    return [
        "--bootstrap-server",
        bootstrap,
        "--alter",
        "--topic",
        topic,
        "--partitions",
        str(partitions),
    ]


def producer_perf_args(
    bootstrap: str,
    topic: str,
    records: int,
    warmup: int,
    payload: int,
    rate: float | None,
    *,
    report_ms: int = 5000,
) -> list[str]:
    return [
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--warmup-records",
        str(warmup),
        "--record-size",
        str(payload),
        "--throughput",
        "-1" if rate is None else str(max(1, round(rate))),
        "--key-distribution",
        "range",
        "--record-key-range",
        str(KEY_RANGE),
        "--reporting-interval",
        str(report_ms),
        "--command-property",
        *PRODUCER_PROPS,
    ]


@dataclass(frozen=True)
class ProducerLine:
    records: int
    rate: float
    mb_per_sec: float
    avg_ms: float
    max_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    steady: bool


_PRODUCER_RE = re.compile(
    r"^(?P<n>\d+) (?P<steady>steady state )?records sent, (?P<rate>[\d.]+) records/sec "
    r"\((?P<mb>[\d.]+) MB/sec\), (?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, "
    r"(?P<p50>\d+) ms 50th, (?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99\.9th\.$"
)


def parse_producer_perf(stdout: str) -> ProducerLine:
    """The steady-state summary of ``ProducerPerformance`` (the overall one without warm-up)."""
    lines: list[ProducerLine] = []
    for raw in stdout.splitlines():
        m = _PRODUCER_RE.match(raw.strip())
        if m:
            lines.append(
                ProducerLine(
                    int(m["n"]),
                    float(m["rate"]),
                    float(m["mb"]),
                    float(m["avg"]),
                    float(m["max"]),
                    float(m["p50"]),
                    float(m["p95"]),
                    float(m["p99"]),
                    float(m["p999"]),
                    bool(m["steady"]),
                )
            )
    steady = [x for x in lines if x.steady]
    if steady:
        return steady[-1]
    if lines:
        return lines[-1]
    raise ValueError(f"no ProducerPerformance summary in its output:\n{stdout[-1500:]}")


_WINDOW_RE = re.compile(
    r"^(?P<n>\d+) records sent, (?P<rate>[\d.]+) records/sec \([\d.]+ MB/sec\), "
    r"[\d.]+ ms avg latency, [\d.]+ ms max latency\.$"
)


def window_rates(stdout: str) -> list[float]:
    """The per-interval rates ``ProducerPerformance`` prints while it runs."""
    return [
        float(m["rate"]) for line in stdout.splitlines() if (m := _WINDOW_RE.match(line.strip()))
    ]


def calibrate(argv: list[str], windows: int, timeout: float) -> float:
    """Run an unthrottled ``ProducerPerformance`` (1 s reporting interval) until it has printed
    `windows` intervals, stop it, and return the median of the last three: the rate once the
    JVMs (tool and server) have warmed up, to size the record count of the timed steps."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline and len(window_rates("\n".join(seen))) < windows:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                break
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    rates = window_rates("".join(seen))
    if not rates:
        raise RuntimeError(f"ProducerPerformance printed no rate in {timeout:.0f} s: {seen[-5:]}")
    return statistics.median(rates[-3:])


def consumer_perf_args(
    bootstrap: str, topic: str, records: int, idle_timeout_ms: int = 10_000
) -> list[str]:
    """``ConsumerPerformance`` reading ``records``; it gives up when no record arrives for
    ``idle_timeout_ms``, which includes the first group join (the offsets topic is created
    then: seconds on a loaded machine)."""
    return [
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--timeout",
        str(idle_timeout_ms),
    ]


@dataclass(frozen=True)
class ConsumerLine:
    records: int
    fetch_seconds: float
    fetch_rate: float
    mb: float


def parse_consumer_perf(stdout: str) -> ConsumerLine:
    """The CSV line of ``ConsumerPerformance``: records and the fetch phase (after the group
    join), whose rate is the consume figure."""
    header: list[str] | None = None
    for raw in stdout.splitlines():
        cells = [c.strip() for c in raw.split(",")]
        if cells and cells[0] == "start.time":
            header = cells
        elif header and len(cells) == len(header):
            row = dict(zip(header, cells, strict=True))
            return ConsumerLine(
                int(row["data.consumed.in.nMsg"]),
                float(row["fetch.time.ms"]) / 1000,
                float(row["fetch.nMsg.sec"]),
                float(row["data.consumed.in.MB"]),
            )
    raise ValueError(f"no ConsumerPerformance result in its output:\n{stdout[-1500:]}")


def e2e_args(bootstrap: str, topic: str, records: int, payload: int) -> list[str]:
    return [
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--producer-acks",
        "all",
        "--record-size",
        str(payload),
    ]


@dataclass(frozen=True)
class E2ELine:
    avg_ms: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    records: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def parse_e2e(stdout: str, records: int = 0) -> E2ELine:
    avg = re.search(r"Avg latency: ([\d.]+) ms", stdout)
    pct = re.search(r"Percentiles: 50th = (\d+), 99th = (\d+), 99\.9th = (\d+)", stdout)
    if not avg or not pct:
        raise ValueError(f"no EndToEndLatency result in its output:\n{stdout[-1500:]}")
    return E2ELine(float(avg[1]), float(pct[1]), float(pct[2]), float(pct[3]), records)
