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
import ssl
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ..core.jsontypes import JsonObj
from .controlplane import KUBELET_CLIENT_USER, ControlPlane
from .kubelet import HOST_IP, NODES, NodeAgent
from .processes import BackOff
from .restclient import PODS, ApiError, Informer, Resource, client_from_kubeconfig

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


LOG_POLL_INTERVAL = 0.2


@dataclass(frozen=True)
class KubeletServing:
    """How the kubelet serves its API (``kubectl logs`` through the API server): its
    certificate and key, the CA its clients' certificates must chain to, and the users (their
    certificates' common names) it answers; anyone else gets 403."""

    cert: Path
    key: Path
    client_ca: Path
    users: frozenset[str]

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.client_ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        context.verify_mode = ssl.CERT_REQUIRED
        return context


def _common_name(peercert: Any) -> str | None:
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


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
        serving: KubeletServing | None = None,
    ) -> None:
        self.node_name = node_name
        self.serving = serving
        self.port: int | None = None
        """The kubelet API's port (``status.daemonEndpoints``), once started with ``serving``."""
        self._runner: web.AppRunner | None = None
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
            api_url=self.client.api_url,
            backoff=BackOff(base=backoff_base, cap=backoff_cap),
            stop_grace=stop_grace,
            node_name=node_name,
            token_refresh_fraction=token_refresh_fraction,
        )
        self.ready_since = _time()
        self.lease_renewals = 0
        """How many times the Lease was renewed (created or updated) since ``start()``."""
        self._heartbeat: asyncio.Task[None] | None = None
        self._started = False

    @classmethod
    def for_control_plane(
        cls, plane: ControlPlane, data_dir: Path | str, node_name: str, **options: Any
    ) -> NodeKubelet:
        """The kubelet of ``node_name`` with its credentials from ``plane``'s CA: the client
        certificate it calls the API server with, and the serving certificate the API server
        reaches it on (answering the API server's kubelet client only)."""
        cert, key = plane.node_serving_certificate(node_name)
        serving = KubeletServing(cert, key, plane.ca_path, frozenset({KUBELET_CLIENT_USER}))
        kubeconfig = plane.node_kubeconfig(node_name)
        return cls(kubeconfig, data_dir, node_name=node_name, serving=serving, **options)

    # -- the kubelet API --------------------------------------------------------------------

    @web.middleware
    async def _authorize(
        self,
        request: web.Request,
        handler: Any,
    ) -> web.StreamResponse:
        assert self.serving is not None
        transport = request.transport
        user = _common_name(None if transport is None else transport.get_extra_info("peercert"))
        if user not in self.serving.users:
            return web.Response(status=403, text=f"user {user!r} may not use this kubelet\n")
        response: web.StreamResponse = await handler(request)
        return response

    async def _container_logs(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        pod, container = request.match_info["pod"], request.match_info["container"]
        path = self.agent.layout.log_path(namespace, pod, container)
        if not path.is_file():
            return web.Response(
                status=404, text=f"no log of container {container} of pod {namespace}/{pod}\n"
            )
        data = path.read_bytes()
        tail = request.query.get("tailLines")
        if tail is not None:
            try:
                lines = int(tail)
            except ValueError:
                return web.Response(status=400, text="tailLines must be an integer\n")
            data = b"".join(data.splitlines(keepends=True)[-lines:]) if lines > 0 else b""
        if request.query.get("follow") not in ("true", "1"):
            return web.Response(body=data, content_type="text/plain")
        response = web.StreamResponse()
        response.content_type = "text/plain"
        await response.prepare(request)
        await response.write(data)
        offset = path.stat().st_size

        def running() -> bool:
            """The container may still write: its pod runs here and it has not finished."""
            for worker in self.agent.workers.values():
                if worker.namespace == namespace and worker.name == pod:
                    sc = worker.containers.get(container) or worker.init_containers.get(container)
                    return sc is None or not sc.finished
            return False

        with contextlib.suppress(ConnectionResetError):
            while True:
                size = path.stat().st_size if path.exists() else offset
                if size > offset:
                    with path.open("rb") as f:
                        f.seek(offset)
                        chunk = f.read(size - offset)
                    offset = size
                    await response.write(chunk)
                elif not running():
                    break
                else:
                    await asyncio.sleep(LOG_POLL_INTERVAL)
            await response.write_eof()
        return response

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _serve(self) -> None:
        assert self.serving is not None
        app = web.Application(middlewares=[self._authorize])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._container_logs)
        # shutdown_timeout: `kubectl logs -f` streams do not hold up a stop.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST_IP, 0, ssl_context=self.serving.ssl_context())
        await site.start()
        self.port = int(self._runner.addresses[0][1])

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

        status: JsonObj = {
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
        if self.port is not None:
            status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": self.port}}
        return status

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
            self.agent.ips.claim()
            if self.serving is not None:
                await self._serve()
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
            await _bounded("heartbeat", self._heartbeat)
            self._heartbeat = None
        await _bounded("pod sync", self.pods.stop())
        await _bounded("pods", self.agent.stop())
        self.agent.ips.release_claim()
        if self._runner is not None:
            await _bounded("log server", self._runner.cleanup())
            self._runner = None
            self.port = None
        await _bounded("API client", self.client.close())


STOP_STEP_TIMEOUT = 60.0
"""Seconds one step of :meth:`NodeKubelet.stop` may take (the pods' own grace periods are
bounded inside ``agent.stop``); a step that takes longer is logged and left behind, so stopping
a node never hangs its caller."""


async def _bounded(step: str, work: Awaitable[object]) -> None:
    """Await ``work`` for at most :data:`STOP_STEP_TIMEOUT`; on timeout cancel it without
    waiting (a task that ignores cancellation must not hang the stop) and log which step."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=STOP_STEP_TIMEOUT)
    if not done:
        task.cancel()
        log.error("node stop: %s did not end within %.0f s; left behind", step, STOP_STEP_TIMEOUT)
        return
    if not task.cancelled() and task.exception() is not None:
        log.warning("node stop: %s failed: %r", step, task.exception())
