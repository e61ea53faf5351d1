"""The cluster the end-to-end tests run against: ``deployed_cluster``.

With ``SCALABLE_TOPICS_E2E_KUBECONFIG`` set, a cluster of your own where ``make deploy`` was
done (kind, k3d, a real one), driven by the ``kubectl`` on ``PATH`` (or
``SCALABLE_TOPICS_E2E_KUBECTL``). Without it — inside ``make test`` — the local control plane,
brought up the way docs/localcluster.md tells a new user to: ``stopic local up`` in the
background, then ``kubectl apply`` of ``crds/`` and ``-k manifests/overlays/local`` with the
pinned kubectl it links as ``DIR/bin/kubectl``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scalable_topics.localcluster.controlplane import kube_binary

KUBECONFIG_ENV = "SCALABLE_TOPICS_E2E_KUBECONFIG"
KUBECTL_ENV = "SCALABLE_TOPICS_E2E_KUBECTL"
TIMEOUT = float(os.environ.get("SCALABLE_TOPICS_E2E_TIMEOUT", "180"))
REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "scalable-topics"
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class DeployedCluster:
    kubeconfig: Path
    kubectl: str


def _kubectl(cluster: DeployedCluster, *args: str, timeout: float = TIMEOUT) -> str:
    result = subprocess.run(
        [cluster.kubectl, "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr or result.stdout}")
    return result.stdout


def _await_api(cluster: DeployedCluster, up: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``stopic local up`` serves (its kubeconfig answers ``/readyz``), or fail with its
    log when it exits or the deadline passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if up.poll() is not None:
            raise AssertionError(f"stopic local up exited {up.returncode}:\n{log.read_text()}")
        if cluster.kubeconfig.exists() and Path(cluster.kubectl).exists():
            readyz = ("get", "--raw", "/readyz")
            probe = subprocess.run(
                [cluster.kubectl, "--kubeconfig", str(cluster.kubeconfig), *readyz],
                capture_output=True,
                timeout=30,
            )
            if probe.returncode == 0:
                return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"stopic local up not serving in {START_TIMEOUT:g}s:\n{log.read_text()}"
            )
        time.sleep(0.2)


@pytest.fixture(scope="package")
def deployed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeployedCluster]:
    kubeconfig = os.environ.get(KUBECONFIG_ENV)
    if kubeconfig:
        kubectl = os.environ.get(KUBECTL_ENV) or shutil.which("kubectl") or "kubectl"
        yield DeployedCluster(Path(kubeconfig), kubectl)
        return
    kube_binary()  # builds it (with progress) on a machine that has not yet
    data_dir = tmp_path_factory.mktemp("e2e-cluster")
    log = data_dir.parent / f"{data_dir.name}-up.log"
    cluster = DeployedCluster(data_dir / "kubeconfig", str(data_dir / "bin" / "kubectl"))
    stopic = (sys.executable, "-m", "scalable_topics.cli.main")
    with log.open("wb") as out:
        up = subprocess.Popen(
            [*stopic, "local", "up", "--data-dir", str(data_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        _await_api(cluster, up, log)
        _kubectl(cluster, "apply", "-f", str(REPO / "crds"))
        _kubectl(cluster, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        _kubectl(cluster, "apply", "-k", str(REPO / "manifests" / "overlays" / "local"))
        # The recommender's Spark job would start a JVM if the run spans a 10-minute mark; these
        # tests do not look at recommendations.
        _kubectl(
            cluster,
            *("-n", NAMESPACE, "patch", "cronjob", "scalable-topics-recommender"),
            *("--type=merge", "-p", '{"spec":{"suspend":true}}'),
        )
        for workload in ("deployment/scalable-topics-operator", "statefulset/segment-broker"):
            _kubectl(
                cluster,
                *("-n", NAMESPACE, "rollout", "status", workload, f"--timeout={TIMEOUT:.0f}s"),
            )
        yield cluster
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
