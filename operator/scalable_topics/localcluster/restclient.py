"""A small typed async client of the Kubernetes REST API, plus a list+watch informer.

The kubelet and the workload controllers talk to the embedded API server only through this, over
HTTP with a bearer token, the way the real kubelet and controller-manager do; against the real
API server (``controlplane.py``) the kubelet speaks TLS with a client certificate read from its
kubeconfig (:func:`client_from_kubeconfig`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from ..core.jsontypes import JsonObj

log = logging.getLogger(__name__)


class ApiError(Exception):
    """A non-2xx answer; ``status`` is the HTTP code, ``reason`` the Status reason."""

    def __init__(self, status: int, reason: str, message: str, body: JsonObj | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone); the caller must relist."""


@dataclass(frozen=True)
class Resource:
    """A resource collection: ``group`` ("" for core), ``version``, ``plural``."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base


PODS = Resource("", "v1", "pods")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
PVCS = Resource("", "v1", "persistentvolumeclaims")
EVENTS = Resource("", "v1", "events")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
STATEFULSETS = Resource("apps", "v1", "statefulsets")
JOBS = Resource("batch", "v1", "jobs")
CRONJOBS = Resource("batch", "v1", "cronjobs")


def _error_from(status: int, text: str) -> ApiError:
    body: JsonObj = {}
    with contextlib.suppress(ValueError):
        parsed = json.loads(text)
        if isinstance(parsed, dict):
            body = parsed
    return ApiError(status, str(body.get("reason", "")), str(body.get("message", text[:500])), body)


class RestClient:
    """Async JSON client for one API server (``api_url``).

    It authenticates with a bearer ``token``, or with the client certificate of ``ssl_context``
    (which also says which CA the server's certificate must chain to), or both.
    """

    def __init__(
        self, api_url: str, token: str | None = None, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = None if self._ssl is None else aiohttp.TCPConnector(ssl=self._ssl)
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=30),
                connector=connector,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JsonObj:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._http().request(
            method, self.api_url + path, params=params, data=data, headers=headers
        ) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise _error_from(resp.status, text)
            if not text:
                return {}
            parsed = json.loads(text)
            return parsed if isinstance(parsed, dict) else {"items": parsed}

    async def get(self, res: Resource, namespace: str | None, name: str) -> JsonObj:
        return await self.request("GET", res.path(namespace, name))

    async def get_or_none(self, res: Resource, namespace: str | None, name: str) -> JsonObj | None:
        try:
            return await self.get(res, namespace, name)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[JsonObj], str]:
        """Items and the list's resourceVersion (where a watch resumes)."""
        params: dict[str, str] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        result = await self.request("GET", res.path(namespace), params=params)
        items = list(result.get("items") or [])
        return items, str((result.get("metadata") or {}).get("resourceVersion", ""))

    async def create(self, res: Resource, namespace: str | None, body: JsonObj) -> JsonObj:
        return await self.request("POST", res.path(namespace), body=body)

    async def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> JsonObj:
        """``merge`` (RFC 7386) or ``json`` (RFC 6902) patch of an object or a subresource."""
        ctype = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
        }[patch_type]
        return await self.request(
            "PATCH", res.path(namespace, name, subresource), body=body, content_type=ctype
        )

    async def patch_status(
        self, res: Resource, namespace: str | None, name: str, status: JsonObj
    ) -> JsonObj:
        return await self.patch(res, namespace, name, {"status": status}, subresource="status")

    async def delete(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        *,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        uid: str | None = None,
    ) -> JsonObj | None:
        """Delete; returns None when the object is already gone."""
        options: JsonObj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            return await self.request("DELETE", res.path(namespace, name), body=options)
        except ApiError as exc:
            if exc.status in (404, 409):
                return None
            raise

    async def watch(
        self,
        res: Resource,
        resource_version: str,
        *,
        timeout_seconds: int = 290,
        field_selector: str | None = None,
    ) -> AsyncIterator[tuple[str, JsonObj]]:
        """Yield ``(type, object)`` events after ``resource_version``.

        Raises :class:`WatchExpired` on 410. Ends when the server closes the stream.
        """
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if field_selector:
            params["fieldSelector"] = field_selector
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + 30)
        async with self._http().get(
            self.api_url + res.path(), params=params, timeout=timeout
        ) as resp:
            if resp.status == 410:
                raise WatchExpired(await resp.text())
            if resp.status >= 400:
                raise _error_from(resp.status, await resp.text())
            async for raw in resp.content:
                line = raw.strip()
                if not line:
                    continue
                event = json.loads(line)
                etype = str(event.get("type", ""))
                obj = event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired(str(obj.get("message", "")))
                    raise ApiError(
                        int(obj.get("code") or 500),
                        str(obj.get("reason", "")),
                        str(obj.get("message", "")),
                        obj,
                    )
                yield etype, obj


class KubeconfigError(ValueError):
    """A kubeconfig this client cannot use (the message says what is missing)."""


