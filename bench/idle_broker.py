"""What a broker's segments cost it: CPU per segment created, and per idle segment and second.

Not part of ``make bench`` (the operator benchmark has the brokers' CPU at rest with 20,000
segments, ``python -m bench.run --only operator``): a developer's check of the periodic work a
broker does for every segment it hosts. A broker subprocess (load history on, no load
reporter) gets N segments of one subscription each through the admin API, 16 creates at a
time; then nothing happens for ``--seconds``, and its CPU over them is read from ``/proc``.

    python -m bench.idle_broker [--segments 7000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench._procs import cpu_seconds
from scalable_topics.client.segment import SegmentAdmin
from segment_broker.testing import BrokerProcess

SETTLE_SECONDS = 12.0
"""Quiet time before the measurement: the creates' first load step (every 10 s) and the
housekeeping of their cursor files are over."""


async def measure(segments: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="idle-broker-") as tmp:
        root = Path(tmp)
        (root / "data").mkdir()
        broker = BrokerProcess(root / "data", args=["--load-history-dir", str(root / "history")])
        broker.start()
        try:
            await broker.wait_ready()
            assert broker.proc is not None
            pid = broker.proc.pid
            async with SegmentAdmin(broker.url) as admin:
                limit = asyncio.Semaphore(16)

                async def create(i: int) -> None:
                    async with limit:
                        await admin.create_segment(
                            "bench", f"t-{i:05d}", 0, 0, 0x7FFF, subscriptions={"sub": "Stream"}
                        )

                cpu0, wall0 = cpu_seconds(pid), time.monotonic()
                await asyncio.gather(*(create(i) for i in range(segments)))
                created_cpu, created_wall = cpu_seconds(pid) - cpu0, time.monotonic() - wall0
            await asyncio.sleep(SETTLE_SECONDS)
            cpu0, wall0 = cpu_seconds(pid), time.monotonic()
            await asyncio.sleep(seconds)
            idle_cpu, idle_wall = cpu_seconds(pid) - cpu0, time.monotonic() - wall0
        finally:
            broker.terminate()
    return {
        "created_seconds": created_wall,
        "cpu_ms_per_created_segment": created_cpu / segments * 1e3,
        "idle_cores": idle_cpu / idle_wall,
        "idle_us_per_segment_second": idle_cpu / idle_wall / segments * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, default=7000)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    r = asyncio.run(measure(args.segments, args.seconds))
    print(
        f"{args.segments} segments created in {r['created_seconds']:.1f} s, "
        f"{r['cpu_ms_per_created_segment']:.2f} ms of the broker's CPU each"
    )
    print(
        f"idle for {args.seconds:.0f} s: {r['idle_cores']:.4f} of a core, "
        f"{r['idle_us_per_segment_second']:.2f} us per segment and second"
    )


if __name__ == "__main__":
    main()
