"""``stopic demo`` (``make run``): the whole system on the embedded control plane, under load.

1. start the embedded control plane (API server + local kubelet) in ``--data-dir``;
2. ``kubectl apply`` the CRDs and ``manifests/overlays/local`` (operator replicas, 3 brokers,
   recommender CronJob) and wait for them;
3. ``kubectl apply`` ``manifests/examples/orders.yaml`` and wait for ``Ready``;
4. drive it: a producer ramps up until the topic splits on load, stream consumers join until a
   consumer-count split, then the load stops until neighbours merge;
5. print the DAG each time it changes, and how to look at it with kubectl.

Ctrl-C ends it cleanly at any point: clients close, every process the cluster started is
stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s

from ..core.resources import GROUP, TOPIC_PLURAL, VERSION
from ..kubeapi import api_client
from .topics import dag_text

NAMESPACE = "default"
TOPIC = "orders"
OPERATOR_SELECTOR = "app.kubernetes.io/name=scalable-topics-operator"
OPERATOR_NAMESPACE = "scalable-topics"
CLIENT_STOP_TIMEOUT = 20.0


def repo_root() -> Path:
    """The checkout the demo runs from (manifests and CRDs are read from it)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "manifests").is_dir() and (parent / "crds").is_dir():
            return parent
    raise SystemExit("stopic demo: run it from a checkout (manifests/ and crds/ not found)")


