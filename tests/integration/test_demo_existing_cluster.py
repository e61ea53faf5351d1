"""``stopic demo --existing-cluster`` (``make run CLUSTER=existing``, issue 21): the demo on a
cluster named by ``KUBECONFIG``, its producer and consumers in the cluster as Job
``scalable-topics-demo/demo-load`` under ServiceAccount ``demo-load``.

The only cluster here is the local control plane, started on its own data directory and handed
to the demo as a foreign one would be: its kubeconfig in ``KUBECONFIG``, its kubectl on ``PATH``.
Our kubelet runs the Job's Pod as a local process from the project's code (the image is
ignored), so the in-cluster path - the Job, its ServiceAccount tokens, the operator found from
inside - is what runs. The overlay is ``manifests/overlays/local-secure`` (a real cluster takes
``manifests/base``, whose requests do not fit this machine's one node) with the recommender's
CronJob suspended, as the e2e tests do, so no Spark job starts mid-run.

What is checked is what the user sees: the exit status, the context named before anything is
applied, the report (nothing lost, key order held, both splits and the merge) and the cleanup
commands; and, while it runs, that the demo process never connects to a Pod's address.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client as k8s

from scalable_topics.cli.demo_cluster import DEMO_NAMESPACE, LOAD_JOB, load_result
from scalable_topics.kubeapi import api_client
from scalable_topics.localcluster.cluster import LocalCluster

from .operator_harness import REPO
from .test_demo_loopback import _address, sockets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

PHASE_TIMEOUT = 240
OVERLAY = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
patches:
  - patch: |-
      apiVersion: batch/v1
      kind: CronJob
      metadata:
        name: scalable-topics-recommender
        namespace: scalable-topics
      spec:
        suspend: true
"""


def write_overlay(where: Path) -> Path:
    where.mkdir()
    base = os.path.relpath(REPO / "manifests/overlays/local-secure", where)
    (where / "kustomization.yaml").write_text(OVERLAY.format(base=base))
    return where


async def pod_addresses(api: k8s.ApiClient) -> set[str]:
    pods = await k8s.CoreV1Api(api).list_pod_for_all_namespaces()
    return {p.status.pod_ip for p in pods.items if p.status and p.status.pod_ip}


def remote_addresses(pid: int) -> set[str]:
    """Addresses process ``pid`` is connected to."""
    found = set()
    for _, _, remote, _ in sockets(pid):
        address = _address(remote.split(":")[0])
        if not address.is_unspecified:
            found.add(str(address))
    return found


async def run_demo(
    api: k8s.ApiClient, env: dict[str, str], cwd: Path, *args: str
) -> tuple[int, str, set[str]]:
    """``stopic demo --existing-cluster ARGS`` to its end: exit status, output, and the Pod
    addresses the demo process was seen connected to (sampled while it ran)."""
    demo = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "scalable_topics.cli.main", "demo", "--existing-cluster", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    )
    dialled: set[str] = set()

    async def watch_sockets() -> None:
        while demo.returncode is None:
            pods = await pod_addresses(api) - {"127.0.0.1"}
            try:
                dialled.update(remote_addresses(demo.pid) & pods)
            except FileNotFoundError:
                return  # the process has ended
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch_sockets())
    try:
        assert demo.stdout is not None
        out = (await asyncio.wait_for(demo.stdout.read(), 6 * PHASE_TIMEOUT)).decode()
        rc = await demo.wait()
        await watcher
        return rc, out, dialled
    finally:
        if demo.returncode is None:
            demo.kill()
            await demo.wait()
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


def assert_reported(out: str) -> None:
    """The end of a successful run as the user reads it."""
    lines = out.splitlines()
    assert "    lost: 0" in lines, out
    assert "    per-key order: held over 200 keys" in lines, out
    assert any(
        line.startswith("    DAG: split on load (epoch 0 -> 1), split on consumers ")
        and "merged when cold" in line
        for line in lines
    ), out
    assert any(line.startswith("  job | ") for line in lines), out


async def test_demo_on_an_existing_cluster_runs_its_load_in_the_cluster(tmp_path: Path) -> None:
    overlay = write_overlay(tmp_path / "overlay")
    async with LocalCluster(tmp_path / "cluster", stop_grace=0.5) as cluster:
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "PATH": f"{cluster.kubectl.parent}{os.pathsep}{os.environ['PATH']}",
        }
        api = await api_client(str(cluster.kubeconfig))
        try:
            flags = ("--overlay", str(overlay), "--phase-timeout", str(PHASE_TIMEOUT))
            rc, out, dialled = await run_demo(api, env, tmp_path, *flags)
            assert rc == 0, out
            lines = out.splitlines()
            [using] = [i for i, line in enumerate(lines) if "using context" in line]
            assert str(cluster.kubeconfig) in lines[using] and cluster.url in lines[using], out
            assert using < next(i for i, line in enumerate(lines) if "applying" in line), out
            assert_reported(out)
            assert f"    kubectl delete namespace {DEMO_NAMESPACE}" in lines, out
            assert not dialled, f"the demo process connected to Pods at {dialled}"

            # The load ran in the cluster, as the Job's Pod under its own ServiceAccount, and
            # its result is the one reported.
            job = await k8s.BatchV1Api(api).read_namespaced_job(LOAD_JOB, DEMO_NAMESPACE)
            assert job.status.succeeded == 1
            core = k8s.CoreV1Api(api)
            selector = f"job-name={LOAD_JOB}"
            [pod] = (await core.list_namespaced_pod(DEMO_NAMESPACE, label_selector=selector)).items
            assert pod.spec.service_account_name == "demo-load"
            log = await core.read_namespaced_pod_log(pod.metadata.name, DEMO_NAMESPACE)
            result = load_result(log)
            assert result is not None and result.ok(), result
            assert result.lost == 0 and result.out_of_order == 0 and result.keys == 200
            assert result.acked > 0 and result.received >= result.acked
            assert result.epochs[0] == 0 and result.epochs == sorted(set(result.epochs))
            assert f"received {result.received}" in out, out

            # Again, naming the context, with --cleanup: the earlier run's Job and topic make
            # way for new ones, and the demo's namespace is gone at the end; the operator and
            # the brokers stay.
            [context] = yaml.safe_load(cluster.kubeconfig.read_text())["contexts"]
            again = (*flags, "--cleanup", "--context", context["name"])
            rc, out, dialled = await run_demo(api, env, tmp_path, *again)
            assert rc == 0, out
            assert f"using context '{context['name']}'" in out, out
            assert "topic orders is left from an earlier run" in out, out
            assert_reported(out)
            assert f"--cleanup: deleting namespace {DEMO_NAMESPACE}" in out, out
            assert f"    kubectl delete namespace {DEMO_NAMESPACE}" not in out.splitlines(), out
            assert not dialled, f"the demo process connected to Pods at {dialled}"
            with pytest.raises(k8s.ApiException) as gone:
                await core.read_namespace(DEMO_NAMESPACE)
            assert gone.value.status == 404
            operator = await k8s.AppsV1Api(api).read_namespaced_deployment(
                "scalable-topics-operator", "scalable-topics"
            )
            assert operator.status.ready_replicas == 2
        finally:
            await api.close()
