"""The cluster-wide auto-scale defaults: the ConfigMap ``scalable-topics-autoscale-defaults`` in
the operator's namespace, watched (no restart needed) and parsed by
``core.policy.parse_cluster_defaults``.

A key that does not parse keeps its previous value; it is logged and reported as a Warning
event on the ConfigMap naming the key. A deleted ConfigMap is the built-in defaults. Each
change is handed to ``on_change`` (the operator re-resolves every topic it leads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from kubernetes_asyncio import watch

from ..core.jsontypes import JsonObj
from ..core.policy import (
    CLUSTER_DEFAULTS_CONFIGMAP,
    ClusterDefaults,
    format_knob,
    parse_cluster_defaults,
)
from .kube import KubeApi

log = logging.getLogger(__name__)

PostEvent = Callable[[JsonObj, str, str, str], Awaitable[None]]


def describe(cluster: ClusterDefaults) -> str:
    knobs = ", ".join(f"{k}={format_knob(k, v)}" for k, v in sorted(cluster.knobs.items()))
    return f"mode={cluster.mode.value} maxBuckets={cluster.bucket_max} knobs: {knobs or 'none'}"


class ClusterDefaultsWatch:
    """List, then watch, the one ConfigMap; ``current`` is the level in force."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        *,
        on_change: Callable[[ClusterDefaults], None],
        events: PostEvent,
        name: str = CLUSTER_DEFAULTS_CONFIGMAP,
        retry: float = 5.0,
        watch_timeout: int = 300,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.on_change = on_change
        self.events = events
        self.retry = retry
        self.watch_timeout = watch_timeout
        self.current = ClusterDefaults()
        self._version: str | None = None
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def load(self) -> str:
        """Read the ConfigMap once (before the first reconcile pass); returns the list's
        resourceVersion to watch from."""
        listing = await self.kube.core.list_namespaced_config_map(
            self.namespace, field_selector=f"metadata.name={self.name}"
        )
        items = [
            cast(JsonObj, self.kube.api_client.sanitize_for_serialization(item))
            for item in listing.items
        ]
        await self.apply(items[0] if items else None)
        return str(listing.metadata.resource_version)

    async def apply(self, obj: Mapping[str, Any] | None) -> None:
        """One version of the ConfigMap (``None``: there is none)."""
        version = None if obj is None else (obj.get("metadata") or {}).get("resourceVersion")
        if obj is not None and version is not None and version == self._version:
            return
        self._version = version
        data = None if obj is None else dict(obj.get("data") or {})
        cluster, problems = parse_cluster_defaults(data, self.current)
        for problem in problems:
            log.warning(
                "ConfigMap %s/%s: key %s: %s; the previous value is kept",
                self.namespace,
                self.name,
                problem.key,
                problem.message,
            )
            if obj is not None:
                body: JsonObj = {"apiVersion": "v1", "kind": "ConfigMap", **dict(obj)}
                await self.events(
                    body,
                    "Warning",
                    "InvalidSetting",
                    f"key {problem.key}: {problem.message}; the previous value is kept",
                )
        if cluster != self.current:
            self.current = cluster
            log.info(
                "cluster auto-scale defaults (ConfigMap %s/%s%s): %s",
                self.namespace,
                self.name,
                "" if obj is not None else ", absent",
                describe(cluster),
            )
            self.on_change(cluster)

    async def run(self) -> None:
        """Keep ``current`` up to date until :meth:`stop`; re-lists after any watch error."""
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = await self.load()
                version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "ConfigMap %s/%s: cannot read or watch it (%s); retrying in %gs",
                    self.namespace,
                    self.name,
                    exc,
                    self.retry,
                )
                version = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.retry)

    async def _watch(self, version: str) -> str | None:
        """Watch from ``version``; returns the version to resume from (``None``: re-list)."""
        stream = watch.Watch()
        try:
            async for event in stream.stream(
                self.kube.core.list_namespaced_config_map,
                self.namespace,
                field_selector=f"metadata.name={self.name}",
                resource_version=version,
                timeout_seconds=self.watch_timeout,
                # The server ends the watch after timeout_seconds; past that, the connection is
                # dead (KubeApi's default deadline would end every watch after 30 s).
                _request_timeout=self.watch_timeout + 30,
                allow_watch_bookmarks=True,
            ):
                kind = event.get("type")
                raw = event.get("raw_object") or {}
                if kind == "ERROR":
                    return None  # 410 Gone and the like: list again
                resumed = (raw.get("metadata") or {}).get("resourceVersion")
                if resumed:
                    version = str(resumed)
                if kind == "DELETED":
                    await self.apply(None)
                elif kind in ("ADDED", "MODIFIED"):
                    await self.apply(raw)
        finally:
            stream.stop()
            await stream.close()
        return version
