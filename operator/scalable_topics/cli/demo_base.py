"""The demo's shared state and plumbing: its settings and counters, its output lines, kubectl,
waiting with progress (``demo_progress``), and reading the topic and the stack from the API."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s

from ..core.resources import (
    GROUP,
    LABEL_TOPIC,
    SEGMENT_PLURAL,
    TOPIC_PLURAL,
    VERSION,
    ScalableTopicSpec,
)
from . import demo_progress
from .demo_ledger import Ledger

NAMESPACE = "default"
TOPIC = "orders"
OPERATOR_SELECTOR = "app.kubernetes.io/name=scalable-topics-operator"
OPERATOR_NAMESPACE = "scalable-topics"
BROKER_SELECTOR = "app.kubernetes.io/name=segment-broker"
PROGRESS_EVERY = 5.0
"""Longest silence while waiting: a progress line at least this often (seconds)."""
POLL = 0.5
SETUP_TIMEOUT = 180.0


def repo_root() -> Path:
    """The checkout the demo runs from (manifests and CRDs are read from it)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "manifests").is_dir() and (parent / "crds").is_dir():
            return parent
    raise SystemExit("stopic demo: run it from a checkout (manifests/ and crds/ not found)")


class DemoBase:
    """What every part of the demo shares (:class:`.demo.Demo` puts the parts together)."""

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
        """The pinned kubectl (``LocalCluster.kubectl``), once the cluster runs."""
        self.context: str | None = None
        """The kubeconfig's context kubectl uses (None: its current context)."""
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


def _pod_ready(pod: Any) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    deleting = pod.metadata.deletion_timestamp is not None
    return not deleting and any(c.type == "Ready" and c.status == "True" for c in conditions)
