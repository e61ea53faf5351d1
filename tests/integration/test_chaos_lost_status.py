"""The lost-status test of docs/correctness.md, under load: the chaos stack (``tests/chaos``,
real processes: three brokers, two operator replicas, a keyed producer writing 64 keys at
400 msg/s, two stream consumers and a queue consumer) splits and merges the topic, then replaces
its status with an empty one, then deletes every Segment and the status again. Each time the
topic comes back with the same DAG (ids, ranges, states, links) at a higher epoch, every segment
stays on its broker, and after the final drain the checker finds every acknowledged message
consumed, in per-key order, on both subscriptions.

    .venv/bin/pytest -s tests/integration/test_chaos_lost_status.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scalable_topics.core.layout import SegmentLayout
from tests.chaos.scenario import ChaosConfig, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FAULTS = ("split", "merge", "lose-status", "lose-status-and-segments")


def shape(layout: SegmentLayout) -> dict[int, tuple[str, bool, tuple[int, ...], tuple[int, ...]]]:
    return {
        sid: (s.hash_range.hex(), s.active, s.parent_ids, s.child_ids)
        for sid, s in layout.segments.items()
    }


async def test_a_lost_status_under_load_loses_nothing(tmp_path: Path) -> None:
    result = await run_chaos(tmp_path, ChaosConfig(faults=FAULTS))
    text = "\n".join(result.lines()) + f"\nhistory: {result.history_path}"
    print(f"\n{text}")
    report = result.report

    assert [s.name for s in result.steps] == list(FAULTS), text
    merged: SegmentLayout = result.steps[2].data["before"]
    assert len(merged.segments) > len(merged.active()) >= 2, "split and merge sealed segments"
    for step in result.steps[2:]:
        before, after = step.data["before"], step.data["after"]
        assert shape(after) == shape(before), f"{step.name}: the DAG changed\n{text}"
        assert after.epoch > before.epoch, f"{step.name}: the epoch went back\n{text}"
        assert step.data["heldAfter"] == step.data["held"], f"{step.name}: broker data\n{text}"
        assert set(step.data["held"]) == set(before.segments), text

    assert result.drained, text
    assert report.sends["ok"] > 3000, text
    assert report.lost == 0, text
    assert report.reordered == 0, text
    assert report.skips == 0, text
    assert report.unexpected == 0, text
    assert report.duplicates_unexplained == 0, text
    assert report.failed_but_read == 0, text
    assert report.inconsistent_positions == 0, text
    assert report.valid, text
