"""Kafka from the Maven cache (bench/_kafka.py): format, start, produce and consume keyed records
with Kafka's own tools, stop."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import _kafka, rescale
from tests.chaos.checker import Outcome, check


def _installed() -> bool:
    return (_kafka.cache_root() / f"kafka-{_kafka.kafka_version()}" / "complete").exists()


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not shutil.which("java") or not (shutil.which("mvn") or _installed()),
        reason="Kafka needs Java 17+ and, once, Maven to fetch its jars from Maven Central "
        "(apt-get install openjdk-17-jdk-headless maven)",
    ),
]


def test_kafka_starts_from_the_cache_takes_keyed_records_and_stops(tmp_path: Path) -> None:
    kafka = _kafka.start_kafka(tmp_path)
    try:
        assert kafka.server.alive()
        endpoint = kafka.endpoint("sync")
        tools = "org.apache.kafka.tools."
        create = _kafka.topic_create_args(kafka.bootstrap, "t", 1, _kafka.TOPIC_CONFIG["sync"])
        _kafka.checked(
            _kafka.run_tool(_kafka.tool_command(endpoint, tools + "TopicCommand", create), 120),
            "create",
        )
        perf = _kafka.producer_perf_args(kafka.bootstrap, "t", 2000, 0, 100, 2000)
        run = _kafka.run_tool(
            _kafka.tool_command(endpoint, tools + "ProducerPerformance", perf), 120
        )
        produced = _kafka.parse_producer_perf(_kafka.checked(run, "produce").stdout)
        assert produced.records == 2000
        assert run.cpu > 0
        # The first group join of a fresh server creates the offsets topic: allow for a slow one.
        read = _kafka.consumer_perf_args(kafka.bootstrap, "t", 2000, idle_timeout_ms=90_000)
        run = _kafka.run_tool(
            _kafka.tool_command(endpoint, tools + "ConsumerPerformance", read), 120
        )
        consumed = _kafka.parse_consumer_perf(_kafka.checked(run, "consume").stdout)
        assert consumed.records == 2000
        assert "Kafka Server started" in kafka.server.log_tail(10**6)

        # Our keyed producer/consumer (bench/kafka/KeyedOrder.java) across a partition change.
        mode = rescale.Mode(rate1=200.0, seconds1=1.5, seconds2=6.0, keys=16, drain=20.0)
        keyed = rescale._kafka_run(kafka, mode, tmp_path, alter=True)
        acked = [s for s in keyed.history.sends if s.outcome is Outcome.OK]
        assert len(acked) == len(keyed.history.sends)
        # Open loop: never more than the schedule; a starved JVM may fall a little behind it.
        scheduled = 200 * 1.5 + 800 * 6.0
        assert 0.9 * scheduled <= len(acked) <= scheduled
        report = check(keyed.history).subscriptions[rescale.SUBSCRIPTION]
        assert report.lost == 0
        assert keyed.rescaled is not None
        partitions = {s.segment for s in acked}
        assert partitions <= {0, 1, 2, 3}
        if keyed.rescaled[1] + 3.0 < mode.seconds1 + mode.seconds2:  # new partitions in time
            assert partitions & {2, 3}
    finally:
        kafka.server.stop()
    assert not kafka.server.alive()


def test_without_maven_and_no_cached_jars_kafka_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java = shutil.which("java")
    assert java is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").symlink_to(java)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(_kafka.KafkaUnavailable, match="mvn not found"):
        _kafka.ensure_kafka(cache=tmp_path / "cache")
