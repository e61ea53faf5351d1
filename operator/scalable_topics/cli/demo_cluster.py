"""``stopic demo --existing-cluster`` (``make run CLUSTER=existing``): the demo on a cluster of
the user's own (kind, k3d, a real one), and ``stopic demo-load``, its load inside that cluster.

Nothing here runs unless asked: ``stopic demo`` without ``--existing-cluster`` starts the local
cluster as always and never reads ``$KUBECONFIG``. With it, the demo

1. says which kubeconfig, context and API server it uses, before anything is sent there;
2. applies the CRDs and an overlay (``manifests/base``, the production install, unless
   ``--overlay`` names another), with the project's images replaced by ``--operator-image`` and
   ``--broker-image`` when given (a cluster pulls them from a registry, or ``kind load``);
   waits for the brokers and an operator replica;
3. applies ``manifests/demo`` (namespace ``scalable-topics-demo``, ServiceAccount ``demo-load``
   bound to the producer and consumer ClusterRoles) and brings the topic ``orders`` to its
   initial shape there;
4. starts Job ``demo-load`` (the operator image running ``stopic demo-load``): the producer and
   the stream consumers run in that Pod with the ServiceAccount's token, the three phases of the
   local demo (:meth:`.demo.Demo.drive`) plus a check that every acknowledged message arrived in
   key order;
5. follows the Job through the API server only - its log, the topic's DAG - and reports the
   Job's result (its last log line, ``DEMO RESULT {...}``). Nothing on this machine connects to
   a Pod: Pod addresses are not reachable from outside a real cluster.

It ends with the commands that remove what it made, or removes the demo's namespace itself with
``--cleanup``; the operator and the brokers stay (they may have been there before).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from ..credentials import client_session
from ..kubeapi import api_client
from .demo import OPERATOR_NAMESPACE, POLL, SETUP_TIMEOUT, TOPIC, Demo, Outcome, repo_root
from .discovery import find_operator
from .errors import UnreachableError
from .kube import API_TIMEOUT

DEMO_NAMESPACE = "scalable-topics-demo"
LOAD_JOB = "demo-load"
RESULT_PREFIX = "DEMO RESULT "
DEFAULT_OVERLAY = "manifests/base"
OPERATOR_IMAGE = "scalable-topics/operator"
BROKER_IMAGE = "scalable-topics/segment-broker"
JOB_SLACK = 120
"""Seconds the Job gets beyond its phases' timeouts (start-up, finding the operator)."""
STARTED = ("Running", "Succeeded", "Failed")
"""Pod phases with a log to read."""
JOB_PHASES = 5
"""Waits of the load bounded by --phase-timeout: three phases and the two of the drain."""


def image_repository(image: str) -> str:
    """``registry/name`` of an image reference, without its tag or digest."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _containers(obj: Any) -> Iterator[dict[str, Any]]:
    """Every container and init container of every Pod template in ``obj``."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _containers(item)


def set_images(documents: list[dict[str, Any]], images: dict[str, str]) -> int:
    """Replace each container image whose repository is a key of ``images`` (the manifests'
    ``scalable-topics/operator``, ``scalable-topics/segment-broker``) by its value, as
    ``kustomize edit set image`` would, and also in those containers' arguments that end with
    ``=<the old image>`` (the recommender's ``spark.kubernetes.container.image``, the image of
    the executor Pods Spark creates); returns how many containers changed."""
    replaced = 0
    for container in _containers(documents):
        old = str(container.get("image", ""))
        wanted = images.get(image_repository(old))
        if not wanted:
            continue
        container["image"] = wanted
        replaced += 1
        for key in ("command", "args"):
            if key in container:
                container[key] = [
                    f"{arg[: -len(old)]}{wanted}" if str(arg).endswith(f"={old}") else arg
                    for arg in container[key]
                ]
    return replaced


