"""``stopic local up|down|reset`` as real processes, the data directory lock, and the kubelet
hand-off."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from scalable_topics.localcluster.cluster import KubeletUnavailable, LocalCluster
from scalable_topics.localcluster.datadir import (
    EXIT_IN_USE,
    HOLDER_FILE,
    DataDirInUse,
    Holder,
    running,
)

from .conftest import eventually, run_kubectl

pytestmark = pytest.mark.integration


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
    """Wait until the ``local up`` process ``up`` holds ``data`` and serves its API."""

    def ready() -> bool:
        holder = running(data)
        return up.returncode is not None or (holder is not None and bool(holder.api_url))

    await eventually(ready, within=30)
    assert up.returncode is None, "stopic local up exited early"
    holder = running(data)
    assert holder is not None and holder.pid == up.pid
    return holder


async def test_local_up_serves_kubectl_and_down_stops_it(tmp_path: Path) -> None:
    data = tmp_path / "state"
    up = await _stopic("local", "up", "--data-dir", str(data), "--no-kubelet")
    try:
        await _serving(data, up)
        probe = LocalCluster(data, kubelet=False)
        result = await run_kubectl(probe, "get", "namespaces", "-o", "name")
        assert "namespace/kube-system" in result.stdout.split()
        await run_kubectl(
            probe,
            "create",
            "-f",
            "-",
            input='{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kept"}}',
        )

        down = await _stopic("local", "down", "--data-dir", str(data))
        _, err = await asyncio.wait_for(down.communicate(), 60)
        assert down.returncode == 0, err.decode()
        assert await asyncio.wait_for(up.wait(), 30) == 0
        assert running(data) is None
        assert not (data / HOLDER_FILE).exists()
    finally:
        if up.returncode is None:
            up.kill()
            await up.wait()

    async with LocalCluster(data, kubelet=False) as again:
        kept = await run_kubectl(
            again, "get", "configmap", "kept", "-o", "jsonpath={.metadata.name}"
        )
        assert kept.stdout == "kept"

    gone = await _stopic("local", "down", "--data-dir", str(data))
    await gone.communicate()
    assert gone.returncode == 1


async def test_sigterm_stops_local_up(tmp_path: Path) -> None:
    data = tmp_path / "state"
    up = await _stopic("local", "up", "--data-dir", str(data), "--no-kubelet")
    try:
        await _serving(data, up)
        os.kill(up.pid, 15)
        assert await asyncio.wait_for(up.wait(), 30) == 0
    finally:
        if up.returncode is None:
            up.kill()
            await up.wait()


async def test_kubelet_missing_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import scalable_topics.localcluster as package

    monkeypatch.setitem(sys.modules, "scalable_topics.localcluster.kubelet", None)
    monkeypatch.delattr(package, "kubelet", raising=False)
    with pytest.raises(KubeletUnavailable, match="--no-kubelet"):
        async with LocalCluster(tmp_path / "c", kubelet=True):
            pass
    async with LocalCluster(tmp_path / "c", kubelet=False) as cluster:
        assert cluster.url.startswith("http://127.0.0.1:")


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
        probe = LocalCluster(data, kubelet=False)
        kubeconfig = probe.kubeconfig.read_bytes()
        await run_kubectl(
            probe,
            "create",
            "configmap",
            "kept",
            "--from-literal=k=v",
        )

        # `local` commands start without the SDK and the Kubernetes client (about 0.1 s).
        for command in (("local", "up"), ("demo",), ("local", "reset")):
            started = time.monotonic()
            second = await _stopic(*command, "--data-dir", str(data))
            code, took, err = await _exit_within(second, started)
            assert code == EXIT_IN_USE, err
            assert took < 2.0, f"{' '.join(command)} took {took:.1f}s to refuse"
            assert f"pid {first.pid}, {holder.api_url}" in err, err
            assert f"stopic local down --data-dir {data}" in err, err

        assert probe.kubeconfig.read_bytes() == kubeconfig
        names = await run_kubectl(probe, "get", "namespaces", "-o", "name")
        assert "namespace/default" in names.stdout.split()
        assert (data / "cluster.sqlite3").exists(), "reset removed state while running"

        first.kill()  # SIGKILL: the lock goes with the process, the holder record stays
        await first.wait()
        assert running(data) is None and (data / HOLDER_FILE).exists()
        third = await _stopic("local", "up", "--data-dir", str(data), "--no-kubelet")
        taken = await _serving(data, third)
        assert taken.pid == third.pid
        kept = await run_kubectl(probe, "get", "configmap", "kept", "-o", "name")
        assert kept.stdout.strip() == "configmap/kept"

        started = time.monotonic()
        third.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(third.wait(), 30) == 0
        assert time.monotonic() - started < 2.0

        reset = await _stopic("local", "reset", "--data-dir", str(data))
        _, err_bytes = await asyncio.wait_for(reset.communicate(), 30)
        assert reset.returncode == 0, err_bytes.decode()
        assert not (data / "cluster.sqlite3").exists() and not (data / "kubeconfig").exists()
    finally:
        for proc in (first, third):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_ctrl_c_stops_local_up_with_a_stubborn_pod_within_2s(tmp_path: Path) -> None:
    """A pod that ignores SIGTERM gets the short stop grace of ``local up``, not its own 30 s."""
    data = tmp_path / "state"
    up = await _stopic("local", "up", "--data-dir", str(data))
    try:
        await _serving(data, up)
        probe = LocalCluster(data, kubelet=False)
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
        await run_kubectl(probe, "create", "-f", "-", input=json.dumps(pod))

        async def running_pod() -> bool:
            phase = await run_kubectl(
                probe, "get", "pod", "stubborn", "-o", "jsonpath={.status.phase}"
            )
            return phase.stdout == "Running"

        await eventually(running_pod, within=60, interval=0.2)
        started = time.monotonic()
        up.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(up.wait(), 30) == 0
        assert time.monotonic() - started < 2.0
    finally:
        if up.returncode is None:
            up.kill()
            await up.wait()


async def test_a_second_cluster_object_on_the_directory_writes_nothing(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path / "c", kubelet=False) as first:
        kubeconfig = first.kubeconfig.read_bytes()
        token = (first.data_dir / "token").read_bytes()
        with pytest.raises(DataDirInUse, match=re.escape(f"pid {os.getpid()}, {first.url}")):
            await LocalCluster(tmp_path / "c", kubelet=False).start()
        assert first.kubeconfig.read_bytes() == kubeconfig
        assert (first.data_dir / "token").read_bytes() == token
        result = await run_kubectl(first, "get", "namespaces", "-o", "name")
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
