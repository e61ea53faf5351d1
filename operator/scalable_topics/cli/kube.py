"""The CLI's side of the Kubernetes API: the kubeconfig, bounded calls, the topic.

Every failure becomes a :class:`~.errors.CliError` naming what was wrong: a kubeconfig that does
not exist or is not valid (usage), an API server that does not answer within
``--request-timeout`` (unreachable), a topic that does not exist (not found).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import socket
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from ..core.resources import GROUP, TOPIC_PLURAL
from ..core.resources import VERSION as API_VERSION
from ..kubeapi import KubeconfigError, configuration
from .errors import CliError, NotFoundError, UnreachableError, UsageError

T = TypeVar("T")

API_TIMEOUT = 10.0
"""Seconds one Kubernetes API call may take before the server counts as unreachable (the
default of ``--request-timeout``)."""

_request_timeout: contextvars.ContextVar[float] = contextvars.ContextVar(
    "request_timeout", default=API_TIMEOUT
)


def connect_problem(error: OSError) -> str:
    """A failed connection in a few words (asyncio's own text repeats the address)."""
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return "host name not resolved"
    if isinstance(error, TimeoutError):
        return "connection timed out"
    return error.strerror or type(error).__name__


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


async def _load(kubeconfig: str | None) -> k8s.Configuration:
    try:
        return await configuration(kubeconfig)
    except KubeconfigError as exc:
        raise UsageError(str(exc)) from None


@contextlib.asynccontextmanager
async def kube_api(
    kubeconfig: str | None, request_timeout: float = API_TIMEOUT
) -> AsyncIterator[k8s.ApiClient]:
    """An API client from ``kubeconfig`` (``None``: in-cluster, else ``~/.kube/config``),
    closed on every path; :func:`call` gives each request ``request_timeout`` seconds."""
    _request_timeout.set(request_timeout)
    config = await _load(kubeconfig)
    async with k8s.ApiClient(config) as api:
        yield api


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"{exc.status} {exc.reason}"


async def call(api: k8s.ApiClient, what: str, request: Awaitable[T]) -> T:
    """Await one API ``request`` (described by ``what``, e.g. "reading scalabletopic
    default/orders") within the request timeout; a 404 is :class:`NotFoundError`."""
    server = api.configuration.host
    limit = _request_timeout.get()
    try:
        async with asyncio.timeout(limit):
            return await request
    except TimeoutError:
        raise UnreachableError(
            f"{what}: the Kubernetes API at {server} did not answer within {limit:g}s "
            "(--request-timeout)"
        ) from None
    except ApiException as exc:
        if exc.status == 404:
            raise NotFoundError(f"{what}: not found") from None
        if exc.status in (401, 403):
            raise CliError(
                f"{what}: {_api_message(exc)} (check the kubeconfig's credentials and RBAC)"
            ) from None
        raise CliError(f"{what}: {_api_message(exc)}") from None
    except aiohttp.ClientConnectorError as exc:
        raise UnreachableError(
            f"{what}: cannot reach the Kubernetes API at {server} ({connect_problem(exc.os_error)})"
        ) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UnreachableError(
            f"{what}: cannot reach the Kubernetes API at {server} ({_one_line(exc)})"
        ) from None


async def read_topic(api: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    custom = k8s.CustomObjectsApi(api)
    try:
        topic: dict[str, Any] = await call(
            api,
            f"reading scalabletopic {namespace}/{name}",
            custom.get_namespaced_custom_object(GROUP, API_VERSION, namespace, TOPIC_PLURAL, name),
        )
    except NotFoundError:
        raise NotFoundError(
            f"scalabletopic {namespace}/{name} not found (see kubectl get stopic -n {namespace})"
        ) from None
    return topic
