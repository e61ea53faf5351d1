"""``stopic demo`` (``make run``): the whole system on the local cluster, under load.

1. start the local cluster (the real control plane and our kubelet, ``LocalCluster``) in
   ``--data-dir``, through the same data-directory lock as ``stopic local up``: a second demo or
   control plane on the directory is refused at once (exit status ``EXIT_IN_USE``) and the first
   is left untouched;
2. ``kubectl apply`` (the pinned kubectl, ``DIR/bin/kubectl``) the CRDs and
   ``manifests/overlays/local-secure`` (authentication on, docs/security.md; operator
   replicas, 3 brokers, recommender CronJob: Pods under their own ServiceAccounts, authorized
   by the Roles of ``manifests/``) and wait for them; the demo's clients present a token of
   ServiceAccount ``demo-client`` (``DIR/demo-client.token``, renewed before it expires);
   print the operator's URL, the address of a Ready operator Pod (found by label: local Pods get
   no Service endpoints);
3. bring ``orders`` (``manifests/examples/orders.yaml``) to its initial shape and wait for
   ``Ready``; print the commands to watch it from another terminal;
4. drive it: a producer ramps up until the topic splits on load, stream consumers join until a
   consumer-count split, then the load stops until neighbours merge;
5. print the DAG each time it changes.

**Start state.** The data directory keeps everything across runs, so the demo may find the
topic of an earlier run: split, merged, in the middle of an operation, being deleted, with its
segments and their messages. Each phase waits for the *next* epoch rather than a fixed one, but
whether a phase can succeed at all depends on the shape it starts from (the producer's ramp
splits two segments, not eight; consumers cannot force a split at ``maxSegments``; a merge needs
more than ``minSegments``). Rather than guess a plan for every shape, the demo deletes a topic
that is not in its initial shape (epoch 0, ``initialSegments`` active, no operation) and waits
until the operator has deleted it and its segments before applying it again: the same three
phases then work every time. A topic already in its initial shape is reused.

**Progress.** Every wait says what it waits for at least every ``PROGRESS_EVERY`` seconds, with
the state it has reached, read from the real status (``demo_progress``).

Ctrl-C ends it within 5 s at any point: clients get ``CLIENT_STOP_TIMEOUT`` to close, pods
``DEFAULT_STOP_GRACE`` between SIGTERM and SIGKILL, then the control plane's four components
stop in turn (~3 s); a second Ctrl-C stops waiting for the clients and pods.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s

from ..core.auth import AUDIENCE
from ..core.resources import (
    GROUP,
    LABEL_TOPIC,
    SEGMENT_PLURAL,
    TOPIC_PLURAL,
    VERSION,
    ScalableTopicSpec,
)
from ..credentials import TOKEN_FILE_ENV, client_session
from ..kubeapi import api_client
from ..localcluster.datadir import EXIT_IN_USE, DataDirInUse
from . import demo_progress
from .local import DEFAULT_STOP_GRACE, refuse_start, shell_setup
from .topics import dag_text

NAMESPACE = "default"
TOPIC = "orders"
OPERATOR_SELECTOR = "app.kubernetes.io/name=scalable-topics-operator"
OPERATOR_NAMESPACE = "scalable-topics"
DEMO_CLIENT = "demo-client"
"""The ServiceAccount the demo's producer and consumers present (docs/security.md)."""
DEMO_TOKEN_SECONDS = 3600
BROKER_SELECTOR = "app.kubernetes.io/name=segment-broker"
CLIENT_STOP_TIMEOUT = 0.5
"""On Ctrl-C, how long clients get to close their sessions before they are cancelled."""
PROGRESS_EVERY = 5.0
"""Longest silence while waiting: a progress line at least this often (seconds)."""
POLL = 0.5
SETUP_TIMEOUT = 180.0
MAX_RATE = 1500.0
RAMP_STEP, RAMP_EVERY = 100.0, 5.0
CONSUMER_EVERY = 8.0


