"""A re-created topic takes its orphaned Segments over in one pass, against the real API server,
even when a Segment changes between the listing and the take-over (its broker's load report is
a status write): the owner is decided on the Segment as it is then, and the ``LayoutRebuilt``
event counts every Segment taken over (``controller.restore.adopt``)."""

from __future__ import annotations

import pytest

from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.restore import adopt, controlled_by
from scalable_topics.core.resources.names import topic_owner_reference

from .conftest import SEGMENTS, CrdClients

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]


async def test_segments_that_changed_since_the_listing_are_taken_over_in_the_same_pass(
    crd_clients: CrdClients,
) -> None:
    ns, api, kube = crd_clients.namespace, crd_clients.api, crd_clients.kube
    topic = await crd_clients.create_topic("recreated", initial_segments=2)
    uid = topic["metadata"]["uid"]
    # Orphaned by the old topic's deletion.
    listed = await crd_clients.create_first_segments(topic, owned=False)
    stale, taken_by_another = listed
    # Both change after the listing: a load report on #0; #1 is taken over by someone else.
    await api.patch_status(SEGMENTS, ns, stale["metadata"]["name"], {"state": "Active"})
    owner = topic_owner_reference("recreated", uid)
    await kube.patch_segment(
        ns,
        taken_by_another["metadata"]["name"],
        {"metadata": {"ownerReferences": [owner]}},
    )

    cache = TopicCache(controller_url=lambda namespace, name: "")
    assert await adopt(kube, cache, topic, listed) == 1

    for body in listed:
        now = await api.get(SEGMENTS, ns, body["metadata"]["name"])
        assert controlled_by(now, uid), now["metadata"]
        assert len(now["metadata"]["ownerReferences"]) == 1, now["metadata"]
    assert (cache.segments[(ns, "recreated")][0]["status"] or {}).get("state") == "Active"
