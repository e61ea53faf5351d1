"""The keyed rate-quadrupling benchmark (bench/rescale.py): order-break count, per-second rates,
Kafka's record file."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import _kafka, rescale
from tests.chaos.checker import Outcome, check


def test_a_key_is_broken_when_it_delivers_a_value_below_one_already_delivered() -> None:
    order = [("a", 0), ("b", 0), ("a", 2), ("a", 1), ("b", 1), ("c", 5), ("c", 6)]
    assert rescale.broken_keys(order) == {"a"}


def test_a_redelivery_is_not_a_broken_order() -> None:
    order = [("a", 0), ("a", 1), ("a", 0), ("a", 1), ("a", 2)]
    assert rescale.broken_keys(order) == set()
    assert rescale.broken_keys([]) == set()


def test_per_second_buckets() -> None:
    assert rescale.per_second([0.1, 0.9, 1.0, 2.5, 2.6, -0.1, 9.0], 3) == [2, 1, 2]


KAFKA_RECORDS = """A key-1 0 0 0 5
A key-1 1 1 0 1010
A key-2 0 1 1 1011
F key-2 1 1012
C key-1 1 1 0 1200
C key-2 0 1 1 1200
C key-1 0 0 0 1300
"""


def test_kafka_record_file_becomes_a_checkable_history() -> None:
    history = rescale.kafka_history(KAFKA_RECORDS.splitlines())
    assert [(s.key, s.value, s.outcome, s.segment, s.position) for s in history.sends] == [
        ("key-1", 0, Outcome.OK, 0, 0),
        ("key-1", 1, Outcome.OK, 1, 0),
        ("key-2", 0, Outcome.OK, 1, 1),
        ("key-2", 1, Outcome.FAIL, None, None),
    ]
    assert history.deliveries[2].time == pytest.approx(1.3)
    report = check(history).subscriptions[rescale.SUBSCRIPTION]
    assert (report.reordered, report.lost) == (1, 0)
    order = [(d.key, d.value) for d in history.deliveries]
    assert rescale.broken_keys(order) == {"key-1"}


def test_a_malformed_record_line_names_its_line() -> None:
    with pytest.raises(ValueError, match="line 2"):
        rescale.kafka_history(["A key-1 0 0 0 5", "C key-1 x"])


def test_keyed_order_command_runs_our_java_source_on_kafkas_jars(tmp_path: Path) -> None:
    install = _kafka.Install("4.4.0", "/usr/bin/java", tmp_path)
    mode = rescale.Mode(rate1=100.0, seconds1=2.0, seconds2=3.0)
    cmd = rescale.keyed_order_command(
        install, tmp_path / "l.properties", "h:1", "t", mode, tmp_path / "o"
    )
    assert cmd[cmd.index("-cp") + 1] == f"{tmp_path}/*"
    source = Path(cmd[cmd.index("-cp") + 2])
    assert source.name == "KeyedOrder.java" and source.exists()
    assert cmd[-10:] == [
        "h:1",
        "t",
        "64",
        "100.0",
        "2.0",
        "400.0",
        "3.0",
        "100",
        f"{tmp_path}/o",
        "30.0",
    ]
