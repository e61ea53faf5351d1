"""Key-shared chaos run (PIP-486, issue 14; ``tests/chaos/keyshared.py``, docs/correctness.md):
stream and checkpoint consumers, each a process of its own, scale 1 → 12 → 3 per subscription
on a 2-segment topic under keyed open-loop load, through a split (request annotation), a rebucket
rollover (12 consumers beyond the buckets at ``maxSegments``) and a merge (request annotation),
with a stream consumer SIGKILLed for good and a checkpoint consumer SIGKILLed and restored from
its checkpoint store. The real operator and broker pods run on the embedded control plane.

After the final drain the checker must find every acknowledged message delivered on both
subscriptions, no key out of order across consumers and segments, and every duplicate explained:
on the stream subscription by the SIGKILLed consumer (it had the earlier delivery), on the
checkpoint subscription by the session's checkpoint (it did not cover the message).

    .venv/bin/pytest -s tests/integration/test_chaos_keyshared.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.checker import CHECKPOINT_RESTORE
from tests.chaos.keyshared import CHECKPOINT_SUB, STREAM_SUB, KeySharedConfig, run_keyshared

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def test_keyshared_consumers_scale_through_split_rollover_merge_and_sigkill(
    tmp_path: Path,
) -> None:
    config = KeySharedConfig()
    result = await run_keyshared(tmp_path, config)
    text = "\n".join(result.lines()) + f"\nhistory: {result.history_path}"
    print(f"\n{text}")
    report = result.report

    assert [s.name for s in result.steps] == [
        "split",
        f"scale-to-{config.peak}",
        "sigkill",
        f"scale-to-{config.final}",
        "merge",
    ], text
    assert result.drained, text
    assert report.sends["ok"] > 1500, text  # 3 x 240 behind + the settles, at the least
    assert report.lost == 0, text
    assert report.reordered == 0, text
    assert report.skips == 0, text
    assert report.unexpected == 0, text
    assert report.duplicates_unexplained == 0, text
    assert report.inconsistent_positions == 0, text
    assert report.valid, text

    # 12 consumers over 3 segments rolled over to 4 buckets each: every consumer had work.
    assert sum(result.buckets_at_peak.values()) >= config.peak, text
    assert result.readers_at_peak == {STREAM_SUB: config.peak, CHECKPOINT_SUB: config.peak}, text
    stream = report.subscriptions[STREAM_SUB]
    checkpoint = report.subscriptions[CHECKPOINT_SUB]
    assert set(stream.duplicates_by_cause) <= {"consumer"}, text
    assert set(checkpoint.duplicates_by_cause) <= {CHECKPOINT_RESTORE}, text
    assert checkpoint.duplicates_by_cause.get(CHECKPOINT_RESTORE, 0) > 0, (
        f"the restore re-read nothing: the checkpoint rule was not exercised\n{text}"
    )
    assert stream.sessions >= config.peak and checkpoint.sessions >= config.peak + 1, text
