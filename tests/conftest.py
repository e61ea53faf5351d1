"""How the suite is spread over pytest-xdist workers (``make test`` runs ``-n``, see README).

Each worker is a pytest session of its own: session fixtures (the session control plane, the
operator stacks' control-plane template, MinIO, Kafka) run once per worker, in the worker's own
base temporary directory, on ports picked free, and each running kubelet claims its pod subnet
machine-wide (``localcluster.kubelet.IPAllocator.claim``), so workers share nothing but the
caches in ``~/.cache`` that ``make test-deps`` filled before pytest.

``make test`` distributes with ``--dist loadscope``: a module (a class, for tests in one) is one
unit that one worker runs in order, so a module's shared fixture (an operator stack, ``stopic
local up``) starts once. (``loadgroup`` could spread the other modules test by test, but with
pytest 9 xdist 3.8 no longer groups by its marks.) Units go out in collection order
(``--no-loadscope-reorder``), which :func:`pytest_collection_modifyitems` sets slowest module
first, so long modules start at once and short ones fill the end of the run instead of one
worker finishing a long module alone.
"""

from __future__ import annotations

import os

import pytest

MODULE_SECONDS: dict[str, float] = {
    "tests/integration/test_demo_existing_cluster.py": 525,
    "tests/integration/test_cli.py": 454,
    "tests/integration/test_recommender_job.py": 383,
    "tests/integration/test_load_history_s3.py": 301,
    "tests/integration/test_operator_move.py": 243,
    "tests/integration/test_operator_crash.py": 241,
    "tests/integration/test_operator_lost_status.py": 155,
    "tests/integration/test_operator_autoscale.py": 139,
    "tests/integration/test_recommender_k8s.py": 126,
    "tests/integration/test_chaos_keyshared.py": 120,
    "tests/integration/test_docs_commands.py": 108,
    "tests/integration/test_localcluster_cli.py": 102,
    "tests/integration/test_operator_retention.py": 81,
    "tests/integration/test_kafka_peer.py": 76,
    "tests/integration/test_broker_crash.py": 74,
    "tests/integration/test_broker_corruption.py": 70,
    "tests/integration/test_bench_auth.py": 62,
    "tests/integration/test_chaos.py": 60,
    "tests/integration/test_operator_metrics.py": 59,
    "tests/integration/test_chaos_lost_status.py": 55,
    "tests/integration/test_operator_lifecycle.py": 55,
    "tests/integration/test_security.py": 53,
    "tests/integration/test_real_controlplane.py": 47,
    "tests/integration/test_operator_failover.py": 47,
    "tests/integration/test_client_queue_order.py": 46,
    "tests/e2e/test_cluster.py": 44,
    "tests/integration/test_bench_smoke.py": 43,
    "tests/integration/test_real_kubelet_pods.py": 41,
    "tests/integration/test_demo_start_state.py": 39,
    "tests/integration/test_tls.py": 37,
    "tests/integration/test_client_queue_operator.py": 37,
    "tests/integration/test_prometheus.py": 37,
    "tests/integration/test_client_keyshared.py": 33,
    "tests/integration/test_operator_liveness.py": 33,
    "tests/integration/test_client_operator_leave.py": 33,
    "tests/integration/test_real_kubelet.py": 31,
    "tests/integration/test_bench_sdk.py": 30,
    "tests/integration/test_real_api.py": 25,
    "tests/unit/test_core_assignment.py": 24,
    "tests/integration/test_client_split.py": 20,
    "tests/integration/test_operator_corruption.py": 19,
    "tests/integration/test_demo_loopback.py": 18,
    "tests/integration/test_broker_fence.py": 17,
    "tests/integration/test_broker_fuzz.py": 16,
    "tests/integration/test_client_close.py": 16,
}
"""Seconds a module took (setup, call and teardown of its tests) in a ``make test`` on 4 workers
on the 2-core machine, load average about 13 with other work: only the order matters. Modules
not listed (under 15 s) follow in collection order, integration and end-to-end before unit. A
new slow module belongs here, or it may end the run alone."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, order the items slowest module first. Every worker orders the same
    way (xdist checks it): a stable sort on fixed weights keeps each module's own order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def weight(item: pytest.Item) -> tuple[float, bool]:
        module = item.path.relative_to(config.rootpath).as_posix()
        return (-MODULE_SECONDS.get(module, 0.0), module.startswith("tests/unit/"))

    items.sort(key=weight)
