"""Finding the operator for ``produce``, ``consume`` and ``bench`` (``docs/client.md``, "CLI").

Without ``--service-url`` the CLI reads the topic through the kubeconfig (or the in-cluster
config) and tries, each for at most :data:`PROBE_TIMEOUT` seconds:

1. the topic's ``status.controller.url`` (the leader's address: reachable in the cluster and
   with the embedded control plane, where pods listen on loopback addresses);
2. the operator's Service (``scalable-topics-operator`` in ``--operator-namespace``), at its
   in-cluster DNS name: for a CLI running in a pod when the recorded leader is gone.

A candidate is reachable when it answers the topic's DAG route
(``GET /v1/topics/{namespace}/{name}/dag``) with 200. When none is, the error names every URL
tried and why it failed, and points at ``--service-url``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s

from ..core.sessions import dag_path
from ..core.subscriptions import SubscriptionType
from ..credentials import tls_failure_message
from .errors import CliError, NotFoundError, UnreachableError
from .kube import call, connect_problem, kube_api, read_topic

PROBE_TIMEOUT = 3.0
"""Seconds a candidate operator URL gets to answer."""

OPERATOR_SERVICE = "scalable-topics-operator"
DEFAULT_OPERATOR_NAMESPACE = "scalable-topics"


@dataclass
class Target:
    """Where the SDK connects: the operator's URL, and the topic when it was read (its spec
    names the subscriptions and their types)."""

    service_url: str
    topic: dict[str, Any] | None = None
    tried: list[str] = field(default_factory=list)

    def subscription_type(self, name: str) -> SubscriptionType | None:
        """The type of a subscription of the topic's spec, ``None`` when the topic was not
        read; :class:`NotFoundError` when the spec has no such subscription."""
        if self.topic is None:
            return None
        meta = self.topic.get("metadata") or {}
        subscriptions = (self.topic.get("spec") or {}).get("subscriptions") or []
        for sub in subscriptions:
            if sub.get("name") == name:
                return SubscriptionType(sub.get("type") or SubscriptionType.STREAM)
        known = ", ".join(
            f"{s.get('name')} ({s.get('type') or SubscriptionType.STREAM})" for s in subscriptions
        )
        raise NotFoundError(
            f"subscription {name!r} not found on scalabletopic "
            f"{meta.get('namespace')}/{meta.get('name')} (its subscriptions: {known or 'none'})"
        )


async def probe(session: aiohttp.ClientSession, url: str, namespace: str, topic: str) -> str | None:
    """``None`` when the operator at ``url`` serves the topic's DAG, else why not (one phrase).
    :class:`NotFoundError` when it answers that it does not know the topic."""
    target = url.rstrip("/") + dag_path(namespace, topic)
    try:
        async with session.get(
            target, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT), allow_redirects=True
        ) as response:
            if response.status == 200:
                return None
            if response.status in (401, 403):
                body = await response.json(content_type=None)
                raise CliError(f"the operator at {url} refused access: {body.get('message')}")
            if response.status == 404:
                raise NotFoundError(
                    f"the operator at {url} does not know topic {namespace}/{topic} "
                    "(it does not exist, or the operator has not handled it yet)"
                )
            return f"HTTP {response.status} {response.reason}"
    except TimeoutError:
        return f"no answer in {PROBE_TIMEOUT:g}s"
    except aiohttp.InvalidURL:
        return "not a URL"
    except aiohttp.ClientConnectorCertificateError as exc:
        return tls_failure_message(url, exc)
    except aiohttp.ClientConnectorError as exc:
        return f"cannot connect ({connect_problem(exc.os_error)})"
    except aiohttp.ClientError as exc:
        return " ".join(str(exc).split()) or type(exc).__name__


def _service_url(service: Any) -> str:
    ports = list(service.spec.ports or [])
    port = next((p for p in ports if p.name == "http"), ports[0] if ports else None)
    number = port.port if port is not None else 8080
    return f"http://{service.metadata.name}.{service.metadata.namespace}.svc:{number}"


async def _operator_service(api: k8s.ApiClient, namespace: str) -> str | None:
    core = k8s.CoreV1Api(api)
    try:
        service = await call(
            api,
            f"reading service {namespace}/{OPERATOR_SERVICE}",
            core.read_namespaced_service(OPERATOR_SERVICE, namespace),
        )
    except NotFoundError:
        return None
    except UnreachableError:
        raise
    except CliError:
        return None  # e.g. not allowed to read Services: the other candidate stays
    return _service_url(service)


async def find_operator(
    session: aiohttp.ClientSession,
    *,
    namespace: str,
    topic: str,
    service_url: str | None,
    kubeconfig: str | None,
    operator_namespace: str,
    request_timeout: float,
) -> Target:
    """The operator URL to use for ``namespace/topic`` (see the module docstring)."""
    if service_url:
        problem = await probe(session, service_url, namespace, topic)
        if problem is not None:
            raise UnreachableError(f"--service-url {service_url}: {problem}")
        return Target(service_url)
    tried: list[str] = []

    async def answers(label: str, url: str) -> bool:
        try:
            problem = await probe(session, url, namespace, topic)
        except NotFoundError:
            problem = "does not serve the topic yet"
        if problem is not None:
            tried.append(f"{label} {url}: {problem}")
        return problem is None

    async with kube_api(kubeconfig, request_timeout) as api:
        obj = await read_topic(api, namespace, topic)
        leader = ((obj.get("status") or {}).get("controller") or {}).get("url")
        if leader and await answers("status.controller.url", str(leader)):
            return Target(str(leader), obj, tried)
        # Only when the leader's own URL does not answer from here (e.g. a pod address seen
        # from outside the cluster) is the Service worth a read.
        service = await _operator_service(api, operator_namespace)
    if service and await answers(f"Service {operator_namespace}/{OPERATOR_SERVICE}", service):
        return Target(service, obj, tried)
    if not leader and not service:
        tried.append(
            "the topic has no status.controller.url (is the operator running?) and there is no "
            f"Service {operator_namespace}/{OPERATOR_SERVICE}"
        )
    raise UnreachableError(
        f"cannot reach the operator for {namespace}/{topic}: tried {'; '.join(tried)}; "
        "pass --service-url URL (the operator's address as seen from here)"
    )
