"""The cluster setting a broker uses: ``loadReportThreshold`` of the ConfigMap
``scalable-topics-autoscale-defaults`` (the operator's; ``core.policy.parse_cluster_defaults``
reads it for both), the relative move of a segment's rates or backlog that makes the broker
rewrite ``Segment.status.load``/``backlog``.

The broker reads the ConfigMap once per load interval, so a change applies without a restart;
an invalid value keeps the previous one (logged; the operator posts the event). A missing
ConfigMap means the built-in 25 %. The value in force is the gauge
``segment_broker_load_report_threshold``; invalid values read are counted in
``segment_broker_settings_problems_total{key}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from scalable_topics.core.policy import (
    CLUSTER_DEFAULTS_CONFIGMAP,
    ClusterDefaults,
    parse_cluster_defaults,
)

from .load import ThresholdReporter
from .metrics import BrokerMetrics

log = logging.getLogger(__name__)


class ClusterSettings:
    """Keeps ``reporter.threshold`` at the ConfigMap's ``loadReportThreshold``."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        reporter: ThresholdReporter,
        metrics: BrokerMetrics,
        *,
        interval: float = 10.0,
        name: str = CLUSTER_DEFAULTS_CONFIGMAP,
    ) -> None:
        self.core = k8s.CoreV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.reporter = reporter
        self.interval = interval
        self.current = ClusterDefaults()
        self.gauge = metrics.load_report_threshold
        self.problems = metrics.settings_problems
        self._apply(self.current)

    def _apply(self, cluster: ClusterDefaults) -> None:
        if cluster.load_report_threshold != self.reporter.threshold:
            log.info(
                "load report threshold %g (ConfigMap %s/%s)",
                cluster.load_report_threshold,
                self.namespace,
                self.name,
            )
        self.current = cluster
        self.reporter.threshold = cluster.load_report_threshold
        self.gauge.set(cluster.load_report_threshold)

    async def refresh(self) -> None:
        try:
            config_map = await self.core.read_namespaced_config_map(self.name, self.namespace)
            data: dict[str, str] | None = dict(config_map.data or {})
        except ApiException as exc:
            if exc.status != 404:
                raise
            data = None
        cluster, problems = parse_cluster_defaults(data, self.current)
        for problem in problems:
            if problem.key == "loadReportThreshold":
                self.problems.labels(problem.key).inc()
                log.warning(
                    "ConfigMap %s/%s: key %s: %s; the previous value is kept",
                    self.namespace,
                    self.name,
                    problem.key,
                    problem.message,
                )
        self._apply(cluster)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("ConfigMap %s/%s not read: %s", self.namespace, self.name, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
