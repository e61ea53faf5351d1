"""Decoding of the Kubernetes protobuf wire format for the few kinds kubectl's generators send.

kubectl's typed clients (``kubectl create namespace|configmap|secret|serviceaccount``) send
request bodies as ``application/vnd.kubernetes.protobuf`` and do not fall back to JSON. This
module decodes those kinds (the ``k8s\\x00`` envelope around ``runtime.Unknown``, then the
object by the field numbers of ``k8s.io/api/core/v1/generated.proto``). Every other kind gets
``415``; responses are always JSON, which those clients accept.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

JSON = dict[str, Any]
Value = int | bytes
"""A field's value: an int for varints, bytes for length-delimited fields."""

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


def fields(buf: bytes) -> list[tuple[int, Value]]:
    """(field number, value) pairs: ints for varints, bytes for length-delimited fields."""
    out: list[tuple[int, Value]] = []
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


def _str(value: Value) -> str:
    if not isinstance(value, bytes):
        raise ProtobufError("expected a string field")
    return value.decode()


def _bytes(value: Value) -> bytes:
    if not isinstance(value, bytes):
        raise ProtobufError("expected a bytes field")
    return value


def _map_entry(value: Value) -> tuple[str, bytes]:
    key = ""
    val = b""
    for n, v in fields(_bytes(value)):
        if n == 1:
            key = _str(v)
        elif n == 2:
            val = _bytes(v)
    return key, val


_Field = Callable[[JSON, Value], None]
"""Stores one decoded field into the object being built."""


def _message(handlers: Mapping[int, _Field]) -> Callable[[bytes], JSON]:
    """A decoder for a message: each field goes to the handler of its number (fields the
    handlers do not know are skipped, as an older decoder skips newer fields)."""

    def decode(buf: bytes) -> JSON:
        obj: JSON = {}
        for n, v in fields(buf):
            handler = handlers.get(n)
            if handler is not None:
                handler(obj, v)
        return obj

    return decode


def _set(name: str, convert: Callable[[Value], Any]) -> _Field:
    def put(obj: JSON, value: Value) -> None:
        obj[name] = convert(value)

    return put


def _map_into(name: str, encode: Callable[[bytes], str]) -> _Field:
    """A ``map<string, …>`` field: every entry lands in the JSON object ``name``."""

    def put(obj: JSON, value: Value) -> None:
        key, val = _map_entry(value)
        obj.setdefault(name, {})[key] = encode(val)

    return put


def _append_to(name: str, convert: Callable[[Value], Any]) -> _Field:
    """A repeated field: every occurrence is appended to the JSON list ``name``."""

    def put(obj: JSON, value: Value) -> None:
        obj.setdefault(name, []).append(convert(value))

    return put


def _base64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


_owner_reference = _message(
    {
        1: _set("kind", _str),
        3: _set("name", _str),
        4: _set("uid", _str),
        5: _set("apiVersion", _str),
        6: _set("controller", bool),
        7: _set("blockOwnerDeletion", bool),
    }
)

_object_meta = _message(
    {
        1: _set("name", _str),
        2: _set("generateName", _str),
        3: _set("namespace", _str),
        5: _set("uid", _str),
        6: _set("resourceVersion", _str),
        11: _map_into("labels", bytes.decode),
        12: _map_into("annotations", bytes.decode),
        13: _append_to("ownerReferences", lambda v: _owner_reference(_bytes(v))),
        14: _append_to("finalizers", _str),
    }
)


def _metadata(obj: JSON, value: Value) -> None:
    obj["metadata"] = _object_meta(_bytes(value))


def _namespace_spec(obj: JSON, value: Value) -> None:
    finalizers = [_str(fv) for fn, fv in fields(_bytes(value)) if fn == 1]
    obj["spec"] = {"finalizers": finalizers} if finalizers else {}


_namespace = _message({1: _metadata, 2: _namespace_spec})

_config_map = _message(
    {
        1: _metadata,
        2: _map_into("data", bytes.decode),
        3: _map_into("binaryData", _base64),
        4: _set("immutable", bool),
    }
)

# ``stringData`` (field 4) is folded into ``data``, as the apiserver does on write.
_secret = _message(
    {
        1: _metadata,
        2: _map_into("data", _base64),
        3: _set("type", _str),
        4: _map_into("data", _base64),
        5: _set("immutable", bool),
    }
)

_service_account = _message({1: _metadata, 4: _set("automountServiceAccountToken", bool)})


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
