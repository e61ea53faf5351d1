"""The demo's progress lines (what it waits for, from real status values) and its waits."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from scalable_topics.cli import demo_progress
from scalable_topics.cli.demo import PROGRESS_EVERY, Demo
from scalable_topics.core.policy import AutoScalePolicy
from scalable_topics.core.resources import ScalableTopicSpec, format_time

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


def orders_policy() -> AutoScalePolicy:
    """The knobs of the topic the demo runs (mergeWindow 1m, mergeCooldown 2m, ...)."""
    manifest = yaml.safe_load((REPO / "manifests/examples/orders.yaml").read_text())
    return ScalableTopicSpec.model_validate(manifest["spec"]).policy()


def seg(
    sid: int,
    start: int,
    *,
    state: str = "Active",
    rate_in: float = 0.0,
    rate_out: float = 0.0,
    changed: float = 0.0,
) -> dict[str, Any]:
    """A Segment as the API returns it; ``changed``: seconds before NOW its load last changed."""
    return {
        "spec": {"segmentId": sid, "range": {"start": start, "end": start + 0x3FFF}},
        "status": {
            "state": state,
            "load": {
                "msgRateIn": rate_in,
                "msgRateOut": rate_out,
                "bytesRateIn": 0,
                "bytesRateOut": 0,
                "updatedAt": format_time(NOW - changed),
            },
        },
    }


def topic(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "orders", "generation": 1},
        "spec": {"initialSegments": 2},
        "status": status,
    }


# -- merge (phase 3) -------------------------------------------------------------------------


def test_merge_line_names_the_coldest_neighbours_and_the_window() -> None:
    segments = [
        seg(1, 0x8000, state="Sealed"),  # a sealed parent is not a candidate
        seg(7, 0xC000, rate_in=100, changed=300),  # warm: above mergeMsgRateInThreshold 30
        seg(5, 0x0000, changed=40),
        seg(6, 0x4000, changed=55),
        seg(8, 0x8000, changed=90),
    ]
    line = demo_progress.merge_progress(segments, orders_policy(), topic(), NOW)
    # Pairs by hash range: #5-#6 (cold 40 s), #6-#8 (cold 55 s), #8-#7 (warm).
    assert line == "segments #6 #8 cold for 55 s of the 60 s mergeWindow"


def test_merge_line_after_the_window_names_the_cooldown_or_the_evaluation() -> None:
    segments = [seg(5, 0x0000, changed=75), seg(6, 0x4000, changed=80), seg(4, 0x8000)]
    policy = orders_policy()
    cooling = topic(lastMergeAt=format_time(NOW - 30))
    assert demo_progress.merge_progress(segments, policy, cooling, NOW) == (
        "segments #5 #6 cold for 75 s (mergeWindow 60 s passed); "
        "mergeCooldown: last merge 30 s ago, 120 s needed"
    )
    assert demo_progress.merge_progress(segments, policy, topic(), NOW) == (
        "segments #5 #6 cold for 75 s (mergeWindow 60 s passed); the operator evaluates every 10 s"
    )


def test_merge_line_without_a_cold_pair_or_above_min_segments() -> None:
    policy = orders_policy()
    warm_between = [
        seg(2, 0x0000, rate_out=60, changed=500),  # at mergeMsgRateOutThreshold: not below it
        seg(3, 0x4000, changed=500),
        seg(4, 0x8000, rate_in=31, changed=500),
    ]
    assert demo_progress.merge_progress(warm_between, policy, topic(), NOW) == (
        "no two neighbours are below the merge thresholds yet (still warm: #2 #4)"
    )
    two = [seg(2, 0x0000, changed=500), seg(3, 0x8000, changed=500)]
    assert demo_progress.merge_progress(two, policy, topic(), NOW) == (
        "2 active segments = minSegments: no merge is possible"
    )


# -- splits (phases 1 and 2) -----------------------------------------------------------------


def test_split_line_names_the_hottest_rate_against_its_threshold() -> None:
    segments = [
        seg(1, 0x0000, rate_in=290, rate_out=100),  # 290/300 = 0.97 of msgRateIn
        seg(2, 0x8000, rate_in=100, rate_out=700),  # 700/800 = 0.88 of msgRateOut
        seg(0, 0x4000, state="Sealed", rate_in=5000),
    ]
    policy = orders_policy()
    assert demo_progress.split_progress(segments, policy, topic(), NOW) == (
        "hottest segment #1 msgRateIn 290/s of the 300/s split threshold"
    )
    recent = topic(lastSplitAt=format_time(NOW - 10))
    assert demo_progress.split_progress(segments, policy, recent, NOW).endswith(
        "; splitCooldown: last split 10 s ago, 30 s needed"
    )
    full = [seg(i, i * 0x2000) for i in range(8)]
    assert demo_progress.split_progress(full, policy, topic(), NOW) == (
        "8 active segments = maxSegments: no further split is possible"
    )


def test_consumer_line_counts_stream_consumers_only() -> None:
    billing = [{"name": f"billing-{i}", "segments": [i]} for i in range(3)]
    audit = [{"name": f"audit-{i}"} for i in range(5)]
    status = topic(
        subscriptions=[
            {"name": "billing", "type": "Stream", "consumers": billing},
            {"name": "audit", "type": "Queue", "consumers": audit},
        ]
    )
    segments = [seg(i, i * 0x4000) for i in range(4)]
    policy = orders_policy()
    assert demo_progress.consumer_split_progress(segments, policy, status, NOW) == (
        "3 stream consumer(s) registered, 4 active segments "
        "(a split comes when consumers outnumber active segments)"
    )
    three = [*segments[:2], seg(9, 0x8000)]
    status["status"]["lastSplitAt"] = format_time(NOW - 12)
    assert demo_progress.consumer_split_progress(three, policy, status, NOW) == (
        "3 stream consumer(s) registered, 3 active segments "
        "(a split comes when consumers outnumber active segments)"
    )
    billing.append({"name": "billing-3", "segments": []})
    assert demo_progress.consumer_split_progress(three, policy, status, NOW) == (
        "4 stream consumer(s) registered, 3 active segments; "
        "splitCooldown: last split 12 s ago, 30 s needed"
    )
    status["status"]["lastSplitAt"] = format_time(NOW - 40)
    assert demo_progress.consumer_split_progress(three, policy, status, NOW) == (
        "4 stream consumer(s) registered, 3 active segments; the split is due now"
    )


# -- the start state -------------------------------------------------------------------------


def test_leftover_shape_tells_a_previous_run_from_a_fresh_topic() -> None:
    assert demo_progress.leftover_shape(topic()) == ""
    assert demo_progress.leftover_shape(topic(epoch=0, activeSegments=2)) == ""
    assert demo_progress.leftover_shape(topic(epoch=3, activeSegments=5)) == (
        "epoch 3, 5 active segments"
    )
    in_flight = topic(epoch=0, activeSegments=2, operation={"kind": "split"})
    assert demo_progress.leftover_shape(in_flight) == "a split operation in flight"
    deleting = topic(epoch=0)
    deleting["metadata"]["deletionTimestamp"] = format_time(NOW)
    assert demo_progress.leftover_shape(deleting) == "being deleted"


def test_ready_is_for_the_current_generation() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "2 active"}
    assert demo_progress.is_ready(topic(conditions=[ready], observedGeneration=1))
    assert not demo_progress.is_ready(topic(conditions=[ready], observedGeneration=0))
    waiting = {"type": "Ready", "status": "False", "reason": "Initializing", "message": ""}
    assert demo_progress.ready_detail(topic(conditions=[waiting])) == "Ready=False (Initializing)"
    assert "not reconciled" in demo_progress.ready_detail(topic())


# -- the waits -------------------------------------------------------------------------------


def test_progress_is_said_at_least_every_10_seconds() -> None:
    assert PROGRESS_EVERY <= 10
    assert demo_progress.progress_line("a merge", "segments #5 #6 cold", 12.4, 300) == (
        "  waiting for a merge: segments #5 #6 cold [12 s of 300 s]"
    )


async def test_wait_for_reports_at_the_progress_interval_until_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = Demo(tmp_path, phase_timeout=60, progress_every=0.2)
    started = time.monotonic()
    checks = 0

    async def done() -> bool:
        return time.monotonic() - started >= 1.5

    async def detail() -> str:
        nonlocal checks
        checks += 1
        return f"check {checks}"

    await demo.wait_for("the thing", done, 10, detail)
    lines = [line for line in capsys.readouterr().out.splitlines() if "waiting for" in line]
    assert len(lines) >= 4, lines
    for n, line in enumerate(lines, 1):
        assert re.search(rf"waiting for the thing: check {n} \[\d+ s of 10 s\]$", line), line


async def test_wait_for_times_out_with_the_state_reached_and_ends_on_ctrl_c(
    tmp_path: Path,
) -> None:
    demo = Demo(tmp_path, phase_timeout=60, progress_every=5)
    polled = asyncio.Event()

    async def never() -> bool:
        polled.set()
        return False

    async def broken() -> str:
        raise ConnectionError("API down")

    with pytest.raises(RuntimeError, match=r"timed out:.*waiting for x: status unavailable"):
        await demo.wait_for("x", never, 0.3, broken)

    polled.clear()
    waiting = asyncio.create_task(demo.wait_for("y", never, 60))
    await polled.wait()  # the wait is under way, between two polls
    started = time.monotonic()
    demo.stop.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert time.monotonic() - started < 0.5
