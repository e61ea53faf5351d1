"""Our kubelet as a node of the real control plane (issue 21): :class:`NodeKubelet`.

It is the only part of the local cluster that stays ours once the API server, scheduler and
controllers are the real ones (``controlplane.py``). It authenticates with a client certificate
as ``system:node:<name>`` in ``system:nodes``, so the Node authorizer and the NodeRestriction
admission plugin decide what it may do, as for any kubelet: register its own Node and keep its
status, renew its own Lease in ``kube-node-lease``, watch the Pods bound to it, read the
ConfigMaps and Secrets those Pods use, request their ServiceAccount tokens, and report their
status. The Pods themselves run through the same :class:`~.kubelet.NodeAgent` as under the
imitation API server (local processes on loopback addresses), minus the binding: the real
scheduler places Pods. See docs/localcluster.md, "The real control plane".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from .kubelet import HOST_IP, NODES, NodeAgent
from .processes import BackOff
from .restclient import PODS, ApiError, Informer, JsonObj, Resource, client_from_kubeconfig

log = logging.getLogger(__name__)

LEASES = Resource("coordination.k8s.io", "v1", "leases")
NODE_LEASE_NAMESPACE = "kube-node-lease"
KUBELET_VERSION = "scalable-topics-local"

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def _micro_time(at: datetime | None = None) -> str:
    """A ``MicroTime`` (what Lease times are)."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(at: datetime | None = None) -> str:
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def memory_capacity() -> str:
    """The machine's memory as a quantity (``MemTotal`` of ``/proc/meminfo``)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1])}Ki"
    return f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')}"


class NodeKubelet:
    """Runs the Pods the real scheduler binds to node ``node_name``.

    ``kubeconfig`` holds the node's client certificate (``ControlPlane.node_kubeconfig``).
    ``start()`` registers the Node (``Ready``, with capacity so the scheduler can place Pods),
    creates its Lease, and returns once the Pod watch has synced; the Lease is renewed every
    ``renew_interval`` seconds and the Node's status every ``status_interval``, so the node
    lifecycle controller never finds the node silent. ``stop()`` kills every process it started.
    ``token_refresh_fraction``: the part of a projected token's lifetime after which it is
    renewed (tests shorten it; the API server issues none shorter than 10 minutes).
    """

    def __init__(
        self,
        kubeconfig: Path | str,
        data_dir: Path | str,
        *,
        node_name: str,
        lease_duration_seconds: int = 40,
        renew_interval: float = 10.0,
        status_interval: float = 60.0,
        backoff_base: float = 10.0,
        backoff_cap: float = 300.0,
        stop_grace: float = 10.0,
        token_refresh_fraction: float = 0.8,
    ) -> None:
        self.node_name = node_name
        self.data_dir = Path(data_dir)
        self.client = client_from_kubeconfig(kubeconfig)
        self.lease_duration_seconds = lease_duration_seconds
        self.renew_interval = renew_interval
        self.status_interval = status_interval
        self.pods = Informer(self.client, PODS, field_selector=f"spec.nodeName={node_name}")
        self.agent = NodeAgent(
            self.client,
            self.pods,
            self.data_dir,
            None,
            backoff=BackOff(base=backoff_base, cap=backoff_cap),
            stop_grace=stop_grace,
            node_name=node_name,
            bind_unscheduled=False,
            token_refresh_fraction=token_refresh_fraction,
        )
        self.ready_since = _time()
        self.lease_renewals = 0
        """How many times the Lease was renewed (created or updated) since ``start()``."""
        self._heartbeat: asyncio.Task[None] | None = None
        self._started = False

    # -- the Node ---------------------------------------------------------------------------

    def node_object(self) -> JsonObj:
        """The Node as registered: only labels NodeRestriction lets a node set on itself."""
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {
                    "kubernetes.io/hostname": self.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": _ARCH.get(platform.machine(), platform.machine()),
                },
            },
        }

    def node_status(self) -> JsonObj:
        now = _time()
        resources = {
            "cpu": str(os.cpu_count() or 1),
            "memory": memory_capacity(),
            "pods": str(self.agent.ips.last - self.agent.ips.first + 1),
        }

        def condition(ctype: str, status: str, reason: str, message: str) -> JsonObj:
            return {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": self.ready_since,
            }

        return {
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": self.node_name},
            ],
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "not checked"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "not checked"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "not checked"),
                condition("Ready", "True", "KubeletReady", "local kubelet is posting ready status"),
            ],
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": _ARCH.get(platform.machine(), platform.machine()),
                "kernelVersion": platform.release(),
                "containerRuntimeVersion": "local-processes://1",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "osImage": "",
                "kubeProxyVersion": "",
            },
        }

    async def register(self) -> JsonObj:
        """Create the Node if it does not exist, then report its status."""
        node = await self.client.get_or_none(NODES, None, self.node_name)
        if node is None:
            try:
                node = await self.client.create(NODES, None, self.node_object())
            except ApiError as exc:
                if exc.status != 409:
                    raise
                node = await self.client.get(NODES, None, self.node_name)
        return await self.client.patch_status(NODES, None, self.node_name, self.node_status())

    async def renew_lease(self, node: JsonObj) -> None:
        """Create or renew ``kube-node-lease/<node>``, owned by the Node (deleted with it)."""
        spec = {
            "holderIdentity": self.node_name,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "renewTime": _micro_time(),
        }
        try:
            await self.client.patch(LEASES, NODE_LEASE_NAMESPACE, self.node_name, {"spec": spec})
        except ApiError as exc:
            if exc.status != 404:
                raise
            meta = node.get("metadata") or {}
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.node_name,
                    "namespace": NODE_LEASE_NAMESPACE,
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Node",
                            "name": self.node_name,
                            "uid": meta.get("uid", ""),
                        }
                    ],
                },
                "spec": spec,
            }
            await self.client.create(LEASES, NODE_LEASE_NAMESPACE, lease)
        self.lease_renewals += 1

    async def _heartbeat_loop(self, node: JsonObj) -> None:
        loop = asyncio.get_running_loop()
        next_status = loop.time() + self.status_interval
        while True:
            await asyncio.sleep(self.renew_interval)
            try:
                if loop.time() >= next_status:
                    node = await self.register()
                    next_status = loop.time() + self.status_interval
                await self.renew_lease(node)
            except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                log.warning("node %s: heartbeat failed: %s", self.node_name, exc)

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> NodeKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            node = await self.register()
            await self.renew_lease(node)
            self._heartbeat = asyncio.create_task(
                self._heartbeat_loop(node), name=f"heartbeat:{self.node_name}"
            )
            self.pods.start()
            await asyncio.wait_for(self.pods.synced.wait(), timeout=60)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        await self.pods.stop()
        await self.agent.stop()
        await self.client.close()
