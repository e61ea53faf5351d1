"""``stopic drain|uncordon POD``: take a broker pod out of service without a write outage.

``drain`` annotates the pod (``scalabletopics.io/drain``): the operator stops placing segments
on it and moves every segment it holds to the other brokers (docs/operator.md, "Moving a
segment"); the command waits until no Segment is on the pod or moving from or to it (the
source deletes its copy only after the move's commit), then the pod can be stopped or the
StatefulSet scaled down (docs/operations.md). ``uncordon`` removes the annotation.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from kubernetes_asyncio import client as k8s

from ..core.resources import GROUP, SEGMENT_PLURAL
from ..core.resources import VERSION as API_VERSION
from ..core.transfer import DRAIN_ANNOTATION, pods_holding
from . import args as cli_args
from .errors import CliError
from .kube import call, kube_api
from .progress import Progress

__all__ = ["add_parsers", "segments_on"]

MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
BROKER_NAMESPACE = "scalable-topics"


def segments_on(pod: str, segments: list[dict[str, Any]]) -> list[str]:
    """``namespace/name`` of the Segments whose log ``pod`` still holds: placed on it, or the
    source or destination of a move in flight (:func:`pods_holding`)."""
    found = []
    for seg in segments:
        if pod in pods_holding(seg):
            meta = seg.get("metadata") or {}
            found.append(f"{meta.get('namespace')}/{meta.get('name')}")
    return sorted(found)


async def _annotate(api: k8s.ApiClient, namespace: str, pod: str, value: str | None) -> None:
    core = k8s.CoreV1Api(api)
    patch = {"metadata": {"annotations": {DRAIN_ANNOTATION: value}}}
    await call(
        api,
        f"annotating pod {namespace}/{pod}",
        core.patch_namespaced_pod(pod, namespace, patch, **MERGE_PATCH),
    )


async def cmd_drain(args: argparse.Namespace) -> int:
    async with kube_api(args.kubeconfig, args.request_timeout) as api:
        if args.command == "uncordon":
            await _annotate(api, args.broker_namespace, args.pod, None)
            print(f"{args.pod}: placement may choose it again")
            return 0
        await _annotate(api, args.broker_namespace, args.pod, "true")
        custom = k8s.CustomObjectsApi(api)
        deadline = time.monotonic() + args.timeout
        with Progress(f"draining {args.pod}") as progress:
            while True:
                listed = await call(
                    api,
                    "listing segments",
                    custom.list_cluster_custom_object(GROUP, API_VERSION, SEGMENT_PLURAL),
                )
                left = segments_on(args.pod, listed.get("items", []))
                if not left:
                    progress.finish("drained")
                    break
                if time.monotonic() > deadline:
                    progress.finish("not yet")
                    raise CliError(
                        f"{args.pod} still holds {len(left)} segment(s) after "
                        f"{args.timeout:g}s ({', '.join(left[:5])}); the drain goes on (see "
                        f"kubectl describe pod {args.pod} -n {args.broker_namespace})"
                    )
                progress.update(f"{len(left)} segment(s) to move")
                await asyncio.sleep(0.5)
        print(f"{args.pod} is drained: no segment is on it or moving from it")
        return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    for name, text in (
        ("drain", "move every segment off a broker pod, placement stops choosing it (waits)"),
        ("uncordon", "let placement choose a drained broker pod again"),
    ):
        parser = sub.add_parser(name, parents=[common], help=text)
        parser.add_argument("pod", help="the broker pod, e.g. segment-broker-2")
        parser.add_argument(
            "--broker-namespace",
            default=BROKER_NAMESPACE,
            help="the brokers' namespace (default: %(default)s)",
        )
        if name == "drain":
            parser.add_argument(
                "--timeout",
                type=cli_args.positive_float,
                default=300.0,
                help="seconds to wait for the drain (default: %(default)g); it goes on after",
            )
        parser.set_defaults(afunc=cmd_drain)