def _kubeconfig_bytes(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """``<key>-data`` (base64) or the file ``<key>`` names (relative to the kubeconfig)."""
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(str(data))
    name = entry.get(key)
    if name:
        return (base / str(name)).read_bytes()
    return None


def client_from_kubeconfig(path: Path | str) -> RestClient:
    """A client for the current context of the kubeconfig at ``path``: its server, its CA
    (``certificate-authority[-data]``), and its user's client certificate and key or token."""
    path = Path(path)
    config = yaml.safe_load(path.read_text()) or {}

    def named(kind: str, name: str) -> JsonObj:
        for item in config.get(f"{kind}s") or []:
            if item.get("name") == name:
                return dict(item.get(kind) or {})
        raise KubeconfigError(f"{path}: no {kind} named {name!r}")

    context = named("context", str(config.get("current-context", "")))
    cluster = named("cluster", str(context.get("cluster", "")))
    user = named("user", str(context.get("user", ""))) if context.get("user") else {}
    server = str(cluster.get("server", ""))
    if not server:
        raise KubeconfigError(f"{path}: the cluster has no server")
    token = user.get("token")
    if not server.startswith("https://"):
        return RestClient(server, str(token) if token else None)
    ca = _kubeconfig_bytes(cluster, "certificate-authority", path.parent)
    context_ssl = ssl.create_default_context(cadata=None if ca is None else ca.decode())
    cert = _kubeconfig_bytes(user, "client-certificate", path.parent)
    key = _kubeconfig_bytes(user, "client-key", path.parent)
    if (cert is None) != (key is None):
        raise KubeconfigError(f"{path}: the user has a client certificate or key, not both")
    if cert is not None and key is not None:
        # ssl loads a certificate chain from files only: a private directory, gone at once.
        with tempfile.TemporaryDirectory(prefix="kubeconfig-") as tmp:
            cert_file, key_file = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert_file.write_bytes(cert)
            key_file.touch(mode=0o600)
            key_file.write_bytes(key)
            context_ssl.load_cert_chain(str(cert_file), str(key_file))
    return RestClient(server, str(token) if token else None, ssl_context=context_ssl)


Handler = Callable[[str, JsonObj], None]


def object_key(obj: JsonObj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class Informer:
    """Keeps a cache of one resource in sync by list + watch and tells handlers what changed.

    Resumes the watch from the last seen resourceVersion after a disconnect and relists after
    410 Gone (emitting ``DELETED`` for objects that vanished meanwhile). Handlers are plain
    callables invoked on the event loop; they should only enqueue work. ``field_selector``
    narrows the list and the watch (the real kubelet's ``spec.nodeName=<node>``).
    """

    def __init__(
        self,
        client: RestClient,
        res: Resource,
        *,
        retry_delay: float = 0.5,
        field_selector: str | None = None,
    ) -> None:
        self.client = client
        self.res = res
        self.field_selector = field_selector
        self.cache: dict[tuple[str, str], JsonObj] = {}
        self.synced = asyncio.Event()
        self._handlers: list[Handler] = []
        self._retry_delay = retry_delay
        self._task: asyncio.Task[None] | None = None

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer:{self.res.plural}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def items(self) -> list[JsonObj]:
        return list(self.cache.values())

    def _emit(self, etype: str, obj: JsonObj) -> None:
        for handler in self._handlers:
            try:
                handler(etype, obj)
            except Exception:
                log.exception("informer %s: handler failed", self.res.plural)

    async def _relist(self) -> str:
        items, rv = await self.client.list(self.res, field_selector=self.field_selector)
        fresh = {object_key(o): o for o in items}
        gone = [o for k, o in self.cache.items() if k not in fresh]
        self.cache = fresh
        for obj in gone:
            self._emit("DELETED", obj)
        for obj in items:
            self._emit("ADDED", obj)
        self.synced.set()
        return rv

    async def _run(self) -> None:
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    rv = await self._relist()
                async for etype, obj in self.client.watch(
                    self.res, rv, field_selector=self.field_selector
                ):
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        rv = str(new_rv)
                    if etype == "BOOKMARK":
                        continue
                    key = object_key(obj)
                    if etype == "DELETED":
                        self.cache.pop(key, None)
                    else:
                        self.cache[key] = obj
                    self._emit(etype, obj)
            except asyncio.CancelledError:
                raise
            except WatchExpired:
                rv = None
            except (aiohttp.ClientError, ApiError, TimeoutError, ValueError) as exc:
                log.debug("informer %s: %s; retrying", self.res.plural, exc)
                await asyncio.sleep(self._retry_delay)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def post_event(
    client: RestClient, obj: JsonObj, reason: str, message: str, warning: bool, component: str
) -> None:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or "default"
    now = _now()
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": ns},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion", "v1"),
            "kind": obj.get("kind", "Pod"),
            "name": meta.get("name"),
            "namespace": ns,
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": component, "host": "local"},
        "reportingComponent": component,
        "reportingInstance": "local",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError):
        await client.create(EVENTS, ns, event)
