"""``stopic local up|down|reset`` as real processes on the real control plane, the data
directory lock, and the kubelet's stop grace."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from scalable_topics.localcluster.cluster import LocalCluster
from scalable_topics.localcluster.datadir import (
    EXIT_IN_USE,
    HOLDER_FILE,
    DataDirInUse,
    Holder,
    running,
)

from .conftest import KubectlResult, eventually, run_kubectl

pytestmark = pytest.mark.integration

START_WITHIN = 120.0
"""Seconds for ``local up`` to serve (~10 s on a fresh directory; the machine is shared)."""
STOP_WITHIN = 5.0
"""Seconds Ctrl-C (or ``local down``) gets to stop the four components and the pods
(docs/localcluster.md)."""


@dataclass(frozen=True)
class Probe:
    """Another terminal on ``data``: its kubeconfig and the kubectl ``local up`` linked."""

    data_dir: Path

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "kubeconfig"

    async def kubectl(self, *args: str, input: str | None = None) -> KubectlResult:
        kubectl = str(self.data_dir / "bin" / "kubectl")
        return await run_kubectl(self, *args, input=input, kubectl=(kubectl,))


async def _stopic(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "scalable_topics.cli.main",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _serving(data: Path, up: asyncio.subprocess.Process) -> Holder:
    """Wait until the ``local up`` process ``up`` says it serves (its kubeconfig and kubectl
    written), and check that it holds ``data``."""
    assert up.stdout is not None
    async with asyncio.timeout(START_WITHIN):
        while not (line := await up.stdout.readline()).startswith(b"local control plane serving"):
            assert line, "stopic local up exited early"
    holder = running(data)
    assert holder is not None and holder.pid == up.pid
    return holder


async def test_local_up_serves_kubectl_and_down_stops_it(tmp_path: Path) -> None:
    data = tmp_path / "state"
    up = await _stopic("local", "up", "--data-dir", str(data), "--no-kubelet")
    try:
        holder = await _serving(data, up)
        assert holder.api_url.startswith("https://127.0.0.1:")
        probe = Probe(data)
        version = (await probe.kubectl("version", "-o", "json")).json()
        assert version["clientVersion"]["gitVersion"] == "v1.37.2"
        assert version["serverVersion"]["gitVersion"] == "v1.37.2"
        result = await probe.kubectl("get", "namespaces", "-o", "name")
        assert "namespace/kube-system" in result.stdout.split()
        created = (
            await probe.kubectl(
                "create",
                "-o",
                "json",
                "-f",
                "-",
                input='{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kept"}}',
            )
        ).json()

        down = await _stopic("local", "down", "--data-dir", str(data))
        _, err = await asyncio.wait_for(down.communicate(), 60)
        assert down.returncode == 0, err.decode()
        assert await asyncio.wait_for(up.wait(), 30) == 0
        assert up.stdout is not None
        out = (await asyncio.wait_for(up.stdout.read(), 10)).decode()
        assert f"kubectl: {data / 'bin' / 'kubectl'}" in out, out
        assert f"export PATH={data / 'bin'}:" in out, out
        assert running(data) is None
        assert not (data / HOLDER_FILE).exists()
    finally:
        if up.returncode is None:
            up.kill()
            await up.wait()

    # A restart keeps every object, uid included.
    async with LocalCluster(data, kubelet=False) as again:
        assert again.kubectl.exists()
        kept = await Probe(data).kubectl("get", "configmap", "kept", "-o", "json")
        assert kept.json()["metadata"]["uid"] == created["metadata"]["uid"]

    gone = await _stopic("local", "down", "--data-dir", str(data))
    await gone.communicate()
    assert gone.returncode == 1


async def _exit_within(proc: asyncio.subprocess.Process, started: float) -> tuple[int, float, str]:
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, time.monotonic() - started, err.decode()


async def test_second_local_up_is_refused_and_a_dead_holder_is_taken_over(
    tmp_path: Path,
) -> None:
    data = tmp_path / "state"
    first = await _stopic("local", "up", "--data-dir", str(data), "--no-kubelet")
    third: asyncio.subprocess.Process | None = None
    try:
        holder = await _serving(data, first)
        probe = Probe(data)
        kubeconfig = probe.kubeconfig.read_bytes()
        await probe.kubectl("create", "configmap", "kept", "--from-literal=k=v")

        # `local` commands start without the SDK and the Kubernetes client (about 0.1 s).
        for command in (("local", "up"), ("demo",), ("local", "reset")):
            started = time.monotonic()
            second = await _stopic(*command, "--data-dir", str(data))
            code, took, err = await _exit_within(second, started)
            assert code == EXIT_IN_USE, err
            # `demo` imports the SDK and the Kubernetes client first (~1.5 s on an idle
            # machine, over 10 s on this shared one when loaded): only `local` is timed.
            if command[0] == "local":
                assert took < 2.0, f"{' '.join(command)} took {took:.1f}s to refuse"
            assert f"pid {first.pid}, {holder.api_url}" in err, err
            assert f"stopic local down --data-dir {data}" in err, err

        assert probe.kubeconfig.read_bytes() == kubeconfig
        names = await probe.kubectl("get", "namespaces", "-o", "name")
        assert "namespace/default" in names.stdout.split()
        for kept_entry in ("etcd", "pki", "logs"):
            assert (data / kept_entry).is_dir(), f"reset removed {kept_entry} while running"

        first.kill()  # SIGKILL: the lock goes with the process, the holder record stays
        await first.wait()
        assert running(data) is None and (data / HOLDER_FILE).exists()
        third = await _stopic("local", "up", "--data-dir", str(data), "--no-kubelet")
        taken = await _serving(data, third)
        assert taken.pid == third.pid
        kept = await probe.kubectl("get", "configmap", "kept", "-o", "name")
        assert kept.stdout.strip() == "configmap/kept"

        started = time.monotonic()
        third.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(third.wait(), 30) == 0
        assert time.monotonic() - started < STOP_WITHIN

        reset = await _stopic("local", "reset", "--data-dir", str(data))
        out_bytes, err_bytes = await asyncio.wait_for(reset.communicate(), 30)
        assert reset.returncode == 0, err_bytes.decode()
        # The PKI, etcd's data, the logs, every kubeconfig and the kubectl link go; what the
        # test's kubectl wrote (its cache) is not the cluster's and stays.
        left = sorted(p.name for p in data.iterdir())
        assert left == ["kubectl-cache"], (left, out_bytes.decode())
    finally:
        for proc in (first, third):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_ctrl_c_stops_local_up_with_a_stubborn_pod(tmp_path: Path) -> None:
    """A pod that ignores SIGTERM gets the short stop grace of ``local up``, not its own 30 s."""
    data = tmp_path / "state"
    up = await _stopic("local", "up", "--data-dir", str(data))
    try:
        await _serving(data, up)
        probe = Probe(data)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "stubborn"},
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    {
                        "name": "c",
                        "image": "local",
                        "command": ["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"],
                    }
                ],
            },
        }
        await probe.kubectl("create", "-f", "-", input=json.dumps(pod))

        async def running_pod() -> bool:
            phase = await probe.kubectl("get", "pod", "stubborn", "-o", "jsonpath={.status.phase}")
            return phase.stdout == "Running"

        await eventually(running_pod, within=90, interval=0.2)
        started = time.monotonic()
        up.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(up.wait(), 30) == 0
        assert time.monotonic() - started < STOP_WITHIN
    finally:
        if up.returncode is None:
            up.kill()
            await up.wait()


async def test_a_second_cluster_object_on_the_directory_writes_nothing(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path / "c", kubelet=False) as first:
        kubeconfig = first.kubeconfig.read_bytes()
        ca = (first.data_dir / "pki" / "ca.crt").read_bytes()
        with pytest.raises(DataDirInUse, match=re.escape(f"pid {os.getpid()}, {first.url}")):
            await LocalCluster(tmp_path / "c", kubelet=False).start()
        assert first.kubeconfig.read_bytes() == kubeconfig
        assert (first.data_dir / "pki" / "ca.crt").read_bytes() == ca
        result = await run_kubectl(
            first, "get", "namespaces", "-o", "name", kubectl=(str(first.kubectl),)
        )
        assert "namespace/default" in result.stdout.split()
    async with LocalCluster(tmp_path / "c", kubelet=False) as again:
        assert again.lock.held


async def test_a_data_dir_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("mine")
    for command in (("local", "up"), ("local", "down"), ("local", "reset"), ("demo",)):
        proc = await _stopic(*command, "--data-dir", str(tmp_path / "notes"))
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 1, err.decode()
        line = err.decode().strip()
        assert line.startswith("stopic: ") and "\n" not in line, line
        assert str(tmp_path / "notes") in line and "directory" in line, line
    assert (tmp_path / "notes").read_text() == "mine"
