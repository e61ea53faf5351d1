"""Kafka as a benchmark peer (bench/_kafka.py): the pinned version, the command lines, the parsing
of Kafka's tools' output."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import _kafka

REPO = Path(__file__).resolve().parents[2]


def test_the_kafka_version_is_pinned_once_in_our_pom() -> None:
    version = _kafka.kafka_version()
    assert version.split(".")[0] >= "4"
    text = _kafka.POM.read_text()
    assert text.count(version) == 1
    assert text.count("${kafka.version}") == 2  # broker and tools follow the one pin


def test_a_pom_without_a_release_version_is_refused(tmp_path: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><properties>'
        "<kafka.version>LATEST</kafka.version></properties></project>"
    )
    with pytest.raises(ValueError, match=r"kafka\.version"):
        _kafka.kafka_version(pom)


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
        ('java version "1.8.0_412"', 8),
        ('openjdk version "21" 2023-09-19', 21),
    ],
)
def test_java_major_version(output: str, major: int) -> None:
    assert _kafka.java_major(output) == major


def test_java_without_a_version_line_is_an_error() -> None:
    with pytest.raises(ValueError):
        _kafka.java_major("command not found")


def test_maven_copies_runtime_jars_into_a_cache_outside_the_repository(tmp_path: Path) -> None:
    cmd = _kafka.resolve_command("mvn", _kafka.POM, tmp_path / "lib", tmp_path / "m2")
    assert "dependency:copy-dependencies" in cmd
    assert "-DincludeScope=runtime" in cmd
    assert f"-DoutputDirectory={tmp_path / 'lib'}" in cmd
    assert f"-Dmaven.repo.local={tmp_path / 'm2'}" in cmd
    assert REPO not in _kafka.cache_root().parents


def test_jars_must_include_kafka_and_a_binding_matching_log4j() -> None:
    good = [
        "kafka_2.13-4.4.0.jar",
        "kafka-tools-4.4.0.jar",
        "log4j-core-2.25.5.jar",
        "log4j-slf4j-impl-2.25.5.jar",
        "slf4j-api-1.7.36.jar",
    ]
    _kafka.check_jars(good, "4.4.0", "2.25.5")
    with pytest.raises(RuntimeError, match=r"log4j-slf4j-impl-2\.25\.5"):
        _kafka.check_jars([*good[:3], "log4j-slf4j-impl-2.24.0.jar", good[4]], "4.4.0", "2.25.5")
    with pytest.raises(RuntimeError, match="slf4j-api"):
        _kafka.check_jars(good[:4], "4.4.0", "2.25.5")


def test_storage_format_joins_a_cluster_id_that_looks_like_an_option(tmp_path: Path) -> None:
    args = _kafka.format_args(tmp_path / "server.properties", "-abc")
    assert args[:2] == ["format", "--standalone"]
    assert "--cluster-id=-abc" in args
    assert len(_kafka.cluster_id()) == 22


def test_server_is_a_single_node_kraft_on_loopback(tmp_path: Path) -> None:
    props = dict(
        line.split("=", 1)
        for line in _kafka.server_properties(9092, 9093, tmp_path).splitlines()
        if line
    )
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:9093"
    assert props["log.dirs"] == str(tmp_path)
    assert props["offsets.topic.replication.factor"] == "1"
    # what a topic keeps on disk is bounded (a full run would fill the disk otherwise)
    assert int(props["log.retention.bytes"]) == 2 * 2**30
    assert int(props["log.segment.bytes"]) < int(props["log.retention.bytes"])


def test_server_heap_is_fixed_and_tools_are_capped(tmp_path: Path) -> None:
    install = _kafka.Install("4.4.0", "/usr/bin/java", tmp_path)
    log4j = tmp_path / "log4j2.properties"
    server = _kafka.java_command(
        install, "kafka.Kafka", ["x"], heap=_kafka.SERVER_HEAP, log4j=log4j, fixed_heap=True
    )
    assert server[1:3] == ["-Xms1g", "-Xmx1g"]
    assert "-XX:+UseG1GC" in server
    assert server[-2:] == ["kafka.Kafka", "x"]
    assert server[server.index("-cp") + 1] == f"{tmp_path}/*"
    tool = _kafka.java_command(install, "T", [], heap=_kafka.TOOL_HEAP, log4j=log4j)
    assert not [a for a in tool if a.startswith("-Xms")]
    assert "-Xmx512m" in tool


def test_producer_perf_is_keyed_acks_all_with_omb_batching() -> None:
    args = _kafka.producer_perf_args("h:1", "t", 1000, 100, 1024, None)
    assert args[args.index("--throughput") + 1] == "-1"
    assert args[args.index("--key-distribution") + 1] == "range"
    assert args[args.index("--record-key-range") + 1] == str(_kafka.KEY_RANGE)
    props = args[args.index("--command-property") + 1 :]
    assert {"acks=all", "linger.ms=1", "batch.size=131072"} <= set(props)
    throttled = _kafka.producer_perf_args("h:1", "t", 1000, 100, 100, 2500.4)
    assert throttled[throttled.index("--throughput") + 1] == "2500"


def test_topic_commands() -> None:
    create = _kafka.topic_create_args("h:1", "t", 2, _kafka.TOPIC_CONFIG["sync"])
    assert create[create.index("--config") + 1] == "flush.messages=1"
    assert "--config" not in _kafka.topic_create_args("h:1", "t", 1, _kafka.TOPIC_CONFIG["default"])
    alter = _kafka.topic_alter_args("h:1", "t", 8)
    assert alter[alter.index("--partitions") + 1] == "8" and "--alter" in alter


PRODUCER_OUT = """Warmup first 200000 records. Steady state results will print after the complete test summary.
190526 records sent, 189956.1 records/sec (18.12 MB/sec), 53.3 ms avg latency, 145.0 ms max latency.
157643 records sent, 156547.2 records/sec (14.93 MB/sec), 11.4 ms avg latency, 45.0 ms max latency.
1000000 records sent, 229515.721827 records/sec (21.89 MB/sec), 17.51 ms avg latency, 727.00 ms max latency, 12 ms 50th, 39 ms 95th, 110 ms 99th, 265 ms 99.9th.
800000 steady state records sent, 339414.509970 records/sec (32.37 MB/sec), 14.58 ms avg latency, 78.00 ms max latency, 12 ms 50th, 35 ms 95th, 44 ms 99th, 74 ms 99.9th.
"""  # noqa: E501


def test_producer_summary_prefers_the_steady_state_line() -> None:
    line = _kafka.parse_producer_perf(PRODUCER_OUT)
    assert line.steady
    assert (line.records, line.rate, line.p50_ms, line.p99_ms, line.p999_ms, line.max_ms) == (
        800000,
        339414.509970,
        12.0,
        44.0,
        74.0,
        78.0,
    )
    overall = _kafka.parse_producer_perf(PRODUCER_OUT.rsplit("\n", 2)[0])
    assert not overall.steady and overall.records == 1000000
    assert _kafka.window_rates(PRODUCER_OUT) == [189956.1, 156547.2]
    with pytest.raises(ValueError, match="no ProducerPerformance summary"):
        _kafka.parse_producer_perf("Exception in thread main")


def test_consumer_summary_uses_the_fetch_phase() -> None:
    out = (
        "Warning: --messages is deprecated.\n"
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
        "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec\n"
        "2026-11-25 06:00:49:675, 2026-11-25 06:00:54:594, 98.1483, 19.9529, 1000000, "
        "203293.3523, 1986, 2933, 33.4635, 340947.8350\n"
    )
    line = _kafka.parse_consumer_perf(out)
    assert (line.records, line.fetch_seconds, line.fetch_rate) == (1000000, 2.933, 340947.835)
    with pytest.raises(ValueError):
        _kafka.parse_consumer_perf("start.time, end.time\n")


def test_end_to_end_latency_summary() -> None:
    out = "0\t78.9\nAvg latency: 4.7131 ms\nPercentiles: 50th = 3, 99th = 20, 99.9th = 78\n"
    e2e = _kafka.parse_e2e(out, 500)
    assert (e2e.avg_ms, e2e.p50_ms, e2e.p99_ms, e2e.p999_ms, e2e.records) == (
        4.7131,
        3.0,
        20.0,
        78.0,
        500,
    )


def test_without_java_the_kafka_rows_say_why_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import broker
    from bench.report import Report

    monkeypatch.setenv("PATH", str(tmp_path))  # no java, no mvn
    monkeypatch.setenv("BENCH_BROKER_SYSTEMS", "kafka,kafka-sync")
    monkeypatch.setattr(broker, "_disk_fsync_ms", lambda directory: 1.0)
    report = Report(quick=True, command="test", out_dir=tmp_path)
    broker.run(report, True)  # raises when a system failed; a missing prerequisite is no failure
    [section] = report.sections
    [table] = [t for t in section.tables if t.title.startswith("Systems not measured")]
    assert [row[0] for row in table.rows] == [
        "Kafka, default flush (ack before fsync)",
        "Kafka, flush.messages=1 (ack after fsync)",
    ]
    assert all("java not found" in str(row[1]) for row in table.rows)
    assert [s["unavailable"] for s in section.data["systems"]] == [True, True]


def test_bottleneck_names_the_saturated_side() -> None:
    from bench._load import StepResult
    from bench.broker import Step, _bottleneck

    result = StepResult(offered=1000.0, achieved=1000.0)
    assert _bottleneck(Step("sweep", result, 0.9, 0.2)) == "server CPU"
    assert _bottleneck(Step("sweep", result, 0.2, 0.95)) == "client CPU"
    assert _bottleneck(Step("sweep", result, 0.3, 0.2, {"fsyncBusy": 0.9})) == "disk (fsync)"
    assert _bottleneck(Step("sweep", result, 0.3, 0.2)).startswith("no CPU saturated")
