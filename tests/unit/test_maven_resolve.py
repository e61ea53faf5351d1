"""``resolve_into``: the one Maven resolution of the s3a jars, Kafka's and RabbitMQ's stream
client. A stand-in ``mvn`` on PATH writes what a real one would into ``-DoutputDirectory``."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from scalable_topics.recommender.s3a import MavenMissing, resolve_into

FAKE_MVN = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in -DoutputDirectory=*) out="${arg#-DoutputDirectory=}" ;; esac
done
[ -n "$FAIL" ] && { echo "resolution failed" >&2; exit 1; }
mkdir -p "$out" && touch "$out/a-1.jar" "$out/b-2.jar"
"""


@pytest.fixture
def fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(FAKE_MVN)
    mvn.chmod(mvn.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return mvn


def test_the_jars_land_in_lib_once_the_check_accepted_them(fake_mvn: Path, tmp_path: Path) -> None:
    seen: list[list[str]] = []
    lib = tmp_path / "cache" / "lib"
    lib.parent.mkdir()
    resolve_into(tmp_path / "pom.xml", lib, tmp_path / "m2", timeout=30, check=seen.append)
    assert seen == [["a-1.jar", "b-2.jar"]]
    assert sorted(p.name for p in lib.iterdir()) == ["a-1.jar", "b-2.jar"]
    assert not (tmp_path / "cache" / "lib.partial").exists()


def test_a_refused_or_failed_resolution_leaves_no_lib(
    fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "lib"

    def refuse(names: list[str]) -> None:
        raise RuntimeError(f"incomplete: {names}")

    with pytest.raises(RuntimeError, match="incomplete"):
        resolve_into(tmp_path / "pom.xml", lib, tmp_path / "m2", timeout=30, check=refuse)
    assert not lib.exists()
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(RuntimeError, match=r"(?s)mvn failed .*resolution failed"):
        resolve_into(tmp_path / "pom.xml", lib, tmp_path / "m2", timeout=30)
    assert not lib.exists()


def test_no_mvn_is_its_own_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MavenMissing):
        resolve_into(tmp_path / "pom.xml", tmp_path / "lib", tmp_path / "m2", timeout=30)
