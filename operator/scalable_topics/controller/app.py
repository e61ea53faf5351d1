"""Wiring of one operator replica: kopf watches, shard leadership, the work queue, the reconciler,
the auto-scaler and the session server (docs/operator.md draws the picture)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from aiohttp import web

from ..core.jsontypes import JsonObj
from ..core.layout import SegmentLayout
from ..core.policy import DEFAULT_POLICY, AutoScalePolicy, ClusterDefaults, Resolution
from ..core.resources import (
    GROUP,
    LABEL_TOPIC,
    SEGMENT_PLURAL,
    TOPIC_PLURAL,
    VERSION,
    ConditionType,
    ScalableTopicSpec,
    SubscriptionType,
    get_condition,
    parse_time,
    parse_topic_spec,
)
from ..core.transfer import ShedPolicy, recorded_broker
from ..credentials import server_ssl_context
from ..kubeauth import KubernetesAuth
from . import metrics
from .access import SessionAccess
from .autoscale import AutoScaler
from .brokers import BrokerAdmin
from .cache import TopicCache, layout_of
from .clusterdefaults import ClusterDefaultsWatch
from .consumers import ConsumerHub
from .consumers.state import subscription_entry
from .corruption import corruption_changed
from .health import DEFAULT_LEASE_TOLERANCE, DEFAULT_STALL, LivenessRule, QueueProgress
from .initialsync import InitialSync
from .kube import KubeApi
from .leadership import ShardLeadership
from .leases import ElectionTimings
from .protocol import OperationExecutor
from .reconciler import NewTopicStatus, TopicReconciler, kube_events
from .sessions import make_app
from .status import TopicGone, update_topic_status
from .workqueue import WorkQueue

log = logging.getLogger(__name__)

SYNC_RECHECK_SECONDS = 5.0
"""How long the initial sync waits for the watches before it looks at their progress again."""

Key = tuple[str, str]


@dataclass
class ControllerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    url: str = ""
    namespace: str = "scalable-topics"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    shards: int = 1
    broker_label: tuple[str, str] = ("app.kubernetes.io/name", "segment-broker")
    broker_port: int = 8080
    broker_token: str | None = None
    broker_token_file: str | None = None
    """A file with the bearer token for the brokers' admin API, re-read when rotated (the
    projected ServiceAccount token of audience scalabletopics.io); wins over ``broker_token``."""
    auth: str = "none"
    """'kubernetes': DAG watch and consumer sessions need a token and RBAC (controller.access)."""
    auth_ttl: float = 10.0
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    """The session server's certificate and key: with both it serves HTTPS/WSS only and
    advertises ``https://`` (read at start; a renewed certificate needs a restart)."""
    tls_ca_file: str | None = None
    """CA bundle of the brokers' certificates: set, the brokers are called and advertised as
    ``https://`` (verified against it); unset, ``http://``."""
    kubeconfig: str | None = None
    timings: ElectionTimings = field(default_factory=ElectionTimings)
    workers: int = 8
    resync_interval: float = 60.0
    recommendation_freshness: float = 1200.0
    defaults: AutoScalePolicy = DEFAULT_POLICY
    lease_tolerance: float = DEFAULT_LEASE_TOLERANCE
    liveness_stall: float = DEFAULT_STALL
    shedding: ShedPolicy = field(default_factory=ShedPolicy)

    def __post_init__(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("--tls-cert-file and --tls-key-file go together: set both or neither")

    @property
    def broker_scheme(self) -> str:
        return "https" if self.tls_ca_file else "http"

    def advertised_url(self) -> str:
        """``--url``, else ``http(s)://HOST:PORT``. ``{pod_dns}`` in ``--url`` stands for the
        pod's DNS name ``a-b-c-d.<namespace>.pod`` (HOST's IP with dashes): each replica gets
        a name a TLS certificate can cover with one wildcard, which a pod IP cannot."""
        scheme = "https" if self.tls_cert_file else "http"
        if not self.url:
            return f"{scheme}://{self.host}:{self.port}"
        pod_dns = f"{self.host.replace('.', '-').replace(':', '-')}.{self.namespace}.pod"
        return self.url.replace("{pod_dns}", pod_dns)


class LedOperations:
    """The operations recorded in the status of topics this replica leads, as
    ``scalable_topic_operation_started_timestamp_seconds`` reads them at each scrape (it
    holds this source weakly from construction on: the replica keeps it alive)."""

    def __init__(self, cache: TopicCache, leads: Callable[[str, str], bool]) -> None:
        self._cache = cache
        self._leads = leads
        metrics.OPERATIONS_IN_PROGRESS.sources.add(self)

    def operations_in_progress(self) -> list[metrics.OperationInProgress]:
        """An operation without a readable ``startedAt``, written before it existed, is left
        out."""
        found = []
        for (namespace, name), topic in list(self._cache.topics.items()):
            op = (topic.get("status") or {}).get("operation") or {}
            if not op or not self._leads(namespace, name):
                continue
            try:
                started = parse_time(str(op.get("startedAt", "")))
            except ValueError:
                continue
            found.append(
                metrics.OperationInProgress(
                    namespace, name, str(op.get("kind")), str(op.get("phase")), started
                )
            )
        return found


class _NoEssence(kopf.DiffBaseStorage):
    """kopf's diff base for an operator of ``on.event`` handlers only: they detect no changes,
    so kopf needs no essence of an object. Its default storage builds one for every watch event
    all the same (a deep copy of the whole body, status included, then pruned), which was 7 % of
    the operator's CPU while 4,000 topics were created."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def _served_subscriptions(spec: ScalableTopicSpec) -> dict[str, Any]:
    """The consumer hub's view of a spec's subscriptions: each Stream one's assignment strategy,
    the Queue ones' names, and the grace period (``ConsumerHub.restore``'s keywords)."""
    return {
        "grace_period": spec.consumer_grace_period,
        "strategies": {
            s.name: s.assignment.value
            for s in spec.subscriptions
            if s.type is SubscriptionType.STREAM
        },
        "queues": [s.name for s in spec.subscriptions if s.type is SubscriptionType.QUEUE],
    }


class Controller:
    """One replica. ``run()`` serves until ``stop()``."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self._stop = asyncio.Event()
        self._kopf_ready = asyncio.Event()
        self.initial_sync = InitialSync()
        self.kube: KubeApi | None = None

    def stop(self) -> None:
        self._stop.set()

    # -- construction --------------------------------------------------------------------------

    async def _build(self) -> None:
        s = self.settings
        self.liveness_rule = LivenessRule(
            s.timings.lease_duration, s.lease_tolerance, s.liveness_stall
        )
        self.kube = kube = await KubeApi.connect(s.kubeconfig)
        # The Lease holder is this *process*, as client-go's ``<hostname>_<uuid>``: a container
        # restarted in the same pod must not inherit the dead process's leadership by renewing
        # "its own" Lease; it campaigns like any other candidate (and the takeover is counted).
        self.leadership = ShardLeadership(
            kube.coordination,
            namespace=s.namespace,
            identity=f"{s.identity}_{uuid.uuid4().hex[:8]}",
            url=s.advertised_url(),
            shards=s.shards,
            timings=s.timings,
            on_gained=self._gained,
            on_lost=self._lost,
        )
        self.cache = TopicCache(
            controller_url=self.leadership.leader_url,
            broker_port=s.broker_port,
            broker_scheme=s.broker_scheme,
            on_broker_change=self._brokers_changed,
        )
        self.led_operations = LedOperations(self.cache, self.leadership.leads)
        self.brokers = BrokerAdmin(
            token=s.broker_token, token_file=s.broker_token_file, ca_file=s.tls_ca_file
        )
        self.access: SessionAccess | None = None
        if s.auth == "kubernetes":
            self.access = SessionAccess(await KubernetesAuth.connect(s.kubeconfig, ttl=s.auth_ttl))
        self.autoscaler: AutoScaler | None = None
        self.hub = ConsumerHub(
            persist=self._persist_subscription, on_consumers_changed=self._consumers_changed
        )
        self.executor = OperationExecutor(
            kube,
            self.brokers,
            self.cache,
            events=self._event,
            on_layout=self._layout_changed,
        )
        self.queue: WorkQueue[Key] = WorkQueue(self._reconcile, workers=s.workers, name="topics")
        self.reconciler = TopicReconciler.wired(
            kube,
            self.brokers,
            self.cache,
            self.executor,
            events=self._event,
            leads=self.leadership.leads,
            controller_ref=self._controller_ref,
            defaults=s.defaults,
            on_deleted=self.hub.forget_topic,
            # The hub serves a topic's consumers once told about it: on gaining the shard, and
            # after every reconcile (new topics, spec changes of subscriptions or grace period).
            on_reconciled=self._restore_consumers,
            # Drains the leader sees in broker stats ungate children even when the consumer
            # that drained the segment never reported it (it crashed first).
            on_drained=self.hub.segment_drained,
            requeue_after=self.queue.add_after,
            shed_policy=s.shedding,
            new_topic_status=self._new_topic_status,
        )
        self.cluster_defaults = ClusterDefaultsWatch(
            kube, s.namespace, on_change=self._cluster_defaults_changed, events=self._event
        )
        self.autoscaler = AutoScaler(
            self.cache,
            kube,
            self.executor,
            locks=self.reconciler.locks,
            policies=self.reconciler.policies,
            plan=self.reconciler.requests.plan,
            events=self._event,
            leads=self.leadership.leads,
            stream_consumers=self.hub.stream_consumer_counts,
            recommendation_freshness=s.recommendation_freshness,
        )

    async def _event(self, topic: JsonObj, type_: str, reason: str, message: str) -> None:
        assert self.kube is not None
        await kube_events(self.kube)(topic, type_, reason, message)

    async def _reconcile(self, key: Key) -> None:
        await self.reconciler.reconcile(key)

    def _cluster_defaults_changed(self, cluster: ClusterDefaults) -> None:
        """The cluster level changed: every topic this replica leads is resolved again (and
        its ``status.autoScale`` rewritten) by a reconcile pass."""
        self.reconciler.cluster = cluster
        for namespace, name in list(self.cache.topics):
            if self.leadership.leads(namespace, name):
                self.queue.add((namespace, name))

    def _layout_changed(self, namespace: str, name: str, layout: SegmentLayout) -> None:
        """A split/merge/rebucket committed: consumers get new assignments, and one more
        reconcile pass brings the conditions and the rest of the status up to date (the
        operator's own status writes do not trigger passes)."""
        metrics.observe_layout(namespace, name, layout)
        self.hub.layout_changed(namespace, name, layout)
        self.queue.add((namespace, name))

    def _controller_ref(self, namespace: str, name: str) -> dict[str, Any]:
        return {
            "pod": self.settings.identity,
            "url": self.settings.advertised_url(),
            "shard": self.leadership.shard_of(namespace, name),
        }

    def _consumers_changed(self, namespace: str, name: str) -> None:
        if self.autoscaler is not None:
            self.autoscaler.trigger(namespace, name)

    async def _persist_subscription(
        self, namespace: str, name: str, subscription: str, coordinator_status: dict[str, Any]
    ) -> None:
        def change(status: dict[str, Any], obj: JsonObj) -> None:
            entries = [
                e for e in status.get("subscriptions") or [] if e.get("name") != subscription
            ]
            entries.append(subscription_entry(subscription, coordinator_status))
            status["subscriptions"] = sorted(entries, key=lambda e: str(e.get("name")))

        assert self.kube is not None
        with contextlib.suppress(TopicGone):
            await update_topic_status(self.kube, namespace, name, change)

    # -- leadership ----------------------------------------------------------------------------

    async def _gained(self, shard: int) -> None:
        # Leadership starts after the initial sync: the cache knows every topic, Segment and
        # broker pod the API server held then, and the watches bring the rest.
        for (namespace, name), topic in list(self.cache.topics.items()):
            if self.leadership.shard_of(namespace, name) != shard:
                continue
            self._restore_consumers(namespace, name, topic)
            self.queue.add((namespace, name))
        self.cache.notify_controller_changed()

    def _restore_consumers(self, namespace: str, name: str, topic: JsonObj) -> None:
        layout = layout_of(topic)
        if layout is None:
            return
        try:
            spec = parse_topic_spec(topic.get("spec"))
        except ValueError:
            return
        self.hub.restore(
            namespace,
            name,
            layout,
            (topic.get("status") or {}).get("subscriptions") or [],
            **_served_subscriptions(spec),
        )

    def _new_topic_status(
        self,
        topic: JsonObj,
        layout: SegmentLayout,
        spec: ScalableTopicSpec,
        resolution: Resolution | None,
    ) -> NewTopicStatus:
        """What a new topic's Ready write carries besides the reconciler's own: the consumer
        hub's first subscription entries and the auto-scaler's first evaluation, which would
        otherwise be two more topic status writes each (docs/operator.md, "Measurements")."""
        meta = topic["metadata"]
        entries = self.hub.initial_entries(
            meta["namespace"],
            meta["name"],
            layout,
            (topic.get("status") or {}).get("subscriptions") or [],
            **_served_subscriptions(spec),
        )
        outcome = None
        if resolution is not None and self.autoscaler is not None:
            outcome = self.autoscaler.first_outcome(topic, layout, resolution)
        return NewTopicStatus(entries, outcome)

    async def _lost(self, shard: int) -> None:
        def in_shard(key: Key) -> bool:
            return self.leadership.shard_of(*key) == shard

        cancelled = self.queue.cancel(in_shard)
        if self.autoscaler is not None:
            cancelled += self.autoscaler.cancel(in_shard)
        lost = [key for key in self.cache.topics if in_shard(key)]
        for namespace, name in lost:
            self.hub.forget_topic(namespace, name)
        metrics.forget_topics(lost)
        self.cache.notify_controller_changed()
        log.warning(
            "shard %d lost: cancelled %d reconcile(s) or operation(s) in progress", shard, cancelled
        )

    def _brokers_changed(self) -> None:
        """A broker pod appeared, went, moved or changed readiness: the topics that wait for a
        broker (not Ready) try again, and those with a segment on a pod whose URL changed get it
        re-recorded. Other topics need nothing from it, and re-reconciling all of them on every
        readiness flip of a busy broker is a storm (1,000 passes each time)."""
        urls = {pod.name: pod.url for pod in self.cache.brokers.values()}

        def moved(segment: JsonObj) -> bool:
            broker = (segment.get("status") or {}).get("broker") or {}
            pod = broker.get("pod")
            return pod in urls and urls[pod] != broker.get("url")

        def draining(segment: JsonObj) -> bool:
            pod = self.cache.brokers.get(recorded_broker(segment) or "")
            return pod is not None and pod.cordoned

        for (namespace, name), topic in list(self.cache.topics.items()):
            if not self.leadership.leads(namespace, name):
                continue
            ready = get_condition(
                (topic.get("status") or {}).get("conditions"), ConditionType.READY
            )
            segments = self.cache.segments.get((namespace, name), {}).values()
            if (
                not ready
                or ready.get("status") != "True"
                or any(moved(s) or draining(s) for s in segments)
            ):
                self.queue.add((namespace, name))

    def _resync_led(self) -> None:
        self.reconciler.new_stats_round()
        for namespace, name in list(self.cache.topics):
            if self.leadership.leads(namespace, name):
                self.queue.add_periodic((namespace, name))

    async def _sync_cache(self) -> None:
        """Return once the watches have delivered every topic, Segment and broker pod the API
        server holds as this replica starts (``controller.initialsync``), or on stop. Listed
        again only while the watches make no progress: a listed object deleted before a watch
        listed it is waited for until then."""
        assert self.kube is not None
        started = time.monotonic()
        sync = self.initial_sync
        progress = -1
        while not self._stop.is_set() and not sync.done.is_set():
            if not sync.listed or sync.pending == progress:
                try:
                    uids = await self._listed_uids()
                except Exception as exc:
                    log.warning("initial sync: listing failed (%s); retrying", exc)
                else:
                    first = not sync.listed
                    sync.relisted(uids)
                    if first:
                        log.info(
                            "initial sync: %d objects listed, %d still to come through the watches",
                            len(uids),
                            sync.pending,
                        )
            progress = sync.pending
            stop = asyncio.create_task(self._stop.wait())
            done = asyncio.create_task(sync.done.wait())
            try:
                await asyncio.wait({stop, done}, timeout=SYNC_RECHECK_SECONDS)
            finally:
                stop.cancel()
                done.cancel()
        if sync.done.is_set():
            self.cache.segments_complete = True
            log.info(
                "initial sync: the cache holds %d topics after %.1fs",
                len(self.cache.topics),
                time.monotonic() - started,
            )

    async def _listed_uids(self) -> set[str]:
        assert self.kube is not None
        key, value = self.settings.broker_label
        found = [
            *await self.kube.list_pods_all_namespaces(f"{key}={value}"),
            *await self.kube.list_all_segments(),
            *await self.kube.list_topics(),
        ]
        return {str(body["metadata"]["uid"]) for body in found}

    async def _resync_loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.settings.resync_interval)
            self._resync_led()

    # -- kopf ----------------------------------------------------------------------------------

    def _registry(self) -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()
        broker_key, broker_value = self.settings.broker_label

        @kopf.on.login(registry=registry)
        def login(**kwargs: Any) -> Any:
            return kopf.login_via_client(**kwargs)

        @kopf.on.event(GROUP, VERSION, TOPIC_PLURAL, registry=registry)
        async def topic_event(event: kopf.RawEvent, **_: Any) -> None:
            body: JsonObj = dict(event["object"])
            meta = body["metadata"]
            self.initial_sync.saw(str(meta.get("uid")))
            key = (meta["namespace"], meta["name"])
            if event.get("type") == "DELETED":
                self.cache.drop_topic(*key)
                self.hub.forget_topic(*key)
                assert self.kube is not None
                self.kube.forget_topic(*key)
                return
            self.cache.put_topic(body)
            assert self.kube is not None
            own = self.kube.wrote_version(*key, str(meta.get("resourceVersion")))
            if self.leadership.leads(*key) and not own:
                self.queue.add(key)

        @kopf.on.event(GROUP, VERSION, SEGMENT_PLURAL, registry=registry)
        async def segment_event(event: kopf.RawEvent, **_: Any) -> None:
            body: JsonObj = dict(event["object"])
            self.initial_sync.saw(str(body["metadata"].get("uid")))
            if event.get("type") == "DELETED":
                self.cache.drop_segment(body)
                topic = (body["metadata"].get("labels") or {}).get(LABEL_TOPIC)
                key = (body["metadata"]["namespace"], str(topic))
                if topic and key in self.cache.topics and self.leadership.leads(*key):
                    self.queue.add(key)
            else:
                meta = body["metadata"]
                owner = (meta.get("labels") or {}).get(LABEL_TOPIC) or body["spec"].get("topic")
                key = (meta["namespace"], str(owner))
                before = self.cache.segments.get(key, {}).get(int(body["spec"]["segmentId"]))
                self.cache.put_segment(body)
                # A broker quarantined the segment or an operator repaired it: the topic's
                # conditions say so (the cache alone triggers no pass).
                if owner and corruption_changed(before, body) and self.leadership.leads(*key):
                    self.queue.add(key)

        @kopf.on.event("", "v1", "pods", labels={broker_key: broker_value}, registry=registry)
        async def broker_pod_event(event: kopf.RawEvent, **_: Any) -> None:
            body: JsonObj = dict(event["object"])
            self.initial_sync.saw(str(body["metadata"].get("uid")))
            if event.get("type") == "DELETED":
                self.cache.drop_pod(body)
            else:
                self.cache.put_pod(body)

        return registry

    def _kopf_settings(self) -> kopf.OperatorSettings:
        settings = kopf.OperatorSettings()
        settings.posting.enabled = False
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 310
        settings.networking.request_timeout = 30
        settings.scanning.disabled = True
        settings.persistence.diffbase_storage = _NoEssence()
        return settings

    # -- run -----------------------------------------------------------------------------------

    def _healthy(self) -> bool:
        return not self._stop.is_set()

    def _ready(self) -> bool:
        return (
            self._kopf_ready.is_set()
            and self.initial_sync.done.is_set()
            and not self._stop.is_set()
        )

    def _liveness(self) -> list[dict[str, Any]]:
        """The failed liveness checks (empty: alive), each with the wall time of the last
        progress it saw; sets ``scalable_topic_operator_healthy{check}`` for every check."""
        rule = self.liveness_rule
        leases = self.leadership.progress()
        now = time.monotonic()
        failures = rule.failures(
            now, leases, QueueProgress(self.queue.waiting, self.queue.last_progress)
        )
        failed = {f.check for f in failures}
        for check in rule.checks(leases):
            metrics.HEALTHY.labels(check).set(0 if check in failed else 1)
        wall = time.time()
        return [
            {
                "check": f.check,
                "reason": f.reason,
                "since": None
                if f.since is None
                else datetime.fromtimestamp(wall - (now - f.since), UTC).isoformat(),
            }
            for f in failures
        ]

    async def run(self) -> None:
        # kopf logs every handled watch event at INFO ("Handler ... succeeded"): with only
        # on.event handlers that is one line per object change, noise at any scale.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        await self._build()
        assert self.kube is not None
        web_app = make_app(
            self.cache,
            self.leadership,
            self.hub,
            health=self._healthy,
            ready=self._ready,
            liveness=self._liveness,
        )
        if self.access is not None:
            self.access.protect(web_app)
        else:
            log.warning("--auth none: DAG watch and consumer sessions are open to anyone")
        runner = web.AppRunner(web_app, access_log=None)
        await runner.setup()
        tls = (
            server_ssl_context(self.settings.tls_cert_file, self.settings.tls_key_file)
            if self.settings.tls_cert_file and self.settings.tls_key_file
            else None
        )
        site = web.TCPSite(runner, self.settings.host, self.settings.port, ssl_context=tls)
        await site.start()
        log.info(
            "operator %s serving on %s", self.settings.identity, self.settings.advertised_url()
        )
        kopf_stop = asyncio.Event()
        kopf_task = asyncio.create_task(
            kopf.operator(
                registry=self._registry(),
                settings=self._kopf_settings(),
                standalone=True,
                clusterwide=True,
                stop_flag=kopf_stop,
                ready_flag=self._kopf_ready,
            ),
            name="kopf",
        )
        try:
            # The first passes resolve with the cluster level, not the built-in defaults alone.
            await self.cluster_defaults.load()
        except Exception as exc:
            log.warning("cluster auto-scale defaults not read yet (%s); the watch retries", exc)
        defaults_watch = asyncio.create_task(self.cluster_defaults.run(), name="cluster-defaults")
        self.queue.start()
        assert self.autoscaler is not None
        self.autoscaler.start()
        resync = asyncio.create_task(self._resync_loop(), name="resync")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._kopf_ready.wait(), 30)
        self._take_signals()
        await self._sync_cache()
        self.leadership.start()
        try:
            stop_waiter = asyncio.create_task(self._stop.wait())
            await asyncio.wait({stop_waiter, kopf_task}, return_when=asyncio.FIRST_COMPLETED)
            if kopf_task.done() and not self._stop.is_set():
                kopf_task.result()
        finally:
            # Leadership first: releasing the Lease is what lets a successor start at once.
            # kopf last: when it stops it waits 5 s for, then cancels, every task created after
            # it started, so ours must be finished by then.
            log.info("operator %s shutting down", self.settings.identity)
            await self.leadership.stop()
            await self.autoscaler.stop()
            await self.queue.stop()
            self.cluster_defaults.stop()
            defaults_watch.cancel()
            await asyncio.gather(defaults_watch, return_exceptions=True)
            resync.cancel()
            await asyncio.gather(resync, return_exceptions=True)
            await self.hub.close()
            await runner.cleanup()
            kopf_stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(kopf_task, 10)
            await self.brokers.close()
            if self.access is not None:
                await self.access.auth.close()
            await self.kube.close()

    def _take_signals(self) -> None:
        """kopf installs its own SIGINT/SIGTERM handlers when it starts (stopping only itself);
        a replica must stop as a whole, leadership first, so they are taken back."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop)
