"""``stopic dag|split|merge``: the friendly front of the topic resources.

``split`` and ``merge`` write the ``scalabletopics.io/request`` annotation with a fresh id and
wait until the leader reports that id in ``status.lastRequest``, so the command's exit code is
the operation's outcome. The segments named are checked against the topic's DAG first: a
segment that is not in it is reported without writing a request.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from typing import Any

from kubernetes_asyncio import client as k8s
from pydantic import ValidationError

from ..core.dagview import render_dag
from ..core.layout import SegmentLayout
from ..core.resources import (
    ANNOTATION_REQUEST,
    GROUP,
    LABEL_TOPIC,
    SEGMENT_PLURAL,
    TOPIC_PLURAL,
    ManualRequest,
)
from ..core.resources import VERSION as API_VERSION
from . import args as cli_args
from .errors import CliError, NotFoundError
from .kube import call, kube_api, read_topic
from .progress import Progress

__all__ = ["CliError", "add_parsers", "autoscale_lines", "dag_text", "request"]

MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}


def _layout(topic: dict[str, Any]) -> SegmentLayout:
    raw = (topic.get("status") or {}).get("layout")
    if not raw:
        meta = topic.get("metadata") or {}
        raise CliError(
            f"scalabletopic {meta.get('namespace')}/{meta.get('name')} has no layout yet "
            "(is the operator running? see kubectl describe stopic)"
        )
    return SegmentLayout.from_metadata(raw)


async def dag_text(api: k8s.ApiClient, namespace: str, name: str) -> str:
    custom = k8s.CustomObjectsApi(api)
    topic = await read_topic(api, namespace, name)
    layout = _layout(topic)
    segments = await call(
        api,
        f"listing the segments of {namespace}/{name}",
        custom.list_namespaced_custom_object(
            GROUP, API_VERSION, namespace, SEGMENT_PLURAL, label_selector=f"{LABEL_TOPIC}={name}"
        ),
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
    lines.extend(autoscale_lines(status.get("autoScale") or {}))
    return "\n".join(lines)


def autoscale_lines(auto: dict[str, Any]) -> list[str]:
    """``status.autoScale`` for people: the effective mode and where it comes from, the knobs
    not at the operator's default (with their source), the last outcome and decision."""
    if not auto:
        return []
    sources = auto.get("sources") or {}
    policy = auto.get("policy") or {}
    mode = auto.get("mode") or "-"
    lines = [f"auto-scale: mode {mode} (from {sources.get('mode', '-')})"]
    changed = [
        f"{knob}={value} ({sources[knob]})"
        for knob, value in policy.items()
        if knob != "mode" and sources.get(knob, "default") != "default"
    ]
    if policy:
        lines.append(
            "  policy: " + (", ".join(changed) + "; " if changed else "") + "the rest default"
        )
    if auto.get("problem"):
        lines.append(f"  problem: {auto['problem']}")
    evaluation = auto.get("lastEvaluation") or {}
    if evaluation:
        reasons = ", ".join(evaluation.get("reasons") or [])
        lines.append(
            f"  last evaluation: {evaluation.get('result')}"
            + (f" [{reasons}]" if reasons else "")
            + f" since {evaluation.get('since', '-')}: {evaluation.get('message', '')}"
        )
    decision = auto.get("lastDecision") or {}
    if decision:
        done = (
            f"executed, operation {decision.get('operation')}"
            if decision.get("executed")
            else "not executed"
        )
        lines.append(
            f"  last decision: {decision.get('action')} {decision.get('segments')} "
            f"({decision.get('source')}, {done}) at {decision.get('decidedAt', '-')}: "
            f"{decision.get('reason', '')}"
        )
    return lines


async def cmd_dag(args: argparse.Namespace) -> int:
    async with kube_api(args.kubeconfig, args.request_timeout) as api:
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


def _check_segments(topic: dict[str, Any], segments: list[int]) -> None:
    layout = _layout(topic)
    missing = [s for s in segments if s not in layout.segments]
    if missing:
        meta = topic.get("metadata") or {}
        active = ", ".join(str(s.segment_id) for s in layout.active())
        raise NotFoundError(
            f"segment {', '.join(map(str, missing))} is not in the DAG of "
            f"{meta.get('namespace')}/{meta.get('name')} (active segments: {active}; see "
            "stopic dag)"
        )


