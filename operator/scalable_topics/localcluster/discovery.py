"""Discovery documents (legacy, unaggregated) and the OpenAPI stubs kubectl asks for.

kubectl 1.32 asks ``/api`` and ``/apis`` for aggregated discovery first; a plain
``application/json`` answer makes it fall back to the per-group-version documents served here.

OpenAPI: kubectl (with its default ``--validate=strict``) reads ``/openapi/v3`` to learn whether
the server validates fields itself (it looks for the ``fieldValidation`` parameter on a PATCH
operation, falling back to Namespace's for unknown group-versions), and otherwise downloads
``/openapi/v2`` (protobuf) for client-side validation. This server publishes just enough v3 to
say "yes" (it implements ``fieldValidation`` for custom resources) and an empty, well-formed v2
document (``swagger: "2.0"``, no definitions), so kubectl never validates against schemas it
does not have and computes strategic merge patches from its compiled-in types.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .registry import ALL_VERBS, SUBRESOURCE_VERBS, Registry, ResourceType

JSON = dict[str, Any]

KUBE_VERSION = {"major": "1", "minor": "32"}

# A protobuf-encoded gnostic ``openapi_v2.Document`` with only ``swagger = "2.0"`` (field 1).
OPENAPI_V2_PROTOBUF = b"\x0a\x032.0"
OPENAPI_V2_JSON: JSON = {
    "swagger": "2.0",
    "info": {"title": "stopic-local", "version": "v1.32.0"},
    "paths": {},
    "definitions": {},
}


def version_info() -> JSON:
    return {
        **KUBE_VERSION,
        "gitVersion": "v1.32.0-stopic-local",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> JSON:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group(name: str, versions: list[str]) -> JSON:
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(registry: Registry) -> JSON:
    groups = [
        _group(name, versions)
        for name, versions in sorted(registry.group_versions().items())
        if name
    ]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, name: str) -> JSON | None:
    versions = registry.group_versions().get(name)
    if not versions or not name:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def _storage_hash(rt: ResourceType) -> str:
    return hashlib.sha256(f"{rt.group}/{rt.kind}".encode()).hexdigest()[:11]


def resource_list(registry: Registry, group: str, version: str) -> JSON | None:
    rts = registry.resources_in(group, version)
    if not rts:
        return None
    resources: list[JSON] = []
    for rt in rts:
        main: JSON = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(ALL_VERBS),
            "storageVersionHash": _storage_hash(rt),
        }
        if rt.short_names:
            main["shortNames"] = list(rt.short_names)
        if rt.categories:
            main["categories"] = list(rt.categories)
        resources.append(main)
        if rt.status:
            resources.append(
                {
                    "name": f"{rt.plural}/status",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": list(SUBRESOURCE_VERBS),
                }
            )
        if rt.scale is not None:
            resources.append(
                {
                    "name": f"{rt.plural}/scale",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": list(SUBRESOURCE_VERBS),
                }
            )
        if rt.log:
            resources.append(
                {
                    "name": f"{rt.plural}/log",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": "Pod",
                    "verbs": ["get"],
                }
            )
        if rt.kind == "Namespace" and not rt.group:
            resources.append(
                {
                    "name": "namespaces/finalize",
                    "singularName": "",
                    "namespaced": False,
                    "kind": "Namespace",
                    "verbs": ["update"],
                }
            )
    gv = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }


OPENAPI_V3_CORE_HASH = "stopic-local-1"


def openapi_v3_root() -> JSON:
    """``/openapi/v3``: only ``api/v1`` is listed (see :func:`openapi_v3_core`)."""
    return {
        "paths": {
            "api/v1": {"serverRelativeURL": f"/openapi/v3/api/v1?hash={OPENAPI_V3_CORE_HASH}"}
        }
    }


def openapi_v3_core() -> JSON:
    """The part of ``/openapi/v3/api/v1`` kubectl reads to learn that the server validates fields.

    kubectl looks for the ``fieldValidation`` query parameter on the PATCH operation of the
    kind it sends, and for group-versions it cannot find, on Namespace's. Only Namespace is
    described, so for every other kind kubectl falls back to its compiled-in knowledge.
    """
    param = {
        "name": "fieldValidation",
        "in": "query",
        "description": "fieldValidation instructs the server on how to handle objects in the "
        "request containing unknown or duplicate fields.",
        "schema": {"type": "string", "uniqueItems": True},
    }
    gvk = {"group": "", "version": "v1", "kind": "Namespace"}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": {
            "/api/v1/namespaces/{name}": {
                "patch": {
                    "tags": ["core_v1"],
                    "operationId": "patchCoreV1Namespace",
                    "parameters": [param],
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                }
            }
        },
        "components": {"schemas": {}},
    }
