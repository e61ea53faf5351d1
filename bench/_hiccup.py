"""How long this machine stops a busy core: the floor under every tail latency measured here.

One process per core, pinned to it, reads the monotonic clock in a loop for a few seconds; a gap
between two consecutive reads is time the process did not run (the kernel's other work, or the
hypervisor running another guest: the vCPU's *steal*, from ``/proc/stat``). All cores spin at
once, because a benchmark step keeps both cores of this machine busy (server and load
generator), and that is when the stalls come: on a quiet machine one spinning core alone sees
none. A request caught in a stall waits for it, whatever the server does, so a p99 below the
stalls' length can only be met in steps that happen to have no stall.

    python -m bench._hiccup [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.report import Section

GAP_FLOOR_S = 0.0005
"""Gaps shorter than this are the loop's own jitter (a clock read costs about 0.1 µs)."""
BOUNDS_MS = (1.0, 5.0, 10.0)


@dataclass(frozen=True)
class CoreStalls:
    core: int
    seconds: float
    gaps_ms: tuple[float, ...]
    """Every gap over ``GAP_FLOOR_S``, in milliseconds, in the order seen."""
    steal_s: float | None
    """CPU time the hypervisor took from this vCPU meanwhile (``/proc/stat``), if known."""

    def over(self, bound_ms: float) -> int:
        return sum(1 for g in self.gaps_ms if g > bound_ms)

    @property
    def longest_ms(self) -> float:
        return max(self.gaps_ms, default=0.0)


@dataclass(frozen=True)
class Stalls:
    cores: tuple[CoreStalls, ...]

    @property
    def longest_ms(self) -> float:
        return max((c.longest_ms for c in self.cores), default=0.0)

    def over(self, bound_ms: float) -> int:
        return sum(c.over(bound_ms) for c in self.cores)

    def summary(self) -> str:
        """One line for a report's notes."""
        if not self.cores:
            return "not measured"
        seconds = self.cores[0].seconds
        counts = ", ".join(f"{self.over(b)} over {b:.0f} ms" for b in BOUNDS_MS)
        steal = [c.steal_s for c in self.cores]
        stolen = (
            f"; stolen by the hypervisor {sum(s for s in steal if s is not None) * 1000:.0f} ms"
            if all(s is not None for s in steal)
            else ""
        )
        cores = f"{len(self.cores)} core{'s' if len(self.cores) != 1 else ''}"
        return (
            f"{cores} spinning for {seconds:.0f} s: longest stall "
            f"{self.longest_ms:.1f} ms, {counts}{stolen}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "longestMs": self.longest_ms,
            "cores": [
                {
                    "core": c.core,
                    "seconds": c.seconds,
                    "gapsMs": list(c.gaps_ms),
                    "stealSeconds": c.steal_s,
                }
                for c in self.cores
            ],
        }


def note(section: Section, stalls: Mapping[str, Stalls]) -> None:
    """Record the probes of a section (``{"start": ..., "end": ...}``) in its notes and data."""
    if not stalls:
        return
    section.note(
        "Machine stalls (`bench/_hiccup.py`: every core busy, the gaps a spinning process "
        "sees; a reply caught in one waits for it): "
        + "; ".join(f"{when}: {s.summary()}" for when, s in stalls.items())
        + "."
    )
    section.figure("machine_longest_stall_ms", max(s.longest_ms for s in stalls.values()), "ms")
    section.data["machineStalls"] = {when: s.to_json() for when, s in stalls.items()}


def spin(
    seconds: float, floor: float = GAP_FLOOR_S, started: Callable[[], None] | None = None
) -> list[float]:
    """Gaps over ``floor`` (seconds) between consecutive clock reads during ``seconds``;
    ``started`` is called after the first read, so a stall from then on is seen."""
    clock = time.perf_counter
    gaps: list[float] = []
    prev = start = clock()
    end = start + seconds
    if started is not None:
        started()
    while prev < end:
        now = clock()
        if now - prev > floor:
            gaps.append(now - prev)
        prev = now
    return gaps


def _steal_ticks() -> dict[int, int]:
    """Per-CPU steal ticks (the eighth value of each ``cpuN`` line of ``/proc/stat``)."""
    out: dict[int, int] = {}
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                name, *values = line.split()
                if name.startswith("cpu") and name != "cpu" and len(values) >= 8:
                    out[int(name[3:])] = int(values[7])
    except OSError:
        pass
    return out


def probe(seconds: float = 5.0, cores: Sequence[int] | None = None) -> Stalls:
    """Spin one pinned process per core for ``seconds``, all at once."""
    usable = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
    before = _steal_ticks()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench._hiccup", "--spin", str(seconds), "--core", str(core)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for core in usable
    ]
    outputs = [p.communicate(timeout=seconds + 60)[0] for p in procs]
    after = _steal_ticks()
    tick = os.sysconf("SC_CLK_TCK")
    result = []
    for core, proc, out in zip(usable, procs, outputs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"hiccup probe on core {core} exited {proc.returncode}")
        steal = (after[core] - before[core]) / tick if core in before and core in after else None
        gaps = json.loads(out)
        result.append(CoreStalls(core, seconds, tuple(g * 1000 for g in gaps), steal))
    return Stalls(tuple(result))


def _say_spinning() -> None:
    print("spinning", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--spin", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--core", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.spin is not None:
        if args.core is not None:
            os.sched_setaffinity(0, {args.core})
        print(json.dumps(spin(args.spin, started=_say_spinning)))
        return
    print(probe(args.seconds).summary())


if __name__ == "__main__":
    main()