async def request(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    op: str,
    segments: list[int],
    at: int | None,
    *,
    wait: float,
    to: str | None = None,
) -> dict[str, Any]:
    """Annotate the request and wait up to ``wait`` seconds for its outcome in
    ``status.lastRequest``."""
    custom = k8s.CustomObjectsApi(api)
    _check_segments(await read_topic(api, namespace, name), segments)
    request_id = f"cli-{uuid.uuid4().hex[:10]}"
    try:
        manual = ManualRequest(id=request_id, op=op, segments=segments, at=at, to=to)
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise CliError(f"invalid {op} request: {problems}") from None
    patch = {"metadata": {"annotations": {ANNOTATION_REQUEST: manual.to_annotation()}}}
    await call(
        api,
        f"annotating scalabletopic {namespace}/{name}",
        custom.patch_namespaced_custom_object(
            GROUP, API_VERSION, namespace, TOPIC_PLURAL, name, patch, **MERGE_PATCH
        ),
    )
    deadline = time.monotonic() + wait
    with Progress(f"{op} {segments} on {namespace}/{name}") as progress:
        try:
            while time.monotonic() < deadline:
                topic = await read_topic(api, namespace, name)
                status = topic.get("status") or {}
                last = status.get("lastRequest") or {}
                if last.get("id") == request_id:
                    progress.finish(str(last.get("result") or "done"))
                    return dict(last)
                operation = status.get("operation")
                progress.update(
                    f"phase {operation['phase']}" if operation else "waiting for the leader"
                )
                await asyncio.sleep(0.25)
        except asyncio.CancelledError:
            print(
                f"stopic: request {request_id} stays on the topic and may still run "
                f"(see kubectl describe stopic {name} -n {namespace})",
                file=sys.stderr,
            )
            raise
        progress.finish("no outcome yet")
    raise CliError(
        f"no outcome for request {request_id} within {wait:g}s; it stays on the topic and may "
        f"still run (is the operator running? see kubectl describe stopic {name} -n {namespace})"
    )


async def cmd_split_or_merge(args: argparse.Namespace) -> int:
    async with kube_api(args.kubeconfig, args.request_timeout) as api:
        to = None
        if args.command == "split":
            segments, at = [args.segment], args.at
        elif args.command == "move":
            segments, at, to = [args.segment], None, args.to
        else:
            segments, at = list(args.segments), None
        outcome = await request(
            api, args.namespace, args.topic, args.command, segments, at, wait=args.timeout, to=to
        )
        if outcome.get("result") != "Succeeded":
            raise CliError(
                f"{args.command} {outcome.get('result', 'failed').lower()}: "
                f"{outcome.get('message') or 'no reason given'}"
            )
        print(f"{outcome.get('result')}: {outcome.get('message')}")
        print(await dag_text(api, args.namespace, args.topic))
        return 0


def _check_merge(args: argparse.Namespace) -> str | None:
    if len(args.segments) < 2:
        return "a merge needs two or more adjacent active segments, e.g. stopic merge TOPIC 2 3"
    if len(set(args.segments)) != len(args.segments):
        return f"segments {args.segments}: each segment can be named once"
    return None


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    dag = sub.add_parser("dag", parents=[common], help="draw a topic's segment DAG")
    dag.add_argument("topic", help="the ScalableTopic's name")
    dag.add_argument("--watch", "-w", action="store_true", help="redraw on every change")
    dag.add_argument(
        "--interval",
        type=cli_args.positive_float,
        default=1.0,
        help="with --watch: seconds between reads of the topic (default: %(default)g)",
    )
    dag.set_defaults(afunc=cmd_dag)

    timeout = argparse.ArgumentParser(add_help=False)
    timeout.add_argument(
        "--timeout",
        type=cli_args.positive_float,
        default=60.0,
        help="seconds to wait for the operator's outcome (default: %(default)g); the request "
        "stays on the topic after that",
    )
    split = sub.add_parser(
        "split", parents=[common, timeout], help="split a segment (waits for the result)"
    )
    split.add_argument("topic", help="the ScalableTopic's name")
    split.add_argument(
        "segment", type=cli_args.non_negative_int, help="id of the active segment to split"
    )
    split.add_argument(
        "--at",
        type=cli_args.hash_point,
        help="the last hash of the lower child, 1 to 4 hex digits, e.g. 3fff "
        "(default: the midpoint of the range)",
    )
    split.set_defaults(afunc=cmd_split_or_merge)

    merge = sub.add_parser(
        "merge",
        parents=[common, timeout],
        help="merge adjacent segments (waits for the result)",
    )
    merge.add_argument("topic", help="the ScalableTopic's name")
    merge.add_argument(
        "segments",
        type=cli_args.non_negative_int,
        nargs="+",
        help="ids of two or more adjacent active segments",
    )
    merge.set_defaults(afunc=cmd_split_or_merge, check=_check_merge)

    move = sub.add_parser(
        "move",
        parents=[common, timeout],
        help="move a segment to another broker pod, lookup-less (waits for the result)",
    )
    move.add_argument("topic", help="the ScalableTopic's name")
    move.add_argument("segment", type=cli_args.non_negative_int, help="id of the segment to move")
    move.add_argument("--to", required=True, help="the broker pod it goes to (segment-broker-2)")
    move.set_defaults(afunc=cmd_split_or_merge)
