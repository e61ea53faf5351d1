"""Cost of one key-shared coordinator event (``SubscriptionCoordinator``), in process.

The controller session server runs every coordinator event on its event loop, so an event's
cost is how long consumers' joins and acknowledgements wait behind it. The state is the
``keyshared`` benchmark's: 64 segments of 4 buckets (256 buckets) read by 200 stream
consumers. Each round times, one event at a time: a consumer joining (``register``), the
previous owners reporting the buckets it takes released (``released``, ack-driven), the
consumer disconnecting (``disconnect``) and leaving (``unregister``), then a split of one
segment (``layout_changed``), the sealed parent reported drained (``drained``) and pruned
(``layout_changed``). p50/p99 per event kind and over all events, of the wall time and of
the thread's CPU time (the latter does not count the time the process waited for a core on a
loaded machine).

    python -m bench.run --only coordinator [--quick]
    python -m bench.coordinator [--rounds N]     # prints the figures
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial

from bench._stats import percentile
from bench.report import Report
from scalable_topics.core.assignment import CoordinatorResult, SubscriptionCoordinator
from scalable_topics.core.layout import SegmentLayout

SEGMENTS, BUCKETS, CONSUMERS = 64, 4, 200
TARGET_P99_MS = 10.0


def _all(measured: dict[str, list[float]]) -> list[float]:
    return [t for values in measured.values() for t in values]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def _release_all(coordinator: SubscriptionCoordinator, now: float) -> None:
    """Every previous owner reports what it hands over released (one report per segment)."""
    by_owner: dict[tuple[str, int], list[int]] = defaultdict(list)
    for (s, b), name in coordinator.withheld().items():
        by_owner[(name, s)].append(b)
    for (name, s), buckets in sorted(by_owner.items()):
        coordinator.released(name, s, buckets, now)


def build(consumers: int = CONSUMERS) -> tuple[SubscriptionCoordinator, _Clock]:
    """The keyshared scenario's steady state: every consumer joined, every hand-off done."""
    clock = _Clock()
    layout = SegmentLayout.initial(SEGMENTS)
    coordinator = SubscriptionCoordinator(
        layout, buckets={s: BUCKETS for s in layout.segments}, grace_period=30.0
    )
    for k in range(consumers):
        coordinator.register(f"c{k:03d}", clock())
        _release_all(coordinator, clock())
    return coordinator, clock


def measure(
    rounds: int, consumers: int = CONSUMERS
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per event, by event kind: wall time, thread CPU time."""
    coordinator, clock = build(consumers)
    timings: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)

    def timed(kind: str, event: Callable[..., CoordinatorResult]) -> CoordinatorResult:
        """Run ``event(now=...)`` and record its cost."""
        now = clock()
        c0, t0 = time.thread_time(), time.perf_counter()
        result = event(now=now)
        timings[kind].append(time.perf_counter() - t0)
        cpu[kind].append(time.thread_time() - c0)
        if result.rejected is not None:
            raise RuntimeError(f"{kind} rejected: {result.rejected}")
        return result

    for r in range(rounds):
        name = f"x{r:04d}"
        timed("register", partial(coordinator.register, name))
        withheld: dict[tuple[str, int], list[int]] = defaultdict(list)
        for (s, b), owner in coordinator.withheld().items():
            withheld[(owner, s)].append(b)
        for (owner, s), buckets in sorted(withheld.items()):
            timed("released", partial(coordinator.released, owner, s, buckets))
        timed("disconnect", partial(coordinator.disconnect, name))
        timed("unregister", partial(coordinator.unregister, name))
        _release_all(coordinator, clock())

        layout = coordinator.layout
        parent = min(s for s, info in layout.segments.items() if info.active)
        split = layout.split(parent)
        children = {c: BUCKETS for c in split.segments[parent].child_ids}
        timed("split", partial(coordinator.layout_changed, split, buckets=children))
        _release_all(coordinator, clock())
        timed("drained", partial(coordinator.drained, None, parent))
        _release_all(coordinator, clock())
        pruned = split.prune(parent)
        timed("prune", partial(coordinator.layout_changed, pruned))
        _release_all(coordinator, clock())
    return timings, cpu


def run(report: Report, quick: bool) -> None:
    rounds = 3 if quick else 20
    timings, cpu = measure(rounds)
    section = report.section("coordinator", "Key-shared coordinator event cost (in process)")
    every = [t for values in timings.values() for t in values]
    labels = {"consumers": str(CONSUMERS), "buckets": str(SEGMENTS * BUCKETS)}
    for name, measured in (("event", timings), ("event_cpu", cpu)):
        for kind, values in [*sorted(measured.items()), ("all", _all(measured))]:
            section.figure(
                f"{name}_p50", 1000.0 * percentile(values, 0.5), "ms", event=kind, **labels
            )
            section.figure(
                f"{name}_p99", 1000.0 * percentile(values, 0.99), "ms", event=kind, **labels
            )
    p99 = 1000.0 * percentile(every, 0.99)
    section.target(
        "coordinator event p99",
        p99 < TARGET_P99_MS,
        f"{p99:.1f} ms over {len(every)} events",
        f"< {TARGET_P99_MS:.0f} ms",
    )
    section.note(
        f"{SEGMENTS} segments x {BUCKETS} buckets, {CONSUMERS} stream consumers; {rounds} rounds "
        "of register, released (per previous owner and segment), disconnect, unregister, split, "
        "drained, prune. Each event runs on the controller session server's event loop."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--consumers", type=int, default=CONSUMERS)
    args = parser.parse_args()
    timings, cpu = measure(args.rounds, args.consumers)
    for kind, values in [*sorted(timings.items()), ("all", _all(timings))]:
        used = cpu[kind] if kind != "all" else _all(cpu)
        print(
            f"{kind:<11} n={len(values):<4} wall p50={1000 * percentile(values, 0.5):6.2f} "
            f"p99={1000 * percentile(values, 0.99):6.2f} max={1000 * max(values):6.2f} ms   "
            f"cpu p50={1000 * percentile(used, 0.5):6.2f} "
            f"p99={1000 * percentile(used, 0.99):6.2f} ms"
        )


if __name__ == "__main__":
    main()
