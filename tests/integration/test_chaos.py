"""Jepsen-style chaos run of the whole stack (``tests/chaos``, ``docs/correctness.md``).

Real processes on the embedded control plane: three brokers and two operator replicas from
``manifests/overlays/local``, a producer (its own process) writing 64 keys open-loop at
400 msg/s, two stream consumers and a queue consumer. Faults, one after another, each followed
by a settle: split, merge, rebucket rollover (automatic, driven by extra stream consumers),
SIGKILL of a broker, SIGKILL of the operator leader, restart of a stream consumer. After the
final drain the checker must find nothing lost, reordered, skipped or unexpected, and every
duplicate explained by a restart.

The producer-blocked windows and the registration → own-segment times are printed (``-s``)
against their targets (p99 ≤ 50 ms, ≤ 5 s). Only the registration target is asserted as is;
the windows are asserted with a stall bound (a writer stuck after a split is the failure class
of Pravega's issues), since a millisecond target cannot be asserted on a shared 2-core machine
— ``make bench`` (``bench/chaos.py``) reports it as a target over three runs.

    .venv/bin/pytest -s tests/integration/test_chaos.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenario import ChaosConfig, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BLOCKED_P99_TARGET = 0.050
STALL_BOUND = 2.0
ASSIGNMENT_TARGET = 5.0


async def test_chaos_no_loss_no_reordering(tmp_path: Path) -> None:
    result = await run_chaos(tmp_path, ChaosConfig())
    text = "\n".join(result.lines())
    split = result.blocked("split")
    verdict = "PASS" if split.count and split.p99 <= BLOCKED_P99_TARGET else "FAIL"
    print(f"\n{text}\nsplit producer-blocked p99 target 50 ms: {verdict}")
    report = result.report
    text += f"\nhistory: {result.history_path}"

    assert result.drained, text
    assert report.sends["ok"] > 5000, text
    assert report.lost == 0, text
    assert report.reordered == 0, text
    assert report.unexpected == 0, text
    assert report.skips == 0, text
    assert report.duplicates_unexplained == 0, text
    assert report.failed_but_read == 0, text
    assert report.inconsistent_positions == 0, text
    assert report.valid, text
    assert report.subscriptions["ordered"].sessions >= 3, "the restart opened a new session"

    assert [s.name for s in result.steps] == [
        "split",
        "merge",
        "rebucket",
        "kill-broker",
        "kill-operator-leader",
        "restart-consumer",
    ], text
    restart = result.steps[-1].data
    assert restart["before"] and restart["after"] == restart["before"], (
        f"a consumer back within the grace period gets its segments unchanged\n{text}"
    )
    for name in ("split", "merge", "rebucket"):
        window = result.blocked(name)
        assert window.count > 0, f"no key crossed the {name}\n{text}"
        assert window.max <= STALL_BOUND, f"{name} stalled the producer: {window.ms()}\n{text}"

    assert result.registrations, text
    for reg in result.registrations:
        assert reg.assigned is not None and reg.assigned <= ASSIGNMENT_TARGET, text
