"""The local kubelet: runs the embedded cluster's Pods as local processes.

:class:`Kubelet` is the entry point :class:`~scalable_topics.localcluster.cluster.LocalCluster`
starts. It combines a node agent (:class:`NodeAgent`, this module: takes Pods, runs their
containers through :mod:`.processes`, probes them and reports status) with the workload
controllers of :mod:`.workloads` (Deployments, StatefulSets, Jobs, CronJobs). Both talk to the API
server only over HTTP (:mod:`.restclient`). ``docs/localcluster-kubelet.md`` describes the
translation from a Pod spec to a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import logging
import secrets
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml

from ..core.jsontypes import JsonObj
from .controlplane import SERVICE_CIDR, component_env
from .podspec import (
    Mount,
    PodLayout,
    PodSpecError,
    container_command,
    container_env,
    container_mounts,
    field_value,
    object_bytes,
    referenced_objects,
    volume_sources,
)
from .processes import (
    BackOff,
    ContainerConfigError,
    ContainerState,
    ProcessSpec,
    RestartPolicy,
    SupervisedContainer,
    rfc3339,
)
from .restclient import (
    CONFIGMAPS,
    PODS,
    SECRETS,
    ApiError,
    Informer,
    Resource,
    RestClient,
    post_event,
)

log = logging.getLogger(__name__)

NODE_NAME = "local"
HOST_IP = "127.0.0.1"
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the API server's ``kube-api-access`` volume is mounted in every container."""
IN_CLUSTER_KUBECONFIG = "in-cluster.kubeconfig"
NODES = Resource("", "v1", "nodes", namespaced=False)
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts")


SUBNET_CLAIM_PORT = 65001
"""The port a running node holds bound (never listening) on its pod subnet's ``.1``, an
address no pod gets: the machine-wide claim on the subnet (:meth:`IPAllocator.claim`). Above
Linux's ephemeral range (32768-60999), so no ``bind(0)`` lands on it."""
_CLAIM_DRAWS = 32


