"""Reading topics and writing ``status.recommendation`` with a resourceVersion compare-and-swap.

The driver uses the official ``kubernetes`` client. A write replaces the topic's whole status
through the status subresource with the ``resourceVersion`` it read, so it can never undo a
concurrent status change (the leader's layout CAS, an assignment update): the API server answers
409 and the writer re-reads and tries again. Nothing is written when the recommendation did not
change (ignoring ``computedAt``), except that a standing recommendation with actions is refreshed
once its ``computedAt`` is older than ``refresh_after`` so that it never goes stale for the
controller while the job still stands by it.
"""

from __future__ import annotations

import copy
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scalable_topics.core.policy import CLUSTER_DEFAULTS_CONFIGMAP, NAMESPACE_POLICY_ANNOTATION
from scalable_topics.core.resources import (
    GROUP,
    SEGMENT_PLURAL,
    TOPIC_PLURAL,
    VERSION,
    parse_time,
)

log = logging.getLogger(__name__)

TopicKey = tuple[str, str]


class WriteResult(enum.StrEnum):
    WRITTEN = "written"
    UNCHANGED = "unchanged"
    VANISHED = "vanished"
    STALE = "stale"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class WriteOutcome:
    result: WriteResult
    conflicts: int = 0
    resource_version: str | None = None


def compact(value: Any) -> Any:
    """Drop ``None`` members recursively: the API server prunes nulls of non-nullable fields,
    so comparing with what it returns needs the same shape."""
    if isinstance(value, Mapping):
        return {str(k): compact(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return value


def same_recommendation(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Equal apart from ``computedAt``."""
    if old is None:
        return False
    strip = ("computedAt",)
    return {k: v for k, v in compact(old).items() if k not in strip} == {
        k: v for k, v in compact(new).items() if k not in strip
    }


def needs_write(
    old: Mapping[str, Any] | None, new: Mapping[str, Any], *, now: float, refresh_after: float
) -> bool:
    if not same_recommendation(old, new):
        return True
    assert old is not None
    if not new.get("actions"):
        return False
    try:
        age = now - parse_time(str(old.get("computedAt")))
    except ValueError:
        return True
    return age >= refresh_after


class TopicStore:
    """The recommender's view of the cluster (sync ``kubernetes`` client, driver only)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.custom: Any = client.CustomObjectsApi(api_client)

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> TopicStore:
        """``kubeconfig`` if given, else in-cluster config when running in a pod, else the
        default kubeconfig (``KUBECONFIG``/``~/.kube/config``).

        A pod of the local cluster is a process whose ServiceAccount files are not where
        in-cluster config looks; its kubelet hands it a ``KUBECONFIG`` naming them instead, so
        in-cluster config that finds no token falls back to the kubeconfig."""
        import os

        from kubernetes import client, config

        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                return cls(client.ApiClient())
            except config.ConfigException:
                pass
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
        return cls(client.ApiClient(configuration))

    def close(self) -> None:
        self.api_client.close()

    def list_topics(self, namespace: str | None = None) -> dict[TopicKey, dict[str, Any]]:
        if namespace:
            body = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, TOPIC_PLURAL
            )
        else:
            body = self.custom.list_cluster_custom_object(GROUP, VERSION, TOPIC_PLURAL)
        topics = {}
        for item in body.get("items", []):
            metadata = item.get("metadata") or {}
            topics[(str(metadata.get("namespace", "")), str(metadata.get("name", "")))] = item
        return topics

    def namespace_policies(self, namespace: str | None = None) -> dict[str, str]:
        """The ``scalabletopics.io/autoscale-policy`` annotation text by namespace (namespaces
        without one left out): the level between a topic's knobs and the cluster defaults."""
        from kubernetes import client

        core = client.CoreV1Api(self.api_client)
        items = [core.read_namespace(namespace)] if namespace else core.list_namespace().items
        found = {}
        for item in items:
            meta = item.metadata
            text = (
                None if meta is None else (meta.annotations or {}).get(NAMESPACE_POLICY_ANNOTATION)
            )
            if meta is not None and text is not None:
                found[str(meta.name)] = str(text)
        return found

    def cluster_defaults(self, namespace: str) -> dict[str, str] | None:
        """The data of the ConfigMap ``scalable-topics-autoscale-defaults`` in the operator's
        ``namespace`` (``None`` when there is none: the built-in defaults apply)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core = client.CoreV1Api(self.api_client)
        try:
            config_map = core.read_namespaced_config_map(CLUSTER_DEFAULTS_CONFIGMAP, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(config_map.data or {})

    def list_segments(self, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace:
            body = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, SEGMENT_PLURAL
            )
        else:
            body = self.custom.list_cluster_custom_object(GROUP, VERSION, SEGMENT_PLURAL)
        return list(body.get("items", []))

    def get_topic(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, TOPIC_PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def write_recommendation(
        self,
        namespace: str,
        name: str,
        recommendation: Mapping[str, Any],
        *,
        now: float,
        refresh_after: float,
        attempts: int = 5,
        after_read: Callable[[dict[str, Any]], None] | None = None,
    ) -> WriteOutcome:
        """CAS ``status.recommendation`` into the topic; see the module docstring.

        Each attempt re-reads the topic. It is not written (``STALE``) when its layout epoch is no
        longer the recommendation's ``basedOnEpoch``: the plan was made for a DAG that is gone.
        ``after_read`` runs between the read and the write of every attempt (a seam for tests
        that need a concurrent change exactly there).
        """
        from kubernetes.client.exceptions import ApiException

        new = compact(recommendation)
        conflicts = 0
        for _ in range(attempts):
            obj = self.get_topic(namespace, name)
            if obj is None:
                return WriteOutcome(WriteResult.VANISHED, conflicts)
            status = dict(obj.get("status") or {})
            epoch = (status.get("layout") or {}).get("epoch")
            based_on = new.get("basedOnEpoch")
            if based_on is not None and epoch is not None and int(epoch) != int(based_on):
                return WriteOutcome(WriteResult.STALE, conflicts)
            if not needs_write(
                status.get("recommendation"), new, now=now, refresh_after=refresh_after
            ):
                return WriteOutcome(
                    WriteResult.UNCHANGED, conflicts, obj["metadata"].get("resourceVersion")
                )
            if after_read is not None:
                after_read(obj)
            body = copy.deepcopy(obj)
            body["status"] = {**status, "recommendation": new}
            try:
                written = self.custom.replace_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, TOPIC_PLURAL, name, body
                )
            except ApiException as exc:
                if exc.status == 409:
                    conflicts += 1
                    log.info("recommendation for %s/%s: conflict, re-reading", namespace, name)
                    continue
                if exc.status == 404:
                    return WriteOutcome(WriteResult.VANISHED, conflicts)
                raise
            return WriteOutcome(
                WriteResult.WRITTEN, conflicts, written["metadata"].get("resourceVersion")
            )
        return WriteOutcome(WriteResult.CONFLICT, conflicts)