@dataclass
class Ledger:
    """What the demo's clients sent and received, by message number (``order <n> for <key>``):
    none lost is every acknowledged number received; key order held is no number received for
    the first time after a higher one of the same key. A message received again (a redelivery
    after its segment moved to another consumer) counts once, as ``redelivered``."""

    acked: set[int] = field(default_factory=set)
    received: set[int] = field(default_factory=set)
    last: dict[str, int] = field(default_factory=dict)
    """Per key, the highest number received."""
    redelivered: int = 0
    out_of_order: int = 0
    foreign: int = 0
    """Messages not of the demo's form (someone else producing to the topic)."""

    def received_message(self, key: str | None, value: bytes) -> None:
        words = value.split()
        if key is None or len(words) != 4 or words[0] != b"order" or not words[1].isdigit():
            self.foreign += 1
            return
        number = int(words[1])
        if number in self.received:
            self.redelivered += 1
            return
        self.received.add(number)
        if number < self.last.get(key, -1):
            self.out_of_order += 1
        else:
            self.last[key] = number

    def missing(self) -> int:
        return len(self.acked - self.received)


@dataclass
class Outcome:
    """What one run of the three phases showed (:meth:`Demo.drive`)."""

    epochs: list[int]
    """The topic's epoch at the start and after each phase that completed."""
    sent: int
    acked: int
    failed: int
    received: int
    redelivered: int
    out_of_order: int
    lost: int
    keys: int
    verified: bool
    """Whether the consumers read until every acknowledged message was received."""

    def ok(self) -> bool:
        return (
            self.verified
            and len(self.epochs) == 4
            and self.acked > 0
            and self.lost == 0
            and self.out_of_order == 0
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        return cls(**json.loads(text))

    def report(self) -> list[str]:
        phases = ["split on load", "split on consumers", "merged when cold"]
        steps = [
            f"{name} (epoch {a} -> {b})"
            for name, a, b in zip(phases, self.epochs, self.epochs[1:], strict=False)
        ]
        order = "held" if self.out_of_order == 0 else f"BROKEN ({self.out_of_order} messages)"
        return [
            f"messages: sent {self.sent}, acknowledged {self.acked}, failed {self.failed}, "
            f"received {self.received} ({self.redelivered} redelivered)",
            f"lost: {self.lost}" + ("" if self.verified else " (not checked)"),
            f"per-key order: {order} over {self.keys} keys",
            f"DAG: {', '.join(steps) or 'no change'}",
        ]


def repo_root() -> Path:
    """The checkout the demo runs from (manifests and CRDs are read from it)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "manifests").is_dir() and (parent / "crds").is_dir():
            return parent
    raise SystemExit("stopic demo: run it from a checkout (manifests/ and crds/ not found)")


class Demo:
    def __init__(
        self,
        data_dir: Path,
        *,
        phase_timeout: float,
        progress_every: float = PROGRESS_EVERY,
        kubeconfig: Path | None = None,
        namespace: str = NAMESPACE,
    ) -> None:
        self.data_dir = data_dir
        self.phase_timeout = phase_timeout
        self.progress_every = progress_every
        self.namespace = namespace
        """The demo topic's namespace."""
        self.stop = asyncio.Event()
        self.kubeconfig = kubeconfig or data_dir / "kubeconfig"
        self.kubectl_path: Path | None = None
        self.context: str | None = None
        """The kubeconfig's context kubectl uses (None: its current context)."""
        """The pinned kubectl (``LocalCluster.kubectl``), once the cluster runs."""
        self.sent = 0
        self.acked = 0
        self.consumed = 0
        self.failed = 0
        self.ledger = Ledger()
        self.rate = 0.0
        self.token_file: Path | None = None
        """The clients' token (:meth:`client_credentials`); None: anonymous."""

    @property
    def root(self) -> Path:
        """The checkout (:func:`repo_root`); only the host side reads manifests from it, the
        in-cluster load (``stopic demo-load``) runs from the image without one."""
        return repo_root()

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    async def kubectl(self, *args: str, check: bool = True) -> str:
        kubectl = str(self.kubectl_path) if self.kubectl_path else shutil.which("kubectl")
        if kubectl is None:
            raise SystemExit("stopic demo: kubectl is not on PATH")
        proc = await asyncio.create_subprocess_exec(
            kubectl,
            "--kubeconfig",
            str(self.kubeconfig),
            *(("--context", self.context) if self.context else ()),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await proc.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        text = out.decode(errors="replace")
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{text}")
        return text

    async def wait_for(
        self,
        what: str,
        done: Callable[[], Awaitable[bool]],
        within: float,
        detail: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        """Poll ``done`` until it is true, saying what it waits for (and ``detail()``, the
        state reached) at least every ``progress_every`` seconds.

        ``RuntimeError`` after ``within`` seconds, ``asyncio.CancelledError`` on Ctrl-C.
        """
        started = time.monotonic()
        next_report = started + self.progress_every
        while not self.stop.is_set():
            if await done():
                return
            now = time.monotonic()
            if now - started > within or now >= next_report:
                line = demo_progress.progress_line(
                    what, await self._detail(detail), now - started, within
                )
                if now - started > within:
                    raise RuntimeError(f"timed out: {line}")
                self.say(line)
                next_report = now + self.progress_every
            await self.pause(min(POLL, max(0.0, next_report - time.monotonic())))
        raise asyncio.CancelledError

    @staticmethod
    async def _detail(detail: Callable[[], Awaitable[str]] | None) -> str:
        if detail is None:
            return ""
        try:
            return await detail()
        except Exception as exc:  # the line must not end the demo: say what failed instead
            return f"status unavailable ({type(exc).__name__}: {exc})"

    async def pause(self, seconds: float) -> None:
        """Sleep, cut short by Ctrl-C."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    # -- reading the cluster -------------------------------------------------------------------

    async def operator_url(self, api: k8s.ApiClient) -> str:
        pods = await k8s.CoreV1Api(api).list_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector=OPERATOR_SELECTOR
        )
        for pod in pods.items:
            ports = [
                p.container_port
                for c in pod.spec.containers
                for p in c.ports or []
                if p.name == "http"
            ]
            if _pod_ready(pod) and pod.status.pod_ip and ports:
                return f"http://{pod.status.pod_ip}:{ports[0]}"
        return ""

    async def stack_state(self, api: k8s.ApiClient) -> tuple[int, int, int, int]:
        """Ready and wanted brokers, ready and wanted operator replicas."""
        core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
        brokers = await core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=BROKER_SELECTOR)
        operators = await core.list_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector=OPERATOR_SELECTOR
        )
        sts = await apps.read_namespaced_stateful_set("segment-broker", OPERATOR_NAMESPACE)
        deploy = await apps.read_namespaced_deployment(
            "scalable-topics-operator", OPERATOR_NAMESPACE
        )
        return (
            sum(_pod_ready(p) for p in brokers.items),
            int(sts.spec.replicas or 0),
            sum(_pod_ready(p) for p in operators.items),
            int(deploy.spec.replicas or 0),
        )

    async def topic_or_none(self, api: k8s.ApiClient) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await k8s.CustomObjectsApi(api).get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, TOPIC_PLURAL, TOPIC
            )
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def topic(self, api: k8s.ApiClient) -> dict[str, Any]:
        topic = await self.topic_or_none(api)
        if topic is None:
            raise RuntimeError(f"topic {self.namespace}/{TOPIC} was deleted")
        return topic

    async def segments(self, api: k8s.ApiClient) -> list[dict[str, Any]]:
        listed = await k8s.CustomObjectsApi(api).list_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            SEGMENT_PLURAL,
            label_selector=f"{LABEL_TOPIC}={TOPIC}",
        )
        items: list[dict[str, Any]] = listed.get("items") or []
        return items

    async def epoch(self, api: k8s.ApiClient) -> int:
        return int(((await self.topic(api)).get("status") or {}).get("epoch") or 0)

    async def status_line(
        self, api: k8s.ApiClient, explain: demo_progress.Explain, prefix: str = ""
    ) -> str:
        topic = await self.topic(api)
        policy = ScalableTopicSpec.model_validate(topic.get("spec") or {}).policy()
        return prefix + explain(await self.segments(api), policy, topic, time.time())

    # -- set-up --------------------------------------------------------------------------------

    async def start_stack(self, api: k8s.ApiClient) -> str:
        """Apply the CRDs and the local overlay; wait for the brokers and an operator; return
        the operator's URL."""
        await self.kubectl("apply", "-f", str(self.root / "crds"))
        await self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=30s")

        async def served() -> bool:
            # Established comes before the API server's storage for the new resources is up
            # (a list then gets 429 "storage is (re)initializing"); the operator's first lists
            # must not meet that.
            out = await self.kubectl("get", "stopic,seg", "-A", "-o", "name", check=False)
            return "storage is (re)initializing" not in out and "error" not in out.lower()

        await self.wait_for("the API server to serve the CRDs", served, SETUP_TIMEOUT)
        await self.apply_stack()

        async def ready() -> bool:
            brokers, want, operators, _ = await self.stack_state(api)
            return (
                want > 0
                and brokers >= want
                and operators > 0
                and bool(await self.operator_url(api))
            )

        async def detail() -> str:
            brokers, want, operators, want_ops = await self.stack_state(api)
            return f"brokers ready {brokers}/{want}, operator replicas ready {operators}/{want_ops}"

        await self.wait_for("the brokers and an operator", ready, SETUP_TIMEOUT, detail)
        return await self.operator_url(api)

    async def apply_stack(self) -> None:
        """The operator and the brokers: here the local overlay with authentication on."""
        await self.kubectl("apply", "-k", str(self.root / "manifests/overlays/local-secure"))

    async def client_credentials(self, api: k8s.ApiClient) -> float:
        """The demo's clients are ServiceAccount ``demo-client`` of ``NAMESPACE``, bound to the
        producer and consumer ClusterRoles (docs/security.md): write a token of it for audience
        scalabletopics.io (TokenRequest through the admin kubeconfig) to
        ``DIR/demo-client.token``, which the demo's clients present (re-read for each new
        connection); returns the token's lifetime."""
        core = k8s.CoreV1Api(api)
        rbac = k8s.RbacAuthorizationV1Api(api)
        meta = k8s.V1ObjectMeta
        await _created_or_exists(
            core.create_namespaced_service_account(
                NAMESPACE, k8s.V1ServiceAccount(metadata=meta(name=DEMO_CLIENT))
            )
        )
        for role in ("scalable-topics-producer", "scalable-topics-consumer"):
            binding = k8s.V1RoleBinding(
                metadata=meta(name=f"{DEMO_CLIENT}-{role.rsplit('-', 1)[1]}"),
                role_ref=k8s.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role
                ),
                subjects=[
                    k8s.RbacV1Subject(kind="ServiceAccount", name=DEMO_CLIENT, namespace=NAMESPACE)
                ],
            )
            await _created_or_exists(rbac.create_namespaced_role_binding(NAMESPACE, binding))
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=DEMO_TOKEN_SECONDS)
        )
        answer = await core.create_namespaced_service_account_token(DEMO_CLIENT, NAMESPACE, request)
        path = self.data_dir / "demo-client.token"
        fresh = path.with_suffix(".new")
        fresh.touch(mode=0o600)
        fresh.write_text(answer.status.token)
        fresh.replace(path)  # atomic, as the kubelet rotates a projected token
        self.token_file = path
        return float(DEMO_TOKEN_SECONDS)

    async def renew_credentials(self, api: k8s.ApiClient, lifetime: float) -> None:
        """A new token at 80 % of the last one's lifetime (the kubelet's schedule); clients
        re-read the file for their next connection."""
        while not self.stop.is_set():
            await self.pause(0.8 * lifetime)
            if not self.stop.is_set():
                lifetime = await self.client_credentials(api)

    async def fresh_topic(self, api: k8s.ApiClient) -> None:
        """Bring ``orders`` to its initial shape (see the module docstring) and wait for Ready."""
        manifest = self.root / "manifests/examples/orders.yaml"
        topic = await self.topic_or_none(api)
        if topic is not None:
            shape = demo_progress.leftover_shape(topic)
            if shape:
                self.say(
                    f"topic {TOPIC} is left from an earlier run ({shape}): deleting it and its "
                    "segments so the demo starts from its initial shape"
                )
                await self.kubectl(
                    "delete",
                    "-n",
                    self.namespace,
                    f"stopic/{TOPIC}",
                    "--wait=false",
                    "--ignore-not-found",
                )

                async def gone() -> bool:
                    return await self.topic_or_none(api) is None and not await self.segments(api)

                async def left() -> str:
                    present = "present" if await self.topic_or_none(api) else "gone"
                    return f"topic {present}, {len(await self.segments(api))} segment(s) left"

                await self.wait_for(
                    f"the operator to delete the old {TOPIC}", gone, SETUP_TIMEOUT, left
                )
        await self.kubectl("apply", "-n", self.namespace, "-f", str(manifest))

        async def ready() -> bool:
            current = await self.topic_or_none(api)
            return current is not None and demo_progress.is_ready(current)

        async def condition() -> str:
            current = await self.topic_or_none(api)
            return demo_progress.ready_detail(current) if current else "not created yet"

        await self.wait_for(f"topic {TOPIC} to be Ready", ready, SETUP_TIMEOUT, condition)

    # -- the show ------------------------------------------------------------------------------

    def counters(self) -> str:
        return f"; sent {self.sent}, acked {self.acked}, consumed {self.consumed}"

    async def watch_dag(self, api: k8s.ApiClient) -> None:
        last_epoch = -1
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                epoch = await self.epoch(api)
                if epoch != last_epoch:
                    last_epoch = epoch
                    self.say(f"DAG changed (epoch {epoch}){self.counters()}")
                    print(await dag_text(api, self.namespace, TOPIC), flush=True)
            await self.pause(1.0)

    async def produce(self, service_url: str, stop: asyncio.Event | None = None) -> None:
        """Send at ``self.rate`` msg/s over 200 keys until ``stop`` (default: the demo's end);
        message ``n`` is ``order <n> for <key>`` so a consumer can tell which it got
        (:class:`Ledger`)."""
        from ..client import ScalableTopicProducer

        stop = stop or self.stop

        async with (
            client_session(self.token_file) as session,
            ScalableTopicProducer(
                service_url, self.namespace, TOPIC, name="demo-producer", session=session
            ) as producer,
        ):
            keys = [f"customer-{i}" for i in range(200)]
            key_cycle = itertools.cycle(keys)
            tick = 0.02
            while not stop.is_set():
                started = time.monotonic()
                for _ in range(int(self.rate * tick)):
                    key = next(key_cycle)
                    number = self.sent
                    future = await producer.send_async(
                        f"order {number} for {key}".encode(), key=key
                    )
                    self.sent += 1
                    future.add_done_callback(functools.partial(self._acked, number))
                await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))

    def _acked(self, number: int, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.acked += 1
            self.ledger.acked.add(number)
        else:
            self.failed += 1

    async def consume(self, service_url: str, name: str, stop: asyncio.Event) -> None:
        from ..client import StreamConsumer

        session = client_session(self.token_file)
        consumer = StreamConsumer(
            service_url, self.namespace, TOPIC, "billing", name, session=session
        )
        try:
            await consumer.start()
        except BaseException:
            await consumer.close()
            await session.close()
            raise
        stopping = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                receiving = asyncio.create_task(consumer.receive())
                await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not receiving.done():
                    receiving.cancel()
                    break
                message = receiving.result()
                self.consumed += 1
                self.ledger.received_message(message.key, message.value)
                consumer.ack_nowait(message)
        finally:
            stopping.cancel()
            await consumer.close(unregister=True)
            await session.close()

    async def run(self) -> int:
        from ..localcluster.cluster import LocalCluster

        self.say(f"starting the local cluster (real control plane, node local) in {self.data_dir}")
        async with LocalCluster(
            self.data_dir, kubelet=True, stop_grace=DEFAULT_STOP_GRACE
        ) as cluster:
            self.kubeconfig = Path(cluster.kubeconfig)
            self.kubectl_path = cluster.kubectl
            self.say(f"API server {cluster.url}, kubeconfig {self.kubeconfig}")
            api = await api_client(str(self.kubeconfig))
            show = asyncio.create_task(self._show(api))
            stopped = asyncio.create_task(self.stop.wait())
            try:
                await asyncio.wait({show, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not show.done():
                    # Ctrl-C: the show winds its clients down itself; a kubectl call it is in
                    # the middle of is not worth waiting for.
                    await asyncio.wait({show}, timeout=CLIENT_STOP_TIMEOUT + 0.2)
                    show.cancel()
                return await show
            finally:
                stopped.cancel()
                show.cancel()
                await asyncio.gather(show, stopped, return_exceptions=True)
                self.say("stopping clients and the local cluster")
                await api.close()

    def next_steps(self, service_url: str) -> None:
        self.say(f"operator: {service_url} (the URL the client SDK takes, docs/client.md)")
        self.say(f"topic {TOPIC} is Ready. In another terminal:")
        commands = [
            *shell_setup(self.kubeconfig, self.kubectl_path),
            f"export {TOKEN_FILE_ENV}={self.data_dir / 'demo-client.token'}",
            f"kubectl get stopic,seg -n {NAMESPACE}",
            f"kubectl describe stopic {TOPIC}",
            f"kubectl stopic dag {TOPIC} --watch",
        ]
        print("\n".join(f"    {c}" for c in commands), flush=True)

    async def _show(self, api: k8s.ApiClient) -> int:
        self.say(
            "applying the CRDs and manifests/overlays/local-secure (operator and 3 brokers, "
            "authentication on)"
        )
        service_url = await self.start_stack(api)
        lifetime = await self.client_credentials(api)
        await self.fresh_topic(api)
        self.next_steps(service_url)

        renewing = asyncio.create_task(self.renew_credentials(api, lifetime))
        watcher = asyncio.create_task(self.watch_dag(api))
        try:
            await self.drive(api, service_url)
            self.say(
                "demo complete: split on load, split on consumers, merged when cold. "
                "Ctrl-C to stop."
            )
            await self.stop.wait()
            return 0
        finally:
            self.stop.set()
            await self._stop_clients([renewing, watcher], [])

    async def drive(self, api: k8s.ApiClient, service_url: str, *, verify: bool = False) -> Outcome:
        """The three phases against the Ready topic: a producer ramps up until the topic splits
        on load, stream consumers join until a consumer-count split, then the load stops until
        neighbours merge.

        With ``verify`` (the in-cluster load), between the second and third phase the producer
        stops, every send is settled and the consumers read until they have received every
        acknowledged message (or the phase timeout says how many they have not): the
        :class:`Outcome` then tells whether any was lost or arrived out of key order.
        """
        stop_producing = asyncio.Event()
        producer = asyncio.create_task(self.produce(service_url, stop_producing))
        consumers: list[tuple[asyncio.Task[None], asyncio.Event]] = []
        clients = [producer]

        def failed() -> None:
            """A client that ended on its own failed: say why instead of waiting out a phase."""
            for task in clients:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"a demo client failed: {task.exception()!r}")

        epochs = [await self.epoch(api)]
        verified = False
        try:
            self.say("phase 1: ramping the producer up until the topic splits on load")
            next_ramp = time.monotonic()

            async def split_on_load() -> bool:
                nonlocal next_ramp
                failed()
                if await self.epoch(api) != epochs[-1]:
                    return True
                if time.monotonic() >= next_ramp:
                    self.rate = min(self.rate + RAMP_STEP, MAX_RATE)
                    next_ramp += RAMP_EVERY
                return False

            await self.wait_for(
                "a split on load",
                split_on_load,
                self.phase_timeout,
                lambda: self.status_line(
                    api, demo_progress.split_progress, f"producing {self.rate:.0f} msg/s; "
                ),
            )
            epochs.append(await self.epoch(api))

            self.say("phase 2: adding stream consumers until a consumer-count split")
            next_consumer = time.monotonic()

            async def split_on_consumers() -> bool:
                nonlocal next_consumer
                failed()
                if await self.epoch(api) != epochs[-1]:
                    return True
                if time.monotonic() >= next_consumer:
                    event = asyncio.Event()
                    name = f"billing-{len(consumers) + 1}"
                    task = asyncio.create_task(self.consume(service_url, name, event))
                    consumers.append((task, event))
                    clients.append(task)
                    self.say(f"  stream consumer {name} joined ({len(consumers)} now)")
                    next_consumer += CONSUMER_EVERY
                return False

            await self.wait_for(
                "a consumer-count split",
                split_on_consumers,
                self.phase_timeout,
                lambda: self.status_line(api, demo_progress.consumer_split_progress),
            )
            epochs.append(await self.epoch(api))

            self.rate = 0.0
            if verify:
                await self._drain(failed)
                verified = True

            self.say("phase 3: load off and consumers gone until cold neighbours merge")
            await self._stop_clients([], consumers)

            async def merged() -> bool:
                return await self.epoch(api) != epochs[-1]

            await self.wait_for(
                "a merge",
                merged,
                self.phase_timeout,
                lambda: self.status_line(api, demo_progress.merge_progress),
            )
            epochs.append(await self.epoch(api))
            return self.outcome(epochs, verified)
        finally:
            await self._stop_clients([], [(producer, stop_producing), *consumers])

    async def _drain(self, failed: Callable[[], None]) -> None:
        """Every send settled, then every acknowledged message received (see :meth:`drive`)."""
        self.say("producer stopped: waiting until the consumers have every acknowledged message")

        async def settled() -> bool:
            failed()
            return self.acked + self.failed >= self.sent

        await self.wait_for(
            "the producer's last sends to be acknowledged",
            settled,
            self.phase_timeout,
            lambda: _text(f"{self.acked + self.failed} of {self.sent} settled"),
        )

        async def received() -> bool:
            failed()
            return self.ledger.missing() == 0

        await self.wait_for(
            "the consumers to receive every acknowledged message",
            received,
            self.phase_timeout,
            lambda: _text(
                f"{len(self.ledger.received)} received, {self.ledger.missing()} of "
                f"{len(self.ledger.acked)} acknowledged still missing"
            ),
        )
        self.say(
            f"  all {len(self.ledger.acked)} acknowledged messages received "
            f"({self.ledger.redelivered} redelivered, {self.ledger.out_of_order} out of key order)"
        )

    def outcome(self, epochs: list[int], verified: bool) -> Outcome:
        return Outcome(
            epochs=epochs,
            sent=self.sent,
            acked=self.acked,
            failed=self.failed,
            received=len(self.ledger.received),
            redelivered=self.ledger.redelivered,
            out_of_order=self.ledger.out_of_order,
            lost=self.ledger.missing(),
            keys=len(self.ledger.last),
            verified=verified,
        )

    @staticmethod
    async def _stop_clients(
        tasks: list[asyncio.Task[None]],
        consumers: list[tuple[asyncio.Task[None], asyncio.Event]],
    ) -> None:
        """Clients stop on their own (closing their sessions) within ``CLIENT_STOP_TIMEOUT``,
        all at once; cancelling is the fallback."""
        for _, event in consumers:
            event.set()
        everything = [*tasks, *(t for t, _ in consumers)]
        if not everything:
            return
        _, late = await asyncio.wait(everything, timeout=CLIENT_STOP_TIMEOUT)
        for task in late:
            task.cancel()
        await asyncio.gather(*everything, return_exceptions=True)


async def _text(text: str) -> str:
    return text


async def _created_or_exists(create: Awaitable[Any]) -> None:
    """Create an object an earlier run may have made (409 Conflict is fine)."""
    try:
        await create
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise


def _pod_ready(pod: Any) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    deleting = pod.metadata.deletion_timestamp is not None
    return not deleting and any(c.type == "Ready" and c.status == "True" for c in conditions)


def _check(args: argparse.Namespace) -> str | None:
    if args.existing_cluster:
        return None
    for flag in ("kubeconfig", "context", "overlay", "operator_image", "broker_image"):
        if getattr(args, flag) is not None:
            return f"--{flag.replace('_', '-')} is for --existing-cluster only"
    if args.cleanup:
        return "--cleanup is for --existing-cluster only"
    return None


def cmd_demo(args: argparse.Namespace) -> int:
    if args.existing_cluster:
        demo: Demo = args.existing_cluster_demo(args)
    else:
        data_dir = Path(args.data_dir).resolve()
        refused = refuse_start(data_dir)
        if refused is not None:
            return refused
        demo = Demo(data_dir, phase_timeout=args.phase_timeout)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(demo.run())

        def interrupt() -> None:
            if demo.stop.is_set():
                task.cancel()  # a second Ctrl-C: stop waiting for clients and pods
            demo.stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupt)
        try:
            return await task
        except asyncio.CancelledError:
            return 0 if demo.stop.is_set() else 130
        except DataDirInUse as exc:
            print(f"stopic: {exc}", file=sys.stderr)
            return EXIT_IN_USE
        except (RuntimeError, OSError) as exc:
            print(f"stopic demo: {exc}", file=sys.stderr)
            return 1

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return asyncio.run(main())


def add_parser(sub: Any, existing_cluster: Callable[[argparse.Namespace], Demo]) -> None:
    """``stopic demo``; ``existing_cluster`` makes the demo of ``--existing-cluster``
    (``demo_cluster``, which builds on this module)."""
    demo = sub.add_parser(
        "demo",
        help="run the live demo on the local cluster (what `make run` runs)",
        description="Start the local cluster (the real control plane and one node), the operator "
        "and 3 brokers, then split "
        "the example topic `orders` on load and on consumers and merge it when cold. Ctrl-C "
        f"ends it. Exits with status {EXIT_IN_USE} at once if a control plane already runs on "
        "--data-dir. With --existing-cluster, the demo runs on a cluster of your own instead "
        "(README, 'On a cluster of your own').",
    )
    demo.add_argument(
        "--data-dir",
        default=".local/run",
        metavar="DIR",
        help="the control plane's state (kept across runs; `stopic local reset --data-dir DIR` "
        "clears it). Default: .local/run",
    )
    demo.add_argument(
        "--phase-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="give up (exit status 1) when a phase - split on load, split on consumers, "
        "merge when cold - has not happened within this time. Default: 300",
    )
    cluster = demo.add_argument_group(
        "on a cluster of your own",
        "Only with --existing-cluster does the demo touch a cluster other than its own local "
        "one: it applies the CRDs, --overlay and manifests/demo there, runs the producer and "
        "consumers in the cluster as Job scalable-topics-demo/demo-load and reports its result.",
    )
    cluster.add_argument(
        "--existing-cluster",
        action="store_true",
        help="run on the cluster of --kubeconfig (default: $KUBECONFIG, else ~/.kube/config) "
        "and --context (default: its current context); --data-dir is not used",
    )
    cluster.add_argument("--kubeconfig", default=None, metavar="FILE")
    cluster.add_argument("--context", default=None, metavar="NAME")
    cluster.add_argument(
        "--overlay",
        default=None,
        metavar="DIR",
        help="the kustomization of the operator and brokers (default: manifests/base, the "
        "production install)",
    )
    cluster.add_argument(
        "--operator-image",
        default=None,
        metavar="IMAGE",
        help="instead of scalable-topics/operator:TAG (the operator, the recommender and the "
        "demo's load)",
    )
    cluster.add_argument(
        "--broker-image",
        default=None,
        metavar="IMAGE",
        help="instead of scalable-topics/segment-broker:TAG",
    )
    cluster.add_argument(
        "--cleanup",
        action="store_true",
        help="delete namespace scalable-topics-demo (topic, Job, ServiceAccount) at the end",
    )
    demo.set_defaults(func=cmd_demo, check=_check, existing_cluster_demo=existing_cluster)