def load_result(log: str) -> Outcome | None:
    """The load's outcome from its log (its last ``DEMO RESULT`` line), None when it has none."""
    for line in reversed(log.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return Outcome.from_json(line[len(RESULT_PREFIX) :])
    return None


class ClusterDemo(Demo):
    """The host side: applies, starts the Job and reports; never a client of a Pod."""

    def __init__(
        self,
        kubeconfig: Path,
        *,
        context: str | None,
        overlay: Path,
        images: dict[str, str],
        phase_timeout: float,
        cleanup: bool,
        progress_every: float | None = None,
    ) -> None:
        extra = {} if progress_every is None else {"progress_every": progress_every}
        super().__init__(
            kubeconfig.parent,
            phase_timeout=phase_timeout,
            kubeconfig=kubeconfig,
            namespace=DEMO_NAMESPACE,
            **extra,
        )
        self.context = context
        self.overlay = overlay
        self.images = images
        self.cleanup = cleanup
        self.job_started = False
        self.job_done = False

    def counters(self) -> str:
        return ""  # the counts are the Job's, in its log

    async def apply_stack(self) -> None:
        rendered = await self.kubectl("kustomize", str(self.overlay))
        documents = [d for d in yaml.safe_load_all(rendered) if d]
        if self.images:
            replaced = set_images(documents, self.images)
            self.say(f"  images set in {replaced} containers: {self._images_text()}")
        await self._apply(documents)

    async def _apply(self, documents: list[dict[str, Any]]) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="stopic-demo-") as file:
            yaml.safe_dump_all(documents, file, sort_keys=False)
            file.flush()
            await self.kubectl("apply", "-f", file.name)

    def _images_text(self) -> str:
        return ", ".join(f"{k} -> {v}" for k, v in sorted(self.images.items()))

    async def where(self) -> tuple[str, str]:
        """The context and the API server URL kubectl will use."""
        context = self.context or (await self.kubectl("config", "current-context")).strip()
        server = await self.kubectl(
            "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
        )
        return context, server.strip()

    async def api(self) -> k8s.ApiClient:
        config = k8s.Configuration()
        await k8s_config.load_kube_config(
            config_file=str(self.kubeconfig), context=self.context, client_configuration=config
        )
        return k8s.ApiClient(config)

    async def run(self) -> int:
        context, server = await self.where()
        self.say(f"using context {context!r} of {self.kubeconfig} (API server {server})")
        api = await self.api()
        try:
            return await self._on_cluster(api)
        finally:
            if self.stop.is_set() and self.job_started and not self.job_done:
                # Ctrl-C: the load stops with the demo.
                await self.kubectl(
                    *("-n", DEMO_NAMESPACE, "delete", "job", LOAD_JOB),
                    *("--ignore-not-found", "--wait=false", "--cascade=background"),
                    check=False,
                )
                self.say(f"deleted Job {DEMO_NAMESPACE}/{LOAD_JOB}")
            await api.close()
            self.clean_up_text()

    async def _on_cluster(self, api: k8s.ApiClient) -> int:
        images = f" with images {self._images_text()}" if self.images else ""
        self.say(f"applying the CRDs and {self.overlay}{images}")
        await self.start_stack(api)
        documents = await self._demo_documents()
        job = next(d for d in documents if d.get("kind") == "Job")
        await self._apply([d for d in documents if d is not job])
        await self.fresh_topic(api)
        await self.start_job(api, job)
        watcher = asyncio.create_task(self.watch_dag(api))
        try:
            outcome, log = await self.follow_job(api)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        if outcome is None:
            tail = "\n".join(log.splitlines()[-20:])
            raise RuntimeError(f"Job {DEMO_NAMESPACE}/{LOAD_JOB} failed without a result:\n{tail}")
        self.say("demo load finished:")
        print("\n".join(f"    {line}" for line in outcome.report()), flush=True)
        if self.cleanup:
            self.say(f"--cleanup: deleting namespace {DEMO_NAMESPACE}")
            await self.kubectl("delete", "namespace", DEMO_NAMESPACE, "--timeout=120s")
        return 0 if outcome.ok() else 1

    async def _demo_documents(self) -> list[dict[str, Any]]:
        rendered = await self.kubectl("kustomize", str(self.root / "manifests/demo"))
        documents = [d for d in yaml.safe_load_all(rendered) if d]
        if OPERATOR_IMAGE in self.images:
            set_images(documents, {OPERATOR_IMAGE: self.images[OPERATOR_IMAGE]})
        return documents

    async def start_job(self, api: k8s.ApiClient, job: dict[str, Any]) -> None:
        """Job ``demo-load`` afresh (a Job's Pod template cannot change: an earlier run's is
        deleted first), its timeouts from ``--phase-timeout``."""
        batch = k8s.BatchV1Api(api)
        job["spec"]["activeDeadlineSeconds"] = int(JOB_PHASES * self.phase_timeout + JOB_SLACK)
        [container] = job["spec"]["template"]["spec"]["containers"]
        container["args"] = [f"--phase-timeout={self.phase_timeout:g}"]
        await self.kubectl(
            *("-n", DEMO_NAMESPACE, "delete", "job", LOAD_JOB),
            *("--ignore-not-found", "--cascade=foreground", "--timeout=120s"),
        )

        async def no_pods() -> bool:
            pods = await k8s.CoreV1Api(api).list_namespaced_pod(
                DEMO_NAMESPACE, label_selector=f"job-name={LOAD_JOB}"
            )
            return not pods.items

        await self.wait_for("the earlier run's load Pod to go", no_pods, SETUP_TIMEOUT)
        await self._apply([job])
        self.job_started = True
        await batch.read_namespaced_job(LOAD_JOB, DEMO_NAMESPACE)
        self.say(
            f"started Job {DEMO_NAMESPACE}/{LOAD_JOB}: the producer and consumers run in the "
            "cluster as ServiceAccount demo-load; its log follows. In another terminal:"
        )
        config = f"--kubeconfig {self.kubeconfig}" + (
            f" --context {self.context}" if self.context else ""
        )
        commands = [
            f"kubectl {config} -n {DEMO_NAMESPACE} get stopic,seg",
            f"kubectl {config} -n {DEMO_NAMESPACE} describe stopic {TOPIC}",
        ]
        print("\n".join(f"    {c}" for c in commands), flush=True)

    async def follow_job(self, api: k8s.ApiClient) -> tuple[Outcome | None, str]:
        """Print the load Pod's new log lines until the Job has finished; its outcome and
        whole log then."""
        core, batch = k8s.CoreV1Api(api), k8s.BatchV1Api(api)
        deadline = time.monotonic() + JOB_PHASES * self.phase_timeout + 2 * JOB_SLACK
        printed = 0
        log = ""
        while True:
            job = await batch.read_namespaced_job(LOAD_JOB, DEMO_NAMESPACE)
            finished = bool(job.status.succeeded or job.status.failed)
            pods = await core.list_namespaced_pod(
                DEMO_NAMESPACE, label_selector=f"job-name={LOAD_JOB}"
            )
            started = [
                p for p in pods.items if p.status.phase in ("Running", "Succeeded", "Failed")
            ]
            if started:
                with contextlib.suppress(k8s.ApiException):
                    log = await core.read_namespaced_pod_log(
                        started[0].metadata.name, DEMO_NAMESPACE
                    )
                lines = log.splitlines()
                for line in lines[printed:]:
                    print(f"  job | {line}", flush=True)
                printed = max(printed, len(lines))
            if finished:
                self.job_done = True
                return load_result(log), log
            if time.monotonic() > deadline:
                raise RuntimeError(f"Job {DEMO_NAMESPACE}/{LOAD_JOB} did not finish in time")
            if self.stop.is_set():
                raise asyncio.CancelledError
            await self.pause(POLL * 2)

    def clean_up_text(self) -> None:
        commands = [
            f"kubectl delete namespace {DEMO_NAMESPACE}",
        ]
        if not self.cleanup:
            self.say("to remove the demo (its topic, the Job and the ServiceAccount):")
            print("\n".join(f"    {c}" for c in commands), flush=True)
        self.say("the operator and the brokers stay; to remove them too:")
        print(
            f"    kubectl delete -k {self.overlay}\n    kubectl delete -f {self.root / 'crds'}",
            flush=True,
        )


