"""``stopic dag|split|merge``: the friendly front of the topic resources.

``split`` and ``merge`` write the ``scalabletopics.io/request`` annotation with a fresh id and
wait until the leader reports that id in ``status.lastRequest``, so the command's exit code is
the operation's outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from ..core.dagview import render_dag
from ..core.layout import SegmentLayout
from ..core.resources import ANNOTATION_REQUEST, GROUP, LABEL_TOPIC, SEGMENT_PLURAL, TOPIC_PLURAL
from ..core.resources import VERSION as API_VERSION
from ..kubeapi import KubeconfigError, api_client
from .progress import Progress

MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}


class CliError(Exception):
    """A failure worth one clear line on stderr and a non-zero exit."""


async def _api(kubeconfig: str | None) -> k8s.ApiClient:
    try:
        return await api_client(kubeconfig)
    except KubeconfigError as exc:
        raise CliError(str(exc)) from None


async def _topic(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    try:
        result: dict[str, Any] = await custom.get_namespaced_custom_object(
            GROUP, API_VERSION, namespace, TOPIC_PLURAL, name
        )
    except ApiException as exc:
        if exc.status == 404:
            raise CliError(f"scalabletopic {namespace}/{name} not found") from None
        raise CliError(f"reading scalabletopic {namespace}/{name}: {exc.reason}") from None
    return result


def _layout(topic: dict[str, Any]) -> SegmentLayout:
    raw = (topic.get("status") or {}).get("layout")
    if not raw:
        raise CliError("the topic has no layout yet (is the operator running?)")
    return SegmentLayout.from_metadata(raw)


async def dag_text(api: k8s.ApiClient, namespace: str, name: str) -> str:
    custom = k8s.CustomObjectsApi(api)
    topic = await _topic(custom, namespace, name)
    layout = _layout(topic)
    segments = await custom.list_namespaced_custom_object(
        GROUP, API_VERSION, namespace, SEGMENT_PLURAL, label_selector=f"{LABEL_TOPIC}={name}"
    )
    rates: dict[int, float] = {}
    backlog: dict[int, int] = {}
    for seg in segments.get("items", []):
        sid = int(seg["spec"]["segmentId"])
        status = seg.get("status") or {}
        if status.get("load"):
            rates[sid] = float(status["load"].get("msgRateIn", 0.0))
        if status.get("backlog"):
            backlog[sid] = sum(int(v) for v in status["backlog"].values())
    status = topic.get("status") or {}
    ready: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    header = (
        f"{namespace}/{name}: Ready={ready.get('status', 'Unknown')}"
        f" ({ready.get('reason', '-')}), controller {(status.get('controller') or {}).get('pod')}"
    )
    operation = status.get("operation")
    lines = [header, render_dag(layout, rates_in=rates, backlog=backlog)]
    if operation:
        lines.append(f"in flight: {operation['kind']} {operation['id']} ({operation['phase']})")
    return "\n".join(lines)


async def cmd_dag(args: argparse.Namespace) -> int:
    api = await _api(args.kubeconfig)
    try:
        if not args.watch:
            print(await dag_text(api, args.namespace, args.topic))
            return 0
        last = ""
        while True:
            text = await dag_text(api, args.namespace, args.topic)
            if text != last:
                print(f"--- {time.strftime('%H:%M:%S')}\n{text}", flush=True)
                last = text
            await asyncio.sleep(args.interval)
    finally:
        await api.close()


async def request(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    op: str,
    segments: list[int],
    at: int | None,
    *,
    wait: float,
) -> dict[str, Any]:
    """Annotate the request and wait up to ``wait`` seconds for its outcome in
    ``status.lastRequest``."""
    custom = k8s.CustomObjectsApi(api)
    await _topic(custom, namespace, name)
    request_id = f"cli-{uuid.uuid4().hex[:10]}"
    body: dict[str, Any] = {"id": request_id, "op": op, "segments": segments}
    if at is not None:
        body["at"] = at
    patch = {"metadata": {"annotations": {ANNOTATION_REQUEST: json.dumps(body)}}}
    await custom.patch_namespaced_custom_object(
        GROUP,
        API_VERSION,
        namespace,
        TOPIC_PLURAL,
        name,
        patch,
        **MERGE_PATCH,
    )
    deadline = time.monotonic() + wait
    with Progress(f"{op} {segments} on {namespace}/{name}") as progress:
        while time.monotonic() < deadline:
            topic = await _topic(custom, namespace, name)
            status = topic.get("status") or {}
            last = status.get("lastRequest") or {}
            if last.get("id") == request_id:
                return dict(last)
            operation = status.get("operation")
            progress.update(
                f"phase {operation['phase']}" if operation else "waiting for the leader"
            )
            await asyncio.sleep(0.25)
    raise CliError(
        f"no outcome for request {request_id} within {wait:.0f}s "
        "(is the operator running? see `kubectl describe stopic`)"
    )


async def cmd_split_or_merge(args: argparse.Namespace) -> int:
    api = await _api(args.kubeconfig)
    try:
        if args.command == "split":
            segments = [args.segment]
            at = int(args.at, 16) if args.at is not None else None
        else:
            segments = list(args.segments)
            at = None
        outcome = await request(
            api, args.namespace, args.topic, args.command, segments, at, wait=args.timeout
        )
        print(f"{outcome.get('result')}: {outcome.get('message')}")
        if outcome.get("result") == "Succeeded":
            print(await dag_text(api, args.namespace, args.topic))
            return 0
        return 1
    finally:
        await api.close()


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    dag = sub.add_parser("dag", parents=[common], help="draw a topic's segment DAG")
    dag.add_argument("topic")
    dag.add_argument("--watch", "-w", action="store_true", help="redraw on every change")
    dag.add_argument("--interval", type=float, default=1.0)
    dag.set_defaults(afunc=cmd_dag)

    split = sub.add_parser("split", parents=[common], help="split a segment (waits for the result)")
    split.add_argument("topic")
    split.add_argument("segment", type=int)
    split.add_argument("--at", help="split point as 4 hex digits (default: the midpoint)")
    split.add_argument("--timeout", type=float, default=60.0)
    split.set_defaults(afunc=cmd_split_or_merge)

    merge = sub.add_parser("merge", parents=[common], help="merge adjacent segments")
    merge.add_argument("topic")
    merge.add_argument("segments", type=int, nargs="+")
    merge.add_argument("--timeout", type=float, default=60.0)
    merge.set_defaults(afunc=cmd_split_or_merge)


def run_async(args: argparse.Namespace) -> int:
    try:
        return int(asyncio.run(args.afunc(args)))
    except CliError as exc:
        print(f"stopic: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
