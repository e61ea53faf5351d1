"""The operator's own Kubernetes API calls (kubernetes_asyncio), kept to the verbs in the RBAC.

kopf watches and indexes; everything the controller *writes* goes through here, so that every
status write is a compare-and-swap on ``resourceVersion`` and every verb used is listed in one
place (``manifests/base/operator-rbac.yaml`` mirrors it).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from ..core.jsontypes import JsonObj
from ..core.resources import GROUP, VERSION
from ..core.resources import SEGMENT_PLURAL as SEGMENTS
from ..core.resources import TOPIC_PLURAL as SCALABLE_TOPICS
from . import metrics

log = logging.getLogger(__name__)


class Conflict(Exception):
    """The object changed since we read it (HTTP 409): re-read and re-apply."""


class NotFound(Exception):
    """The object does not exist (HTTP 404)."""


def _translate(exc: ApiException) -> Exception:
    if exc.status == 409:
        return Conflict(exc.reason)
    if exc.status == 404:
        return NotFound(exc.reason)
    return exc


def _ignore_environment_proxies(api_client: k8s.ApiClient) -> None:
    """kubernetes_asyncio's aiohttp session has ``trust_env=True``: every request then looks
    up proxies and parses ``~/.netrc`` in a worker thread, which was a fifth of the operator's
    CPU when reconciling 1,000 topics (bench/operator.py). The API server is reached directly
    (in a pod) or as the kubeconfig says (its ``proxy-url`` is still honoured), so
    ``HTTP(S)_PROXY`` and netrc are not consulted. aiohttp has no public setter for this."""
    session = getattr(api_client.rest_client, "pool_manager", None)
    if session is not None and hasattr(session, "_trust_env"):
        session._trust_env = False


REQUEST_TIMEOUT = 30.0
"""Seconds an API request may take before it fails (and its pass is retried)."""

LIST_TIMEOUT = 90.0
"""The same for a LIST, which at 10,000 topics carries 20,000 Segments: above the API server's
own 60 s limit, so that the client never cuts a listing the server would still finish (a
replica that cannot list never finishes its initial sync)."""


def _bound_requests(api_client: k8s.ApiClient, seconds: float) -> None:
    """kubernetes_asyncio sends a request without ``_request_timeout`` with no deadline at all
    (not even aiohttp's own five minutes): a connection that stops answering would hold its
    reconcile pass, and the topic's lock, forever. Every request of the controller gets
    ``seconds`` unless it names its own (a LIST names ``LIST_TIMEOUT``): one object's read or
    write takes milliseconds, so a request still unanswered after ``seconds`` is stuck."""
    rest = api_client.rest_client
    send = rest.request
    if getattr(send, "bounded", False):
        return

    async def request(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("_request_timeout"):
            kwargs["_request_timeout"] = seconds
        return await send(*args, **kwargs)

    request.bounded = True  # type: ignore[attr-defined]
    rest.request = request  # type: ignore[method-assign]


MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}


class KubeApi:
    """Typed façade over the few endpoints the controller uses."""

    OWN_VERSIONS_KEPT = 8

    def __init__(self, api_client: k8s.ApiClient, *, timeout: float = REQUEST_TIMEOUT) -> None:
        self.api_client = api_client
        _bound_requests(api_client, timeout)
        self._own_versions: dict[tuple[str, str], deque[str]] = {}
        self.on_topic_written: Callable[[JsonObj], None] | None = None
        """Called with every topic this client wrote, as the API server answered: the
        operator's cache takes it, so that whatever reads the cache next sees this replica's
        own writes without waiting for their watch events (``TopicReconciler.wired``)."""
        self._namespaces: dict[str, tuple[float, Mapping[str, str]]] = {}
        self.custom = k8s.CustomObjectsApi(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.coordination = k8s.CoordinationV1Api(api_client)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> KubeApi:
        """In-cluster credentials when running in a pod, else the kubeconfig (``$KUBECONFIG``)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except k8s_config.ConfigException:
            await k8s_config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
        api_client = k8s.ApiClient(configuration)
        _ignore_environment_proxies(api_client)
        return cls(api_client)

    async def close(self) -> None:
        await self.api_client.close()

    # -- ScalableTopic -------------------------------------------------------------------------

    def _wrote(self, obj: JsonObj) -> JsonObj:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        versions = self._own_versions.get(key)
        if versions is None:
            versions = self._own_versions[key] = deque(maxlen=self.OWN_VERSIONS_KEPT)
        versions.append(str(meta.get("resourceVersion")))
        if self.on_topic_written is not None:
            self.on_topic_written(obj)
        return obj

    def wrote_version(self, namespace: str, name: str, resource_version: str) -> bool:
        """Whether ``resource_version`` of the topic is the result of one of our own recent
        writes. The watch event of such a write brings nothing the writer did not know, so it
        needs no further reconcile pass (at 1,000 topics that halves the passes)."""
        return resource_version in self._own_versions.get((namespace, name), ())

    def forget_topic(self, namespace: str, name: str) -> None:
        self._own_versions.pop((namespace, name), None)

    async def get_topic(self, namespace: str, name: str) -> JsonObj | None:
        return await self._get_or_none(SCALABLE_TOPICS, namespace, name)

    async def _get_or_none(self, plural: str, namespace: str, name: str) -> JsonObj | None:
        try:
            return cast(
                JsonObj,
                await self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural, name
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list_topics(self) -> list[JsonObj]:
        result = await self.custom.list_custom_object_for_all_namespaces(
            GROUP, VERSION, SCALABLE_TOPICS, _request_timeout=LIST_TIMEOUT
        )
        return cast(list[JsonObj], result.get("items", []))

    async def replace_topic_status(self, body: JsonObj) -> JsonObj:
        """Write ``body['status']`` if the topic still has ``body``'s resourceVersion."""
        meta = body["metadata"]
        try:
            written = await self.custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, meta["namespace"], SCALABLE_TOPICS, meta["name"], body
            )
            return self._wrote(cast(JsonObj, written))
        except ApiException as exc:
            raise _translate(exc) from None

    async def patch_topic(self, namespace: str, name: str, patch: JsonObj) -> JsonObj:
        """JSON merge patch of metadata (finalizers, annotations)."""
        try:
            patched = await self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, SCALABLE_TOPICS, name, patch, **MERGE_PATCH
            )
            return self._wrote(cast(JsonObj, patched))
        except ApiException as exc:
            raise _translate(exc) from None

    # -- Segment -------------------------------------------------------------------------------

    async def get_segment(self, namespace: str, name: str) -> JsonObj | None:
        return await self._get_or_none(SEGMENTS, namespace, name)

    async def list_segments(self, namespace: str, topic: str) -> list[JsonObj]:
        result = await self.custom.list_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            SEGMENTS,
            label_selector=f"{GROUP}/topic={topic}",
            _request_timeout=LIST_TIMEOUT,
        )
        return cast(list[JsonObj], result.get("items", []))

    async def list_all_segments(self) -> list[JsonObj]:
        """Every Segment of every namespace (one LIST, no selector)."""
        result = await self.custom.list_custom_object_for_all_namespaces(
            GROUP, VERSION, SEGMENTS, _request_timeout=LIST_TIMEOUT
        )
        return cast(list[JsonObj], result.get("items", []))

    async def create_segment(self, body: JsonObj) -> JsonObj:
        """Create, or return the existing object when it is already there (idempotent)."""
        meta = body["metadata"]
        try:
            return cast(
                JsonObj,
                await self.custom.create_namespaced_custom_object(
                    GROUP, VERSION, meta["namespace"], SEGMENTS, body
                ),
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = await self.custom.get_namespaced_custom_object(
            GROUP, VERSION, meta["namespace"], SEGMENTS, meta["name"]
        )
        return cast(JsonObj, existing)

    async def patch_segment(self, namespace: str, name: str, patch: JsonObj) -> JsonObj:
        """JSON merge patch of a Segment's metadata (its owner, when a lost layout is rebuilt
        for a re-created topic); a ``resourceVersion`` in the patch makes it a CAS."""
        try:
            return cast(
                JsonObj,
                await self.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, SEGMENTS, name, patch, **MERGE_PATCH
                ),
            )
        except ApiException as exc:
            raise _translate(exc) from None

    async def patch_segment_status(
        self, namespace: str, name: str, status: JsonObj, *, resource_version: str | None = None
    ) -> JsonObj:
        """Merge patch of a Segment's status; with ``resource_version`` a compare-and-swap
        (``Conflict`` when the Segment changed since)."""
        patch: JsonObj = {"status": status}
        if resource_version is not None:
            patch["metadata"] = {"resourceVersion": resource_version}
        try:
            written = cast(
                JsonObj,
                await self.custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    namespace,
                    SEGMENTS,
                    name,
                    patch,
                    **MERGE_PATCH,
                ),
            )
        except ApiException as exc:
            metrics.STATUS_WRITES.labels("Segment", "failed").inc()
            raise _translate(exc) from None
        metrics.STATUS_WRITES.labels("Segment", "written").inc()
        return written

    async def delete_segment(self, namespace: str, name: str) -> None:
        try:
            await self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, SEGMENTS, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    # -- Pods, namespaces ------------------------------------------------------------------------

    async def list_pods_all_namespaces(self, label_selector: str) -> list[JsonObj]:
        """Pods as dicts (the shape kopf's events carry, camelCase keys)."""
        result = await self.core.list_pod_for_all_namespaces(
            label_selector=label_selector, _request_timeout=LIST_TIMEOUT
        )
        return [
            cast(JsonObj, self.api_client.sanitize_for_serialization(pod)) for pod in result.items
        ]

    NAMESPACE_TTL = 5.0

    async def namespace_annotations(self, namespace: str) -> Mapping[str, str]:
        """A namespace's annotations (the namespace-level auto-scale policy), read at most once
        per ``NAMESPACE_TTL`` seconds: every reconcile pass needs them, and they rarely change."""
        cached = self._namespaces.get(namespace)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.NAMESPACE_TTL:
            return cached[1]
        try:
            ns = await self.core.read_namespace(namespace)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        annotations = cast(Mapping[str, str], ns.metadata.annotations or {})
        self._namespaces[namespace] = (now, annotations)
        return annotations

    # -- Events --------------------------------------------------------------------------------

    async def post_event(
        self, obj: JsonObj, *, type_: str, reason: str, message: str, component: str
    ) -> None:
        """A core/v1 Event about ``obj``. Failures are logged, never raised: an event is
        information, and losing one must not fail the reconcile that produced it."""
        meta = obj["metadata"]
        stamp = datetime.now(UTC)
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(
                # A name is at most 253 characters (the object's too): keep room for the suffix.
                name=f"{meta['name'][:240].rstrip('-.')}.{uuid.uuid4().hex[:12]}",
                namespace=meta["namespace"],
            ),
            involved_object=k8s.V1ObjectReference(
                api_version=obj.get("apiVersion"),
                kind=obj.get("kind"),
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            source=k8s.V1EventSource(component=component),
            reporting_component=component,
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=1,
        )
        try:
            # The created Event is not read: building its model from the answer cost more CPU
            # than the request (3.5 % of the operator's while 4,000 topics were created).
            response = cast(
                aiohttp.ClientResponse,
                await self.core.create_namespaced_event(
                    meta["namespace"], event, _preload_content=False
                ),
            )
            try:
                if response.status >= 300:
                    raise RuntimeError(f"{response.status}: {(await response.text())[:200]}")
            finally:
                response.release()
        except Exception as exc:
            log.warning("could not post event %s/%s: %s (%s)", reason, meta["name"], message, exc)