# -- the load, in the cluster ------------------------------------------------------------------


async def run_load(args: argparse.Namespace) -> int:
    """``stopic demo-load``: the demo's three phases with the Pod's own credentials; prints
    ``DEMO RESULT <json>`` last; exit status 0 when nothing was lost and key order held."""
    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or DEMO_NAMESPACE
    demo = Demo(Path(tempfile.gettempdir()), phase_timeout=args.phase_timeout, namespace=namespace)
    api = await api_client(None)
    try:
        url = args.service_url or await _operator_url(demo, namespace, args.operator_namespace)
        demo.say(f"operator {url}; topic {namespace}/{TOPIC}")
        outcome = await demo.drive(api, url, verify=True)
    finally:
        await api.close()
    for line in outcome.report():
        demo.say(line)
    print(RESULT_PREFIX + outcome.to_json(), flush=True)
    return 0 if outcome.ok() else 1


async def _operator_url(demo: Demo, namespace: str, operator_namespace: str) -> str:
    """The operator as the CLI finds it (:func:`.discovery.find_operator`), retried while a
    leader is being elected."""
    found: list[str] = []
    problem: list[str] = []

    async def reachable() -> bool:
        async with client_session() as session:
            try:
                target = await find_operator(
                    session,
                    namespace=namespace,
                    topic=TOPIC,
                    service_url=None,
                    kubeconfig=None,
                    operator_namespace=operator_namespace,
                    request_timeout=API_TIMEOUT,
                )
            except UnreachableError as exc:
                problem[:] = [str(exc)]
                return False
        found.append(target.service_url)
        return True

    async def detail() -> str:
        return problem[0] if problem else ""

    await demo.wait_for("the operator", reachable, SETUP_TIMEOUT, detail)
    return found[0]


