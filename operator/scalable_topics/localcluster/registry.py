"""The resource types the local apiserver serves: built-ins plus whatever CRDs declare."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")


@dataclass(frozen=True)
class ScaleSpec:
    """Where the ``/scale`` subresource reads and writes (JSONPath-ish dotted paths)."""

    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    label_selector_path: str | None = None
    selector_from_spec: bool = False
    """Built-in workloads derive the selector string from ``spec.selector``."""


@dataclass
class ResourceType:
    group: str
    versions: tuple[str, ...]
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status: bool = False
    scale: ScaleSpec | None = None
    log: bool = False
    crd: bool = False
    schemas: dict[str, JSON | None] = field(default_factory=dict)
    printer_columns: dict[str, list[JSON]] = field(default_factory=dict)
    storage_key: str | None = None
    """For an alias served from another resource's storage (events.k8s.io/v1 Event)."""

    @property
    def key(self) -> str:
        return f"{self.group}/{self.plural}"

    @property
    def store_key(self) -> str:
        return self.storage_key or self.key

    @property
    def preferred_version(self) -> str:
        return self.versions[0]

    def api_version(self, version: str | None = None) -> str:
        v = version or self.preferred_version
        return f"{self.group}/{v}" if self.group else v

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


def _b(
    group: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool = True,
    version: str = "v1",
    short: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    status: bool = False,
    scale: ScaleSpec | None = None,
    log: bool = False,
    storage_key: str | None = None,
) -> ResourceType:
    return ResourceType(
        group=group,
        versions=(version,),
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=namespaced,
        short_names=short,
        categories=categories,
        status=status,
        scale=scale,
        log=log,
        storage_key=storage_key,
    )


_WORKLOAD_SCALE = ScaleSpec(selector_from_spec=True)

BUILTINS: tuple[ResourceType, ...] = (
    _b("", "namespaces", "Namespace", namespaced=False, short=("ns",), status=True),
    _b("", "pods", "Pod", short=("po",), categories=("all",), status=True, log=True),
    _b("", "services", "Service", short=("svc",), categories=("all",), status=True),
    _b("", "endpoints", "Endpoints", short=("ep",)),
    _b("", "configmaps", "ConfigMap", short=("cm",)),
    _b("", "secrets", "Secret"),
    _b("", "serviceaccounts", "ServiceAccount", short=("sa",)),
    _b("", "events", "Event", short=("ev",)),
    _b("", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), status=True),
    _b("", "nodes", "Node", namespaced=False, short=("no",), status=True),
    _b("events.k8s.io", "events", "Event", short=("ev",), storage_key="/events"),
    _b("coordination.k8s.io", "leases", "Lease"),
    _b(
        "apps",
        "deployments",
        "Deployment",
        short=("deploy",),
        categories=("all",),
        status=True,
        scale=_WORKLOAD_SCALE,
    ),
    _b(
        "apps",
        "statefulsets",
        "StatefulSet",
        short=("sts",),
        categories=("all",),
        status=True,
        scale=_WORKLOAD_SCALE,
    ),
    _b(
        "apps",
        "replicasets",
        "ReplicaSet",
        short=("rs",),
        categories=("all",),
        status=True,
        scale=_WORKLOAD_SCALE,
    ),
    _b("apps", "daemonsets", "DaemonSet", short=("ds",), categories=("all",), status=True),
    _b("batch", "jobs", "Job", categories=("all",), status=True),
    _b("batch", "cronjobs", "CronJob", short=("cj",), categories=("all",), status=True),
    _b("policy", "poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",), status=True),
    _b("rbac.authorization.k8s.io", "roles", "Role"),
    _b("rbac.authorization.k8s.io", "rolebindings", "RoleBinding"),
    _b("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", namespaced=False),
    _b("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    _b(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short=("crd", "crds"),
        categories=("api-extensions",),
        status=True,
    ),
    _b(
        "autoscaling",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        version="v2",
        short=("hpa",),
        categories=("all",),
        status=True,
    ),
    _b("networking.k8s.io", "networkpolicies", "NetworkPolicy", short=("netpol",)),
    _b("monitoring.coreos.com", "servicemonitors", "ServiceMonitor", categories=("prometheus",)),
)

_CORE_GROUP_ORDER = ("",)


class Registry:
    """Resource types indexed for the lookups the HTTP layer and the controllers do."""

    def __init__(self) -> None:
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        self._by_key: dict[str, ResourceType] = {}
        self._by_kind: dict[tuple[str, str], ResourceType] = {}
        self._crd_keys: dict[str, str] = {}
        for rt in BUILTINS:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        old = self._by_key.get(rt.key)
        if old is not None:
            self.remove(rt.key)
        self._by_key[rt.key] = rt
        for v in rt.versions:
            self._by_gvr[(rt.group, v, rt.plural)] = rt
        self._by_kind[(rt.group, rt.kind)] = rt

    def remove(self, key: str) -> ResourceType | None:
        rt = self._by_key.pop(key, None)
        if rt is None:
            return None
        for v in rt.versions:
            self._by_gvr.pop((rt.group, v, rt.plural), None)
        if self._by_kind.get((rt.group, rt.kind)) is rt:
            del self._by_kind[(rt.group, rt.kind)]
        return rt

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_gvr.get((group, version, plural))

    def by_key(self, key: str) -> ResourceType | None:
        return self._by_key.get(key)

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group = api_version.rpartition("/")[0]
        return self._by_kind.get((group, kind))

    def storage_aliases(self, store_key: str) -> list[ResourceType]:
        return [rt for rt in self._by_key.values() if rt.store_key == store_key]

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(list(self._by_key.values()))

    def group_versions(self) -> dict[str, list[str]]:
        """Groups (``""`` is core) to their served versions, preferred first."""
        out: dict[str, list[str]] = {}
        for rt in self._by_key.values():
            versions = out.setdefault(rt.group, [])
            for v in rt.versions:
                if v not in versions:
                    versions.append(v)
        return out

    def resources_in(self, group: str, version: str) -> list[ResourceType]:
        return [rt for (g, v, _), rt in sorted(self._by_gvr.items()) if g == group and v == version]
