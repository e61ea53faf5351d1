"""``pom_property``: the one reader of the version pins in our poms (s3a jars, Kafka, RabbitMQ's
stream client)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import _kafka, _rabbitmq
from scalable_topics.recommender import s3a
from scalable_topics.recommender.s3a import pom_property


def _pom(tmp_path: Path, properties: str) -> Path:
    pom = tmp_path / "pom.xml"
    pom.write_text(
        f'<project xmlns="http://maven.apache.org/POM/4.0.0"><properties>{properties}'
        "</properties></project>"
    )
    return pom


def test_a_pinned_release_is_read(tmp_path: Path) -> None:
    pom = _pom(tmp_path, "<a.version> 1.11.0 </a.version><b>text</b>")
    assert pom_property(pom, "a.version", release=True) == "1.11.0"
    assert pom_property(pom, "b") == "text"


@pytest.mark.parametrize("value", ["LATEST", "[1.0,2.0)", "1.11", "1.11.0-SNAPSHOT"])
def test_a_release_pin_refuses_anything_but_a_version(tmp_path: Path, value: str) -> None:
    pom = _pom(tmp_path, f"<a.version>{value}</a.version>")
    with pytest.raises(ValueError, match=r"a\.version must be a release"):
        pom_property(pom, "a.version", release=True)
    assert pom_property(pom, "a.version") == value


@pytest.mark.parametrize("properties", ["", "<a.version></a.version>", "<b>1.0.0</b>"])
def test_a_missing_or_empty_property_is_named(tmp_path: Path, properties: str) -> None:
    with pytest.raises(ValueError, match=r"no <properties><a\.version>"):
        pom_property(_pom(tmp_path, properties), "a.version")


def test_our_poms_pin_releases() -> None:
    for version in (
        s3a.hadoop_version(),
        _kafka.kafka_version(),
        _rabbitmq.client_version(),
        pom_property(_kafka.POM, "log4j.version", release=True),
    ):
        assert version.count(".") == 2 and version.replace(".", "").isdigit()
