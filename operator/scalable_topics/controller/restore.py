"""The I/O around ``core.rebuild`` for a topic whose ``status.layout`` is gone (docs/operator.md,
"Lost status"): ask every broker which segments of the topic it holds, take the topic's Segment
resources over (a re-created topic has a new uid, and the garbage collector would delete
Segments owned by the old one), and write a Segment for each segment only a broker still has.

The order matters: the Segments (each naming the broker that holds the data) are written before
the rebuilt layout, so that no later pass can place one of its segments afresh, empty, on
another broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ..brokeradmin import AdminError
from ..core.jsontypes import JsonObj
from ..core.layout import SegmentLayout
from ..core.rebuild import BrokerReport, broker_report
from ..core.resources import (
    TOPIC_KIND,
    format_time,
    segment_manifest,
    segment_name,
    topic_owner_reference,
)
from ..core.transfer import ANNOTATION_BROKER, recorded_broker
from .brokers import BrokerAdmin
from .cache import TopicCache
from .kube import Conflict, KubeApi
from .status import reread_segment

log = logging.getLogger(__name__)

ADOPT_ATTEMPTS = 5
"""Patches of one Segment's owner before the take-over gives up (the pass is retried)."""


class BrokersUnanswered(Exception):
    """Not every broker that may hold the topic's data answered: the layout is neither rebuilt
    nor created afresh until they do (a segment only that broker has would be missed)."""


async def broker_reports(
    brokers: BrokerAdmin, cache: TopicCache, namespace: str, topic: str, segments: Iterable[JsonObj]
) -> list[BrokerReport]:
    """What every known broker pod holds of the topic (the seals' successors included).

    Raises :class:`BrokersUnanswered` when a broker pod did not answer, or when a Segment names
    a broker pod that is not running."""
    pods = dict(cache.brokers)
    away = sorted(
        {pod for pod in (recorded_broker(s) for s in segments) if pod and pod not in pods}
    )
    unanswered: list[str] = [f"{pod} (not running; named by a Segment)" for pod in away]
    reports: list[BrokerReport] = []

    async def one(name: str, url: str) -> None:
        admin = brokers.at(url)
        try:
            for summary in await admin.list_segments(namespace, topic):
                if summary.get("namespace") != namespace or summary.get("topic") != topic:
                    continue  # a broker older than the filter lists everything
                stats: dict[str, Any] | None = summary
                if summary.get("sealed"):
                    # The summary has no seal: its successors are the links to the children.
                    stats = await admin.find_stats(namespace, topic, int(summary["segmentId"]))
                if stats is not None:
                    reports.append(broker_report(stats, name, url))
        except AdminError as exc:
            unanswered.append(f"{name} ({exc.code}: {exc.message})")

    await asyncio.gather(*(one(name, pod.url) for name, pod in sorted(pods.items())))
    if unanswered:
        raise BrokersUnanswered(
            "status.layout is missing and is rebuilt only once every broker has said which "
            f"segments of the topic it holds; no answer from {', '.join(sorted(unanswered))}"
        )
    return reports


def controlled_by(body: JsonObj, uid: str) -> bool:
    """Whether the object's controller owner is the object of ``uid``."""
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


async def adopt(
    kube: KubeApi, cache: TopicCache, topic: JsonObj, segments: Iterable[JsonObj]
) -> int:
    """Make the topic the controller owner of its Segments where another uid is (a re-created
    topic); returns how many were taken over."""
    meta = topic["metadata"]
    namespace, uid = meta["namespace"], meta["uid"]
    owner = topic_owner_reference(meta["name"], uid)
    taken = 0
    for body in segments:
        for _ in range(ADOPT_ATTEMPTS):
            if controlled_by(body, uid):
                break
            refs = (body.get("metadata") or {}).get("ownerReferences") or []
            others = [
                r for r in refs if r.get("kind") != TOPIC_KIND or r.get("name") != meta["name"]
            ]
            name = body["metadata"]["name"]
            try:
                updated = await kube.patch_segment(
                    namespace,
                    name,
                    {
                        "metadata": {
                            "ownerReferences": [*others, owner],
                            "resourceVersion": body["metadata"]["resourceVersion"],
                        }
                    },
                )
            except Conflict:
                # Its broker's load report (a status write) came between the listing and the
                # patch: the owner is decided on the Segment as it is now, in this pass, so
                # that the LayoutRebuilt event counts every Segment taken over.
                fresh = await reread_segment(kube, cache, body)
                if fresh is None:
                    break
                body = fresh
                continue
            cache.put_segment(updated)
            taken += 1
            break
        else:
            raise Conflict(f"Segment {body['metadata']['name']} kept changing under the take-over")
    return taken


async def write_missing_segments(
    kube: KubeApi,
    cache: TopicCache,
    topic: JsonObj,
    layout: SegmentLayout,
    reports: Mapping[int, BrokerReport],
) -> None:
    """A Segment for each segment only a broker reported (``reports``), naming that broker; its
    state is the DAG's (``Pending`` for a fenced one, which the next pass activates like any
    fenced child of a committed layout), and ``layout``'s epoch as ``recordedAtEpoch``."""
    meta = topic["metadata"]
    for sid, report in sorted(reports.items()):
        info = layout.segments.get(sid)
        parents = list(info.parent_ids) if info is not None else []
        body = segment_manifest(
            topic=meta["name"],
            namespace=meta["namespace"],
            topic_uid=meta["uid"],
            segment_id=sid,
            hash_range=report.hash_range,
            parents=parents,
            buckets=report.buckets,
        )
        body["metadata"]["annotations"] = {ANNOTATION_BROKER: report.pod}
        created = await kube.create_segment(body)
        if info is not None and not info.active:
            state = "Sealed"
        elif info is not None and report.writable:
            state = "Active"
        else:
            state = "Pending"
        status: dict[str, Any] = {
            "state": state,
            "broker": {"pod": report.pod, "url": report.url},
            "recordedAtEpoch": layout.epoch,
        }
        if state == "Sealed" and report.sealed_at is not None:
            status["sealedAt"] = format_time(report.sealed_at)
        updated = await kube.patch_segment_status(
            meta["namespace"], segment_name(meta["name"], sid), status
        )
        cache.put_segment(updated or created)
        log.warning(
            "%s/%s: wrote Segment %d (%s, %s) from broker %s: its Segment resource was gone",
            meta["namespace"],
            meta["name"],
            sid,
            report.hash_range.hex(),
            state,
            report.pod,
        )


async def record_epoch(
    kube: KubeApi, cache: TopicCache, segments: Iterable[JsonObj], epoch: int
) -> None:
    """Write ``epoch`` as ``status.recordedAtEpoch`` on each of ``segments`` (where it is not
    there yet): a rebuilt layout's epoch is recorded nowhere else, and a later rebuild from these
    Segments must go above it (``core.rebuild``)."""
    for body in segments:
        if ((body.get("status") or {}).get("recordedAtEpoch") or -1) >= epoch:
            continue
        meta = body["metadata"]
        updated = await kube.patch_segment_status(
            meta["namespace"], meta["name"], {"recordedAtEpoch": epoch}
        )
        cache.put_segment(updated)
