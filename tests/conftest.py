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
    "tests/integration/test_cli.py": 300,
    "tests/integration/test_real_api.py": 200,
    "tests/integration/test_load_history_s3.py": 160,
    "tests/integration/test_operator_crash.py": 150,
    "tests/integration/test_chaos_keyshared.py": 140,
    "tests/integration/test_operator_move.py": 130,
    "tests/integration/test_operator_autoscale.py": 120,
    "tests/integration/test_docs_commands.py": 120,
    "tests/integration/test_operator_lost_status.py": 110,
    "tests/integration/test_recommender_job.py": 100,
    "tests/integration/test_chaos.py": 90,
    "tests/integration/test_operator_lifecycle.py": 90,
    "tests/integration/test_localcluster_cli.py": 80,
    "tests/e2e/test_cluster.py": 70,
    "tests/integration/test_broker_crash.py": 60,
    "tests/integration/test_bench_auth.py": 55,
    "tests/integration/test_chaos_lost_status.py": 55,
    "tests/integration/test_broker_fuzz.py": 50,
    "tests/integration/test_broker_corruption.py": 45,
    "tests/integration/test_client_keyshared.py": 45,
    "tests/integration/test_real_kubelet_pods.py": 45,
    "tests/integration/test_security.py": 45,
    "tests/integration/test_operator_retention.py": 40,
    "tests/integration/test_real_controlplane.py": 40,
}
"""Seconds a module takes, roughly (setup, call and teardown of its tests, from
``--durations`` of serial and ``-n 4`` runs on the 2-core machine): only the order matters.
Modules not listed follow in collection order, integration and end-to-end before unit."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, order the items slowest module first. Every worker orders the same
    way (xdist checks it): a stable sort on fixed weights keeps each module's own order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def weight(item: pytest.Item) -> tuple[float, bool]:
        module = item.path.relative_to(config.rootpath).as_posix()
        return (-MODULE_SECONDS.get(module, 0.0), module.startswith("tests/unit/"))

    items.sort(key=weight)
