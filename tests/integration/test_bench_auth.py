"""`make bench` measures the cost of authentication: the broker bench's `ours-go-auth` system
(our broker with `--auth kubernetes` against a real kube-apiserver, driven by the Go client) is
measured through every phase, the report has the cost table and figures from its server-bound
pair with `ours-go` (blocks of A B B A probes), and the control plane is gone afterwards.
`ours-auth` (the Python load generator with a token) still runs when named."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _apiservers_under(root: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"kube-apiserver" in a for a in cmdline) and any(
            str(root).encode() in a for a in cmdline
        ):
            found.append(int(proc.name))
    return found


def test_quick_bench_measures_produce_with_authentication_on_and_off(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    keys = "ours-go,ours-go-auth,ours-auth"
    env = {**os.environ, "BENCH_BROKER_SYSTEMS": keys, "TMPDIR": str(scratch)}
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "bench.run", "--quick", "--only", "broker", "--out", str(out)]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=420)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    [section] = json.loads((out / "latest.json").read_text())["sections"]
    systems = {s["key"]: s for s in section["data"]["systems"]}
    assert set(systems) == set(keys.split(","))
    for key in ("ours-go-auth", "ours-auth"):
        assert "--auth kubernetes" in systems[key]["version"]
    for s in systems.values():
        assert s["error"] is None
        for payload in ("100", "1024"):
            run = s["runs"][payload]
            assert run["saturation"] > 0
            assert run["steps"][1]["kind"] == "80%" and run["steps"][1]["p99_ms"] > 0
            for step in run["steps"]:
                server = step["server"]
                for stage in ("frame", "stage", "write", "sync", "visible", "ack"):
                    mean, p99 = server[f"{stage}MeanMs"], server[f"{stage}P99LeMs"]
                    assert mean > 0 and p99 > 0, (stage, server)
    costs = {
        f["labels"]["payload"]: f["value"]
        for f in section["figures"]
        if f["name"] == "auth_throughput_cost"
    }
    assert set(costs) == {"100", "1024"}
    for payload, cost in costs.items():
        # One block of A B B A probes in quick mode: two of each, not in the saturation.
        off, on = (
            [s["achieved"] for s in systems[key]["runs"][payload]["steps"] if s["kind"] == "pair"]
            for key in ("ours-go", "ours-go-auth")
        )
        assert len(off) == len(on) == 2 and min(off + on) > 0
        ratio = statistics.geometric_mean(on) / statistics.geometric_mean(off)
        assert abs(cost - 100 * (1 - ratio)) < 1e-6
        python_steps = systems["ours-auth"]["runs"][payload]["steps"]
        assert not [s for s in python_steps if s["kind"] == "pair"]
    markdown = (out / "latest.md").read_text()
    assert "Authentication cost (same run, interleaved" in markdown
    assert "segment broker (Go client), --auth kubernetes against authentication off" in markdown
    assert "where an entry's time goes, by stage" in markdown
    assert "p99 <= 10 ms at 50 % of saturation, 1024 B" in markdown
    assert "authentication costs < 5% throughput, 100 B" in markdown
    assert _apiservers_under(scratch) == []
