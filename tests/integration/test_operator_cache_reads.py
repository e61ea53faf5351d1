"""A reconcile pass that starts from the watch cache's copy, against the real API server: a copy
one write behind costs a 409 and the same pass again from a fresh read, and loses nobody's
write; a steady topic's pass reads nothing at the API server (docs/operator.md, "Reading from
the cache").

The reconciler runs in this process, with the operator's real collaborators, two in-process
brokers and a cache fed by the test instead of a watch: a copy one write behind is the
interleaving under test (a write whose watch event has not come yet), which a watch cannot be
made to produce on purpose. The API server and its admission are the real ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from scalable_topics.controller.brokers import BrokerAdmin
from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.kube import KubeApi
from scalable_topics.controller.protocol import OperationExecutor
from scalable_topics.controller.reconciler import FINALIZER, TopicReconciler, kube_events
from scalable_topics.core.jsontypes import JsonObj
from scalable_topics.core.policy import DEFAULT_POLICY
from scalable_topics.core.resources import GROUP, VERSION
from scalable_topics.localcluster.restclient import RestClient, client_from_kubeconfig
from segment_broker.testing import running_broker

from .conftest import SEGMENTS, TOPICS, ClusterNamespace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]


@dataclass
class Pass:
    """One reconciler, its cache and a client of the API server."""

    reconciler: TopicReconciler
    cache: TopicCache
    api: RestClient
    namespace: str
    leader: dict[str, str]
    """What ``controller_ref`` answers: the leading pod and its URL."""

    async def run(self, name: str) -> None:
        await self.reconciler.reconcile((self.namespace, name))


def _reads(source: str) -> float:
    return REGISTRY.get_sample_value("scalable_topic_reads_total", {"source": source}) or 0.0


def _pod(name: str, url: str, namespace: str) -> JsonObj:
    host = url.removeprefix("http://").rsplit(":", 1)[0]
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"pod-{name}"},
        "status": {"podIP": host, "conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.fixture
async def passes(local_cluster: ClusterNamespace, tmp_path: Path) -> AsyncIterator[Pass]:
    await local_cluster.apply_crds()
    ns = local_cluster.namespace
    async with (
        running_broker(tmp_path / "broker-0") as first,
        running_broker(tmp_path / "broker-1") as second,
    ):
        kube = await KubeApi.connect(str(local_cluster.kubeconfig))
        admin = BrokerAdmin()
        api = client_from_kubeconfig(local_cluster.kubeconfig)
        cache = TopicCache(controller_url=lambda namespace, name: "http://controller")
        for pod, running in {"broker-0": first, "broker-1": second}.items():
            cache.put_pod(_pod(pod, running.url, ns))
            # One port per in-process broker on one address: the URL the pod stands for.
            cache.brokers[pod] = dataclasses.replace(cache.brokers[pod], url=running.url)
        cache.segments_complete = True
        events = kube_events(kube)
        leader = {"pod": "test", "url": "http://controller"}
        executor = OperationExecutor(kube, admin, cache, events=events)
        reconciler = TopicReconciler.wired(
            kube,
            admin,
            cache,
            executor,
            events=events,
            leads=lambda namespace, name: True,
            controller_ref=lambda namespace, name: dict(leader),
            defaults=DEFAULT_POLICY,
        )
        try:
            yield Pass(reconciler, cache, api, ns, leader)
        finally:
            await admin.close()
            await api.close()
            await kube.close()


def _topic(name: str) -> JsonObj:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ScalableTopic",
        "metadata": {"name": name},
        "spec": {"initialSegments": 2, "subscriptions": [{"name": "s", "type": "Stream"}]},
    }


def _ready(topic: JsonObj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (topic.get("status") or {}).get("conditions") or []
    )


async def test_a_copy_one_write_behind_is_read_again_and_loses_no_write(passes: Pass) -> None:
    """The cache holds the topic as created; another client has labelled it since. The pass
    starts from the copy, its finalizer patch meets a 409, and the same pass runs again from a
    fresh read: Ready, with the finalizer and the label."""
    ns = passes.namespace
    created = await passes.api.create(TOPICS, ns, _topic("behind"))
    passes.cache.put_topic(created)
    labelled = await passes.api.patch(
        TOPICS, ns, "behind", {"metadata": {"labels": {"team": "billing"}}}
    )
    assert int(labelled["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )
    cached, fresh = _reads("cache"), _reads("api")

    await passes.run("behind")

    assert (_reads("cache"), _reads("api")) == (cached + 1, fresh + 1)
    topic = await passes.api.get(TOPICS, ns, "behind")
    assert _ready(topic), topic.get("status")
    assert FINALIZER in topic["metadata"]["finalizers"]
    assert topic["metadata"]["labels"] == {"team": "billing"}
    segments, _ = await passes.api.list(SEGMENTS, ns)
    assert sorted(s["spec"]["segmentId"] for s in segments) == [0, 1]
    # The cache holds what the pass wrote, not the copy it started from.
    held = passes.cache.topics[(ns, "behind")]
    assert held["metadata"]["resourceVersion"] == topic["metadata"]["resourceVersion"]


async def test_a_steady_topics_pass_reads_and_writes_nothing_at_the_api_server(
    passes: Pass,
) -> None:
    """A resync pass over a Ready topic starts from the cache and writes nothing."""
    ns = passes.namespace
    passes.cache.put_topic(await passes.api.create(TOPICS, ns, _topic("steady")))
    await passes.run("steady")
    before = await passes.api.get(TOPICS, ns, "steady")
    assert _ready(before)
    cached, fresh = _reads("cache"), _reads("api")

    await passes.run("steady")
    await passes.run("steady")

    assert (_reads("cache"), _reads("api")) == (cached + 2, fresh)
    after = await passes.api.get(TOPICS, ns, "steady")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    # A steady pass does not compute the status again, yet a change of what the status says
    # that is not in the topic (here, the leader) is still written.
    passes.leader.update(pod="successor", url="http://successor")
    await passes.run("steady")
    moved = await passes.api.get(TOPICS, ns, "steady")
    assert moved["status"]["controller"]["pod"] == "successor", moved["status"]["controller"]
    assert _ready(moved)


async def test_a_deletion_is_finalized_from_a_fresh_read(passes: Pass) -> None:
    """The watch's copy of a topic being deleted is not settled: the pass reads it at the API
    server, deletes its Segments and releases the finalizer."""
    ns = passes.namespace
    passes.cache.put_topic(await passes.api.create(TOPICS, ns, _topic("leaving")))
    await passes.run("leaving")
    await passes.api.delete(TOPICS, ns, "leaving")
    deleting = await passes.api.get(TOPICS, ns, "leaving")
    assert deleting["metadata"].get("deletionTimestamp")
    passes.cache.put_topic(deleting)
    fresh = _reads("api")

    await passes.run("leaving")

    assert _reads("api") == fresh + 1
    assert await passes.api.get_or_none(TOPICS, ns, "leaving") is None
    segments, _ = await passes.api.list(SEGMENTS, ns)
    assert segments == []
