"""Writes a segment's rates to ``Segment.status.load`` (DESIGN §4): the broker's only API write.

Wrapped in ``load.ThresholdReporter`` it patches only when a rate moved by more than 25 % since
the last write, so a steady segment costs no API writes, and the write's ``updatedAt`` is the
modification time the controller's merge window is measured from. The broker's ServiceAccount
needs ``patch`` on ``segments/status`` and nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
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

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> KubernetesLoadReporter:
        return cls(await api_client(kubeconfig))

    async def close(self) -> None:
        await self.api_client.close()

    async def write(self, namespace: str, topic: str, segment_id: int, rates: SegmentRates) -> None:
        body = {"status": {"load": {**rates.to_status(), "updatedAt": format_time(self.clock())}}}
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
                    "segment %s/%s-%d has no Segment resource; load not reported",
                    namespace,
                    topic,
                    segment_id,
                )
                return
            raise
        self.writes += 1