class IPAllocator:
    """Hands out ``<subnet>.x`` loopback addresses per pod, persisted in a JSON file.

    Each cluster draws its own ``127.A.B`` subnet the first time it starts (kept in the file),
    and its running node claims it (:meth:`claim`), so two embedded clusters on one machine —
    ``make run`` beside a test run, or parallel test workers — never hand the same address
    and port to two pods. ``subnet`` fixes it (tests).

    Addresses of StatefulSet pods are *sticky*: kept for the pod's name after the pod is
    deleted, so the re-created pod gets the same address. Sticky entries of absent pods are
    reclaimed (oldest first) only when the pool is exhausted.
    """

    def __init__(
        self, path: Path, first: int = 2, last: int = 254, subnet: str | None = None
    ) -> None:
        self.path = path
        self.first, self.last = first, last
        self._entries: dict[str, dict[str, Any]] = {}
        stored_subnet: str | None = None
        if path.exists():
            with contextlib.suppress(ValueError, OSError):
                loaded = json.loads(path.read_text())
                if isinstance(loaded, dict):
                    stored_subnet = loaded.get("subnet")
                    pods = loaded.get("pods", {})
                    self._entries = {str(k): dict(v) for k, v in pods.items()}
        if stored_subnet is not None and in_service_cidr(stored_subnet):
            log.warning("pod subnet %s is in the Service range: drawing another", stored_subnet)
            stored_subnet, self._entries = None, {}
        self.subnet = subnet or stored_subnet or _random_subnet()
        self._claim: socket.socket | None = None
        if stored_subnet != self.subnet:
            self._save()

    def claim(self) -> None:
        """Hold the subnet for as long as the node runs (until :meth:`release_claim`): bind
        ``<subnet>.1``:data:`SUBNET_CLAIM_PORT`, which no other process can then bind. A
        subnet another running node holds — drawn by both at random, or stored here and taken
        while this cluster was down — is given up for a new draw, with its addresses (no pod
        runs yet: the node claims before it watches Pods)."""
        if self._claim is not None:
            return
        for _ in range(_CLAIM_DRAWS):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((f"{self.subnet}.1", SUBNET_CLAIM_PORT))
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE:
                    raise
                log.warning(
                    "pod subnet %s is held by another running node: drawing another", self.subnet
                )
                self.subnet, self._entries = _random_subnet(), {}
                self._save()
                continue
            self._claim = sock
            return
        raise RuntimeError(f"no free pod subnet in {_CLAIM_DRAWS} draws")

    def release_claim(self) -> None:
        if self._claim is not None:
            self._claim.close()
            self._claim = None

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        data = {"subnet": self.subnet, "pods": self._entries}
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(self.path)

    def get(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return None if entry is None else str(entry["ip"])

    def allocate(self, key: str, sticky: bool, live_keys: set[str]) -> str | None:
        entry = self._entries.get(key)
        if entry is not None:
            entry["sticky"] = sticky
            entry["used"] = time.time()
            self._save()
            return str(entry["ip"])
        used = {str(e["ip"]) for e in self._entries.values()}
        free = [
            f"{self.subnet}.{x}"
            for x in range(self.first, self.last + 1)
            if f"{self.subnet}.{x}" not in used
        ]
        if not free:
            idle = sorted(
                (e.get("used", 0.0), k) for k, e in self._entries.items() if k not in live_keys
            )
            if not idle:
                return None
            reclaimed = self._entries.pop(idle[0][1])
            free = [str(reclaimed["ip"])]
        self._entries[key] = {"ip": free[0], "sticky": sticky, "used": time.time()}
        self._save()
        return free[0]

    def release(self, key: str, *, force: bool = False) -> None:
        entry = self._entries.get(key)
        if entry is not None and (force or not entry.get("sticky")):
            del self._entries[key]
            self._save()

    def keys(self) -> list[str]:
        return list(self._entries)


_SERVICE_NETWORK = ipaddress.ip_network(SERVICE_CIDR)


def in_service_cidr(subnet: str) -> bool:
    """Whether the ``127.A.B`` subnet lies in the real control plane's Service ClusterIP range
    (:data:`~.controlplane.SERVICE_CIDR`), where pod addresses must never be."""
    return ipaddress.ip_address(f"{subnet}.0") in _SERVICE_NETWORK


def _random_subnet() -> str:
    """A ``127.A.B`` loopback subnet outside ``127.0`` (where the API servers listen) and
    the Service ClusterIP range."""
    while True:
        subnet = f"127.{secrets.randbelow(254) + 1}.{secrets.randbelow(256)}"
        if not in_service_cidr(subnet):
            return subnet


class Notifier:
    """Lets tasks wait for a predicate over state that changes in synchronous callbacks."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut


@dataclass
class Condition:
    status: bool
    since: float


def _owner_kind(pod: JsonObj) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind"))
    return None


def _pod_key(pod: JsonObj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def grace_of(pod: JsonObj) -> int:
    meta = pod.get("metadata") or {}
    if meta.get("deletionGracePeriodSeconds") is not None:
        return int(meta["deletionGracePeriodSeconds"])
    value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return 30 if value is None else int(value)


class PodWorker:
    """Runs one Pod: volumes, init containers, containers, probes and the status it reports."""

    def __init__(self, agent: NodeAgent, pod: JsonObj) -> None:
        self.agent = agent
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta.get("uid", "")
        self.namespace: str = meta.get("namespace", "default")
        self.name: str = meta["name"]
        spec = pod.get("spec") or {}
        self.policy = RestartPolicy.parse(spec.get("restartPolicy"))
        self.pod_ip: str | None = None
        self.start_time: float | None = None
        self.containers: dict[str, SupervisedContainer] = {}
        self.init_containers: dict[str, SupervisedContainer] = {}
        self.ready: dict[str, bool] = {}
        self.probed: set[str] = set()
        self.startup_probed: set[str] = set()
        self.startup_passed: dict[str, float | None] = {}
        self._last_error: dict[str, str] = {}
        self.conditions: dict[str, Condition] = {}
        self.initialized = not spec.get("initContainers")
        self.final_phase: str | None = None
        self.pending_message: tuple[str, str] | None = None
        self.changed = Notifier()
        self.terminating = False
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._main: asyncio.Task[None] | None = None
        self._pusher: asyncio.Task[None] | None = None
        self._last_pushed: JsonObj | None = None
        self._objects: dict[tuple[str, str], JsonObj | None] = {}
        self._tokens: dict[tuple[str, str], str] = {}
        self._token_refresh_at = 0.0
        self._token_refresher: asyncio.Task[None] | None = None
        self.token_requests = 0
        """ServiceAccount tokens obtained for this Pod (first ones and refreshes)."""
        self._fetched = False
        previous = {
            c.get("name"): c for c in (pod.get("status") or {}).get("containerStatuses") or []
        }
        self._previous_restarts = {
            str(name): int(c.get("restartCount", 0))
            + (1 if c.get("state", {}).get("running") else 0)
            for name, c in previous.items()
        }

    @property
    def layout(self) -> PodLayout:
        return self.agent.layout

    def start(self) -> None:
        self._pusher = asyncio.create_task(self._push_loop(), name=f"status:{self.name}")
        self._main = asyncio.create_task(self._run(), name=f"pod:{self.namespace}/{self.name}")

    def mark_changed(self) -> None:
        self._dirty.set()
        self.changed.notify()

    # -- lifecycle -------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._setup()
            if not await self._run_init_containers():
                return
            spec = self.pod.get("spec") or {}
            for c in spec.get("containers") or []:
                sc = self._supervisor(c, self.policy)
                self.containers[c["name"]] = sc
                self.ready[c["name"]] = False
                if c.get("readinessProbe"):
                    self.probed.add(c["name"])
                if c.get("startupProbe"):
                    self.startup_probed.add(c["name"])
            for c in spec.get("containers") or []:
                self.containers[c["name"]].start()
                for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if c.get(kind):
                        self._tasks.append(
                            asyncio.create_task(
                                self._probe_loop(c, kind), name=f"{kind}:{self.name}"
                            )
                        )
            self.mark_changed()
            await asyncio.gather(*(sc.wait_finished() for sc in self.containers.values()))
            if not self.terminating and self.containers:
                codes = [sc.state.exit_code for sc in self.containers.values()]
                self.final_phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"
                self.mark_changed()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod %s/%s: worker failed", self.namespace, self.name)

    async def _setup(self) -> None:
        await self.agent.wait_name_free(self.namespace, self.name)
        sticky = _owner_kind(self.pod) == "StatefulSet"
        host_network = bool((self.pod.get("spec") or {}).get("hostNetwork"))
        while True:
            if host_network:
                ip: str | None = HOST_IP
            else:
                ip = self.agent.ips.allocate(_pod_key(self.pod), sticky, self.agent.live_keys())
            if ip is not None:
                break
            self.pending_message = ("OutOfAddresses", "no free loopback address for the pod")
            self.mark_changed()
            await asyncio.sleep(2.0)
        self.pending_message = None
        self.pod_ip = ip
        self.start_time = time.time()
        self._set_condition("PodScheduled", True)
        self._set_condition("Initialized", self.initialized)
        self._prepare_pod_dir()
        self.mark_changed()

    def _prepare_pod_dir(self) -> None:
        """A new pod (uid) taking a name starts with fresh logs and emptyDirs."""
        pod_dir = self.layout.pod_dir(self.namespace, self.name)
        marker = pod_dir / ".uid"
        pod_dir.mkdir(parents=True, exist_ok=True)
        previous_uid = marker.read_text().strip() if marker.exists() else None
        if previous_uid != self.uid:
            for log_file in pod_dir.glob("*.log"):
                log_file.write_bytes(b"")
            shutil.rmtree(pod_dir / "volumes", ignore_errors=True)
            marker.write_text(self.uid)

    async def _run_init_containers(self) -> bool:
        spec = self.pod.get("spec") or {}
        for c in spec.get("initContainers") or []:
            # Init containers restart on failure unless the pod's policy is Never.
            policy = (
                RestartPolicy.NEVER
                if self.policy is RestartPolicy.NEVER
                else RestartPolicy.ON_FAILURE
            )
            sc = self._supervisor(c, policy)
            self.init_containers[c["name"]] = sc
            sc.start()
            self.mark_changed()
            state = await sc.wait_finished()
            if self.terminating:
                return False
            if state.exit_code != 0:
                self.final_phase = "Failed"
                self.mark_changed()
                return False
        if not self.initialized:
            self.initialized = True
            self._set_condition("Initialized", True)
            self.mark_changed()
        return True

    def _supervisor(self, container: JsonObj, policy: RestartPolicy) -> SupervisedContainer:
        name = container["name"]

        async def prepare() -> ProcessSpec:
            return await self._process_spec(container)

        return SupervisedContainer(
            name=name,
            prepare=prepare,
            policy=policy,
            backoff=self.agent.backoff,
            on_change=lambda: self._container_changed(name),
            restart_count=self._previous_restarts.get(name, 0),
        )

    def _container_changed(self, name: str) -> None:
        sc = self.containers.get(name) or self.init_containers.get(name)
        if sc is not None and name in self.containers:
            # A new run (or an exit) has to pass its readiness probe again.
            self.ready[name] = False
        if sc is not None and sc.running:
            self.agent.event(self.pod, "Started", f"Started container {name}")
        elif sc is not None and sc.state.reason == "CrashLoopBackOff":
            self.agent.event(self.pod, "BackOff", sc.state.message or "", warning=True)
        elif sc is not None and sc.state.reason in (
            "CreateContainerConfigError",
            "CreateContainerError",
        ):
            message = f"Error: {sc.state.message}"
            if self._last_error.get(name) != message:
                self._last_error[name] = message
                self.agent.event(self.pod, "Failed", message, warning=True)
        self.mark_changed()

    async def _fetch_objects(self) -> None:
        for kind, name, optional in sorted(referenced_objects(self.pod)):
            res = CONFIGMAPS if kind == "ConfigMap" else SECRETS
            obj = await self.agent.client.get_or_none(res, self.namespace, name)
            if obj is None and not optional:
                raise ContainerConfigError(f'{kind.lower()} "{name}" not found')
            self._objects[(kind, name)] = obj
        await self._request_tokens()

    def _token_sources(self) -> list[tuple[str, JsonObj]]:
        """(volume name, ``serviceAccountToken`` source) of every projected token."""
        found: list[tuple[str, JsonObj]] = []
        for vol in (self.pod.get("spec") or {}).get("volumes") or []:
            for source in (vol.get("projected") or {}).get("sources") or []:
                if "serviceAccountToken" in source:
                    found.append((vol["name"], source["serviceAccountToken"]))
        return found

    async def _request_tokens(self) -> None:
        """A fresh ServiceAccount token per projected ``serviceAccountToken`` source, from the
        TokenRequest API, bound to this Pod (it dies with the Pod) and for the audience the
        source asks (the API server's own when none); a refresher renews them once
        ``token_refresh_fraction`` (80%, as the kubelet) of their lifetime has passed."""
        sources = self._token_sources()
        if not sources:
            return
        account = (self.pod.get("spec") or {}).get("serviceAccountName") or "default"
        soonest = float("inf")
        for volume, source in sources:
            body = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [source["audience"]] if source.get("audience") else [],
                    "expirationSeconds": int(source.get("expirationSeconds") or 3600),
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": self.name,
                        "uid": self.uid,
                    },
                },
            }
            path = SERVICE_ACCOUNTS.path(self.namespace, account, "token")
            try:
                answer = await self.agent.client.request("POST", path, body=body)
            except ApiError as exc:
                raise ContainerConfigError(
                    f"requesting a token of serviceaccount {account!r}: {exc}"
                ) from exc
            status = answer.get("status") or {}
            self._tokens[(volume, str(source.get("path", "token")))] = str(status.get("token", ""))
            issued = time.time()
            expires = _parse_rfc3339(status.get("expirationTimestamp"), issued + 600)
            lifetime = expires - issued
            soonest = min(soonest, issued + self.agent.token_refresh_fraction * lifetime)
            self.token_requests += 1
        self._token_refresh_at = soonest
        if self._token_refresher is None:
            self._token_refresher = asyncio.create_task(
                self._refresh_tokens(), name=f"tokens:{self.name}"
            )
            self._tasks.append(self._token_refresher)

    async def _refresh_tokens(self) -> None:
        while True:
            await asyncio.sleep(max(self._token_refresh_at - time.time(), 0.0))
            try:
                await self._request_tokens()
            except (ContainerConfigError, aiohttp.ClientError, TimeoutError) as exc:
                log.warning("pod %s/%s: token refresh failed: %s", self.namespace, self.name, exc)
                self._token_refresh_at = time.time() + 5.0
                continue
            volumes = volume_sources(self.pod, self.layout)
            for (volume, rel), token in self._tokens.items():
                self._write_projection(volumes[volume], [], {rel: token})

    def _materialise_volumes(self, volumes: dict[str, Path]) -> None:
        for vol in (self.pod.get("spec") or {}).get("volumes") or []:
            target = volumes[vol["name"]]
            if "configMap" in vol or "secret" in vol:
                kind = "ConfigMap" if "configMap" in vol else "Secret"
                src = vol.get("configMap") or vol.get("secret") or {}
                ref_name = src.get("name") if kind == "ConfigMap" else src.get("secretName")
                self._write_projection(target, [(kind, str(ref_name), src)], {})
            elif "projected" in vol or "downwardAPI" in vol:
                sources: list[tuple[str, str, JsonObj]] = []
                downward: dict[str, str] = {}
                projected = vol.get("projected") or {
                    "sources": [{"downwardAPI": vol["downwardAPI"]}]
                }
                for source in projected.get("sources") or []:
                    if "configMap" in source:
                        sources.append(
                            ("ConfigMap", source["configMap"].get("name", ""), source["configMap"])
                        )
                    elif "secret" in source:
                        sources.append(
                            ("Secret", source["secret"].get("name", ""), source["secret"])
                        )
                    elif "serviceAccountToken" in source:
                        rel = str(source["serviceAccountToken"].get("path", "token"))
                        downward[rel] = self._tokens.get((vol["name"], rel), "")
                    elif "downwardAPI" in source:
                        for item in source["downwardAPI"].get("items") or []:
                            if "fieldRef" in item:
                                downward[item["path"]] = field_value(
                                    self._pod_with_status(), item["fieldRef"]["fieldPath"]
                                )
                self._write_projection(target, sources, downward)
            else:
                target.mkdir(parents=True, exist_ok=True)

    def _write_projection(
        self, target: Path, sources: list[tuple[str, str, JsonObj]], extra: dict[str, str]
    ) -> None:
        target.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes] = {k: v.encode() for k, v in extra.items()}
        for kind, name, src in sources:
            obj = self._objects.get((kind, name))
            if obj is None:
                continue
            data = object_bytes(kind, obj)
            items = src.get("items")
            if items:
                for item in items:
                    if item["key"] in data:
                        files[item["path"]] = data[item["key"]]
                    elif not src.get("optional"):
                        raise ContainerConfigError(
                            f"couldn't find key {item['key']} in {kind} {name}"
                        )
            else:
                files.update(data)
        for rel, content in files.items():
            if rel.startswith("/") or ".." in Path(rel).parts:
                raise ContainerConfigError(f"volume item path {rel!r} must be relative, no '..'")
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(content)
            tmp.replace(path)

    def _pod_with_status(self) -> JsonObj:
        pod = dict(self.pod)
        spec = dict(pod.get("spec") or {})
        spec["nodeName"] = self.agent.node_name
        pod["spec"] = spec
        status = dict(pod.get("status") or {})
        status.update(
            {
                "podIP": self.pod_ip,
                "podIPs": [{"ip": self.pod_ip}],
                "hostIP": HOST_IP,
                "hostIPs": [{"ip": HOST_IP}],
            }
        )
        pod["status"] = status
        return pod

    async def _process_spec(self, container: JsonObj, *, refresh: bool = True) -> ProcessSpec:
        """argv/env/cwd for ``container``; ``refresh`` re-reads ConfigMaps/Secrets and rewrites
        the volume files (done before every container start, not for each exec probe)."""
        try:
            if refresh or not self._fetched:
                await self._fetch_objects()
            volumes = volume_sources(self.pod, self.layout)
            if refresh or not self._fetched:
                self._materialise_volumes(volumes)
                self._fetched = True
            pod = self._pod_with_status()
            env = container_env(container, pod, self._objects)
            mounts = container_mounts(container, volumes)
            extra = {
                "POD_IP": self.pod_ip or "",
                "POD_NAME": self.name,
                "POD_NAMESPACE": self.namespace,
                "PYTHONUNBUFFERED": "1",
            }
            extra.update(self._in_cluster_env(mounts))
            services = {k: v for k, v in extra.items() if k.startswith("KUBERNETES_SERVICE_")}
            # The kubelet's own environment is scrubbed of KUBECONFIG, KUBERNETES_SERVICE_* and
            # proxies, as the components' is.
            base_env = component_env()
            cmd = container_command(container, env, mounts, extra, base_env, services)
        except PodSpecError as exc:
            raise ContainerConfigError(str(exc), exc.reason) from exc
        except ApiError as exc:
            raise ContainerConfigError(f"reading referenced objects: {exc}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ContainerConfigError(f"API server unreachable: {exc}") from exc
        cwd = cmd.cwd
        if cwd is None:
            # Spark executors, for one, fetch the application's jars into "./".
            cwd = self.layout.work_dir(self.namespace, self.name, container["name"])
            cwd.mkdir(parents=True, exist_ok=True)
        elif not cwd.is_dir():
            if self.agent.layout.data_dir in cwd.parents:
                cwd.mkdir(parents=True, exist_ok=True)
            else:
                raise ContainerConfigError(
                    f"workingDir {cwd} does not exist", "CreateContainerError"
                )
        return ProcessSpec(
            argv=cmd.argv,
            env=cmd.env,
            cwd=cwd,
            log_path=self.layout.log_path(self.namespace, self.name, container["name"]),
        )

    def _in_cluster_env(self, mounts: list[Mount]) -> dict[str, str]:
        """What a Pod's in-cluster clients need to reach the API server from a local process.

        ``KUBERNETES_SERVICE_HOST``/``_PORT`` name the API server itself (127.0.0.1 and its
        port: no Service proxy runs here). The ServiceAccount files are not at
        :data:`SERVICE_ACCOUNT_MOUNT` but in the Pod's volume directory, where in-cluster
        loaders do not look; so a container that mounts them also gets ``KUBECONFIG``, a
        kubeconfig pointing at that token (``tokenFile``) and CA. Clients that try in-cluster
        configuration first fall back to it; the identity is the Pod's ServiceAccount.
        """
        url = urlsplit(self.agent.api_url)
        port = str(url.port or 443)
        env = {
            "KUBERNETES_SERVICE_HOST": url.hostname or HOST_IP,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
        }
        account = next(
            (m.local_dir for m in mounts if m.mount_path.rstrip("/") == SERVICE_ACCOUNT_MOUNT),
            None,
        )
        if account is None:
            return env
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "in-cluster",
                    "cluster": {
                        "server": self.agent.api_url,
                        "certificate-authority": str(account / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "serviceaccount", "user": {"tokenFile": str(account / "token")}}],
            "contexts": [
                {
                    "name": "in-cluster",
                    "context": {
                        "cluster": "in-cluster",
                        "user": "serviceaccount",
                        "namespace": self.namespace,
                    },
                }
            ],
            "current-context": "in-cluster",
        }
        path = self.agent.layout.pod_dir(self.namespace, self.name) / IN_CLUSTER_KUBECONFIG
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.replace(path)
        env["KUBECONFIG"] = str(path)
        return env

    # -- probes ----------------------------------------------------------------------------

    async def _probe_loop(self, container: JsonObj, kind: str) -> None:
        """Probe one container per run: startup first (if any), then readiness/liveness."""
        probe: JsonObj = container[kind]
        name = container["name"]
        sc = self.containers[name]
        initial = float(probe.get("initialDelaySeconds", 0))
        period = max(float(probe.get("periodSeconds", 10)), 0.1)
        failure_threshold = int(probe.get("failureThreshold", 3))
        success_threshold = int(probe.get("successThreshold", 1))
        gated = kind != "startupProbe" and name in self.startup_probed
        while True:
            await self.changed.wait_for(lambda: sc.running or sc.finished)
            if sc.finished:
                return
            started = sc.state.started_at
            if gated:
                await self.changed.wait_for(self._startup_passed_or_left(name, sc, started))
                if self.startup_passed.get(name) != started:
                    await self.changed.wait_for(_left_run(sc, started))
                    continue
            await asyncio.sleep(initial)
            successes = failures = 0
            while sc.running and sc.state.started_at == started:
                ok = await self._probe_once(container, probe)
                if not (sc.running and sc.state.started_at == started):
                    break
                if ok:
                    successes, failures = successes + 1, 0
                else:
                    successes, failures = 0, failures + 1
                if kind == "startupProbe" and ok:
                    self.startup_passed[name] = started
                    self.mark_changed()
                    break
                if kind == "readinessProbe":
                    if ok and successes >= success_threshold and not self.ready[name]:
                        self.ready[name] = True
                        self.mark_changed()
                    elif not ok and failures >= failure_threshold and self.ready[name]:
                        self.ready[name] = False
                        self.mark_changed()
                elif not ok and failures >= failure_threshold:
                    what = "startup" if kind == "startupProbe" else "liveness"
                    self.agent.event(
                        self.pod,
                        "Killing",
                        f"Container {name} failed {what} probe, will be restarted",
                        warning=True,
                    )
                    await sc.kill_for_restart(float(grace_of(self.pod)))
                    break
                await asyncio.sleep(period)
            await self.changed.wait_for(_left_run(sc, started))

    def _startup_passed_or_left(
        self, name: str, sc: SupervisedContainer, started: float | None
    ) -> Callable[[], bool]:
        return lambda: (
            self.startup_passed.get(name) == started
            or not (sc.running and sc.state.started_at == started)
        )

    def container_ready(self, name: str) -> bool:
        """Running, past its startup probe (if any) and passing its readiness probe (if any)."""
        sc = self.containers.get(name)
        if sc is None or not sc.running:
            return False
        if name in self.startup_probed and self.startup_passed.get(name) != sc.state.started_at:
            return False
        return self.ready.get(name, False) if name in self.probed else True

    async def _probe_once(self, container: JsonObj, probe: JsonObj) -> bool:
        timeout = max(float(probe.get("timeoutSeconds", 1)), 0.1)
        host_default = self.pod_ip or HOST_IP
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                port = _port(container, get.get("port"))
                scheme = str(get.get("scheme", "HTTP")).lower()
                host = get.get("host") or host_default
                path = get.get("path", "/")
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                async with self.agent.http().get(
                    f"{scheme}://{host}:{port}{path}",
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout),
                    ssl=False,
                    allow_redirects=False,
                ) as resp:
                    return 200 <= resp.status < 400
            if "tcpSocket" in probe or "grpc" in probe:
                sock = probe.get("tcpSocket") or probe.get("grpc") or {}
                port = _port(container, sock.get("port"))
                host = sock.get("host") or host_default
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                return True
            if "exec" in probe:
                spec = await self._process_spec(
                    {**container, "command": probe["exec"].get("command"), "args": []},
                    refresh=False,
                )
                proc = await asyncio.create_subprocess_exec(
                    *spec.argv,
                    env=dict(spec.env),
                    cwd=spec.cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                    start_new_session=True,
                )
                try:
                    return await asyncio.wait_for(proc.wait(), timeout) == 0
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
                    return False
        except (OSError, TimeoutError, aiohttp.ClientError, ContainerConfigError, ValueError):
            return False
        return True

    # -- status ----------------------------------------------------------------------------

    def _set_condition(self, ctype: str, status: bool) -> None:
        current = self.conditions.get(ctype)
        if current is None or current.status != status:
            self.conditions[ctype] = Condition(status, time.time())

    def _started(self, name: str) -> bool:
        sc = self.containers.get(name)
        if sc is None or not sc.running:
            return False
        return (
            name not in self.startup_probed or self.startup_passed.get(name) == sc.state.started_at
        )

    def _container_status(
        self,
        spec: JsonObj,
        sc: SupervisedContainer | None,
        ready: bool,
        *,
        started: bool | None = None,
    ) -> JsonObj:
        state = sc.state if sc is not None else ContainerState("waiting", reason="PodInitializing")
        entry: JsonObj = {
            "name": spec["name"],
            "image": spec.get("image", ""),
            "imageID": "",
            "ready": ready,
            "restartCount": sc.restart_count if sc is not None else 0,
            "started": state.kind == "running" if started is None else started,
            "state": state.to_api(),
            "lastState": sc.last_state.to_api() if sc is not None and sc.last_state else {},
        }
        if sc is not None and sc.pid is not None:
            entry["containerID"] = f"local://{sc.pid}"
        return entry

    def phase(self) -> str:
        if self.final_phase is not None:
            return self.final_phase
        if not self.initialized or not self.containers:
            return "Pending"
        states = list(self.containers.values())
        if all(sc.finished for sc in states):
            return "Succeeded" if all(sc.state.exit_code == 0 for sc in states) else "Failed"
        if any(sc.running or sc.restart_count > 0 or sc.last_state for sc in states):
            return "Running"
        if any(sc.state.kind == "terminated" for sc in states):
            return "Running"
        return "Pending"

    def status(self) -> JsonObj:
        spec = self.pod.get("spec") or {}
        phase = self.phase()
        containers_ready = bool(self.containers) and all(
            self.container_ready(c["name"]) for c in spec.get("containers") or []
        )
        if phase in ("Succeeded", "Failed"):
            containers_ready = False
        if self.conditions:
            self._set_condition("ContainersReady", containers_ready)
            self._set_condition("Ready", containers_ready)
        # The real API server sets the QoS class at creation and refuses a change.
        qos = (self.pod.get("status") or {}).get("qosClass") or "BestEffort"
        status: JsonObj = {"phase": phase, "qosClass": qos}
        if self.conditions:
            status["conditions"] = [
                {
                    "type": ctype,
                    "status": "True" if cond.status else "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": rfc3339(cond.since),
                    **(
                        {"reason": "ContainersNotReady"}
                        if ctype in ("Ready", "ContainersReady") and not cond.status
                        else {}
                    ),
                }
                for ctype, cond in self.conditions.items()
            ]
        if self.pending_message:
            status["reason"], status["message"] = self.pending_message
        if self.pod_ip:
            status.update(
                {
                    "podIP": self.pod_ip,
                    "podIPs": [{"ip": self.pod_ip}],
                    "hostIP": HOST_IP,
                    "hostIPs": [{"ip": HOST_IP}],
                }
            )
        if self.start_time:
            status["startTime"] = rfc3339(self.start_time)
        if spec.get("initContainers"):
            status["initContainerStatuses"] = [
                self._container_status(
                    c,
                    self.init_containers.get(c["name"]),
                    bool(
                        (sc := self.init_containers.get(c["name"]))
                        and sc.finished
                        and sc.state.exit_code == 0
                    ),
                )
                for c in spec["initContainers"]
            ]
        status["containerStatuses"] = [
            self._container_status(
                c,
                self.containers.get(c["name"]),
                self.container_ready(c["name"]),
                started=self._started(c["name"]),
            )
            for c in spec.get("containers") or []
        ]
        return status

    async def _push_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            status = self.status()
            comparable = json.dumps(status, sort_keys=True)
            if (
                self._last_pushed is not None
                and json.dumps(self._last_pushed, sort_keys=True) == comparable
            ):
                continue
            try:
                await self.agent.client.patch_status(PODS, self.namespace, self.name, status)
                self._last_pushed = status
            except ApiError as exc:
                if exc.status == 404:
                    return
                log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, exc)
                await asyncio.sleep(0.5)
                self._dirty.set()
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.debug("pod %s/%s: status update failed: %s", self.namespace, self.name, exc)
                await asyncio.sleep(0.5)
                self._dirty.set()

    async def flush_status(self) -> None:
        """Push the current status now (used right before finishing a deletion)."""
        status = self.status()
        with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError):
            await self.agent.client.patch_status(PODS, self.namespace, self.name, status)
            self._last_pushed = status

    async def terminate(self, grace: float, *, push_status: bool = True) -> None:
        """Kill all containers (SIGTERM, ``grace``, SIGKILL) and wait until they are gone."""
        self.terminating = True
        if not push_status and self._pusher is not None:
            # A stopping node leaves the last reported status alone (no phase Failed from
            # the SIGTERM exit codes), so the pod runs again when the kubelet comes back.
            self._pusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pusher
        if self._main is not None and not self._main.done():
            self._main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._main
        for task in self._tasks:
            task.cancel()
        supervisors = [*self.init_containers.values(), *self.containers.values()]
        await asyncio.gather(*(sc.stop(grace) for sc in supervisors))
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if push_status:
            await self.flush_status()
        if self._pusher is not None:
            self._pusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pusher


def _parse_rfc3339(value: Any, default: float) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def _left_run(sc: SupervisedContainer, started: float | None) -> Callable[[], bool]:
    """Predicate: the container is no longer in the run that started at ``started``."""
    return lambda: not (sc.running and sc.state.started_at == started)


def _port(container: JsonObj, port: Any) -> int:
    if isinstance(port, int):
        return port
    text = str(port)
    if text.isdigit():
        return int(text)
    for p in container.get("ports") or []:
        if p.get("name") == text:
            return int(p["containerPort"])
    raise ValueError(f"unknown named port {text!r}")


class NodeAgent:
    """Watches Pods and runs those the scheduler bound to node ``node_name``.

    Pods get ServiceAccount tokens, never the node's own credentials, and ``api_url`` (the API
    server's address) as their in-cluster API server (``PodWorker._in_cluster_env``).
    """

    def __init__(
        self,
        client: RestClient,
        pods: Informer,
        data_dir: Path,
        *,
        api_url: str,
        backoff: BackOff,
        stop_grace: float = 10.0,
        node_name: str = NODE_NAME,
        token_refresh_fraction: float = 0.8,
    ) -> None:
        self.client = client
        self.api_url = api_url
        self.node_name = node_name
        self.token_refresh_fraction = token_refresh_fraction
        self.pods = pods
        self.layout = PodLayout(data_dir)
        self.backoff = backoff
        self.stop_grace = stop_grace
        self.ips = IPAllocator(data_dir / "kubelet" / "pod-ips.json")
        self.workers: dict[str, PodWorker] = {}
        self._finished_uids: set[str] = set()
        self._delete_issued: set[str] = set()
        self._terminations: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._events_enabled = True
        pods.add_handler(self._on_pod)

    def http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        return self._session

    def live_keys(self) -> set[str]:
        return {_pod_key(p) for p in self.pods.items()}

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def wait_name_free(self, namespace: str, name: str) -> None:
        """Wait until a previous pod of the same name has no process left (it may hold the port)."""
        while (task := self._terminations.get((namespace, name))) is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
            if self._terminations.get((namespace, name)) is task:
                self._terminations.pop((namespace, name), None)

    def _on_pod(self, etype: str, pod: JsonObj) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if node not in (None, "", self.node_name):
            return
        uid = str(meta.get("uid", ""))
        worker = self.workers.get(uid)
        if etype == "DELETED":
            if worker is not None:
                del self.workers[uid]
                self._terminate(worker, float(grace_of(pod)), finish_delete=False)
            else:
                self._release_ip(pod)
            self._finished_uids.discard(uid)
            self._delete_issued.discard(uid)
            return
        if worker is not None:
            worker.pod = pod
            if meta.get("deletionTimestamp") and not worker.terminating:
                worker.terminating = True
                self._terminate(worker, float(grace_of(pod)), finish_delete=True)
            return
        if meta.get("deletionTimestamp"):
            self._spawn(self._finish_delete(pod), f"finish-delete:{meta.get('name')}")
            return
        if uid in self._finished_uids:
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            self._finished_uids.add(uid)
            return
        if not node:
            return
        worker = PodWorker(self, pod)
        self.workers[uid] = worker
        worker.start()

    def _terminate(self, worker: PodWorker, grace: float, *, finish_delete: bool) -> None:
        key = (worker.namespace, worker.name)

        async def run() -> None:
            self.event(worker.pod, "Killing", "Stopping container(s)")
            await worker.terminate(grace, push_status=finish_delete)
            self.workers.pop(worker.uid, None)
            if finish_delete:
                await self._finish_delete(worker.pod)
            else:
                self._release_ip(worker.pod)

        task = self._spawn(run(), f"terminate:{worker.name}")
        self._terminations[key] = task

        def forget(done: asyncio.Task[Any]) -> None:
            if self._terminations.get(key) is done:
                del self._terminations[key]

        task.add_done_callback(forget)

    async def _finish_delete(self, pod: JsonObj) -> None:
        meta = pod["metadata"]
        uid = str(meta.get("uid", ""))
        if uid in self._delete_issued:
            return
        self._delete_issued.add(uid)
        try:
            await self.client.delete(
                PODS,
                meta.get("namespace"),
                meta["name"],
                grace_period_seconds=0,
                uid=meta.get("uid"),
            )
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("pod %s: finishing deletion failed: %s", meta["name"], exc)

    def _release_ip(self, pod: JsonObj) -> None:
        self.ips.release(_pod_key(pod))

    def event(self, obj: JsonObj, reason: str, message: str, *, warning: bool = False) -> None:
        """Record a core/v1 Event about ``obj`` (best effort, in the background)."""
        if not self._events_enabled:
            return
        self._spawn(
            post_event(self.client, obj, reason, message, warning, "kubelet"), f"event:{reason}"
        )

    async def stop(self) -> None:
        """Kill every process of every pod; returns when all are gone."""
        self._events_enabled = False
        workers = list(self.workers.values())
        self.workers.clear()
        results = await asyncio.gather(
            *(
                w.terminate(min(float(grace_of(w.pod)), self.stop_grace), push_status=False)
                for w in workers
            ),
            return_exceptions=True,
        )
        for worker, result in zip(workers, results, strict=True):
            if isinstance(result, BaseException):
                log.error("pod %s: stopping failed: %r", worker.name, result)
        pending = list(self._background)
        for task in pending:
            if not task.get_name().startswith("terminate:"):
                task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
