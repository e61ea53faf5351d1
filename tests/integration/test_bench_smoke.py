"""`python -m bench.run --quick --only broker` starts the peers, measures, stops them, reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (shutil.which("nats-server") or os.path.exists("/usr/sbin/nats-server"))
        or not shutil.which("redis-server"),
        reason="nats-server and redis-server are needed (apt-get install nats-server redis-server)",
    ),
]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_quick_bench_runs_the_peers_and_stops_them(tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_BROKER_SYSTEMS": "nats,redis"}
    cmd = [sys.executable, "-m", "bench.run", "--quick", "--only", "broker", "--out", str(tmp_path)]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    report = json.loads((tmp_path / "latest.json").read_text())
    [section] = report["sections"]
    systems = {s["key"]: s for s in section["data"]["systems"]}
    assert set(systems) == {"nats", "redis"}
    for s in systems.values():
        assert s["error"] is None
        assert not _running(s["serverPid"])
        for payload in ("100", "1024"):
            run = s["runs"][payload]
            assert run["saturation"] > 0
            assert [st["kind"] for st in run["steps"]] == ["probe", "80%", "50%"]
            at80 = run["steps"][1]
            assert at80["recorded"] > 0
            assert 0 < at80["p50_ms"] <= at80["p99_ms"] <= at80["max_ms"]
            assert run["consume"]["received"] > 0
    markdown = (tmp_path / "latest.md").read_text()
    assert "NATS JetStream" in markdown
    assert "Redis Streams" in markdown
    assert "ack before fsync" in markdown
    for payload in ("100", "1024"):
        name = f"broker-latency-{payload}B.png"
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in markdown