def existing_cluster_demo(args: argparse.Namespace) -> Demo:
    """The demo of ``stopic demo --existing-cluster``, from its arguments."""
    named = args.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if os.pathsep in named:
        raise SystemExit(
            f"stopic demo: KUBECONFIG names several files ({named}); pass --kubeconfig FILE"
        )
    kubeconfig = Path(named).expanduser().resolve()
    if not kubeconfig.is_file():
        raise SystemExit(f"stopic demo: kubeconfig {kubeconfig}: no such file")
    overlay = Path(args.overlay or repo_root() / DEFAULT_OVERLAY).resolve()
    if not (overlay / "kustomization.yaml").is_file():
        raise SystemExit(f"stopic demo: --overlay {overlay}: no kustomization.yaml there")
    images = {
        repository: image
        for repository, image in (
            (OPERATOR_IMAGE, args.operator_image),
            (BROKER_IMAGE, args.broker_image),
        )
        if image
    }
    return ClusterDemo(
        kubeconfig,
        context=args.context,
        overlay=overlay,
        images=images,
        phase_timeout=args.phase_timeout,
        cleanup=args.cleanup,
    )


def cmd_demo_load(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return asyncio.run(run_load(args))
    except RuntimeError as exc:
        print(f"stopic demo-load: {exc}", file=sys.stderr, flush=True)
        return 1


def add_load_parser(sub: Any) -> None:
    load = sub.add_parser(
        "demo-load",
        help="the demo's producer and consumers, run in the cluster by `stopic demo "
        "--existing-cluster` (Job demo-load)",
        description="Run the demo's three phases against topic `orders` with this Pod's "
        "credentials: the in-cluster config for the API and $SCALABLE_TOPICS_TOKEN_FILE for the "
        "brokers and the operator. Prints `DEMO RESULT {...}` last; exits 0 when every "
        "acknowledged message was received in key order.",
    )
    load.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="the topic's namespace (default: $POD_NAMESPACE, else scalable-topics-demo)",
    )
    load.add_argument(
        "--operator-namespace",
        default=OPERATOR_NAMESPACE,
        help="where the operator's Service is (default: %(default)s)",
    )
    load.add_argument("--service-url", default=None, help="the operator's URL (default: found)")
    load.add_argument(
        "--phase-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="give up when a phase has not happened within this time (default: %(default)g)",
    )
    load.set_defaults(func=cmd_demo_load)
