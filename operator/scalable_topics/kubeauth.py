"""Verifying clients against the Kubernetes API, for the servers that do (brokers, operator).

``TokenReview`` authenticates a bearer token (audience :data:`core.auth.AUDIENCE`),
``SubjectAccessReview`` authorizes (identity, namespace, topic, verb); both answers are cached
for a short TTL in bounded caches (``core.auth``). The server's own credentials are its Pod's
(``kubeapi``: in-cluster, else the kubeconfig), so its ServiceAccount needs ``create`` on
``tokenreviews`` and ``subjectaccessreviews`` (manifests/base/operator-rbac.yaml).

A failed review (API server unreachable, 5xx) is not cached and refuses the request with
``AuthUnavailable`` (HTTP 503, WebSocket close 1013): fail closed, the client retries.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from .core.auth import (
    AUDIENCE,
    DEFAULT_MAX_ENTRIES,
    DEFAULT_TTL,
    ERR_AUTH_UNAVAILABLE,
    AccessDenied,
    Identity,
    TTLCache,
    access_review,
    bearer_token,
    decision_of,
    forbidden,
    identity_from_review,
    token_review,
    unauthenticated,
)
from .kubeapi import api_client

log = logging.getLogger(__name__)


class KubernetesAuth:
    """Authenticate and authorize against one API server; cheap after the first request of an
    identity (two cache lookups)."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        audiences: tuple[str, ...] = (AUDIENCE,),
        ttl: float = DEFAULT_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self.api = api
        self.audiences = audiences
        self._authn = k8s.AuthenticationV1Api(api)
        self._authz = k8s.AuthorizationV1Api(api)
        self._identities: TTLCache[bytes, Identity | AccessDenied] = TTLCache(ttl, max_entries)
        self._decisions: TTLCache[tuple[Identity, str, str, str], tuple[bool, str]] = TTLCache(
            ttl, max_entries
        )
        self.token_reviews = 0
        self.access_reviews = 0

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, **options: Any) -> KubernetesAuth:
        return cls(await api_client(kubeconfig), **options)

    async def close(self) -> None:
        await self.api.close()

    async def authenticate(self, authorization: str | None) -> Identity:
        """The identity behind an ``Authorization`` header; :class:`AccessDenied` otherwise."""
        token = bearer_token(authorization)
        if not token:
            raise unauthenticated("no bearer token")
        key = hashlib.sha256(token.encode()).digest()
        cached = self._identities.get(key)
        if cached is None:
            try:
                body: Any = token_review(token, self.audiences)
                answer = await self._authn.create_token_review(body)
            except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise _unavailable("TokenReview", exc) from None
            self.token_reviews += 1
            review = self.api.sanitize_for_serialization(answer)
            try:
                cached = identity_from_review(review, self.audiences)
            except AccessDenied as exc:
                cached = exc
            self._identities.put(key, cached)
        if isinstance(cached, AccessDenied):
            raise AccessDenied(cached.code, str(cached))
        return cached

    async def allowed(self, identity: Identity, verb: str, namespace: str, topic: str) -> bool:
        key = (identity, verb, namespace, topic)
        cached = self._decisions.get(key)
        if cached is None:
            try:
                request: Any = access_review(identity, verb, namespace, topic)
                answer = await self._authz.create_subject_access_review(request)
            except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise _unavailable("SubjectAccessReview", exc) from None
            self.access_reviews += 1
            cached = decision_of(self.api.sanitize_for_serialization(answer))
            self._decisions.put(key, cached)
        return cached[0]

    async def authorize(self, identity: Identity, verb: str, namespace: str, topic: str) -> None:
        """:class:`AccessDenied` naming the missing permission unless RBAC grants ``verb``."""
        if not await self.allowed(identity, verb, namespace, topic):
            raise forbidden(identity, verb, namespace, topic)


def _unavailable(what: str, exc: BaseException) -> AccessDenied:
    status = getattr(exc, "status", None)
    detail = f"HTTP {status}" if status else type(exc).__name__
    log.warning("%s failed: %s", what, exc)
    return AccessDenied(
        ERR_AUTH_UNAVAILABLE, f"cannot verify credentials now ({what} failed: {detail}); retry"
    )
