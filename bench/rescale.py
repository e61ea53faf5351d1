"""A keyed workload whose rate quadruples mid-run: our split against Kafka's partition count.

One producer sends ``key-i`` with the values 0, 1, 2, … of each key, open loop at ``rate1``
for ``seconds1``, then at ``4 * rate1``; one ordered consumer reads concurrently and drains at
the end. At the change:

- **ours**: every active segment is split (2 → 4 segments) through the brokers' admin API in the
  protocol's order (two real broker processes, ``--fsync always``, the real operator session
  server, the SDK's ``ScalableTopicProducer`` and ``StreamConsumer``: the harness of
  ``bench/split.py``);
- **Kafka, fixed**: the topic keeps its 2 partitions;
- **Kafka, altered**: ``TopicCommand --alter --partitions 4``, as an operator would to add
  capacity. Keys hash to partitions modulo the count, so most keys move to another partition
  while their older records still wait in the old one.

Kafka's side is a small producer/consumer of ours (``bench/kafka/KeyedOrder.java``, run by the
JDK's source launcher on Kafka's jars: acks=all, linger 1 ms, 128 KB batches, idempotent; the
topic has ``flush.messages=1``, ack after fsync like ours; both clients refresh metadata every
second so they see new partitions at once; the consumer reads new partitions from the earliest
offset). Every acknowledgement and delivery is recorded and the same checker
(``tests/chaos/checker.py``) classifies both histories; on top, the keys whose order broke are
counted (a key is broken when it delivered a value below one it had already delivered).

    python -m bench.run --only rescale [--quick]
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import _kafka
from bench.report import Cell, Report, Section
from tests.chaos.checker import Delivery, History, Outcome, Send, check

PARTITIONS = 2
SUBSCRIPTION = "s"
JAVA_SOURCE = Path(__file__).resolve().parent / "kafka" / "KeyedOrder.java"


@dataclass(frozen=True)
class Mode:
    rate1: float
    seconds1: float
    seconds2: float
    keys: int = 64
    payload: int = 100
    drain: float = 30.0

    @property
    def rate2(self) -> float:
        return 4 * self.rate1


QUICK = Mode(rate1=400.0, seconds1=3.0, seconds2=4.0, drain=15.0)
FULL = Mode(rate1=1000.0, seconds1=8.0, seconds2=12.0)


@dataclass
class Run:
    """One system's history, with times in seconds from the producer's start."""

    key: str
    label: str
    history: History
    change: float
    """When the rate quadrupled."""
    rescaled: tuple[float, float] | None = None
    """When the split / the partition change started and finished (None: no change)."""
    notes: list[str] = field(default_factory=list)


def broken_keys(deliveries: Iterable[tuple[str, int]]) -> set[str]:
    """Keys that delivered a value below one they had already delivered, in delivery order. A
    value delivered again (a redelivery) does not count: it is a duplicate, not a reordering."""
    top: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    broken: set[str] = set()
    for key, value in deliveries:
        if (key, value) in seen:
            continue
        seen.add((key, value))
        last = top.get(key)
        if last is not None and value < last:
            broken.add(key)
        top[key] = value if last is None else max(last, value)
    return broken


def per_second(times: Iterable[float], seconds: int) -> list[int]:
    """How many of `times` fall into each whole second 0 … seconds-1."""
    counts = Counter(int(t) for t in times if t >= 0)
    return [counts.get(s, 0) for s in range(seconds)]


def kafka_history(lines: Iterable[str]) -> History:
    """The history of a ``KeyedOrder.java`` record file (``A``/``F``/``C`` lines, times in ms)."""
    history = History(ordered={SUBSCRIPTION: True})
    for number, line in enumerate(lines, 1):
        f = line.split()
        if not f:
            continue
        try:
            if f[0] == "A":
                t = int(f[5]) / 1000
                history.sends.append(Send(f[1], int(f[2]), t, Outcome.OK, t, int(f[3]), int(f[4])))
            elif f[0] == "F":
                t = int(f[3]) / 1000
                history.sends.append(Send(f[1], int(f[2]), t, Outcome.FAIL, t))
            elif f[0] == "C":
                history.deliveries.append(
                    Delivery(
                        SUBSCRIPTION,
                        "c1",
                        0,
                        f[1],
                        int(f[2]),
                        int(f[5]) / 1000,
                        int(f[3]),
                        int(f[4]),
                    )
                )
            else:
                raise ValueError(f"unknown record kind {f[0]!r}")
        except (IndexError, ValueError) as e:
            raise ValueError(f"record file line {number}: {line!r}: {e}") from None
    return history


def keyed_order_command(
    install: _kafka.Install, log4j: Path, bootstrap: str, topic: str, mode: Mode, out: Path
) -> list[str]:
    return [
        install.java,
        f"-Xmx{_kafka.TOOL_HEAP}",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        install.classpath,
        str(JAVA_SOURCE),
        bootstrap,
        topic,
        str(mode.keys),
        str(mode.rate1),
        str(mode.seconds1),
        str(mode.rate2),
        str(mode.seconds2),
        str(mode.payload),
        str(out),
        str(mode.drain),
    ]


def _kafka_run(kafka: _kafka.Kafka, mode: Mode, workdir: Path, alter: bool) -> Run:
    name = "altered" if alter else "fixed"
    topic = f"keyed-{name}"
    endpoint = kafka.endpoint("sync")
    tools = "org.apache.kafka.tools.TopicCommand"
    create = _kafka.topic_create_args(
        kafka.bootstrap, topic, PARTITIONS, _kafka.TOPIC_CONFIG["sync"]
    )
    _kafka.checked(_kafka.run_tool(_kafka.tool_command(endpoint, tools, create), 120), "create")
    out = workdir / f"{topic}.txt"
    argv = keyed_order_command(kafka.install, kafka.log4j, kafka.bootstrap, topic, mode, out)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    started = 0.0
    change = mode.seconds1
    rescaled: tuple[float, float] | None = None
    alter_thread: threading.Thread | None = None
    alter_error: list[str] = []

    def add_partitions(at: float) -> None:
        nonlocal rescaled
        args = _kafka.topic_alter_args(kafka.bootstrap, topic, 2 * PARTITIONS)
        run = _kafka.run_tool(_kafka.tool_command(endpoint, tools, args), 120)
        if run.returncode != 0:
            alter_error.append(run.stderr[-2000:])
        rescaled = (at, time.monotonic() - started)

    done: list[str] = []
    for line in proc.stdout:
        if line.startswith("START"):
            started = time.monotonic()
        elif line.startswith("CHANGE"):
            change = int(line.split()[1]) / 1000
            if alter:
                at = time.monotonic() - started
                alter_thread = threading.Thread(target=add_partitions, args=(at,))
                alter_thread.start()
        elif line.startswith("DONE"):
            done = line.split()[1:]
    stderr = proc.stderr.read() if proc.stderr else ""
    proc.wait()
    if alter_thread is not None:
        alter_thread.join()
    if proc.returncode != 0 or not done:
        raise RuntimeError(f"KeyedOrder.java exited with {proc.returncode}:\n{stderr[-3000:]}")
    if alter_error:
        raise RuntimeError(f"TopicCommand --alter failed:\n{alter_error[0]}")
    with out.open(encoding="ascii") as f:
        history = kafka_history(f)
    label = (
        f"Kafka, {PARTITIONS} -> {2 * PARTITIONS} partitions (TopicCommand --alter)"
        if alter
        else f"Kafka, fixed {PARTITIONS} partitions"
    )
    return Run(f"kafka-{name}", label, history, change, rescaled)


async def _ours_run(mode: Mode, base: Path) -> Run:
    from scalable_topics.client import ScalableTopicProducer, StreamConsumer
    from tests.integration.client_harness import TopicEnv, broker_processes, start_operator

    history = History(ordered={SUBSCRIPTION: True})
    with broker_processes(base, 2) as brokers:
        operator = await start_operator()
        env = TopicEnv(
            operator,
            [b.url for b in brokers],
            "bench",
            "rescale",
            subscriptions={SUBSCRIPTION: "Stream"},
        )
        try:
            await env.create(PARTITIONS)
            async with (
                ScalableTopicProducer(env.service_url, "bench", "rescale", linger_ms=1) as producer,
                StreamConsumer(env.service_url, "bench", "rescale", SUBSCRIPTION, "c1") as reader,
            ):
                t0 = time.monotonic()
                producing = asyncio.Event()
                producing.set()
                acked: set[tuple[str, int]] = set()
                got: set[tuple[str, int]] = set()

                def record(
                    key: str, value: int, invoked: float, future: asyncio.Future[Any]
                ) -> None:
                    now = time.monotonic() - t0
                    if future.cancelled() or future.exception() is not None:
                        history.sends.append(Send(key, value, invoked, Outcome.INFO, now))
                        return
                    mid = future.result()
                    history.sends.append(
                        Send(key, value, invoked, Outcome.OK, now, mid.segment_id, None)
                    )
                    acked.add((key, value))

                async def send() -> None:
                    sent = 0
                    nxt = [0] * mode.keys
                    end = mode.seconds1 + mode.seconds2
                    while (t := time.monotonic() - t0) < end:
                        due = int(
                            mode.rate1 * min(t, mode.seconds1)
                            + mode.rate2 * max(0.0, t - mode.seconds1)
                        )
                        while sent < due:
                            k = sent % mode.keys
                            key, value = f"key-{k}", nxt[k]
                            nxt[k] += 1
                            payload = str(value).encode().ljust(mode.payload)
                            future = await producer.send_async(payload, key=key)
                            future.add_done_callback(
                                functools.partial(record, key, value, time.monotonic() - t0)
                            )
                            sent += 1
                        await asyncio.sleep(0.001)
                    await producer.flush()
                    producing.clear()

                async def consume() -> None:
                    drain_until: float | None = None
                    while True:
                        if not producing.is_set():
                            drain_until = drain_until or time.monotonic() + mode.drain
                            if acked <= got or time.monotonic() > drain_until:
                                return
                        try:
                            async with asyncio.timeout(0.2):
                                msg = await reader.receive()
                        except TimeoutError:
                            continue
                        assert msg.key is not None
                        value = int(msg.value.decode().strip())
                        got.add((msg.key, value))
                        history.deliveries.append(
                            Delivery(
                                SUBSCRIPTION,
                                "c1",
                                0,
                                msg.key,
                                value,
                                time.monotonic() - t0,
                                msg.segment_id,
                                None,
                            )
                        )
                        await reader.ack(msg)

                sender = asyncio.create_task(send())
                receiver = asyncio.create_task(consume())
                await asyncio.sleep(max(0.0, mode.seconds1 - (time.monotonic() - t0)))
                began = time.monotonic() - t0
                for segment in list(env.layout.active()):
                    await env.split(segment.segment_id)
                rescaled = (began, time.monotonic() - t0)
                await sender
                await receiver
        finally:
            await env.close()
            await operator.stop()
    label = f"segment broker, {PARTITIONS} -> {2 * PARTITIONS} segments (split)"
    return Run("ours", label, history, mode.seconds1, rescaled)


def _rate(times: Sequence[float], start: float, end: float) -> float:
    n = sum(1 for t in times if start <= t < end)
    return n / (end - start) if end > start else 0.0


def _describe(section: Section, runs: list[Run], mode: Mode) -> None:
    rows: list[list[Cell]] = []
    end = mode.seconds1 + mode.seconds2
    for run in runs:
        report = check(run.history)
        sub = report.subscriptions[SUBSCRIPTION]
        order = [(d.key, d.value) for d in sorted(run.history.deliveries, key=lambda d: d.time)]
        broken = broken_keys(order)
        acks = [s.completed or s.invoked for s in run.history.sends if s.outcome is Outcome.OK]
        reads = [d.time for d in run.history.deliveries]
        rows.append(
            [
                run.label,
                round(_rate(acks, 1.0, run.change)),
                round(_rate(acks, run.change + 1.0, end)),
                round(_rate(reads, run.change + 1.0, end)),
                f"{run.rescaled[0]:.1f} -> {run.rescaled[1]:.1f} s" if run.rescaled else "-",
                f"{len(broken)} / {mode.keys}",
                sub.reordered,
                sub.lost,
                sub.duplicates_after_restart + sub.duplicates_unexplained,
                report.sends.get("fail", 0) + report.sends.get("info", 0),
            ]
        )
        key = run.key
        section.figure("keys_order_broken", len(broken), "keys", system=key)
        section.figure("reordered", sub.reordered, "messages", system=key)
        section.figure("lost", sub.lost, "messages", system=key)
        section.figure(
            "acked_after_change", _rate(acks, run.change + 1.0, end), "msg/s", system=key
        )
        if key == "ours":
            section.target(
                "per-key order kept across the split (chaos checker)",
                not broken and sub.reordered == 0 and sub.lost == 0,
                f"{len(broken)} keys broken, {sub.reordered} reordered, {sub.lost} lost",
                "0 / 0 / 0",
            )
        section.data.setdefault("runs", []).append(
            {
                "label": run.label,
                "keysBroken": sorted(broken),
                "check": report.to_json(),
                "change": run.change,
                "rescaled": run.rescaled,
                "ackedPerSecond": per_second(acks, int(end) + 1),
                "consumedPerSecond": per_second(reads, int(end + mode.drain) + 1),
            }
        )
    section.table(
        f"Keyed load {mode.rate1:,.0f} -> {mode.rate2:,.0f} msg/s at {mode.seconds1:.0f} s "
        f"({mode.keys} keys, {mode.payload} B, ack after fsync)",
        [
            "system",
            "acked msg/s before",
            "acked msg/s after (+1 s)",
            "consumed msg/s after",
            "rescale (start -> done)",
            "keys whose order broke",
            "reordered deliveries",
            "lost",
            "duplicates",
            "failed sends",
        ],
        rows,
    )
    seconds = int(end) + 3
    series = [
        (
            per_second(
                [s.completed or s.invoked for s in r.history.sends if s.outcome is Outcome.OK],
                seconds,
            ),
            per_second([d.time for d in r.history.deliveries], seconds),
        )
        for r in runs
    ]
    columns = ["second"]
    for r in runs:
        short = r.label.split(" (")[0]
        columns += [f"{short}: acked", "consumed"]
    table: list[list[Cell]] = []
    for s in range(seconds):
        row: list[Cell] = [s]
        for acked, consumed in series:
            row += [acked[s], consumed[s]]
        table.append(row)
    section.table("Throughput over time (msg/s per second of the run)", columns, table)


def run(report: Report, quick: bool) -> None:
    mode = QUICK if quick else FULL
    section = report.section(
        "rescale", "Keyed load that quadruples: our split vs Kafka's partition count"
    )
    runs: list[Run] = []
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="bench-rescale-") as tmp:
        base = Path(tmp)
        runs.append(asyncio.run(_ours_run(mode, base / "ours")))
        try:
            kafka = _kafka.start_kafka(_mkdir(base / "kafka"))
        except _kafka.KafkaUnavailable as e:
            section.note(f"Kafka not run: {e}")
            kafka = None
        if kafka is not None:
            try:
                runs.append(_kafka_run(kafka, mode, base, alter=False))
                runs.append(_kafka_run(kafka, mode, base, alter=True))
            finally:
                kafka.server.stop()
    load.append(os.getloadavg())
    _describe(section, runs, mode)
    section.data["loadAverage"] = [list(x) for x in load]
    section.note(
        "Load average "
        + " -> ".join("/".join(f"{x:.2f}" for x in v) for v in load)
        + " (start -> end; other work shares these 2 cores)."
    )
    section.note(
        "Order is checked per key in delivery order by the chaos checker "
        "(`reordered`: deliveries of a value after a larger one of the same key; `lost`: "
        "acknowledged, never delivered after the drain); 'keys whose order broke' counts the "
        "keys with at least one such delivery. Kafka's clients refresh metadata every second "
        "(`metadata.max.age.ms=1000`; the default, 5 min, would keep them on the old partitions "
        "that long) and its consumer commits after every poll."
    )


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
