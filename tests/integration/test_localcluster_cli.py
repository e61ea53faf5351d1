"""``stopic local up|down`` as real processes, and the kubelet hand-off."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from scalable_topics.localcluster.cluster import PID_FILE, KubeletUnavailable, LocalCluster

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


async def test_local_up_serves_kubectl_and_down_stops_it(tmp_path: Path) -> None:
    data = tmp_path / "state"
    up = await _stopic("local", "up", "--data-dir", str(data), "--no-kubelet")
    try:
        await eventually(lambda: (data / PID_FILE).exists() or up.returncode is not None, within=30)
        assert up.returncode is None, "stopic local up exited early"
        assert int((data / PID_FILE).read_text()) == up.pid
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
        assert not (data / PID_FILE).exists()
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
        await eventually(lambda: (data / PID_FILE).exists() or up.returncode is not None, within=30)
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
