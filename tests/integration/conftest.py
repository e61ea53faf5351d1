"""Shared fixtures for integration tests: the embedded control plane and a kubectl runner.

``local_cluster`` runs the API server on the test's own event loop. Anything synchronous that
talks to it (the ``kubernetes`` client, ``subprocess.run``) must therefore run off the loop —
``await asyncio.to_thread(...)`` — or the server cannot answer. :func:`run_kubectl` does that.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scalable_topics.localcluster.cluster import LocalCluster
from segment_broker.testing import BrokerProcess

from .client_harness import OperatorReplica, broker_processes, start_operator

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


@dataclass
class KubectlResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


class KubectlTarget(Protocol):
    """What :func:`run_kubectl` needs of a cluster: ``LocalCluster`` or ``ControlPlane``."""

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def data_dir(self) -> Path: ...


async def run_kubectl(
    cluster: KubectlTarget,
    *args: str,
    input: str | None = None,
    check: bool = True,
    within: float = 60,
    kubectl: Sequence[str] = (KUBECTL,),
) -> KubectlResult:
    """Run ``kubectl --kubeconfig <cluster>`` without blocking the loop the server runs on.

    ``kubectl`` is the command (the machine's by default; ``(kube, "kubectl")`` for the one in
    the real control plane's binary)."""
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "KUBECACHEDIR": str(cluster.data_dir / "kubectl-cache"),
        "HOME": str(cluster.data_dir),
    }
    proc = await asyncio.create_subprocess_exec(
        *kubectl,
        *args,
        stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(
        proc.communicate(input.encode() if input is not None else None), within
    )
    result = KubectlResult(proc.returncode or 0, out.decode(), err.decode())
    if check and result.returncode != 0:
        raise AssertionError(
            f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result


async def eventually(
    predicate: Callable[[], Awaitable[bool] | bool], within: float = 30.0, interval: float = 0.05
) -> None:
    """Await ``predicate`` until it is true, failing after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(interval)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Metric samples by name and sorted ``(label, value)`` pairs."""


async def metric_samples(url: str) -> Samples:
    """Every sample a process (a broker, the operator) serves at ``<url>/metrics``."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture
async def local_cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """An API server without a kubelet, on an ephemeral port, state under ``tmp_path``."""
    async with LocalCluster(tmp_path / "cluster", api_port=0, kubelet=False) as cluster:
        yield cluster


@pytest.fixture
def kubectl(local_cluster: LocalCluster) -> Callable[..., Awaitable[KubectlResult]]:
    """``await kubectl("get", "pods", "-o", "json")`` against ``local_cluster``."""

    async def run(*args: str, input: str | None = None, check: bool = True) -> KubectlResult:
        return await run_kubectl(local_cluster, *args, input=input, check=check)

    return run


# -- client tests: real broker processes and one operator session server ---------------------


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    """Two real broker processes shared by a test module."""
    with broker_processes(tmp_path_factory.mktemp("brokers"), 2) as procs:
        yield procs


@pytest.fixture
async def operator() -> AsyncIterator[OperatorReplica]:
    """The operator's real session server over an in-memory DAG source (client_harness)."""
    replica = await start_operator()
    yield replica
    await replica.stop()
