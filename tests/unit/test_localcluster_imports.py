"""The local cluster of ``make run``, ``stopic local`` and the operator benchmark runs on the
real control plane: none of them may import the imitation API server's modules (issue 21)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMITATION = [
    "apiserver",
    "store",
    "objects",
    "registry",
    "schema",
    "tables",
    "discovery",
    "protobuf",
    "patches",
    "workloads",
    "gc",
    "cron",
    "selectors",
    "errors",
]


def test_local_cluster_cli_and_bench_import_no_imitation_module() -> None:
    code = (
        "import sys\n"
        "import scalable_topics.localcluster.cluster, scalable_topics.cli.main\n"
        "import scalable_topics.cli.demo, scalable_topics.cli.local, bench.operator\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('scalable_topics.')"
        " or m == 'celpy')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = set(done.stdout.split())
    imitation = {f"scalable_topics.localcluster.{name}" for name in IMITATION} | {"celpy"}
    assert "scalable_topics.localcluster.cluster" in loaded
    assert not loaded & imitation, sorted(loaded & imitation)
