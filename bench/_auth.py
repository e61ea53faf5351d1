"""Our broker with authentication on (`--auth kubernetes`, docs/security.md), for the cost of it.

A real control plane (kube-apiserver with RBAC, `localcluster.controlplane`) answers the
broker's TokenReview and SubjectAccessReview calls. The load generator presents a token of the
ServiceAccount `bench/client` (audience scalabletopics.io), bound to the producer and consumer
ClusterRoles of `manifests/base/client-rbac.yaml`; the resets between payload sizes go through
the admin API with a token of `bench/operator`, the broker's only `--admin-identities` entry.
The broker reviews with the admin kubeconfig (its own identity does not matter to the cost).

Decisions are per connection, so the steady state measured by the broker bench pays nothing
per message: the interleaved `ours-go` and `ours-go-auth` rows show it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from bench import _ours
from bench._procs import CLIENT_CORE, Server, free_port, pin_process, start_server
from scalable_topics.core.auth import AUDIENCE
from scalable_topics.localcluster.controlplane import ControlPlane, kube_binary
from scalable_topics.localcluster.restclient import RestClient, client_from_kubeconfig
from segment_broker.tools.launch import broker_command

CLIENT_RBAC = Path(__file__).resolve().parents[1] / "manifests" / "base" / "client-rbac.yaml"
T = TypeVar("T")


@dataclass
class AuthServer(Server):
    """The broker; stopping it also stops the control plane."""

    on_stop: Callable[[], None] | None = None

    def stop(self, timeout: float = 15.0) -> None:
        try:
            super().stop(timeout)
        finally:
            if self.on_stop is not None:
                self.on_stop()
                self.on_stop = None


class _Plane:
    """A ControlPlane served by an event loop in a thread of its own (its components live as
    long as the thread that started them)."""

    def __init__(self, data_dir: Path) -> None:
        self.plane = ControlPlane(data_dir, binary=kube_binary())
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 180.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        try:
            self.call(self.plane.stop(), 60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()


async def _identities(api: RestClient, workdir: Path) -> tuple[Path, Path]:
    """Namespace, ServiceAccounts, the example ClusterRoles, bindings; token files of the
    client and of the admin identity."""
    ns = _ours.NAMESPACE
    await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    for role in yaml.safe_load_all(CLIENT_RBAC.read_text()):
        await api.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", body=role)
    files = []
    for account in ("client", "operator"):
        await api.request(
            "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body={"metadata": {"name": account}}
        )
    for role in ("scalable-topics-producer", "scalable-topics-consumer"):
        binding = {
            "metadata": {"name": f"client-{role}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "client", "namespace": ns}],
        }
        await api.request(
            "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", body=binding
        )
    for account in ("client", "operator"):
        answer = await api.request(
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token",
            body={"spec": {"audiences": [AUDIENCE], "expirationSeconds": 7200}},
        )
        path = workdir / f"{account}.token"
        path.write_text(answer["status"]["token"])
        files.append(path)
    return files[0], files[1]


def _check_enforced(url: str) -> None:
    """The measured broker really refuses an anonymous client (else the row means nothing)."""
    try:
        with urllib.request.urlopen(f"{url}/admin/v1/segments", timeout=10) as r:
            status = int(r.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    if status != 401:
        raise RuntimeError(f"ours-auth: an anonymous admin request got {status}, not 401")


def start_ours_auth(workdir: Path) -> tuple[Server, dict[str, Any], str]:
    plane = _Plane(workdir / "plane")
    try:

        async def setup() -> tuple[Path, Path]:
            await plane.plane.start()
            # On the load generator's core, which has room, not the broker's: the API server
            # and etcd stand in for a control plane that runs on other machines.
            for pid in plane.plane.pids.values():
                pin_process(pid, CLIENT_CORE)
            api = client_from_kubeconfig(plane.plane.kubeconfig)
            try:
                return await _identities(api, workdir)
            finally:
                await api.close()

        client_token, admin_token = plane.call(setup())
        port = free_port()
        argv = broker_command(
            port,
            workdir / "data",
            "--fsync", "always",
            "--auth", "kubernetes",
            "--kubeconfig", str(plane.plane.kubeconfig),
            "--admin-identities", f"system:serviceaccount:{_ours.NAMESPACE}:operator",
        )  # fmt: skip

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                return int(r.status) == 200

        env = {k: v for k, v in os.environ.items() if not k.startswith("SEGMENT_BROKER_")}
        server = start_server("segment-broker-auth", argv, workdir, port, ready, env=env)
        _check_enforced(f"http://127.0.0.1:{port}")
    except BaseException:
        plane.close()
        raise
    auth_server = AuthServer(
        server.name, server.proc, server.workdir, server.log_path, server.port, plane.close
    )
    endpoint = {
        "url": f"http://127.0.0.1:{port}",
        "tokenFile": str(client_token),
        "adminTokenFile": str(admin_token),
    }
    return auth_server, endpoint, _ours._version() + ", --auth kubernetes"


async def ours_auth_adapter(endpoint: dict[str, Any]) -> _ours.OursAdapter:
    """The `ours` client presenting the client's token: the SDK reads the file named by
    `SCALABLE_TOPICS_TOKEN_FILE` (this load-generator process serves only this system)."""
    from scalable_topics.credentials import TOKEN_FILE_ENV

    os.environ[TOKEN_FILE_ENV] = str(endpoint["tokenFile"])
    return _ours.OursAdapter(endpoint)
