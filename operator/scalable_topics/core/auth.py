"""Who may produce, consume and administer: the pure half of authentication and authorization
(docs/security.md).

Clients present a Kubernetes ServiceAccount token bound to :data:`AUDIENCE` as a bearer token.
The brokers and the operator verify it with a ``TokenReview`` and decide with a
``SubjectAccessReview`` on ``scalabletopics.io/scalabletopics`` (the topic is the resource name)
with the custom verbs :data:`VERB_PRODUCE` and :data:`VERB_CONSUME`, and ``get`` for the DAG
watch (whoever may ``get`` the topic can already read its DAG from ``status``). Custom verbs
rather than subresources: RBAC checks a verb on a subresource only as ``<resource>/<sub>``, which
reads as an API path that does not exist, while ``verbs: [produce]`` on ``scalabletopics`` says
what it grants.

This module builds the review bodies, reads their answers and caches decisions; the HTTP calls
are in ``scalable_topics.kubeauth``. Decisions are per connection (a handshake), never per
message, and cached for a short TTL so a RoleBinding added or removed takes effect within it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

AUDIENCE = "scalabletopics.io"
"""The audience of client tokens: a token minted for the API server (or anything else) is
refused, so a token leaked from one service cannot be replayed here."""
GROUP = "scalabletopics.io"
RESOURCE = "scalabletopics"
VERB_PRODUCE = "produce"
VERB_CONSUME = "consume"
VERB_GET = "get"
DEFAULT_TTL = 10.0
"""Seconds a token review or an access decision is reused."""
DEFAULT_MAX_ENTRIES = 4096

ERR_UNAUTHENTICATED = "Unauthenticated"
ERR_FORBIDDEN = "Forbidden"
ERR_AUTH_UNAVAILABLE = "AuthUnavailable"
CLOSE_UNAUTHENTICATED = 4401
"""WebSocket close code of a refused credential (the HTTP status + 4000)."""
CLOSE_FORBIDDEN = 4403
CLOSE_AUTH_UNAVAILABLE = 1013
""""Try again later": the API server could not be asked."""

ROLE_FOR_VERB = {
    VERB_PRODUCE: "scalable-topics-producer",
    VERB_CONSUME: "scalable-topics-consumer",
    VERB_GET: "scalable-topics-producer or scalable-topics-consumer",
}
"""The example ClusterRoles of manifests/base/client-rbac.yaml that grant each verb."""


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated user as the TokenReview reported it (what a SubjectAccessReview needs)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class AccessDenied(Exception):
    """A refused request; ``str()`` is safe to send to the client and names what is missing."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def status(self) -> int:
        return {ERR_UNAUTHENTICATED: 401, ERR_FORBIDDEN: 403}.get(self.code, 503)

    @property
    def close_code(self) -> int:
        return {ERR_UNAUTHENTICATED: CLOSE_UNAUTHENTICATED, ERR_FORBIDDEN: CLOSE_FORBIDDEN}.get(
            self.code, CLOSE_AUTH_UNAVAILABLE
        )


def unauthenticated(reason: str) -> AccessDenied:
    return AccessDenied(
        ERR_UNAUTHENTICATED,
        f"{reason}: present a ServiceAccount token for audience {AUDIENCE!r} as "
        "'Authorization: Bearer <token>' (docs/security.md)",
    )


def forbidden(
    identity: Identity, verb: str, namespace: str, topic: str, reason: str = ""
) -> AccessDenied:
    why = f" ({reason})" if reason else ""
    return AccessDenied(
        ERR_FORBIDDEN,
        f"{identity.username} may not {verb} topic {namespace}/{topic}{why}: needs verb "
        f'"{verb}" on {RESOURCE}.{GROUP} "{topic}" in namespace "{namespace}" (e.g. a '
        f"RoleBinding to ClusterRole {ROLE_FOR_VERB.get(verb, 'scalable-topics-admin')})",
    )


def admin_forbidden(identity: Identity, allowed: frozenset[str]) -> AccessDenied:
    return AccessDenied(
        ERR_FORBIDDEN,
        f"{identity.username} may not use the broker admin API: only "
        f"{', '.join(sorted(allowed)) or 'no identity'} may (the operator's ServiceAccount)",
    )


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header ("" when there is none)."""
    if not header:
        return ""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def token_review(token: str, audiences: tuple[str, ...]) -> dict[str, Any]:
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token, "audiences": list(audiences)},
    }


def identity_from_review(review: Mapping[str, Any], audiences: tuple[str, ...]) -> Identity:
    """The identity of an answered TokenReview; :class:`AccessDenied` when the token is not
    valid (unknown, expired, its ServiceAccount, Pod or Secret deleted) or not for ``audiences``
    (the API server checks the audience; this repeats it so a server that ignored
    ``spec.audiences`` cannot let a token of another audience through)."""
    status = review.get("status") or {}
    if not status.get("authenticated"):
        error = str(status.get("error") or "token not valid")
        raise unauthenticated(f"token refused ({error})")
    if audiences and not set(status.get("audiences") or ()) & set(audiences):
        raise unauthenticated(f"token not issued for audience {audiences[0]!r}")
    user = status.get("user") or {}
    extra = user.get("extra") or {}
    return Identity(
        username=str(user.get("username", "")),
        uid=str(user.get("uid", "")),
        groups=tuple(str(g) for g in user.get("groups") or ()),
        extra=tuple(sorted((str(k), tuple(str(x) for x in v or ())) for k, v in extra.items())),
    )


def access_review(identity: Identity, verb: str, namespace: str, topic: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "user": identity.username,
        "groups": list(identity.groups),
        "resourceAttributes": {
            "group": GROUP,
            "resource": RESOURCE,
            "verb": verb,
            "namespace": namespace,
            "name": topic,
        },
    }
    if identity.uid:
        spec["uid"] = identity.uid
    if identity.extra:
        spec["extra"] = {k: list(v) for k, v in identity.extra}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def decision_of(review: Mapping[str, Any]) -> tuple[bool, str]:
    """(allowed, reason) of an answered SubjectAccessReview."""
    status = review.get("status") or {}
    allowed = bool(status.get("allowed")) and not status.get("denied")
    return allowed, str(status.get("reason") or status.get("evaluationError") or "")


K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """At most ``max_entries`` values, each for ``ttl`` seconds; the least recently used goes
    first when full (an attacker sending random tokens evicts entries, never grows memory)."""

    def __init__(
        self,
        ttl: float = DEFAULT_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl < 0 or max_entries < 1:
            raise ValueError("ttl must be >= 0 and max_entries >= 1")
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires, value = found
        if self._clock() >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._entries[key] = (self._clock() + self.ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
