"""API semantics on top of the store: create/update/patch/delete, subresources, CRDs.

Everything here is synchronous and runs on the event loop thread, so each call is atomic with
respect to every other request: a resourceVersion check and the write that follows it cannot be
interleaved with another writer (which is what makes 409 Conflict exact).
"""

from __future__ import annotations

import base64
import builtins
import copy
import logging
import re
import secrets
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from . import schema as schemas
from .errors import (
    ApiError,
    Cause,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    invalid,
    not_found,
    stale,
    unsupported_media_type,
)
from .patches import json_patch, merge_patch, strategic_merge_patch
from .registry import Registry, ResourceType, ScaleSpec
from .selectors import format_selector, label_selector_from_api, make_filter
from .store import Store

log = logging.getLogger(__name__)

JSON = dict[str, Any]

CRD_KEY = "apiextensions.k8s.io/customresourcedefinitions"
NS_KEY = "/namespaces"
CRD_CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0)
    major = int(m.group(1))
    stage = {"alpha": 2, "beta": 1, None: 0}[m.group(2)]
    minor = int(m.group(3) or 0)
    return (stage, -major, -minor)


def _get_path(obj: Any, path: str) -> Any:
    cur = obj
    for part in [p for p in path.split(".") if p]:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _set_path(obj: JSON, path: str, value: Any) -> None:
    parts = [p for p in path.split(".") if p]
    cur = obj
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = cur[part] = {}
        cur = nxt
    cur[parts[-1]] = value


_GENERATION_GROUPS = frozenset(
    {"apps", "batch", "policy", "autoscaling", "networking.k8s.io", "apiextensions.k8s.io"}
)


def _has_generation(rt: ResourceType) -> bool:
    """Kinds whose ``metadata.generation`` the real apiserver maintains (those with a spec
    to observe; ConfigMaps, Secrets, Leases, Events, RBAC, Namespaces have none)."""
    return rt.crd or rt.group in _GENERATION_GROUPS or rt.key in ("/pods", "/services")


def _fold_string_data(rt: ResourceType, obj: JSON) -> None:
    """A Secret's write-only ``stringData`` is merged into ``data``, as the apiserver does."""
    if rt.key != "/secrets" or not isinstance(obj.get("stringData"), dict):
        return
    current = obj.get("data")
    data: JSON = current if isinstance(current, dict) else {}
    for k, v in obj.pop("stringData").items():
        data[k] = base64.b64encode(str(v).encode()).decode()
    obj["data"] = data


# -- events.k8s.io/v1 <-> core/v1 Event ----------------------------------------------------

_EVENT_FIELDS = (
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
)
_EVENT_SAME = ("metadata", "eventTime", "series", "action", "reason", "related", "type")


def _convert_event(src: JSON, api_version: str, renamed: tuple[tuple[str, str], ...]) -> JSON:
    """``src`` in the other Event shape: shared fields as they are, ``renamed`` ones (pairs of
    target and source name) under their name there."""
    out: JSON = {"apiVersion": api_version, "kind": "Event"}
    for k in _EVENT_SAME:
        if k in src:
            out[k] = src[k]
    for target, source in renamed:
        if source in src:
            out[target] = src[source]
    return out


def event_to_new(core: JSON) -> JSON:
    return _convert_event(core, "events.k8s.io/v1", _EVENT_FIELDS)


def event_to_core(new: JSON) -> JSON:
    return _convert_event(new, "v1", tuple((old, newk) for newk, old in _EVENT_FIELDS))


