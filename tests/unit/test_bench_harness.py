"""The benchmark harness itself: registry, report, open-loop driver, group-commit figures."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import broker
from bench import run as bench_run
from bench._load import Consumer, StepResult, StepSpec, produce_step
from bench._ours import fsync_delta
from bench._procs import Server
from bench.report import Report


def test_registry_finds_benchmark_modules_only() -> None:
    names = bench_run.discover()
    assert "broker" in names
    assert not {"run", "report"} & set(names)
    assert not [n for n in names if n.startswith("_")]
    assert bench_run.load("broker") is not None


def test_a_failing_benchmark_is_reported_and_the_others_still_run(tmp_path: Path) -> None:
    report = Report(quick=True, command="test", out_dir=tmp_path)

    def broken(r: Report, quick: bool) -> None:
        r.section("broken", "Broken").figure("x", 1, "u")
        raise RuntimeError("boom")

    async def fine(r: Report, quick: bool) -> None:
        s = r.section("fine", "Fine")
        s.table("T", ["a", "b"], [[1, 2.5], [None, "z"]])
        s.target("t1", True, "1", ">= 1")
        s.target("t2", False, "0", ">= 1")

    assert not bench_run.run_one("broken", broken, report, True)
    assert bench_run.run_one("fine", fine, report, True)
    md, js = report.write(tmp_path)
    data = json.loads(js.read_text())
    assert [s["name"] for s in data["sections"]] == ["broken", "fine"]
    assert "RuntimeError: boom" in data["sections"][0]["error"]
    assert data["sections"][1]["targets"][1] == {
        "name": "t2",
        "passed": False,
        "measured": "0",
        "required": ">= 1",
    }
    text = md.read_text()
    assert "| fine | t1 | **PASS** | 1 | >= 1 |" in text
    assert "| fine | t2 | **FAIL** | 0 | >= 1 |" in text
    assert "| 1 | 2.50 |" in text
    assert "| - | z |" in text


def test_unknown_benchmark_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench_run.main(["--only", "nope", "--out", str(tmp_path)])


class SerialProducer:
    """A system that serves one batch at a time in `service` seconds: capacity is at most
    `batch / service` messages per second on any machine (slower machines only lower it)."""

    def __init__(self, service: float) -> None:
        self.service = service
        self.lock = asyncio.Lock()
        self.messages = 0

    async def send(self, n: int) -> None:
        async with self.lock:
            await asyncio.sleep(self.service)
            self.messages += n

    async def close(self) -> None:
        return None


class Adapter:
    def __init__(self, producer: SerialProducer) -> None:
        self.p = producer

    async def reset(self) -> None:
        return None

    async def producer(self, payload_size: int, batch: int, window: int) -> SerialProducer:
        return self.p

    async def consumer(self, batch: int) -> Consumer:
        raise NotImplementedError("produce-only test system")


def spec(
    rate: float | None, duration: float, batch: int, window: int, drain: float = 30.0
) -> StepSpec:
    return StepSpec("test", {}, 100, rate, duration, 0.0, batch, window, drain=drain)


async def test_open_loop_under_capacity_sends_everything_with_service_latency() -> None:
    producer = SerialProducer(0.002)
    result = await produce_step(Adapter(producer), spec(500.0, 1.0, 100, 1000))
    assert result.errors == 0
    assert result.unfinished == 0
    assert result.sent == result.acked == producer.messages == 500  # everything due by the end
    assert result.recorded == result.acked
    assert result.p50_ms >= 2.0
    assert result.p50_ms <= result.p99_ms <= result.max_ms


async def test_overload_shows_up_as_latency_not_as_a_lower_offered_rate() -> None:
    """Coordinated omission check: messages queued in the generator count from their intended
    time, so an overloaded system shows seconds of latency, not the service time."""
    producer = SerialProducer(0.02)  # at most 10 / 0.02 = 500 msg/s
    result = await produce_step(Adapter(producer), spec(3000.0, 1.0, 10, 50, drain=0.5))
    assert result.offered == 3000.0
    assert result.achieved <= 600
    assert result.errors == 0
    assert result.recorded >= 2900  # unsent messages are recorded with their wait so far
    assert result.p99_ms >= 500
    assert result.max_ms >= 500


async def test_closed_loop_keeps_the_window_full() -> None:
    producer = SerialProducer(0.005)
    result = await produce_step(Adapter(producer), spec(None, 0.5, 10, 40))
    assert result.offered is None
    assert result.acked == producer.messages > 0
    # Four batches queue behind the lock, so each waits for about four service times.
    assert result.p50_ms >= 10


def test_fsync_delta_from_prometheus_histogram() -> None:
    before = {"count": 10.0, "sum": 0.01, "le=0.001": 10.0, "le=0.01": 10.0, "le=+Inf": 10.0}
    after = {"count": 110.0, "sum": 0.31, "le=0.001": 60.0, "le=0.01": 108.0, "le=+Inf": 110.0}
    d = fsync_delta(before, after, 2.0)
    assert d["fsyncPerSec"] == 50.0
    assert d["fsyncMeanMs"] == pytest.approx(3.0)
    assert d["fsyncBusy"] == pytest.approx(0.15)
    assert d["fsyncP99LeMs"] == float("inf")  # only 98 of 100 are <= 10 ms
    after["le=0.01"] = 109.0
    assert fsync_delta(before, after, 2.0)["fsyncP99LeMs"] == 10.0


def test_a_probe_without_acks_in_its_window_is_not_a_capacity_and_runs_again(
    tmp_path: Path,
) -> None:
    results = [
        StepResult(offered=None, achieved=0.0, sent=4096, acked=4096, wall=2.0),
        StepResult(offered=None, achieved=50_000.0, sent=90_000, acked=90_000, wall=2.0),
    ]

    class Scripted(broker._Runner):
        def _produce(self, spec: StepSpec) -> StepResult:
            return results.pop(0)

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        server = Server("idle", proc, tmp_path, tmp_path / "log", 0)
        system = broker.System("scripted", "scripted", "none", lambda _: (server, {}, ""))
        runner = Scripted(system, server, None, {})
        runner.out.runs[100] = broker.PayloadRun(100)
        step = runner.produce(100, None, "probe", broker.QUICK)
        assert step.result.achieved == 50_000.0 and not results
        assert [s.result.achieved for s in runner.out.runs[100].probes] == [50_000.0]
        assert runner.out.runs[100].saturation == 50_000.0
    finally:
        proc.kill()
        proc.wait()
