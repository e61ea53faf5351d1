"""Jepsen-style correctness harness for scalable topics.

- :mod:`tests.chaos.checker` — pure analysis of a recorded history (lost, duplicated, reordered,
  skipped, unexpected and recovered values; producer hand-off windows).
- :mod:`tests.chaos.workload` — the open-loop keyed writer and the recording readers.
- :mod:`tests.chaos.writer` — the writer in a process of its own (JSON lines to the recorder).
- :mod:`tests.chaos.nemesis` — the faults (split/merge requests, SIGKILL of pod processes,
  consumer restarts).
- :mod:`tests.chaos.scenario` — the whole run on the embedded control plane, shared by
  ``tests/integration/test_chaos.py`` and ``bench/chaos.py``.
- :mod:`tests.chaos.consumer` — stream or checkpoint consumers in a process of their own.
- :mod:`tests.chaos.keyshared` — the key-shared run (PIP-486): consumers scaling 1 → 12 → 3
  through a split, a rollover and a merge, with SIGKILLs (``test_chaos_keyshared.py``).

See ``docs/correctness.md``.
"""