class Demo:
    def __init__(self, data_dir: Path, *, phase_timeout: float) -> None:
        self.data_dir = data_dir
        self.phase_timeout = phase_timeout
        self.root = repo_root()
        self.stop = asyncio.Event()
        self.kubeconfig = data_dir / "kubeconfig"
        self.sent = 0
        self.acked = 0
        self.consumed = 0
        self.rate = 0.0

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    async def kubectl(self, *args: str, check: bool = True) -> str:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise SystemExit("stopic demo: kubectl is not on PATH")
        proc = await asyncio.create_subprocess_exec(
            kubectl,
            "--kubeconfig",
            str(self.kubeconfig),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        text = out.decode(errors="replace")
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{text}")
        return text

    async def until(
        self, what: str, predicate: Callable[[], Awaitable[bool]], within: float
    ) -> None:
        deadline = time.monotonic() + within
        while not self.stop.is_set():
            if await predicate():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {within:.0f}s waiting for {what}")
            await self.pause(0.5)
        raise asyncio.CancelledError

    async def pause(self, seconds: float) -> None:
        """Sleep, cut short by Ctrl-C."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    # -- set-up --------------------------------------------------------------------------------

    async def operator_url(self, api: k8s.ApiClient) -> str:
        pods = await k8s.CoreV1Api(api).list_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector=OPERATOR_SELECTOR
        )
        for pod in pods.items:
            ready = any(
                c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
            )
            ports = [
                p.container_port
                for c in pod.spec.containers
                for p in c.ports or []
                if p.name == "http"
            ]
            if ready and pod.status.pod_ip and ports:
                return f"http://{pod.status.pod_ip}:{ports[0]}"
        return ""

    async def topic(self, api: k8s.ApiClient) -> dict[str, Any]:
        result: dict[str, Any] = await k8s.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, TOPIC_PLURAL, TOPIC
        )
        return result

    async def epoch(self, api: k8s.ApiClient) -> int:
        return int(((await self.topic(api)).get("status") or {}).get("epoch") or 0)

    # -- the show ------------------------------------------------------------------------------

    async def watch_dag(self, api: k8s.ApiClient) -> None:
        last_epoch = -1
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                epoch = await self.epoch(api)
                if epoch != last_epoch:
                    last_epoch = epoch
                    self.say(
                        f"DAG changed (epoch {epoch}); sent {self.sent}, acked "
                        f"{self.acked}, consumed {self.consumed}"
                    )
                    print(await dag_text(api, NAMESPACE, TOPIC), flush=True)
            await self.pause(1.0)

    async def produce(self, service_url: str) -> None:
        from ..client import ScalableTopicProducer

        async with ScalableTopicProducer(
            service_url, NAMESPACE, TOPIC, name="demo-producer"
        ) as producer:
            keys = [f"customer-{i}" for i in range(200)]
            key_cycle = itertools.cycle(keys)
            tick = 0.02
            while not self.stop.is_set():
                started = time.monotonic()
                for _ in range(int(self.rate * tick)):
                    key = next(key_cycle)
                    future = await producer.send_async(
                        f"order {self.sent} for {key}".encode(), key=key
                    )
                    self.sent += 1
                    future.add_done_callback(self._acked)
                await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))

    def _acked(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.acked += 1

    async def consume(self, service_url: str, name: str, stop: asyncio.Event) -> None:
        from ..client import StreamConsumer

        consumer = StreamConsumer(service_url, NAMESPACE, TOPIC, "billing", name)
        await consumer.start()
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
                consumer.ack_nowait(message)
        finally:
            stopping.cancel()
            await consumer.close(unregister=True)

    async def run(self) -> int:
        from ..localcluster.cluster import LocalCluster

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.say(f"starting the embedded control plane in {self.data_dir}")
        async with LocalCluster(self.data_dir, kubelet=True) as cluster:
            self.kubeconfig = Path(cluster.kubeconfig)
            api = await api_client(str(self.kubeconfig))
            try:
                return await self._show(api)
            finally:
                await api.close()
                self.say("stopping clients and the embedded control plane")

    async def _show(self, api: k8s.ApiClient) -> int:
        await self.kubectl("apply", "-f", str(self.root / "crds"))
        await self.kubectl("apply", "-k", str(self.root / "manifests/overlays/local"))
        self.say("waiting for the operator and 3 brokers")
        await self.kubectl(
            "rollout",
            "status",
            "-n",
            OPERATOR_NAMESPACE,
            "statefulset/segment-broker",
            "--timeout=180s",
        )
        await self.until("a ready operator", lambda: _truthy(self.operator_url(api)), 180)
        service_url = await self.operator_url(api)
        await self.kubectl(
            "apply", "-n", NAMESPACE, "-f", str(self.root / "manifests/examples/orders.yaml")
        )
        await self.kubectl(
            "wait", "-n", NAMESPACE, "--for=condition=Ready", f"stopic/{TOPIC}", "--timeout=120s"
        )
        self.say("topic orders is Ready. In another terminal:")
        print(
            f"    export KUBECONFIG={self.kubeconfig}\n"
            f"    kubectl get stopic,seg -n {NAMESPACE}\n"
            f"    kubectl describe stopic {TOPIC}\n"
            f"    kubectl stopic dag {TOPIC} --watch",
            flush=True,
        )

        watcher = asyncio.create_task(self.watch_dag(api))
        producer = asyncio.create_task(self.produce(service_url))
        consumers: list[tuple[asyncio.Task[None], asyncio.Event]] = []
        try:
            start = await self.epoch(api)
            self.say("phase 1: ramping the producer up until the topic splits on load")
            deadline = time.monotonic() + self.phase_timeout
            while await self.epoch(api) == start:
                if self.stop.is_set():
                    return 0
                if time.monotonic() > deadline:
                    raise RuntimeError("no load-driven split within the phase timeout")
                self.rate = min(self.rate + 100.0, 1500.0)
                self.say(f"  producing {self.rate:.0f} msg/s")
                await self.pause(5)

            self.say("phase 2: adding stream consumers until a consumer-count split")
            start = await self.epoch(api)
            deadline = time.monotonic() + self.phase_timeout
            while await self.epoch(api) == start:
                if self.stop.is_set():
                    return 0
                if time.monotonic() > deadline:
                    raise RuntimeError("no consumer-count split within the phase timeout")
                event = asyncio.Event()
                name = f"billing-{len(consumers) + 1}"
                consumers.append(
                    (asyncio.create_task(self.consume(service_url, name, event)), event)
                )
                self.say(f"  stream consumer {name} joined ({len(consumers)} now)")
                await self.pause(8)

            self.say("phase 3: load off and consumers gone until cold neighbours merge")
            self.rate = 0.0
            for task, event in consumers:
                event.set()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 10)
            start = await self.epoch(api)
            await self.until(
                "a merge", lambda: _changed(self.epoch(api), start), self.phase_timeout + 300
            )
            self.say(
                "demo complete: split on load, split on consumers, merged when cold. "
                "Ctrl-C to stop."
            )
            await self.stop.wait()
            return 0
        finally:
            # Clients stop on their own (closing their sessions); cancelling is the fallback.
            self.stop.set()
            for _, event in consumers:
                event.set()
            tasks = [watcher, producer, *(t for t, _ in consumers)]
            _, late = await asyncio.wait(tasks, timeout=CLIENT_STOP_TIMEOUT)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _truthy(value: Awaitable[str]) -> bool:
    return bool(await value)


async def _changed(value: Awaitable[int], start: int) -> bool:
    return await value != start


def cmd_demo(args: argparse.Namespace) -> int:
    demo = Demo(Path(args.data_dir).resolve(), phase_timeout=args.phase_timeout)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, demo.stop.set)
        task = asyncio.create_task(demo.run())
        stopper = asyncio.create_task(demo.stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            # Ctrl-C: the demo winds its clients down itself; cancel only if that hangs.
            await asyncio.wait({task}, timeout=CLIENT_STOP_TIMEOUT + 10)
        stopper.cancel()
        if not task.done():
            task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return 0 if demo.stop.is_set() else 130
        except RuntimeError as exc:
            print(f"stopic demo: {exc}", file=sys.stderr)
            return 1

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return asyncio.run(main())


def add_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="run the live demo on the embedded control plane")
    demo.add_argument("--data-dir", default=".local/run")
    demo.add_argument("--phase-timeout", type=float, default=300.0)
    demo.set_defaults(func=cmd_demo)
