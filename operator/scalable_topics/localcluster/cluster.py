"""``LocalCluster``: the embedded control plane (API server, garbage collector, kubelet).

Never use it in production: there is no authentication beyond the presence of a bearer token,
no authorization, no admission webhooks and no TLS. See ``docs/localcluster.md``.
"""

from __future__ import annotations

import copy
import json
import logging
import secrets
import socket
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import yaml
from aiohttp import web

from .apiserver import ApiServer
from .datadir import DataDirLock
from .errors import ApiError
from .gc import GarbageCollector
from .objects import NS_KEY, Api
from .registry import Registry
from .store import Store

log = logging.getLogger(__name__)

JSON = dict[str, Any]

DB_NAME = "cluster.sqlite3"
TOKEN_FILE = "token"
KUBECONFIG_FILE = "kubeconfig"
CONTEXT = "stopic-local"
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class _KubeletLike(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class KubeletUnavailable(RuntimeError):
    pass


def _load_kubelet(**kwargs: Any) -> _KubeletLike:
    try:
        from . import kubelet as kubelet_module
    except ImportError as exc:
        raise KubeletUnavailable(
            "the local kubelet (scalable_topics.localcluster.kubelet) is not available: "
            f"{exc}; start the cluster with kubelet=False / --no-kubelet"
        ) from exc
    cls = kubelet_module.Kubelet
    instance: _KubeletLike = cls(**kwargs)
    return instance


def _read_manifests(path: Path) -> list[JSON]:
    if path.is_dir():
        files = sorted([*path.glob("*.yaml"), *path.glob("*.yml"), *path.glob("*.json")])
    else:
        files = [path]
    docs: list[JSON] = []
    for f in files:
        text = f.read_text()
        docs.extend([json.loads(text)] if f.suffix == ".json" else yaml.safe_load_all(text))
    return docs


def write_kubeconfig(path: Path, url: str, token: str, namespace: str = "default") -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": url}}],
        "users": [{"name": CONTEXT, "user": {"token": token}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)


class LocalCluster:
    """An embedded Kubernetes API server persisted in ``data_dir``.

    ``async with LocalCluster(tmp_path, kubelet=False) as cluster:`` serves on
    ``cluster.url`` and writes ``cluster.kubeconfig``; objects survive a restart on the same
    directory with their resourceVersions and UIDs.

    ``start()`` first takes the directory's lock (``datadir.DataDirLock``) and raises
    ``datadir.DataDirInUse``, having written nothing, while another control plane holds it;
    ``stop()`` releases it last. ``stop_grace`` caps the grace period of the pods the kubelet
    kills on ``stop()`` (``None``: the kubelet's default).
    """

    def __init__(
        self,
        data_dir: Path | str,
        api_port: int = 0,
        kubelet: bool = True,
        host: str = "127.0.0.1",
        history_size: int = 50_000,
        stop_grace: float | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.lock = DataDirLock(self.data_dir)
        self.stop_grace = stop_grace
        self.api_port = api_port
        self.host = host
        self.want_kubelet = kubelet
        self.history_size = history_size
        self.token = ""
        self.url = ""
        self.store: Store | None = None
        self.api: Api | None = None
        self.gc: GarbageCollector | None = None
        self.server: ApiServer | None = None
        self.kubelet: _KubeletLike | None = None
        self._runner: web.AppRunner | None = None
        self._started = False

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / KUBECONFIG_FILE

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _load_token(self) -> str:
        path = self.data_dir / TOKEN_FILE
        if path.exists():
            return path.read_text().strip()
        token = secrets.token_urlsafe(32)
        path.write_text(token + "\n")
        path.chmod(0o600)
        return token

    async def start(self) -> None:
        if self._started:
            return
        self.lock.acquire()
        self._started = True
        try:
            await self._start_locked()
        except BaseException:
            await self.stop()
            raise
        log.info("local cluster serving on %s (kubeconfig %s)", self.url, self.kubeconfig)

    async def _start_locked(self) -> None:
        self.token = self._load_token()
        self.store = Store(self.data_dir / DB_NAME, history_size=self.history_size)
        self.api = Api(self.store, Registry())
        self._ensure_system_namespaces()
        self.gc = GarbageCollector(self.api)
        self.server = ApiServer(self.api, self.data_dir)
        runner = web.AppRunner(
            self.server.app, handler_cancellation=True, shutdown_timeout=2.0, access_log=None
        )
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.api_port))
        site = web.SockSite(runner, sock)
        await site.start()
        self._runner = runner
        port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        self.server.server_address = f"{self.host}:{port}"
        write_kubeconfig(self.kubeconfig, self.url, self.token)
        self.lock.publish(self.url)
        self.gc.start()
        if self.want_kubelet:
            knobs = {} if self.stop_grace is None else {"stop_grace": self.stop_grace}
            self.kubelet = _load_kubelet(
                api_url=self.url,
                token=self.token,
                data_dir=self.data_dir,
                kubeconfig=self.kubeconfig,
                **knobs,
            )
            await self.kubelet.start()

    def _ensure_system_namespaces(self) -> None:
        assert self.api is not None
        rt = self.api.registry.by_key(NS_KEY)
        assert rt is not None
        for name in SYSTEM_NAMESPACES:
            if self.api.store.get(NS_KEY, "", name) is None:
                self.api.create(rt, "", {"metadata": {"name": name}})

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            if self.kubelet is not None:
                try:
                    await self.kubelet.stop()
                finally:
                    self.kubelet = None
            if self.gc is not None:
                await self.gc.stop()
            if self.store is not None:
                self.store.close_subscriptions()
            if self._runner is not None:
                await self._runner.cleanup()
                self._runner = None
            if self.store is not None:
                self.store.close()
        finally:
            self.lock.release()

    # -- helpers for tests and ``make run`` -------------------------------------------------

    def _require_api(self) -> Api:
        if self.api is None:
            raise RuntimeError("the cluster is not running")
        return self.api

    def create(self, obj: JSON, namespace: str | None = None) -> JSON:
        """Create one object (a dict as in a manifest) in-process, or raise ``ApiError``."""
        api = self._require_api()
        rt = api.registry.by_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        if rt is None:
            raise ApiError(
                404,
                "NotFound",
                f'no matches for kind "{obj.get("kind")}" in version "{obj.get("apiVersion")}"',
            )
        version = str(obj.get("apiVersion", "")).rpartition("/")[2]
        ns = namespace or (obj.get("metadata") or {}).get("namespace") or "default"
        return api.create(rt, ns if rt.namespaced else "", copy.deepcopy(obj), version=version)

    def apply(self, obj: JSON, namespace: str | None = None) -> JSON:
        """Create, or replace the existing object's content (keeping its status)."""
        api = self._require_api()
        try:
            return self.create(obj, namespace)
        except ApiError as exc:
            if exc.code != 409:
                raise
        rt = api.registry.by_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        assert rt is not None
        version = str(obj.get("apiVersion", "")).rpartition("/")[2]
        meta = obj.get("metadata") or {}
        ns = (namespace or meta.get("namespace") or "default") if rt.namespaced else ""
        current = api.get(rt, ns, meta["name"])
        body = copy.deepcopy(obj)
        body_meta = body.setdefault("metadata", {})
        body_meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        return api.update(rt, ns, meta["name"], body, version=version)

    async def apply_file(self, path: Path | str, namespace: str | None = None) -> list[JSON]:
        """Apply every document of a YAML file (or every ``*.yaml`` of a directory)."""
        out: list[JSON] = []
        for doc in _read_manifests(Path(path)):
            if not doc:
                continue
            items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else [doc]
            for item in items or []:
                out.append(self.apply(item, namespace))
        return out
