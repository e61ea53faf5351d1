"""`python -m bench.run --quick --only sdk` measures the SDK's paths (ScalableTopicProducer over 4
segments -> StreamConsumers, per message and through send_many/receive_many) next to the raw
segment path, and every acknowledged message of every path's measured windows reaches the
consumers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_quick_sdk_bench_reports_every_path_and_the_ratios(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench.run", "--quick", "--only", "sdk", "--out", str(tmp_path)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    [section] = json.loads((tmp_path / "latest.json").read_text())["sections"]
    assert section["name"] == "sdk" and section["error"] is None
    results = section["data"]["results"]
    assert set(results) == {"raw", "sdk", "sdk-batch"}
    for path in results.values():
        for phase in ("capacity", "latency"):
            step = path[phase]
            assert step["produce_msg_s"] > 0 and step["e2e_msg_s"] > 0
            assert step["errors"] == 0
            assert step["unreceived"] == 0, "an acknowledged message never reached a consumer"
            assert 0 < step["e2e_p50_ms"] <= step["e2e_p99_ms"] <= step["e2e_max_ms"]
        assert path["latency"]["offered_msg_s"] == results["sdk"]["latency"]["offered_msg_s"]
    raw = results["raw"]["capacity"]["e2e_msg_s"]
    assert section["data"]["ratio"] == pytest.approx(
        results["sdk-batch"]["capacity"]["e2e_msg_s"] / raw
    )
    assert section["data"]["per_message_ratio"] == pytest.approx(
        results["sdk"]["capacity"]["e2e_msg_s"] / raw
    )
    markdown = (tmp_path / "latest.md").read_text()
    assert "SDK end-to-end throughput (send_many / receive_many) / raw segment path" in markdown
    assert "Per message (send_async, receive, ack) the SDK reaches" in markdown
