"""Decoding of the Kubernetes protobuf wire format for the few kinds kubectl's generators send.

kubectl's typed clients (``kubectl create namespace|configmap|secret|serviceaccount``) send
request bodies as ``application/vnd.kubernetes.protobuf`` and do not fall back to JSON. This
module decodes those kinds (the ``k8s\\x00`` envelope around ``runtime.Unknown``, then the
object by the field numbers of ``k8s.io/api/core/v1/generated.proto``). Every other kind gets
``415``; responses are always JSON, which those clients accept.
"""

from __future__ import annotations

import base64
from typing import Any

JSON = dict[str, Any]

MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs: ints for varints, bytes for length-delimited fields."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            out.append((number, value))
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise ProtobufError("truncated field")
            out.append((number, buf[pos : pos + length]))
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
    return out


def _str(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ProtobufError("expected a string field")
    return value.decode()


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise ProtobufError("expected a bytes field")
    return value


def _map_entry(value: int | bytes) -> tuple[str, bytes]:
    key = ""
    val = b""
    for n, v in fields(_bytes(value)):
        if n == 1:
            key = _str(v)
        elif n == 2:
            val = _bytes(v)
    return key, val


def _owner_reference(buf: bytes) -> JSON:
    ref: JSON = {}
    names = {5: "apiVersion", 1: "kind", 3: "name", 4: "uid"}
    for n, v in fields(buf):
        if n in names:
            ref[names[n]] = _str(v)
        elif n == 6:
            ref["controller"] = bool(v)
        elif n == 7:
            ref["blockOwnerDeletion"] = bool(v)
    return ref


def _object_meta(buf: bytes) -> JSON:
    meta: JSON = {}
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    for n, v in fields(buf):
        if n in strings:
            meta[strings[n]] = _str(v)
        elif n in (11, 12):
            key, val = _map_entry(v)
            meta.setdefault("labels" if n == 11 else "annotations", {})[key] = val.decode()
        elif n == 13:
            meta.setdefault("ownerReferences", []).append(_owner_reference(_bytes(v)))
        elif n == 14:
            meta.setdefault("finalizers", []).append(_str(v))
    return meta


def _namespace(buf: bytes) -> JSON:
    obj: JSON = {}
    for n, v in fields(buf):
        if n == 1:
            obj["metadata"] = _object_meta(_bytes(v))
        elif n == 2:
            finalizers = [_str(fv) for fn, fv in fields(_bytes(v)) if fn == 1]
            obj["spec"] = {"finalizers": finalizers} if finalizers else {}
    return obj


def _config_map(buf: bytes) -> JSON:
    obj: JSON = {}
    for n, v in fields(buf):
        if n == 1:
            obj["metadata"] = _object_meta(_bytes(v))
        elif n == 2:
            key, val = _map_entry(v)
            obj.setdefault("data", {})[key] = val.decode()
        elif n == 3:
            key, val = _map_entry(v)
            obj.setdefault("binaryData", {})[key] = base64.b64encode(val).decode()
        elif n == 4:
            obj["immutable"] = bool(v)
    return obj


def _secret(buf: bytes) -> JSON:
    obj: JSON = {}
    for n, v in fields(buf):
        if n == 1:
            obj["metadata"] = _object_meta(_bytes(v))
        elif n == 2:
            key, val = _map_entry(v)
            obj.setdefault("data", {})[key] = base64.b64encode(val).decode()
        elif n == 3:
            obj["type"] = _str(v)
        elif n == 4:
            key, val = _map_entry(v)
            obj.setdefault("data", {})[key] = base64.b64encode(val).decode()
        elif n == 5:
            obj["immutable"] = bool(v)
    return obj


def _service_account(buf: bytes) -> JSON:
    obj: JSON = {}
    for n, v in fields(buf):
        if n == 1:
            obj["metadata"] = _object_meta(_bytes(v))
        elif n == 4:
            obj["automountServiceAccountToken"] = bool(v)
    return obj


_DECODERS = {
    ("v1", "Namespace"): _namespace,
    ("v1", "ConfigMap"): _config_map,
    ("v1", "Secret"): _secret,
    ("v1", "ServiceAccount"): _service_account,
}


def decode(body: bytes) -> JSON:
    """A protobuf request body as the JSON object it stands for (``ProtobufError`` if this
    module does not know its kind)."""
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf envelope")
    api_version = kind = ""
    raw = b""
    for n, v in fields(body[len(MAGIC) :]):
        if n == 1:
            for tn, tv in fields(_bytes(v)):
                if tn == 1:
                    api_version = _str(tv)
                elif tn == 2:
                    kind = _str(tv)
        elif n == 2:
            raw = _bytes(v)
    decoder = _DECODERS.get((api_version, kind))
    if decoder is None:
        raise ProtobufError(
            f"protobuf bodies of {api_version or '?'}/{kind or '?'} are not supported"
        )
    obj = decoder(raw)
    obj["apiVersion"] = api_version
    obj["kind"] = kind
    obj.setdefault("metadata", {})
    return obj
