"""Build or fetch, once per machine, the outside parts the tests run: ``make test-deps``, which
``make test`` runs before pytest.

Each of them is also made on first use by its fixture, but there the test's timeout
(``timeout = 300`` in pyproject.toml) covers the fixture too, and a first build takes longer
than that (the Kubernetes binaries about 7 min on 2 idle cores, MinIO about 8). Here nothing
cuts it short. A part that cannot be had is reported and left to its tests, which skip or fail
saying why.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from bench._kafka import ensure_kafka
from bench._native import build_go_tool
from bench._ours_go import TOOL_DIR as SEGMENT_BENCH_DIR
from bench._procs import ensure_debian_package
from bench._rabbitmq import ensure_client as ensure_rabbitmq_client
from scalable_topics.localcluster.controlplane import kube_binary
from scalable_topics.recommender.s3a import ensure_jars

from .integration.s3_server import minio_binary
from .prometheus_binaries import PACKAGE as PROMETHEUS_PACKAGE

STEPS: tuple[tuple[str, Callable[[], Any]], ...] = (
    ("Kubernetes binaries (hack/kube)", kube_binary),
    ("MinIO (S3 server of the load-history tests)", minio_binary),
    ("hadoop-aws jars (s3a:// for Spark)", ensure_jars),
    ("Kafka jars (the benchmark's peer)", ensure_kafka),
    (
        "Debian rabbitmq-server (the benchmark's peer)",
        lambda: ensure_debian_package("rabbitmq-server", "rabbitmq-server"),
    ),
    ("RabbitMQ stream client (StreamBench.java)", ensure_rabbitmq_client),
    ("segment-bench (bench/ours-go)", lambda: build_go_tool(SEGMENT_BENCH_DIR, "segment-bench")),
    ("Debian prometheus (promtool)", lambda: ensure_debian_package("promtool", PROMETHEUS_PACKAGE)),
)


def main() -> int:
    for name, step in STEPS:
        started = time.monotonic()
        try:
            step()
        except Exception as exc:  # reported; the tests that need it say why they skip or fail
            print(f"test-deps: {name}: not available: {exc}", file=sys.stderr, flush=True)
            continue
        print(f"test-deps: {name}: ready ({time.monotonic() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
