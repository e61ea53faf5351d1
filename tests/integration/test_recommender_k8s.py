"""The recommender CronJob in the base's Kubernetes mode on the real control plane: Spark's own
Kubernetes scheduler backend (``k8s://`` master from the Pod's Service variables) creates the
executor Pods through the API server from the executor pod template, under the recommender's
ServiceAccount and Role; our kubelet runs them as local JVMs; they read the history claim; the
driver writes ``status.recommendation``, deletes its executors, and the Job completes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from scalable_topics.localcluster.nodekubelet import NodeKubelet
from scalable_topics.localcluster.restclient import PODS, Resource, client_from_kubeconfig
from scalable_topics.recommender.writer import TopicStore

from .conftest import ClusterNamespace, eventually
from .test_recommender_job import RECOMMENDER, create_topics, write_history_on_claim

pytestmark = [pytest.mark.spark, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
BASE_NS = "scalable-topics"
JOBS = Resource("batch", "v1", "jobs")
JOB = "recommender-k8s"
DRIVER = "app.kubernetes.io/name=scalable-topics-recommender,app.kubernetes.io/component=driver"
EXECUTORS = "spark-role=executor"


def overlay(directory: Path, namespace: str) -> Path:
    """``manifests/overlays/local`` as it is (its CronJob in the base's Kubernetes mode) in
    ``namespace``, without operator or brokers, and with the CronJob suspended: the test starts
    its Job itself (``kubectl create job --from``) instead of waiting for the schedule."""
    directory.mkdir(parents=True, exist_ok=True)

    def patch(api: str, kind: str, name: str, **body: Any) -> dict[str, Any]:
        meta = {"name": name} if kind == "Namespace" else {"name": name, "namespace": BASE_NS}
        return {"apiVersion": api, "kind": kind, "metadata": meta, **body}

    patches = [
        patch("v1", "Namespace", BASE_NS, **{"$patch": "delete"}),
        patch("apps/v1", "Deployment", "scalable-topics-operator", spec={"replicas": 0}),
        patch("apps/v1", "StatefulSet", "segment-broker", spec={"replicas": 0}),
        patch("batch/v1", "CronJob", RECOMMENDER, spec={"suspend": True}),
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "resources": [os.path.relpath(REPO / "manifests" / "overlays" / "local", directory)],
        "patches": [{"patch": json.dumps(p)} for p in patches],
    }
    (directory / "kustomization.yaml").write_text(json.dumps(kustomization))
    return directory


async def test_spark_on_kubernetes_runs_executor_pods_and_writes_recommendations(
    local_cluster: ClusterNamespace, local_node: NodeKubelet, tmp_path: Path
) -> None:
    ns = local_cluster.namespace
    kustomized = overlay(tmp_path / "overlay", ns)
    store = await asyncio.to_thread(TopicStore.connect, str(local_cluster.kubeconfig))
    admin = client_from_kubeconfig(local_cluster.kubeconfig)
    try:
        await create_topics(local_cluster, store, {"orders": 4})
        await local_cluster.kubectl("apply", "-k", str(kustomized))
        await write_history_on_claim(local_cluster, local_node, admin)

        await local_cluster.kubectl("create", "job", JOB, f"--from=cronjob/{RECOMMENDER}")
        executors: dict[str, dict[str, Any]] = {}

        async def job_finished() -> bool:
            pods, _ = await admin.list(PODS, ns, label_selector=EXECUTORS)
            for pod in pods:
                status = pod.get("status") or {}
                seen = executors.setdefault(pod["metadata"]["name"], {"phases": set()})
                seen["phases"].add(status.get("phase"))
                seen["pod"] = pod
            job = await admin.get(JOBS, ns, JOB)
            status = job.get("status") or {}
            if status.get("failed"):
                raise AssertionError(f"recommender job failed: {await _logs(local_cluster)}")
            return bool(status.get("succeeded"))

        await eventually(job_finished, within=300, interval=0.5)
        (driver,) = (await admin.list(PODS, ns, label_selector=DRIVER))[0]
        assert driver["spec"]["nodeName"] == local_node.node_name
        assert driver["spec"]["serviceAccountName"] == RECOMMENDER
        assert driver["status"]["phase"] == "Succeeded"

        # Spark created the executors from the template (its labels, its command) as Pods owned
        # by the driver Pod; the scheduler put them on our node and the kubelet ran them.
        assert len(executors) == 2, sorted(executors)
        for name, seen in executors.items():
            pod = seen["pod"]
            assert "Running" in seen["phases"], (name, seen["phases"])
            assert pod["spec"]["nodeName"] == local_node.node_name
            labels = pod["metadata"]["labels"]
            assert labels["app.kubernetes.io/component"] == "executor"
            (container,) = pod["spec"]["containers"]
            assert container["command"] == ["python", "-m", "scalable_topics.recommender.executor"]
            assert container["args"] == ["executor"]
            # Bound to its Pod address, not the host's interface (SPARK_LOCAL_IP).
            log = local_node.agent.layout.log_path(ns, name, "executor").read_text()
            assert "resolves to a loopback address" not in log, log[-2000:]
            owners = pod["metadata"]["ownerReferences"]
            assert [(o["kind"], o["name"]) for o in owners] == [("Pod", driver["metadata"]["name"])]

        # The driver deleted its executors when the application ended.
        async def executors_gone() -> bool:
            pods, _ = await admin.list(PODS, ns, label_selector=EXECUTORS)
            return not pods

        await eventually(executors_gone, within=60)

        log = await _driver_log(local_cluster)
        # Nothing Spark asked of the API server was refused (the Role in recommender-rbac.yaml;
        # Spark logs a refused cleanup and carries on).
        assert "forbidden" not in log.lower(), log[-4000:]
        summary = _summary(log)
        assert summary["quality"]["valid"] > 0
        # The work ran on the executor Pods (a k8s:// driver runs no task itself).
        assert sorted(e["host"] for e in summary["executors"]) == sorted(
            s["pod"]["status"]["podIP"] for s in executors.values()
        )
        assert sum(e["tasks"] for e in summary["executors"]) > 0
        obj = await asyncio.to_thread(store.get_topic, ns, "orders")
        assert obj is not None
        rec = obj["status"]["recommendation"]
        assert rec["basedOnEpoch"] == 0 and rec["window"] == "1h"
        assert [(a["kind"], a["segments"]) for a in rec["actions"]][:1] == [("split", [1])]
    finally:
        await local_cluster.kubectl("delete", "-k", str(kustomized), "--wait=false", check=False)
        await admin.close()
        store.close()


def _summary(log: str) -> dict[str, Any]:
    """The recommender's JSON summary: the last line of its output that is a JSON object."""
    for line in reversed(log.splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    raise AssertionError(f"no summary in the driver's log:\n{log[-4000:]}")


async def _driver_log(cluster: ClusterNamespace) -> str:
    result = await cluster.kubectl("logs", f"job/{JOB}", check=False)
    return result.stdout + result.stderr


async def _logs(cluster: ClusterNamespace) -> str:
    result = await cluster.kubectl(
        "logs", "-l", "app.kubernetes.io/name=scalable-topics-recommender", "--tail=60", check=False
    )
    return result.stdout + result.stderr
