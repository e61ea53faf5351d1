"""Chaos run (Jepsen-style, ``tests/chaos``): correctness under faults, producer-blocked windows
of split/merge/rebucket, and consumer registration → own segment.

The scenario is the one of ``tests/integration/test_chaos.py`` (``tests.chaos.scenario``): the
embedded control plane with three broker pods and two operator replicas, 64 keys written
open-loop at 400 msg/s by a producer in its own process, two stream consumers and a queue
consumer; split, merge, rebucket rollover, SIGKILL of a broker, SIGKILL of the operator leader,
restart of a stream consumer; final drain; checker. Full mode runs it three times and pools the
per-key windows (p50/p99/max over all keys of all runs); quick mode runs it once without the
rebucket and the leader kill.

    python -m bench.run --only chaos [--quick]
    python -m bench.chaos [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.report import Report, Section
from tests.chaos.checker import KeyWindow, summarize
from tests.chaos.scenario import FAULTS, ChaosConfig, ChaosResult, run_chaos

BLOCKED_P99_TARGET_MS = 50.0
REGISTRATION_TARGET_S = 5.0
WINDOW_STEPS = ("split", "merge", "rebucket")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def config(quick: bool) -> ChaosConfig:
    if quick:
        faults = tuple(f for f in FAULTS if f not in ("rebucket", "kill-operator-leader"))
        return ChaosConfig(faults=faults, warmup_reads=200, settle_reads=400)
    return ChaosConfig()


async def run_many(runs: int, quick: bool) -> list[ChaosResult]:
    results = []
    for _ in range(runs):
        directory = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
        try:
            results.append(await run_chaos(directory, config(quick)))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return results


def fill(section: Section, results: list[ChaosResult]) -> None:
    runs = len(results)
    counts = [
        "sent",
        "acked",
        "lost",
        "reordered",
        "skips",
        "unexpected",
        "dup after restart",
        "dup unexplained",
        "recovered",
        "valid",
    ]
    rows: list[list[str | int | float | None]] = []
    for i, r in enumerate(results, 1):
        rep = r.report
        rows.append(
            [
                f"run {i}",
                r.sent,
                r.acked,
                rep.lost,
                rep.reordered,
                rep.skips,
                rep.unexpected,
                rep.duplicates_after_restart,
                rep.duplicates_unexplained,
                rep.recovered,
                "yes" if rep.valid and r.drained else "NO",
            ]
        )
    section.table("Checker (after the final drain)", ["run", *counts], rows)

    pooled: dict[str, list[KeyWindow]] = {}
    for r in results:
        for name, windows in r.windows.items():
            pooled.setdefault(name, []).extend(windows)
    window_rows: list[list[str | int | float | None]] = []
    for name in WINDOW_STEPS:
        windows = pooled.get(name, [])
        if not windows:
            continue
        blocked = summarize(w.blocked for w in windows)
        gap = summarize(w.gap for w in windows)
        window_rows.append(
            [
                name,
                blocked.count,
                blocked.p50 * 1e3,
                blocked.p99 * 1e3,
                blocked.max * 1e3,
                gap.p50 * 1e3,
                gap.p99 * 1e3,
            ]
        )
        for stat in ("p50", "p99", "max"):
            section.figure(f"{name}_blocked_{stat}", getattr(blocked, stat) * 1e3, "ms")
    section.table(
        "Segment hand-off: last parent ack -> first child ack, any key (ms)",
        ["run", *WINDOW_STEPS],
        [
            [i, *(_ms(r.segment_gaps.get(n)) for n in WINDOW_STEPS)]
            for i, r in enumerate(results, 1)
        ],
    )
    section.table(
        "Producer-blocked window per key (ms)",
        ["operation", "keys", "p50", "p99", "max", "ack gap p50", "ack gap p99"],
        window_rows,
    )
    section.note(
        "Baseline ack latency away from faults (intended time → ack), per run: "
        + "; ".join(f"run {i}: {r.quiet_latency.ms()}" for i, r in enumerate(results, 1))
    )

    registrations = [reg for r in results for reg in r.registrations]
    section.table(
        "Stream consumer registration → own segment (s)",
        ["run", "consumer", "assigned", "first message", "segments"],
        [
            [i, f"{reg.consumer}#{reg.session}", reg.assigned, reg.first_message, str(reg.segments)]
            for i, r in enumerate(results, 1)
            for reg in r.registrations
        ],
    )
    section.table(
        "Faults (last run); ack latency of the sends invoked while each ran (ms)",
        ["step", "seconds", "p50", "p99", "max", "detail"],
        [
            [
                s.name,
                s.seconds,
                _ms(results[-1].stalls[s.name].p50),
                _ms(results[-1].stalls[s.name].p99),
                _ms(results[-1].stalls[s.name].max),
                s.detail,
            ]
            for s in results[-1].steps
        ],
    )

    lost = sum(r.report.lost for r in results)
    reordered = sum(r.report.reordered for r in results)
    unexpected = sum(r.report.unexpected for r in results)
    unexplained = sum(r.report.duplicates_unexplained for r in results)
    valid = all(r.report.valid and r.drained for r in results)
    section.figure("lost", lost, "messages")
    section.figure("reordered", reordered, "messages")
    section.figure("duplicates_unexplained", unexplained, "deliveries")
    section.figure(
        "duplicates_after_restart",
        sum(r.report.duplicates_after_restart for r in results),
        "deliveries",
    )
    section.target(
        "no loss, reordering, skip or unexpected value; duplicates only after restarts",
        valid,
        f"{runs} run(s): lost {lost}, reordered {reordered}, unexpected {unexpected}, "
        f"unexplained duplicates {unexplained}",
        "all 0",
    )
    split = summarize(w.blocked for w in pooled.get("split", []))
    section.target(
        "split producer-blocked window p99",
        bool(split.count) and split.p99 * 1e3 <= BLOCKED_P99_TARGET_MS,
        split.ms(),
        f"p99 <= {BLOCKED_P99_TARGET_MS:g} ms",
    )
    assigned = [reg.assigned for reg in registrations]
    slowest = max((a for a in assigned if a is not None), default=float("inf"))
    section.target(
        "stream consumer registration -> own segment",
        None not in assigned and slowest <= REGISTRATION_TARGET_S,
        f"max {slowest:.2f} s over {len(assigned)} registrations",
        f"<= {REGISTRATION_TARGET_S:g} s",
    )
    section.note(
        "blocked = first child ack - max(last parent ack, first child send's intended time): "
        "the time the producer held a key back. The ack gap includes the key's own send "
        "interval (64 keys at 400 msg/s: one message per key every 160 ms)."
    )
    section.note(
        "Writer in its own process; API server, kubelet and consumers share the test process; "
        "brokers and operators are separate processes on the same 2 cores. Windows include "
        "scheduling noise from everything else running on the machine."
    )
    for r in results:
        section.notes.extend(r.notes)
    section.data["runs"] = [{"lines": r.lines(), "report": r.report.to_json()} for r in results]


async def run(report: Report, quick: bool) -> None:
    section = report.section("chaos", "Chaos: correctness under faults, split/merge windows")
    runs = 1 if quick else 3
    if quick:
        section.note("Quick mode: one short run without rebucket and leader kill.")
    fill(section, await run_many(runs, quick))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    results = asyncio.run(run_many(args.runs, args.quick))
    for i, r in enumerate(results, 1):
        print(f"--- run {i}")
        print("\n".join(r.lines()))
    return 0 if all(r.report.valid and r.drained for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
