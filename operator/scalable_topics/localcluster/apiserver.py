"""The aiohttp application serving the Kubernetes REST API from :class:`~.objects.Api`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from . import discovery, protobuf, tables
from .errors import ApiError, bad_request, gone, method_not_allowed, not_found
from .objects import APPLY_PATCH, Api
from .registry import ResourceType
from .selectors import make_filter
from .store import ADDED, DELETED, MODIFIED, Event, TooOld

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

BOOKMARK_INTERVAL = 30.0
LOG_POLL_INTERVAL = 0.2
_ENCODED_CACHE_SIZE = 4096
_HEALTH_PATHS = ("/healthz", "/livez", "/readyz")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=_dumps(obj), status=status, content_type="application/json")


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "t", "yes")


class _Target:
    """What a resource URL names."""

    def __init__(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        name: str | None,
        sub: str | None,
    ) -> None:
        self.rt = rt
        self.version = version
        self.namespace = namespace
        self.name = name
        self.sub = sub


class ApiServer:
    def __init__(self, api: Api, data_dir: Path | None = None) -> None:
        self.api = api
        self.store = api.store
        self.registry = api.registry
        self.data_dir = data_dir
        self.server_address = "127.0.0.1:0"
        # Encoded watch lines by (event rv, resource, version, type): one serialization per
        # event however many watchers receive it.
        self._encoded: dict[tuple[int | None, str, str, str], bytes] = {}
        self.app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024**2)
        r = self.app.router
        r.add_get("/version", self._version)
        r.add_get("/version/", self._version)
        for path in _HEALTH_PATHS:
            r.add_get(path, self._health)
        r.add_get("/api", self._api)
        r.add_get("/api/", self._api)
        r.add_get("/apis", self._apis)
        r.add_get("/apis/", self._apis)
        r.add_get("/openapi/v2", self._openapi_v2)
        r.add_get("/openapi/v3", self._openapi_v3)
        r.add_get("/openapi/v3/{path:.*}", self._openapi_v3_gv)
        r.add_route("*", "/api/{version}", self._core_root)
        r.add_route("*", "/api/{version}/{tail:.*}", self._core)
        r.add_route("*", "/apis/{group}", self._group_root)
        r.add_route("*", "/apis/{group}/{version}", self._gv_root)
        r.add_route("*", "/apis/{group}/{version}/{tail:.*}", self._grouped)

    # -- plumbing ---------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # No authentication: kubectl drops bearer tokens on plain-HTTP connections, so a
        # token can be neither required nor checked (see docs/localcluster.md).
        self.api.warnings = []
        try:
            response = await handler(request)
        except ApiError as exc:
            response = _json(exc.status(), status=exc.code)
        except web.HTTPException:
            raise
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("internal error serving %s %s", request.method, request.path)
            err = ApiError(500, "InternalError", f"Internal error occurred: {exc}")
            response = _json(err.status(), status=500)
        if self.api.warnings and not response.prepared:
            for w in dict.fromkeys(self.api.warnings):
                quoted = w.replace("\\", "\\\\").replace('"', '\\"')
                response.headers.add("Warning", f'299 - "{quoted}"')
        return response

    async def _version(self, request: web.Request) -> web.Response:
        return _json(discovery.version_info())

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _api(self, request: web.Request) -> web.Response:
        return _json(discovery.api_versions(self.server_address))

    async def _apis(self, request: web.Request) -> web.Response:
        return _json(discovery.api_group_list(self.registry))

    async def _openapi_v3(self, request: web.Request) -> web.Response:
        return _json(discovery.openapi_v3_root())

    async def _openapi_v3_gv(self, request: web.Request) -> web.Response:
        if request.match_info["path"] != "api/v1":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _json(discovery.openapi_v3_core())

    async def _openapi_v2(self, request: web.Request) -> web.Response:
        if "protobuf" in request.headers.get("Accept", ""):
            return web.Response(
                body=discovery.OPENAPI_V2_PROTOBUF,
                content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            )
        return _json(discovery.OPENAPI_V2_JSON)

    async def _core_root(self, request: web.Request) -> web.Response:
        doc = discovery.resource_list(self.registry, "", request.match_info["version"])
        if doc is None or request.method != "GET":
            raise not_found("", "", request.path)
        return _json(doc)

    async def _group_root(self, request: web.Request) -> web.Response:
        doc = discovery.api_group(self.registry, request.match_info["group"])
        if doc is None or request.method != "GET":
            raise not_found("", "", request.path)
        return _json(doc)

    async def _gv_root(self, request: web.Request) -> web.Response:
        doc = discovery.resource_list(
            self.registry, request.match_info["group"], request.match_info["version"]
        )
        if doc is None or request.method != "GET":
            raise not_found("", "", request.path)
        return _json(doc)

    async def _core(self, request: web.Request) -> web.StreamResponse:
        return await self._resource(request, "", request.match_info["version"])

    async def _grouped(self, request: web.Request) -> web.StreamResponse:
        return await self._resource(
            request, request.match_info["group"], request.match_info["version"]
        )

    def _target(self, group: str, version: str, tail: str) -> _Target:
        parts = [p for p in tail.split("/") if p]
        namespace: str | None = None
        if (
            parts
            and parts[0] == "namespaces"
            and len(parts) >= 3
            and not (group == "" and len(parts) == 3 and parts[2] in ("status", "finalize"))
        ):
            namespace = parts[1]
            parts = parts[2:]
        if not parts or len(parts) > 3:
            raise not_found("", group, tail)
        rt = self.registry.lookup(group, version, parts[0])
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if namespace is not None and not rt.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        if sub is not None and not (
            (sub == "status" and rt.status)
            or (sub == "scale" and rt.scale is not None)
            or (sub == "log" and rt.log)
            or (sub == "finalize" and rt.key == "/namespaces")
        ):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _Target(rt, version, namespace, name, sub)

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        ctype = request.content_type
        if "protobuf" in ctype:
            try:
                return protobuf.decode(raw)
            except protobuf.ProtobufError as exc:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format ({exc}) - accepted media "
                    "types include: application/json, application/yaml",
                ) from None
        if "cbor" in ctype:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: application/json, application/yaml (got {ctype})",
            )
        try:
            if "yaml" in ctype:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise bad_request(f"failed to decode the request body: {exc}") from None

    # -- resource dispatch -----------------------------------------------------------------

    async def _resource(self, request: web.Request, group: str, version: str) -> web.StreamResponse:
        t = self._target(group, version, request.match_info["tail"])
        q = request.query
        method = request.method
        dry_run = "All" in q.getall("dryRun", [])
        validation = q.get("fieldValidation", "Warn")
        if validation not in ("Ignore", "Warn", "Strict"):
            raise bad_request(
                f'fieldValidation must be one of "Ignore", "Warn" or "Strict", got "{validation}"'
            )
        ns = t.namespace or ""
        if t.rt.namespaced and t.namespace is None and (t.name is not None or method == "POST"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if t.name is None:
            if method == "GET":
                if _flag(q.get("watch")):
                    return await self._watch(request, t)
                return self._list(request, t)
            if method == "POST":
                obj = self.api.create(
                    t.rt,
                    ns,
                    await self._body(request),
                    version=t.version,
                    dry_run=dry_run,
                    field_validation=validation,
                )
                return _json(obj, status=201)
            if method == "DELETE":
                items = self.api.delete_collection(
                    t.rt,
                    t.namespace,
                    q.get("labelSelector"),
                    q.get("fieldSelector"),
                    self._delete_options(await self._body(request), q),
                    dry_run=dry_run,
                )
                return _json(
                    {
                        "kind": f"{t.rt.kind}List",
                        "apiVersion": t.rt.api_version(t.version),
                        "metadata": {"resourceVersion": str(self.store.rv)},
                        "items": items,
                    }
                )
            raise method_not_allowed()
        name = t.name
        if t.sub == "log":
            if method != "GET":
                raise method_not_allowed()
            return await self._log(request, t)
        if t.sub == "scale":
            if method == "GET":
                return _json(self.api.get_scale(t.rt, ns, name))
            if method == "PUT":
                return _json(
                    self.api.write_scale(
                        t.rt, ns, name, body=await self._body(request), dry_run=dry_run
                    )
                )
            if method == "PATCH":
                return _json(
                    self.api.write_scale(
                        t.rt,
                        ns,
                        name,
                        content_type=self._patch_type(request),
                        patch=await self._body(request),
                        dry_run=dry_run,
                    )
                )
            raise method_not_allowed()
        if method == "GET":
            obj = self.api.to_view(t.rt, self.api.get(t.rt, ns, name), t.version)
            return self._respond_object(request, t, obj)
        if method == "PUT":
            obj = self.api.update(
                t.rt,
                ns,
                name,
                await self._body(request),
                subresource=t.sub,
                version=t.version,
                dry_run=dry_run,
                field_validation=validation,
            )
            return _json(obj)
        if method == "PATCH":
            obj = self.api.patch(
                t.rt,
                ns,
                name,
                self._patch_type(request),
                await self._body(request),
                subresource=t.sub,
                version=t.version,
                dry_run=dry_run,
                field_validation=validation,
            )
            return _json(obj)
        if method == "DELETE" and t.sub is None:
            options = self._delete_options(await self._body(request), q)
            obj = self.api.delete(t.rt, ns, name, options, dry_run=dry_run, version=t.version)
            return _json(obj)
        raise method_not_allowed()

    def _patch_type(self, request: web.Request) -> str:
        ctype = request.content_type
        if ctype == APPLY_PATCH:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "server-side apply is not supported by the local cluster; use client-side "
                "kubectl apply (the default)",
            )
        return ctype

    @staticmethod
    def _delete_options(body: Any, q: Any) -> JSON:
        options: JSON = dict(body) if isinstance(body, dict) else {}
        if "propagationPolicy" in q:
            options["propagationPolicy"] = q["propagationPolicy"]
        if "gracePeriodSeconds" in q:
            try:
                options["gracePeriodSeconds"] = int(q["gracePeriodSeconds"])
            except ValueError:
                raise bad_request("gracePeriodSeconds must be an integer") from None
        if "orphanDependents" in q:
            options["orphanDependents"] = _flag(q["orphanDependents"])
        return options

    @staticmethod
    def _wants_table(request: web.Request) -> bool:
        accept = request.headers.get("Accept", "")
        first = accept.split(",")[0]
        return "as=Table" in first

    def _respond_object(self, request: web.Request, t: _Target, obj: JSON) -> web.Response:
        if self._wants_table(request):
            include = request.query.get("includeObject", "Metadata")
            return _json(
                tables.render(t.rt, t.version, [obj], obj["metadata"]["resourceVersion"], include)
            )
        return _json(obj)

    def _list(self, request: web.Request, t: _Target) -> web.Response:
        q = request.query
        items, rv = self.api.list(
            t.rt, t.namespace, q.get("labelSelector"), q.get("fieldSelector"), t.version
        )
        if self._wants_table(request):
            include = q.get("includeObject", "Metadata")
            return _json(tables.render(t.rt, t.version, items, str(rv), include))
        return _json(
            {
                "kind": f"{t.rt.kind}List",
                "apiVersion": t.rt.api_version(t.version),
                "metadata": {"resourceVersion": str(rv)},
                "items": items,
            }
        )

    # -- watch -----------------------------------------------------------------------------

    async def _watch(self, request: web.Request, t: _Target) -> web.StreamResponse:
        q = request.query
        rt = t.rt
        match = make_filter(q.get("labelSelector"), q.get("fieldSelector"))
        table = self._wants_table(request)
        include = q.get("includeObject", "Metadata")
        bookmarks = _flag(q.get("allowWatchBookmarks"))
        initial_events = _flag(q.get("sendInitialEvents"))
        raw_rv = q.get("resourceVersion", "")
        since: int | None
        if raw_rv in ("", "0") or initial_events:
            since = None
        else:
            try:
                since = int(raw_rv)
            except ValueError:
                raise bad_request(f"invalid resource version: {raw_rv!r}") from None
        timeout: float | None = None
        if q.get("timeoutSeconds"):
            try:
                timeout = float(q["timeoutSeconds"])
            except ValueError:
                raise bad_request("timeoutSeconds must be a number") from None
        response = web.StreamResponse(status=200)
        response.content_type = "application/json"
        response.enable_chunked_encoding()
        try:
            sub, backlog = self.store.subscribe(
                rt.store_key, t.namespace if rt.namespaced else None, since
            )
        except TooOld as exc:
            await response.prepare(request)
            status = gone(f"too old resource version: {exc.requested} ({exc.oldest})").status()
            await response.write((_dumps({"type": "ERROR", "object": status}) + "\n").encode())
            await response.write_eof()
            return response
        initial: list[JSON] = []
        if since is None:
            initial = self.store.list(rt.store_key, t.namespace if rt.namespaced else None)
        start_rv = self.store.rv
        first_table = [True]

        def render(kind: str, obj: JSON, rv: int | None = None) -> bytes:
            cache_key = (rv, rt.key, t.version, kind)
            if rv is not None and not table:
                cached = self._encoded.get(cache_key)
                if cached is not None:
                    return cached
            view = self.api.to_view(rt, obj, t.version)
            out: JSON = view
            if table:
                out = tables.render(
                    rt,
                    t.version,
                    [view],
                    view["metadata"]["resourceVersion"],
                    include,
                    with_columns=first_table[0],
                )
                first_table[0] = False
            line = (_dumps({"type": kind, "object": out}) + "\n").encode()
            if rv is not None and not table:
                if len(self._encoded) >= _ENCODED_CACHE_SIZE:
                    self._encoded.clear()
                self._encoded[cache_key] = line
            return line

        def translate(event: Event) -> bytes | None:
            obj = event.obj
            if match is None:
                return render(event.type, obj, event.rv)
            new_view = self.api.to_view(rt, obj, t.version)
            if event.type == DELETED:
                return render(DELETED, obj, event.rv) if match(new_view) else None
            now_in = match(new_view)
            was_in = (
                event.type == MODIFIED
                and event.old is not None
                and match(self.api.to_view(rt, event.old, t.version))
            )
            if now_in and was_in:
                return render(MODIFIED, obj, event.rv)
            if now_in:
                return render(ADDED, obj, event.rv)
            if was_in:
                return render(DELETED, obj, event.rv)
            return None

        def bookmark(rv: int, annotations: JSON | None = None) -> bytes:
            meta: JSON = {"resourceVersion": str(rv)}
            if annotations:
                meta["annotations"] = annotations
            obj = {"kind": rt.kind, "apiVersion": rt.api_version(t.version), "metadata": meta}
            return (_dumps({"type": "BOOKMARK", "object": obj}) + "\n").encode()

        try:
            await response.prepare(request)
            initial.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            for obj in initial:
                view = self.api.to_view(rt, obj, t.version)
                if match is None or match(view):
                    await response.write(render(ADDED, obj))
            if initial_events and bookmarks:
                await response.write(bookmark(start_rv, {"k8s.io/initial-events-end": "true"}))
            for event in backlog:
                line = translate(event)
                if line is not None:
                    await response.write(line)
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                wait = BOOKMARK_INTERVAL if bookmarks else None
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    wait = remaining if wait is None else min(wait, remaining)
                try:
                    item = await asyncio.wait_for(sub.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and (deadline is None or time.monotonic() < deadline):
                        await response.write(bookmark(self.store.rv))
                    continue
                if item is None:
                    break
                line = translate(item)
                if line is not None:
                    await response.write(line)
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
        except ConnectionResetError:
            pass
        finally:
            self.store.unsubscribe(sub)
        return response

    # -- pod logs --------------------------------------------------------------------------

    async def _log(self, request: web.Request, t: _Target) -> web.StreamResponse:
        assert t.name is not None and t.namespace is not None
        pod = self.api.get(t.rt, t.namespace, t.name)
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = request.query.get("container")
        if not container:
            if len(containers) != 1:
                raise bad_request(
                    f"a container name must be specified for pod {t.name}, choose one of: "
                    f"[{' '.join(str(c) for c in containers)}]"
                )
            container = str(containers[0])
        elif container not in containers:
            init = [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []]
            if container not in init:
                raise bad_request(f"container {container} is not valid for pod {t.name}")
        if self.data_dir is None:
            raise bad_request("pod logs are not available: the cluster has no data directory")
        path = self.data_dir / "pods" / t.namespace / t.name / f"{container}.log"
        if not path.exists():
            raise bad_request(
                f'container "{container}" in pod "{t.name}" is waiting to start: ContainerCreating'
            )
        data = path.read_bytes()
        tail = request.query.get("tailLines")
        if tail is not None:
            try:
                n = int(tail)
            except ValueError:
                raise bad_request("tailLines must be an integer") from None
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-n:]) if n > 0 else b""
        if not _flag(request.query.get("follow")):
            return web.Response(body=data, content_type="text/plain")
        response = web.StreamResponse()
        response.content_type = "text/plain"
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(data)
        offset = path.stat().st_size
        uid = pod["metadata"].get("uid")
        try:
            while True:
                current = self.store.get("/pods", t.namespace, t.name)
                size = path.stat().st_size if path.exists() else offset
                if size > offset:
                    with path.open("rb") as fh:
                        fh.seek(offset)
                        chunk = fh.read(size - offset)
                    offset = size
                    await response.write(chunk)
                elif current is None or current["metadata"].get("uid") != uid:
                    break
                else:
                    await asyncio.sleep(LOG_POLL_INTERVAL)
            await response.write_eof()
        except ConnectionResetError:
            pass
        return response