class Api:
    """The apiserver's object semantics; the HTTP layer and the controllers both call it."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self.warnings: builtins.list[str] = []
        self._hooks: builtins.list[Callable[[], None]] = []
        for crd in store.list(CRD_KEY):
            self._register_crd(crd)

    # -- helpers ---------------------------------------------------------------------------

    def _err_not_found(self, rt: ResourceType, name: str) -> ApiError:
        return not_found(rt.plural, rt.group, name)

    def to_view(self, rt: ResourceType, obj: JSON, version: str | None = None) -> JSON:
        """The stored object as served at ``version`` (apiVersion only; no conversion)."""
        if rt.storage_key == "/events":
            return event_to_new(obj)
        api_version = rt.api_version(version)
        if obj.get("apiVersion") == api_version and obj.get("kind") == rt.kind:
            return obj
        out = dict(obj)
        out["apiVersion"] = api_version
        out["kind"] = rt.kind
        return out

    def _from_view(self, rt: ResourceType, body: JSON) -> JSON:
        if rt.storage_key == "/events":
            return event_to_core(body)
        out = dict(body)
        out["apiVersion"] = rt.api_version()
        out["kind"] = rt.kind
        return out

    def _storage_rt(self, rt: ResourceType) -> ResourceType:
        if rt.storage_key:
            base = self.registry.by_key(rt.storage_key)
            if base is not None:
                return base
        return rt

    def _stored(self, rt: ResourceType, namespace: str, name: str) -> tuple[ResourceType, JSON]:
        """The type ``rt`` is stored as, and the stored object (404 when there is none)."""
        srt = self._storage_rt(rt)
        existing = self.store.get(srt.key, namespace if rt.namespaced else "", name)
        if existing is None:
            raise self._err_not_found(rt, name)
        return srt, existing

    def get(self, rt: ResourceType, namespace: str, name: str) -> JSON:
        obj = self.store.get(rt.store_key, namespace if rt.namespaced else "", name)
        if obj is None:
            raise self._err_not_found(rt, name)
        return obj

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        version: str | None = None,
    ) -> tuple[builtins.list[JSON], int]:
        match = make_filter(label_selector, field_selector)
        items = self.store.list(rt.store_key, namespace if rt.namespaced else None)
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        views = [self.to_view(rt, o, version) for o in items]
        if match is not None:
            views = [o for o in views if match(o)]
        return views, self.store.rv

    # -- create ----------------------------------------------------------------------------

    def _check_namespace(self, namespace: str) -> None:
        ns = self.store.get(NS_KEY, "", namespace)
        if ns is None:
            raise not_found("namespaces", "", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise forbidden(
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated",
                plural="namespaces",
                name=namespace,
            )

    def _validate_name(self, rt: ResourceType, name: str) -> builtins.list[Cause]:
        if rt.group == "rbac.authorization.k8s.io":
            ok = bool(name) and "/" not in name and name not in (".", "..")
            detail = "may not contain '/'"
        elif rt.kind == "Namespace":
            ok = len(name) <= 63 and bool(_DNS_LABEL.match(name))
            detail = (
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                "or '-', and must start and end with an alphanumeric character"
            )
        else:
            ok = len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))
            detail = (
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character"
            )
        if ok:
            return []
        return [Cause("FieldValueInvalid", f'Invalid value: "{name}": {detail}', "metadata.name")]

    def _check_body(self, rt: ResourceType, body: Any, version: str | None) -> JSON:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        kind = body.get("kind")
        if kind and kind != rt.kind:
            raise bad_request(
                f"the API version in the data ({body.get('apiVersion')}) does not match the "
                f"expected API version ({rt.api_version(version)})"
                if body.get("apiVersion") != rt.api_version(version)
                else f"kind {kind} does not match the expected kind {rt.kind}"
            )
        meta = body.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        return body

    def create(
        self,
        rt: ResourceType,
        namespace: str,
        body: Any,
        *,
        version: str | None = None,
        dry_run: bool = False,
        field_validation: str = "Ignore",
    ) -> JSON:
        body = self._check_body(rt, body, version)
        obj = self._from_view(rt, copy.deepcopy(body))
        srt = self._storage_rt(rt)
        meta: JSON = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            meta["namespace"] = namespace
            self._check_namespace(namespace)
        else:
            meta.pop("namespace", None)
        name = meta.get("name")
        if not name:
            prefix = meta.get("generateName")
            if not prefix:
                raise invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [
                        Cause(
                            "FieldValueRequired",
                            "Required value: name or generateName is required",
                            "metadata.name",
                        )
                    ],
                )
            for _ in range(16):
                name = prefix + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
                if self.store.get(srt.key, meta.get("namespace", ""), name) is None:
                    break
            meta["name"] = name
        assert isinstance(name, str)
        causes = self._validate_name(rt, name)
        if causes:
            raise invalid(rt.kind, rt.group, name, causes)
        if self.store.get(srt.key, meta.get("namespace", ""), name) is not None:
            raise already_exists(rt.plural, rt.group, name)
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta.pop("generation", None)
        if _has_generation(rt):
            meta["generation"] = 1
        if rt.status:
            obj.pop("status", None)
        _fold_string_data(rt, obj)
        self._prepare_create(rt, obj)
        if rt.crd:
            obj = self._validate_custom(rt, obj, None, field_validation)
        if dry_run:
            meta["resourceVersion"] = str(self.store.rv)
            return self.to_view(rt, obj, version)
        meta["resourceVersion"] = str(self.store.next_rv())
        self.store.put(srt.key, obj, created=True)
        if rt.key == CRD_KEY:
            self._register_crd(obj)
        return self.to_view(rt, obj, version)

    def _prepare_create(self, rt: ResourceType, obj: JSON) -> None:
        if rt.key == NS_KEY:
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj["status"] = {"phase": "Active"}
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj[
                "metadata"
            ]["name"]
        elif rt.key == "/pods":
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
        elif rt.key == "/secrets" and not obj.get("type"):
            obj["type"] = "Opaque"
        elif rt.key == "/services":
            obj["status"] = {"loadBalancer": {}}
        elif rt.key == CRD_KEY:
            self._check_crd(obj)
            fins = obj["metadata"].setdefault("finalizers", [])
            if CRD_CLEANUP_FINALIZER not in fins:
                fins.append(CRD_CLEANUP_FINALIZER)
            obj["status"] = self._crd_status(obj)

    # -- update / patch --------------------------------------------------------------------

    def update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        version: str | None = None,
        dry_run: bool = False,
        require_rv: bool | None = None,
        field_validation: str = "Ignore",
    ) -> JSON:
        body = self._check_body(rt, body, version)
        srt, existing = self._stored(rt, namespace, name)
        new = self._from_view(rt, copy.deepcopy(body))
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            meta = new["metadata"] = {}
        if meta.get("name") not in (None, name):
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on "
                f"the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        old_meta = existing["metadata"]
        rv = meta.get("resourceVersion")
        if rv:
            if str(rv) != old_meta["resourceVersion"]:
                raise stale(rt.plural, rt.group, name)
        elif require_rv if require_rv is not None else rt.crd:
            raise invalid(
                rt.kind,
                rt.group,
                name,
                [
                    Cause(
                        "FieldValueInvalid",
                        "Invalid value: 0: must be specified for an update",
                        "metadata.resourceVersion",
                    )
                ],
            )
        return self._write_update(
            rt,
            srt,
            existing,
            new,
            subresource=subresource,
            version=version,
            dry_run=dry_run,
            field_validation=field_validation,
        )

    def _write_update(
        self,
        rt: ResourceType,
        srt: ResourceType,
        existing: JSON,
        new: JSON,
        *,
        subresource: str | None,
        version: str | None,
        dry_run: bool,
        field_validation: str = "Ignore",
    ) -> JSON:
        old_meta = existing["metadata"]
        name = old_meta["name"]
        if subresource == "status":
            status = new.get("status")
            new = copy.deepcopy(existing)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif rt.status:
            if "status" in existing:
                new["status"] = copy.deepcopy(existing["status"])
            else:
                new.pop("status", None)
        meta = new["metadata"]
        for k in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ):
            if k in old_meta:
                meta[k] = old_meta[k]
            else:
                meta.pop(k, None)
        meta["name"] = name
        if "namespace" in old_meta:
            meta["namespace"] = old_meta["namespace"]
        meta.pop("managedFields", None)
        meta.pop("selfLink", None)
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise invalid(
                    rt.kind,
                    rt.group,
                    name,
                    [
                        Cause(
                            "FieldValueForbidden",
                            "Forbidden: no new finalizers can be added if the object is being "
                            "deleted",
                            "metadata.finalizers",
                        )
                    ],
                )
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        _fold_string_data(rt, new)
        if rt.key == NS_KEY and subresource != "finalize":
            new["spec"] = copy.deepcopy(existing.get("spec", {}))
        if rt.crd and subresource != "scale":
            new = self._validate_custom(rt, new, existing, field_validation)
        elif rt.key == CRD_KEY:
            self._check_crd(new)
            new["status"] = self._crd_status(new)
        meta = new["metadata"]
        if _has_generation(rt) and self._spec_changed(rt, existing, new):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if new == existing:
            return self.to_view(rt, existing, version)
        if dry_run:
            return self.to_view(rt, new, version)
        if self._deletion_complete(rt, new):
            meta["resourceVersion"] = str(self.store.next_rv())
            self.store.remove(srt.key, new)
            self._after_remove(rt, new)
            return self.to_view(rt, new, version)
        meta["resourceVersion"] = str(self.store.next_rv())
        self.store.put(srt.key, new, created=False)
        if rt.key == CRD_KEY:
            self._register_crd(new)
        return self.to_view(rt, new, version)

    @staticmethod
    def _deletion_complete(rt: ResourceType, obj: JSON) -> bool:
        """A terminating object goes once its last finalizer is gone (and, for a pod, once
        its grace period was cut to zero; for a namespace, once its spec finalizers are)."""
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return False
        if int(meta.get("deletionGracePeriodSeconds") or 0) > 0:
            return False
        return not (rt.key == NS_KEY and (obj.get("spec") or {}).get("finalizers"))

    def _spec_changed(self, rt: ResourceType, old: JSON, new: JSON) -> bool:
        skip = {"metadata", "apiVersion", "kind"}
        if rt.status:
            skip.add("status")
        keys = (set(old) | set(new)) - skip
        return any(old.get(k) != new.get(k) for k in keys)

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        version: str | None = None,
        dry_run: bool = False,
        field_validation: str = "Ignore",
    ) -> JSON:
        srt, existing = self._stored(rt, namespace, name)
        current = copy.deepcopy(self.to_view(rt, existing, version))
        patched = self.apply_patch(rt, current, content_type, patch)
        if not isinstance(patched, dict):
            raise bad_request("the patch must produce a JSON object")
        rv = (patched.get("metadata") or {}).get("resourceVersion")
        if rv and str(rv) != existing["metadata"]["resourceVersion"]:
            raise stale(rt.plural, rt.group, name)
        new = self._from_view(rt, patched)
        if not isinstance(new.get("metadata"), dict):
            new["metadata"] = {}
        return self._write_update(
            rt,
            srt,
            existing,
            new,
            subresource=subresource,
            version=version,
            dry_run=dry_run,
            field_validation=field_validation,
        )

    def apply_patch(self, rt: ResourceType, current: JSON, content_type: str, patch: Any) -> Any:
        if content_type == MERGE_PATCH:
            if not isinstance(patch, dict):
                raise bad_request("merge patch must be a JSON object")
            return merge_patch(current, patch)
        if content_type == JSON_PATCH:
            return json_patch(current, patch)
        if content_type == STRATEGIC_PATCH:
            if rt.crd:
                raise unsupported_media_type(content_type)
            if not isinstance(patch, dict):
                raise bad_request("strategic merge patch must be a JSON object")
            return strategic_merge_patch(current, patch)
        raise unsupported_media_type(content_type)

    # -- scale ------------------------------------------------------------------------------

    def get_scale(self, rt: ResourceType, namespace: str, name: str) -> JSON:
        if rt.scale is None:
            raise not_found(rt.plural + "/scale", rt.group, name)
        obj = self.get(rt, namespace, name)
        return self._scale_of(rt.scale, obj)

    def _scale_of(self, spec: ScaleSpec, obj: JSON) -> JSON:
        meta = obj["metadata"]
        selector = ""
        if spec.selector_from_spec:
            selector = format_selector(
                label_selector_from_api((obj.get("spec") or {}).get("selector"))
            )
        elif spec.label_selector_path:
            selector = str(_get_path(obj, spec.label_selector_path) or "")
        status: JSON = {"replicas": int(_get_path(obj, spec.status_replicas_path) or 0)}
        if selector:
            status["selector"] = selector
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": int(_get_path(obj, spec.spec_replicas_path) or 0)},
            "status": status,
        }

    def write_scale(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        patch: Any = None,
        dry_run: bool = False,
    ) -> JSON:
        if rt.scale is None:
            raise not_found(rt.plural + "/scale", rt.group, name)
        existing = self.get(rt, namespace, name)
        scale = self._scale_of(rt.scale, existing)
        if content_type is not None:
            scale = self.apply_patch(rt, scale, content_type, patch)
        elif isinstance(body, dict):
            scale = body
        else:
            raise bad_request("the body of the request must be a Scale object")
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        if rv and str(rv) != existing["metadata"]["resourceVersion"]:
            raise stale(rt.plural, rt.group, name)
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid(
                "Scale",
                "autoscaling",
                name,
                [
                    Cause(
                        "FieldValueInvalid",
                        f"Invalid value: {replicas}: must be greater than or equal to 0",
                        "spec.replicas",
                    )
                ],
            )
        new = copy.deepcopy(existing)
        _set_path(new, rt.scale.spec_replicas_path, replicas)
        srt = self._storage_rt(rt)
        if rt.crd:
            new = self._validate_custom(rt, new, existing)
        updated = self._write_update(
            rt, srt, existing, new, subresource="scale", version=None, dry_run=dry_run
        )
        return self._scale_of(rt.scale, updated)

    # -- delete -----------------------------------------------------------------------------

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        options: JSON | None = None,
        *,
        dry_run: bool = False,
        version: str | None = None,
    ) -> JSON:
        options = options or {}
        srt, existing = self._stored(rt, namespace, name)
        pre = options.get("preconditions") or {}
        meta = existing["metadata"]
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise conflict(
                rt.plural,
                rt.group,
                name,
                "Precondition failed: "
                f"UID in precondition: {pre['uid']}, UID in object meta: {meta.get('uid')}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise conflict(
                rt.plural,
                rt.group,
                name,
                "Precondition failed: "
                f"ResourceVersion in precondition: {pre['resourceVersion']}, ResourceVersion in "
                f"object meta: {meta.get('resourceVersion')}",
            )
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents") is True:
            policy = "Orphan"
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and FOREGROUND not in finalizers:
            finalizers.append(FOREGROUND)
        elif policy == "Orphan" and ORPHAN not in finalizers:
            finalizers.append(ORPHAN)
        grace = self._grace_period(rt, existing, options)
        finalizers_pending = rt.key == NS_KEY or bool(finalizers) or grace > 0
        if not finalizers_pending:
            if dry_run:
                return self.to_view(rt, existing, version)
            final = copy.deepcopy(existing)
            final["metadata"]["resourceVersion"] = str(self.store.next_rv())
            self.store.remove(srt.key, final)
            self._after_remove(rt, final)
            return self.to_view(rt, final, version)
        new = copy.deepcopy(existing)
        nmeta = new["metadata"]
        if finalizers:
            nmeta["finalizers"] = finalizers
        if not nmeta.get("deletionTimestamp"):
            nmeta["deletionTimestamp"] = now_rfc3339()
            nmeta["deletionGracePeriodSeconds"] = grace
        elif grace < int(nmeta.get("deletionGracePeriodSeconds") or 0):
            nmeta["deletionGracePeriodSeconds"] = grace
        if rt.key == NS_KEY:
            new.setdefault("status", {})["phase"] = "Terminating"
        if new == existing or dry_run:
            return self.to_view(rt, existing, version)
        nmeta["resourceVersion"] = str(self.store.next_rv())
        self.store.put(srt.key, new, created=False)
        return self.to_view(rt, new, version)

    def _grace_period(self, rt: ResourceType, obj: JSON, options: JSON) -> int:
        """Pods bound to a node terminate gracefully: the kubelet finishes the deletion."""
        if rt.key != "/pods" or not (obj.get("spec") or {}).get("nodeName"):
            return 0
        phase = (obj.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return 0
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        return max(0, int(grace))

    def _after_remove(self, rt: ResourceType, obj: JSON) -> None:
        if rt.key == CRD_KEY:
            self._unregister_crd(obj)

    def delete_collection(
        self,
        rt: ResourceType,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        options: JSON | None,
        *,
        dry_run: bool = False,
    ) -> builtins.list[JSON]:
        items, _ = self.list(rt, namespace, label_selector, field_selector)
        out = []
        for item in items:
            meta = item["metadata"]
            try:
                out.append(
                    self.delete(
                        rt, meta.get("namespace", ""), meta["name"], options, dry_run=dry_run
                    )
                )
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return out

    # -- custom resources -------------------------------------------------------------------

    def _validate_custom(
        self, rt: ResourceType, obj: JSON, old: JSON | None, field_validation: str = "Ignore"
    ) -> JSON:
        """Prune, default and validate a custom resource. ``field_validation`` is the request's
        ``fieldValidation``: unknown fields fail the request (``Strict``), become ``Warning``
        headers (``Warn``, the server's default) or are dropped silently (``Ignore``)."""
        version = str(obj.get("apiVersion", "")).rpartition("/")[2] or rt.preferred_version
        sch = rt.schemas.get(version) or rt.schemas.get(rt.preferred_version)
        if sch is None:
            return obj
        metadata = obj.get("metadata", {})
        dropped: builtins.list[str] = []
        body = schemas.prune(obj, sch, root=True, dropped=dropped)
        if dropped and field_validation == "Strict":
            version_name = str(obj.get("apiVersion", "")).rpartition("/")[2]
            raise bad_request(
                f'{rt.kind} in version "{version_name}" cannot be handled as a {rt.kind}: '
                "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in dropped)
            )
        if field_validation == "Warn":
            self.warnings.extend(f'unknown field "{p}"' for p in dropped)
        body = schemas.apply_defaults(body, sch)
        body["metadata"] = metadata
        causes, warnings = schemas.validate(body, sch, old)
        self.warnings.extend(warnings)
        if causes:
            raise invalid(rt.kind, rt.group, metadata.get("name", ""), causes)
        out: JSON = body
        return out

    def _check_crd(self, crd: JSON) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        name = crd["metadata"].get("name", "")
        causes: builtins.list[Cause] = []
        if not spec.get("group"):
            causes.append(Cause("FieldValueRequired", "Required value", "spec.group"))
        if not names.get("plural"):
            causes.append(Cause("FieldValueRequired", "Required value", "spec.names.plural"))
        if not names.get("kind"):
            causes.append(Cause("FieldValueRequired", "Required value", "spec.names.kind"))
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{spec.get("scope")}": supported values: '
                    '"Cluster", "Namespaced"',
                    "spec.scope",
                )
            )
        versions = spec.get("versions") or []
        if not versions:
            causes.append(Cause("FieldValueRequired", "Required value", "spec.versions"))
        elif sum(1 for v in versions if v.get("storage")) != 1:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    "Invalid value: must have exactly one version marked as storage version",
                    "spec.versions",
                )
            )
        if (
            names.get("plural")
            and spec.get("group")
            and name != f"{names['plural']}.{spec['group']}"
        ):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
                    "metadata.name",
                )
            )
        if causes:
            raise invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, causes)
        for v in versions:
            self._collect_rule_warnings(
                ((v.get("schema") or {}).get("openAPIV3Schema")) or {},
                f"spec.versions[{v.get('name')}]",
            )

    def _collect_rule_warnings(self, node: Any, where: str) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations") or []:
                err = schemas.check_rule(rule.get("rule", ""))
                if err:
                    msg = (
                        f"{where}: CEL rule {rule.get('rule')!r} cannot be evaluated locally: {err}"
                    )
                    log.warning("%s", msg)
                    self.warnings.append(msg)
            for v in node.values():
                self._collect_rule_warnings(v, where)
        elif isinstance(node, list):
            for v in node:
                self._collect_rule_warnings(v, where)

    def _crd_status(self, crd: JSON) -> JSON:
        spec = crd.get("spec") or {}
        names = dict(spec.get("names") or {})
        names.setdefault("singular", str(names.get("kind", "")).lower())
        names.setdefault("listKind", f"{names.get('kind', '')}List")
        ts = (crd.get("status") or {}).get("conditions")
        stamp = now_rfc3339()
        if ts:
            stamp = ts[0].get("lastTransitionTime", stamp)
        stored = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
        old_stored = (crd.get("status") or {}).get("storedVersions") or []
        return {
            "acceptedNames": names,
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": stamp,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": stamp,
                },
            ],
            "storedVersions": sorted(set(old_stored) | set(stored)),
        }

    def _register_crd(self, crd: JSON) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        served = [v for v in spec.get("versions") or [] if v.get("served", True)]
        if not served:
            self.registry.remove(f"{spec.get('group')}/{names.get('plural')}")
            return
        served.sort(key=lambda v: _version_priority(v["name"]))
        storage = next((v for v in spec.get("versions") or [] if v.get("storage")), served[0])
        subres = storage.get("subresources") or {}
        scale = subres.get("scale")
        rt = ResourceType(
            group=spec["group"],
            versions=tuple(v["name"] for v in served),
            plural=names["plural"],
            singular=names.get("singular") or names["kind"].lower(),
            kind=names["kind"],
            namespaced=spec.get("scope") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()),
            categories=tuple(names.get("categories") or ()),
            status="status" in subres,
            scale=ScaleSpec(
                spec_replicas_path=scale["specReplicasPath"],
                status_replicas_path=scale.get("statusReplicasPath", ".status.replicas"),
                label_selector_path=scale.get("labelSelectorPath"),
            )
            if isinstance(scale, dict)
            else None,
            crd=True,
            schemas={v["name"]: ((v.get("schema") or {}).get("openAPIV3Schema")) for v in served},
            printer_columns={
                v["name"]: list(v.get("additionalPrinterColumns") or []) for v in served
            },
        )
        self.registry.add(rt)
        for hook in self._hooks:
            hook()

    def _unregister_crd(self, crd: JSON) -> None:
        spec = crd.get("spec") or {}
        key = f"{spec.get('group')}/{(spec.get('names') or {}).get('plural')}"
        self.registry.remove(key)
        for _k, obj in [(k, o) for k, o in self.store.iter_all() if k == key]:
            final = copy.deepcopy(obj)
            final["metadata"]["resourceVersion"] = str(self.store.next_rv())
            self.store.remove(key, final)
        for hook in self._hooks:
            hook()

    def on_registry_change(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)
