"""The stall probe of the benchmarks (bench/_hiccup.py) sees a process that does not run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from bench import _hiccup


def test_a_stopped_process_is_one_gap_at_least_as_long_as_the_stop() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench._hiccup", "--spin", "1.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert proc.stderr.readline().strip() == "spinning"
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=30)
    gaps_ms = [g * 1000 for g in json.loads(out)]
    assert max(gaps_ms) >= 200


def test_the_summary_counts_the_gaps_of_every_core() -> None:
    stalls = _hiccup.Stalls(
        (
            _hiccup.CoreStalls(0, 10.0, (0.6, 2.0, 12.5), 0.03),
            _hiccup.CoreStalls(1, 10.0, (6.0,), 0.01),
        )
    )
    assert stalls.longest_ms == 12.5
    assert [stalls.over(b) for b in _hiccup.BOUNDS_MS] == [3, 2, 1]
    assert stalls.summary() == (
        "2 cores spinning for 10 s: longest stall 12.5 ms, 3 over 1 ms, 2 over 5 ms, "
        "1 over 10 ms; stolen by the hypervisor 40 ms"
    )


def test_steal_is_left_out_where_a_core_has_no_figure() -> None:
    stalls = _hiccup.Stalls((_hiccup.CoreStalls(0, 5.0, (), None),))
    assert stalls.summary() == (
        "1 core spinning for 5 s: longest stall 0.0 ms, 0 over 1 ms, 0 over 5 ms, 0 over 10 ms"
    )


def test_every_usable_core_has_a_steal_counter() -> None:
    ticks = _hiccup._steal_ticks()
    assert set(os.sched_getaffinity(0)) <= set(ticks)
    assert all(v >= 0 for v in ticks.values())


def test_the_probe_spins_one_process_per_core_asked() -> None:
    core = min(os.sched_getaffinity(0))
    stalls = _hiccup.probe(0.3, cores=[core])
    assert [c.core for c in stalls.cores] == [core]
    assert stalls.cores[0].seconds == 0.3
    assert stalls.cores[0].steal_s is not None and stalls.cores[0].steal_s >= 0
