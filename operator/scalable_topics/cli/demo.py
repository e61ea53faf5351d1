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
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s

from ..credentials import TOKEN_FILE_ENV
from ..kubeapi import api_client
from ..localcluster.datadir import EXIT_IN_USE, DataDirInUse
from .demo_base import (
    NAMESPACE,
    OPERATOR_NAMESPACE,
    POLL,
    PROGRESS_EVERY,
    SETUP_TIMEOUT,
    TOPIC,
    repo_root,
)
from .demo_ledger import Ledger, Outcome
from .demo_phases import DemoPhases
from .demo_setup import DemoSetup
from .demo_traffic import CLIENT_STOP_TIMEOUT
from .local import DEFAULT_STOP_GRACE, refuse_start, shell_setup
from .topics import dag_text

__all__ = [
    "OPERATOR_NAMESPACE",
    "POLL",
    "PROGRESS_EVERY",
    "SETUP_TIMEOUT",
    "TOPIC",
    "Demo",
    "Ledger",
    "Outcome",
    "add_parser",
    "cmd_demo",
    "repo_root",
]
"""The names other modules and tests import from here; the parts live in ``demo_base``
(settings, output, waiting, reading the cluster), ``demo_setup``, ``demo_traffic``,
``demo_phases`` and ``demo_ledger``."""


class Demo(DemoSetup, DemoPhases):
    """The demo on the local cluster: set up (:class:`DemoSetup`), then the phases
    (:class:`DemoPhases`) while the DAG is printed as it changes."""

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
