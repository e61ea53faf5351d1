"""Pure translation of a Pod's container spec into a local process (no I/O besides path lookups).

Covers the Kubernetes ``$(VAR)`` expansion, environment assembly (``env``, ``envFrom``,
``fieldRef``, ConfigMap/Secret keys), the on-disk layout of a pod, and the rewriting of volume
mount paths into local directories (a process has no mount namespace, so every occurrence of a
``mountPath`` in its command, arguments, environment values and working directory is replaced by
the directory that backs the volume).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.jsontypes import JsonObj


class PodSpecError(Exception):
    """The container cannot be started as specified; ``reason`` becomes the waiting reason."""

    def __init__(self, message: str, reason: str = "CreateContainerConfigError") -> None:
        super().__init__(message)
        self.reason = reason


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion (``third_party/forked/golang/expansion``).

    ``$(NAME)`` is replaced when ``NAME`` is in ``env`` and kept verbatim otherwise; ``$$`` is an
    escaped ``$`` (so ``$$(NAME)`` yields the literal ``$(NAME)``); any other ``$`` is literal.
    """
    out: list[str] = []
    i, n = 0, len(value)
    while i < n:
        ch = value[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = value[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = value.find(")", i + 2)
            if close < 0:
                out.append(value[i:])
                break
            name = value[i + 2 : close]
            if name in env:
                out.append(env[name])
            else:
                out.append(value[i : close + 1])
            i = close + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Mount:
    mount_path: str
    local_dir: Path
    volume: str


class MountRewriter:
    """Replaces mount paths by their local directories, longest mount path first.

    A mount path matches only as a whole path prefix: it must not be preceded by a path
    character and must be followed by ``/`` or a character that cannot continue a path
    component, so ``/data`` rewrites ``/data`` and ``--dir=/data/x`` but not ``/database``.
    One regex pass makes the rewrite idempotent with respect to its own output.
    """

    def __init__(self, mounts: Iterable[tuple[str, Path]]) -> None:
        table: dict[str, str] = {}
        for mount_path, local in mounts:
            key = mount_path.rstrip("/") or "/"
            table[key] = str(local)
        # A mount over "/" cannot be expressed as a rewrite of path prefixes.
        table.pop("/", None)
        self._table = table
        ordered = sorted(table, key=len, reverse=True)
        self._regex = (
            re.compile(
                r"(?<![\w.\-/])(" + "|".join(re.escape(p) for p in ordered) + r")(?=/|$|[^\w.\-])"
            )
            if ordered
            else None
        )

    def __call__(self, value: str) -> str:
        if self._regex is None:
            return value
        return self._regex.sub(lambda m: self._table[m.group(1)], value)


_PYTHON = re.compile(r"python(3(\.\d+)?)?")


def resolve_executable(command: str, venv_bin: Path | None = None, path: str | None = None) -> str:
    """Map a container's ``command[0]`` to a local executable.

    ``python``/``python3``/``python3.N`` (bare or with a directory, as images spell it) run with
    the current interpreter; other bare names are looked up in the virtualenv's bin directory and
    then on ``PATH``; a path that exists is used as is.
    """
    base = os.path.basename(command)
    if _PYTHON.fullmatch(base):
        return sys.executable
    bin_dir = Path(sys.executable).parent if venv_bin is None else venv_bin
    if "/" not in command:
        candidate = bin_dir / command
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        found = shutil.which(command, path=path)
        if found:
            return found
        raise PodSpecError(f"executable {command!r} not found in {bin_dir} or PATH", "StartError")
    if os.path.exists(command):
        return command
    found = shutil.which(base, path=f"{bin_dir}{os.pathsep}{path or os.environ.get('PATH', '')}")
    if found:
        return found
    raise PodSpecError(f"executable {command!r} not found", "StartError")


def env_suffix(volume_name: str) -> str:
    """``LOCALCLUSTER_MOUNT_<suffix>`` for a volume: upper case, non-alphanumerics as ``_``."""
    return re.sub(r"[^A-Z0-9]", "_", volume_name.upper())


def _decode_secret(data: Mapping[str, str]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for key, value in data.items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise PodSpecError(f"secret key {key!r} is not valid base64") from exc
    return out


def object_bytes(kind: str, obj: JsonObj) -> dict[str, bytes]:
    """The key → content map of a ConfigMap (``data`` + ``binaryData``) or Secret."""
    if kind == "Secret":
        result = {k: v.encode() for k, v in (obj.get("stringData") or {}).items()}
        result.update(_decode_secret(obj.get("data") or {}))
        return result
    result = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    result.update(_decode_secret(obj.get("binaryData") or {}))
    return result


def _lookup_key(
    ref: JsonObj, kind: str, objects: Mapping[tuple[str, str], JsonObj | None]
) -> str | None:
    name = ref.get("name", "")
    key = ref.get("key", "")
    optional = bool(ref.get("optional", False))
    obj = objects.get((kind, name))
    if obj is None:
        if optional:
            return None
        raise PodSpecError(f'{kind.lower()} "{name}" not found')
    values = object_bytes(kind, obj)
    if key not in values:
        if optional:
            return None
        raise PodSpecError(f"couldn't find key {key} in {kind} {name}")
    return values[key].decode("utf-8", errors="replace")


_FIELD_INDEX = re.compile(r"metadata\.(labels|annotations)\['([^']*)'\]")


def field_value(pod: JsonObj, path: str) -> str:
    """Value of a downward-API ``fieldRef.fieldPath`` for ``pod``."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(p.get("ip", "") for p in status.get("podIPs") or []),
        "status.hostIPs": ",".join(p.get("ip", "") for p in status.get("hostIPs") or []),
    }
    if path in simple:
        return "" if simple[path] is None else str(simple[path])
    match = _FIELD_INDEX.fullmatch(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise PodSpecError(f"unsupported fieldRef {path!r}")


ObjectRef = tuple[str, str, bool]
"""(kind, name, optional) of a ConfigMap or Secret a pod uses."""

# (field holding the reference, kind referred to, key of the name in the reference)
_ENV_FROM_REFS = (("configMapRef", "ConfigMap", "name"), ("secretRef", "Secret", "name"))
_ENV_KEY_REFS = (("configMapKeyRef", "ConfigMap", "name"), ("secretKeyRef", "Secret", "name"))
_VOLUME_REFS = (("configMap", "ConfigMap", "name"), ("secret", "Secret", "secretName"))
_PROJECTED_REFS = (("configMap", "ConfigMap", "name"), ("secret", "Secret", "name"))


def _refs_in(holder: JsonObj, ref_fields: tuple[tuple[str, str, str], ...]) -> set[ObjectRef]:
    refs: set[ObjectRef] = set()
    for field_name, kind, name_key in ref_fields:
        if field_name in holder:
            ref = holder[field_name]
            refs.add((kind, ref.get(name_key, ""), bool(ref.get("optional", False))))
    return refs


def referenced_objects(pod: JsonObj) -> set[ObjectRef]:
    """(kind, name, optional) of every ConfigMap/Secret the pod's containers and volumes use."""
    spec = pod.get("spec") or {}
    refs: set[ObjectRef] = set()
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for src in c.get("envFrom") or []:
            refs |= _refs_in(src, _ENV_FROM_REFS)
        for var in c.get("env") or []:
            refs |= _refs_in(var.get("valueFrom") or {}, _ENV_KEY_REFS)
    for vol in spec.get("volumes") or []:
        refs |= _refs_in(vol, _VOLUME_REFS)
        for source in (vol.get("projected") or {}).get("sources") or []:
            refs |= _refs_in(source, _PROJECTED_REFS)
    return refs


def container_env(
    container: JsonObj, pod: JsonObj, objects: Mapping[tuple[str, str], JsonObj | None]
) -> dict[str, str]:
    """The container's own environment, in Kubernetes order: ``envFrom``, then ``env``.

    Each ``env[].value`` is expanded against the variables defined before it.
    """
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for field_name, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            if field_name not in src:
                continue
            ref = src[field_name]
            obj = objects.get((kind, ref.get("name", "")))
            if obj is None:
                if ref.get("optional", False):
                    continue
                raise PodSpecError(f'{kind.lower()} "{ref.get("name", "")}" not found')
            for key, raw in object_bytes(kind, obj).items():
                env[prefix + key] = raw.decode("utf-8", errors="replace")
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        value_from = var["valueFrom"]
        if "fieldRef" in value_from:
            env[name] = field_value(pod, value_from["fieldRef"].get("fieldPath", ""))
        elif "configMapKeyRef" in value_from:
            found = _lookup_key(value_from["configMapKeyRef"], "ConfigMap", objects)
            if found is not None:
                env[name] = found
        elif "secretKeyRef" in value_from:
            found = _lookup_key(value_from["secretKeyRef"], "Secret", objects)
            if found is not None:
                env[name] = found
        elif "resourceFieldRef" in value_from:
            env[name] = _resource_field(container, value_from["resourceFieldRef"])
        else:
            raise PodSpecError(f"unsupported valueFrom for env {name!r}")
    return env


def _resource_field(container: JsonObj, ref: JsonObj) -> str:
    resource = str(ref.get("resource", ""))
    section, _, kind = resource.partition(".")
    value = ((container.get("resources") or {}).get(section) or {}).get(kind)
    if value is not None:
        return str(value)
    if kind == "cpu":
        return str(os.cpu_count() or 1)
    if kind == "memory":
        return str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return "0"


@dataclass(frozen=True)
class PodLayout:
    """Where a pod's files live under the cluster's data directory."""

    data_dir: Path

    def pod_dir(self, namespace: str, pod: str) -> Path:
        return self.data_dir / "pods" / namespace / pod

    def work_dir(self, namespace: str, pod: str, container: str) -> Path:
        """The working directory of a container without ``workingDir``: its own, as a
        container's filesystem is (not the kubelet's, shared by every Pod)."""
        return self.pod_dir(namespace, pod) / "workdir" / container

    def log_path(self, namespace: str, pod: str, container: str) -> Path:
        return self.pod_dir(namespace, pod) / f"{container}.log"

    def volume_dir(self, namespace: str, pod: str, volume: str) -> Path:
        return self.pod_dir(namespace, pod) / "volumes" / volume

    def claim_dir(self, namespace: str, claim: str) -> Path:
        return self.data_dir / "volumes" / namespace / claim


def volume_sources(pod: JsonObj, layout: PodLayout) -> dict[str, Path]:
    """Local directory backing each volume of the pod (files are not written here)."""
    meta = pod["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    result: dict[str, Path] = {}
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        vname = vol["name"]
        if "persistentVolumeClaim" in vol:
            result[vname] = layout.claim_dir(ns, vol["persistentVolumeClaim"]["claimName"])
        elif "hostPath" in vol:
            result[vname] = Path(vol["hostPath"]["path"])
        else:
            result[vname] = layout.volume_dir(ns, name, vname)
    return result


def container_mounts(container: JsonObj, volumes: Mapping[str, Path]) -> list[Mount]:
    mounts: list[Mount] = []
    for vm in container.get("volumeMounts") or []:
        vname = vm["name"]
        if vname not in volumes:
            raise PodSpecError(f"volumeMount {vname!r} refers to no volume of the pod")
        local = volumes[vname]
        sub = vm.get("subPath")
        if sub:
            local = local / sub
        mounts.append(Mount(vm["mountPath"], local, vname))
    return mounts


@dataclass(frozen=True)
class ContainerCommand:
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None


def container_command(
    container: JsonObj,
    container_env_vars: Mapping[str, str],
    mounts: list[Mount],
    extra_env: Mapping[str, str],
    base_env: Mapping[str, str],
    service_env: Mapping[str, str] | None = None,
) -> ContainerCommand:
    """argv, complete environment and working directory of a container process.

    ``command``/``args`` are expanded against the container's environment over ``service_env``
    (``KUBERNETES_SERVICE_HOST``/``_PORT``: a kubelet puts the Service variables under the
    container's own, so ``$(KUBERNETES_SERVICE_HOST)`` in args names the API server) and then
    rewritten through the mount table, as are the container's environment values. ``extra_env``
    (``KUBECONFIG``, ``POD_IP``…) fills only names the container does not set, and everything is
    layered over ``base_env`` (the kubelet's own environment).
    """
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if not command:
        raise PodSpecError(
            f"container {container.get('name')!r} has no command; the image's entrypoint "
            "cannot be known locally",
            "CreateContainerError",
        )
    rewrite = MountRewriter((m.mount_path, m.local_dir) for m in mounts)
    expansion = {**(service_env or {}), **container_env_vars}
    argv = [rewrite(expand(part, expansion)) for part in command + args]
    argv[0] = resolve_executable(argv[0], path=base_env.get("PATH"))
    env = dict(base_env)
    env.update({k: rewrite(v) for k, v in container_env_vars.items()})
    for key, value in extra_env.items():
        if key not in container_env_vars:
            env[key] = value
    for m in mounts:
        key = f"LOCALCLUSTER_MOUNT_{env_suffix(m.volume)}"
        if key not in container_env_vars:
            env[key] = str(m.local_dir)
        if m.mount_path.rstrip("/") == "/tmp" and "TMPDIR" not in container_env_vars:
            # Temporary files go to the pod's volume, as they would inside the container.
            env["TMPDIR"] = str(m.local_dir)
    cwd: Path | None = None
    if container.get("workingDir"):
        cwd = Path(rewrite(container["workingDir"]))
    return ContainerCommand(argv, env, cwd)
