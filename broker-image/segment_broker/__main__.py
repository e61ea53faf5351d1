"""``python -m segment_broker`` / ``segment-broker``: run one broker process."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from aiohttp import web

from .access import BrokerAccess
from .clustersettings import ClusterSettings
from .config import BrokerConfig, parse_config
from .corruption import CorruptionReporter
from .load import (
    HistorySink,
    HistoryWriter,
    LoadReporter,
    LoadTracker,
    SegmentRates,
    ThresholdReporter,
)
from .metrics import BrokerMetrics
from .s3history import S3HistoryWriter
from .server import Broker
from .transfer import hand_off

log = logging.getLogger("segment_broker")

GC_THRESHOLDS = (700, 10, 100)
"""The cyclic collector's thresholds once the broker is ready: CPython's young generations (a
collection of what the hot path allocated stays small and short), and a full collection at most
every 100 collections of the middle one instead of every 10. A full collection walks every
hosted segment's objects: while 3,000 topics were created, each of the three brokers made 8 of
them, about 90 ms each (220 ms each four minutes into a 10,000-topic run), every one a stall of
every connection of the broker. At these thresholds: none, and 0.35 instead of 1.0 s of
collections per broker (bench/README.md, operator, eleventh round)."""


class _NoReporter:
    """``--load-reporter none``: rates still reach the history and the Prometheus gauges."""

    async def write(self, namespace: str, topic: str, segment_id: int, rates: SegmentRates) -> None:
        return None


async def _reporter(
    config: BrokerConfig,
) -> tuple[LoadReporter, CorruptionReporter | None, Callable[[], Awaitable[None]]]:
    """The load reporter, the writer of ``Segment.status.corruption`` (the same Kubernetes
    client, or none), and how to close them."""
    if config.load_reporter == "kubernetes":
        from .k8s_reporter import KubernetesLoadReporter

        k8s = await KubernetesLoadReporter.connect(config.kubeconfig)
        return ThresholdReporter(k8s), k8s, k8s.close

    async def nothing() -> None:
        return None

    return _NoReporter(), None, nothing


def _cluster_settings(
    config: BrokerConfig, reporter: LoadReporter, metrics: BrokerMetrics, stop: asyncio.Event
) -> asyncio.Task[None] | None:
    """With the Kubernetes load reporter in a pod (``POD_NAMESPACE``, the operator's namespace
    in the manifests): follow ``loadReportThreshold`` of the cluster defaults ConfigMap."""
    namespace = os.environ.get("POD_NAMESPACE")
    if config.load_reporter != "kubernetes" or not namespace:
        return None
    from .k8s_reporter import KubernetesLoadReporter

    assert isinstance(reporter, ThresholdReporter)
    assert isinstance(reporter.inner, KubernetesLoadReporter)
    settings = ClusterSettings(
        reporter.inner.api_client,
        namespace,
        reporter,
        metrics,
        interval=config.load_interval_s,
    )
    return asyncio.get_running_loop().create_task(settings.run(stop))


async def _access(config: BrokerConfig, metrics: BrokerMetrics) -> BrokerAccess | None:
    if config.auth != "kubernetes":
        log.warning("--auth none: produce, consume and admin are open to anyone (insecure)")
        return None
    from scalable_topics.kubeauth import KubernetesAuth

    auth = await KubernetesAuth.connect(
        config.kubeconfig, audiences=(config.auth_audience,), ttl=config.auth_ttl_s
    )
    admins = frozenset(a.strip() for a in config.admin_identities.split(",") if a.strip())
    return BrokerAccess(auth, admins, metrics)


def _tls(config: BrokerConfig) -> ssl.SSLContext | None:
    if not (config.tls_cert_file and config.tls_key_file):
        return None
    from scalable_topics.credentials import server_ssl_context

    return server_ssl_context(config.tls_cert_file, config.tls_key_file)


def _history(location: str | None) -> HistorySink | None:
    """A directory, or ``s3://bucket/prefix`` (segment_broker.s3history)."""
    if not location:
        return None
    if location.startswith("s3://"):
        return S3HistoryWriter(location)
    return HistoryWriter(Path(location))


async def serve(config: BrokerConfig, stop: asyncio.Event) -> None:
    tls = _tls(config)
    metrics = BrokerMetrics()
    history = _history(config.load_history_dir)
    reporter, corruption_reporter, close_reporter = await _reporter(config)
    tracker = LoadTracker(
        reporter,
        history,
        interval=config.load_interval_s,
        window=max(60.0, config.load_interval_s),
        registry=metrics.registry,
    )
    access = await _access(config, metrics)
    broker = Broker(
        config, metrics=metrics, tracker=tracker, corruption_reporter=corruption_reporter
    )
    app = broker.make_app()
    if access is not None:
        access.protect(app)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True, ssl_context=tls)
    await site.start()
    log.info(
        "listening on %s:%d (%s, fsync=%s)",
        config.host,
        config.port,
        "https" if config.tls_cert_file else "http",
        config.fsync,
    )
    await broker.start()
    # Everything allocated so far (modules, the recovered segments) lives as long as the
    # process: out of the collector's sight, a full collection walks only what came after it.
    # Full collections over the startup heap took 30-60 ms, every one a stall of every
    # connection (segment_broker_gc_pause_seconds).
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    log.info("ready: %d segments", len(broker.store.segments))
    load_task = asyncio.get_running_loop().create_task(tracker.run(stop))
    settings_task = _cluster_settings(config, reporter, metrics, stop)
    try:
        await stop.wait()
        await hand_off(broker.store, config.handoff_wait_s)
    finally:
        log.info("shutting down")
        await broker.stop()
        await runner.cleanup()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(load_task, 5.0)
        if settings_task is not None:
            settings_task.cancel()
            await asyncio.gather(settings_task, return_exceptions=True)
        await close_reporter()
        if isinstance(history, S3HistoryWriter):
            await asyncio.to_thread(history.close)  # the last buffered lines
        if access is not None:
            await access.auth.close()


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, stop)

    if config.uvloop:
        try:
            import uvloop

            uvloop.run(run())
            return 0
        except ImportError:
            log.info("uvloop not installed; using asyncio")
    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
