"""Writes a segment's rates to ``Segment.status.load`` (DESIGN §4), its backlog per
subscription to ``Segment.status.backlog`` and a quarantined segment's corruption to
``Segment.status.corruption``: the broker's only API writes.

Wrapped in ``load.ThresholdReporter`` it patches only when a rate (or a backlog) moved by more
than 25 % since the last write, so a steady segment costs no API writes, and the load write's
``updatedAt`` is the modification time the controller's merge window is measured from. Rates
and backlog that moved in the same interval go in one patch (a new segment's first report is
one write, not two); a backlog alone leaves ``load`` and its ``updatedAt`` untouched. The
broker's ServiceAccount needs ``patch`` on ``segments/status`` and nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from scalable_topics.core.resources import GROUP, SEGMENT_PLURAL, VERSION, format_time, segment_name
from scalable_topics.kubeapi import api_client

from .load import SegmentRates

log = logging.getLogger(__name__)

_MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}


class KubernetesLoadReporter:
    def __init__(
        self, api_client: k8s.ApiClient, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.api_client = api_client
        self.custom = k8s.CustomObjectsApi(api_client)
        self.clock = clock
        self.writes = 0
        self._backlog_names: dict[tuple[str, str, int], set[str]] = {}
        """Subscriptions last written per segment: a merge patch removes a gone one by null."""

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> KubernetesLoadReporter:
        return cls(await api_client(kubeconfig))

    async def close(self) -> None:
        await self.api_client.close()

    async def write(self, namespace: str, topic: str, segment_id: int, rates: SegmentRates) -> None:
        await self.write_status(namespace, topic, segment_id, rates, None)

    async def write_backlog(
        self, namespace: str, topic: str, segment_id: int, backlog: Mapping[str, int]
    ) -> None:
        await self.write_status(namespace, topic, segment_id, None, backlog)

    async def write_status(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        rates: SegmentRates | None,
        backlog: Mapping[str, int] | None,
    ) -> None:
        """One merge patch of ``status.load`` and/or ``status.backlog`` (None: left as is)."""
        status: dict[str, Any] = {}
        key = (namespace, topic, segment_id)
        if rates is not None:
            status["load"] = {**rates.to_status(), "updatedAt": format_time(self.clock())}
        if backlog is not None:
            gone = self._backlog_names.get(key, set()) - backlog.keys()
            status["backlog"] = {**dict.fromkeys(gone), **backlog}
        if not status:
            return
        what = " and ".join(part for part in ("load", "backlog") if part in status)
        if await self._patch_status(namespace, topic, segment_id, {"status": status}, what):
            self.writes += 1
            if backlog is not None:
                self._backlog_names[key] = set(backlog)

    def forget(self, namespace: str, topic: str, segment_id: int) -> None:
        self._backlog_names.pop((namespace, topic, segment_id), None)

    async def write_corruption(
        self, namespace: str, topic: str, segment_id: int, corruption: dict[str, Any] | None
    ) -> None:
        """``status.corruption`` = ``{position, file, offset, reason, source, detectedAt}`` of a
        quarantined segment; None removes it (merge patch) once an operator truncated it."""
        value: dict[str, Any] | None = None
        if corruption is not None:
            value = {**corruption, "detectedAt": format_time(float(corruption["detectedAt"]))}
        body = {"status": {"corruption": value}}
        await self._patch_status(namespace, topic, segment_id, body, "corruption")

    async def _patch_status(
        self, namespace: str, topic: str, segment_id: int, body: dict[str, Any], what: str
    ) -> bool:
        """False when the Segment resource does not exist (a broker used without the operator)."""
        try:
            await self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                SEGMENT_PLURAL,
                segment_name(topic, segment_id),
                body,
                **_MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                log.info(
                    "segment %s/%s-%d has no Segment resource; %s not reported",
                    namespace,
                    topic,
                    segment_id,
                    what,
                )
                return False
            raise
        return True
