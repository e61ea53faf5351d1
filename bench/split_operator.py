"""The producer-blocked window of a split with the real operator (issue 17).

``bench split`` drives the brokers' admin API from the producer's own process. Here the split
runs as users run it: the local control plane (``operator_stack``: the real API server, our
kubelet, ``manifests/overlays/local``) with two broker pods, one operator process, a topic of
two segments (auto-scaling off), and splits asked for with the request annotation (what
``kubectl stopic split`` writes). A :class:`~scalable_topics.client.ScalableTopicProducer` in
this process sends keyed messages at a constant rate throughout.

For each key of a split segment the **window** is the time between its last acknowledgement
on the parent and its first on a child (it includes the key's own send interval, as in
``bench split``). The operator's log gives, for each split, how long after the parents' seal
the children were open (``children open … ms after the parents' seal``): the controller's
share of the window.

    python -m bench.run --only split_operator [--quick]
"""

from __future__ import annotations

import asyncio
import functools
import re
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import _hiccup
from bench._stats import percentile
from bench.report import Report
from bench.split import FULL, Mode, key_windows

TOPIC = "window"
OPENED = re.compile(
    r"split \S+: children open ([0-9.]+) ms after the parents' seal \((\d+) of (\d+) opened"
)
QUICK = Mode(rate=2000.0, keys=16, splits=3, settle=0.5)
"""Fewer splits than ``bench split``'s quick mode: the control plane's start takes most of it."""


def _width(hash_range: dict[str, Any]) -> int:
    return int(hash_range["end"]) - int(hash_range["start"])


async def _measure(mode: Mode, base: Path) -> dict[str, Any]:
    from scalable_topics.client import ScalableTopicProducer
    from scalable_topics.core.hashing import segment_hash
    from tests.integration.operator_harness import operator_stack, topic_body

    async with operator_stack(base, operator_replicas=0, brokers=2) as stack:
        operator = await stack.start_operator("bench")
        await stack.apply_topic(topic_body(TOPIC, segments=2, autoScale={"enabled": False}))
        await stack.wait_ready(TOPIC)
        keys = [f"key-{i}" for i in range(mode.keys)]
        acks: dict[str, list[tuple[float, int]]] = defaultdict(list)
        errors: list[BaseException] = []
        stop = asyncio.Event()
        splits: list[tuple[int, int, int]] = []
        """(parent, first hash, last hash) of each split, in order."""

        def record(key: str, future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                return
            if future.exception() is not None:
                errors.append(future.exception())  # type: ignore[arg-type]
                return
            acks[key].append((time.monotonic(), future.result().segment_id))

        async with ScalableTopicProducer(operator.url, "default", TOPIC, linger_ms=1) as producer:

            async def send() -> None:
                started, sent = time.monotonic(), 0
                while not stop.is_set():
                    while sent < int((time.monotonic() - started) * mode.rate):
                        key = keys[sent % len(keys)]
                        future = await producer.send_async(b"x" * 100, key=key)
                        future.add_done_callback(functools.partial(record, key))
                        sent += 1
                    await asyncio.sleep(0.001)

            sender = asyncio.create_task(send())
            await asyncio.sleep(2 * mode.settle)
            for i in range(mode.splits):
                segments = await stack.segments(TOPIC)
                active = [
                    body
                    for body in segments.values()
                    if (body.get("status") or {}).get("state") == "Active"
                ]
                widest = max(active, key=lambda b: _width(b["spec"]["range"]))
                parent = int(widest["spec"]["segmentId"])
                hash_range = widest["spec"]["range"]
                request = f"split-{i}"
                await stack.request(TOPIC, {"id": request, "op": "split", "segments": [parent]})
                await stack.wait_request(TOPIC, request, within=60)
                splits.append((parent, int(hash_range["start"]), int(hash_range["end"])))
                await asyncio.sleep(mode.settle)
            stop.set()
            await sender
            await producer.flush()
            early = producer.early_connects
        parents_of = {
            segment_id: [int(p) for p in body["spec"].get("parents") or []]
            for segment_id, body in (await stack.segments(TOPIC)).items()
        }
        await stack.stop_operators()
        lines = list(OPENED.finditer(operator.log()))
        opened = [float(m.group(1)) for m in lines]
        by_seal = [(int(m.group(2)), int(m.group(3))) for m in lines]

    per_split = [
        key_windows(
            acks,
            [k for k in keys if start <= segment_hash(k) <= end],
            parent,
            [s for s, parents in parents_of.items() if parent in parents],
        )
        for parent, start, end in splits
    ]
    windows = [w for mine in per_split for w in mine]
    return {
        "splits": splits,
        "windows": windows,
        "per_split": per_split,
        "opened": opened,
        "by_seal": by_seal,
        "errors": len(errors),
        "early_connects": early,
        "interval_ms": 1000.0 * mode.keys / mode.rate,
    }


async def run(report: Report, quick: bool) -> None:
    mode = QUICK if quick else FULL
    section = report.section("split_operator", "Split window with the real operator")
    stalls = {"start": await asyncio.to_thread(_hiccup.probe)}
    with tempfile.TemporaryDirectory(prefix="bench-split-operator-") as tmp:
        result = await _measure(mode, Path(tmp))
    windows, opened = result["windows"], result["opened"]
    if not windows:
        raise RuntimeError("no key was observed on both a parent and a child")
    section.figure("window_p50", percentile(windows, 0.5), "ms")
    section.figure("window_p99", percentile(windows, 0.99), "ms")
    section.figure("window_max", max(windows), "ms")
    if opened:
        section.figure("children_open_p50", statistics.median(opened), "ms")
        section.figure("children_open_max", max(opened), "ms")
    section.table(
        "Splits",
        ["parent", "keys", "window p50 ms", "window max ms", "children open after the seal ms"],
        [
            [
                parent,
                len(mine),
                round(statistics.median(mine), 1) if mine else None,
                round(max(mine), 1) if mine else None,
                opened[i] if i < len(opened) else None,
            ]
            for i, ((parent, _, _), mine) in enumerate(
                zip(result["splits"], result["per_split"], strict=True)
            )
        ],
    )
    section.note(
        f"{mode.rate:.0f} msg/s of 100 B over {mode.keys} keys (one message per key every "
        f"{result['interval_ms']:.1f} ms), {mode.splits} splits asked for with the request "
        "annotation; the real operator and two broker pods on the local control plane, all on "
        f"this machine's cores; {len(windows)} samples; {result['errors']} send errors; the "
        f"producer connected to {result['early_connects']} children on SEALING (protocol v5); "
        f"{sum(n for n, _ in result['by_seal'])} of {sum(m for _, m in result['by_seal'])} "
        "children were opened by their parent's broker with the seal (a split's children "
        "placed beside their parent), the others by the operator after it."
    )
    section.note(
        "window = a key's first ack on a child minus its last ack on the parent; children "
        "open = the operator's own figure (its log), from the parents' seal (its terminate "
        "calls returned) to the children's activation (0 when the seal opened them all)."
    )
    _hiccup.note(section, stalls)
