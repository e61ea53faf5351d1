"""The DAG watch client against the real session server (in-process, no brokers needed)."""

from __future__ import annotations

import pytest

from scalable_topics.client import DagWatcher, TopicNotFoundError
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.sessions import dag_message
from tests.memory_dags import MemoryDagSource

from .client_harness import start_operator

pytestmark = pytest.mark.integration


def _publish(dags: MemoryDagSource, layout: SegmentLayout, controller: str = "") -> None:
    dags.publish(
        dag_message(
            "ns",
            "t",
            layout,
            brokers={i: f"http://broker-{i}:8080" for i in layout.segments},
            buckets={i: 1 for i in layout.segments},
            controller_url=controller or None,
        )
    )


async def test_watcher_follows_changes_and_never_goes_back() -> None:
    replica = await start_operator()
    try:
        layout = SegmentLayout.initial(2)
        _publish(replica.dags, layout)
        async with DagWatcher(replica.url, "ns", "t") as watcher:
            assert watcher.epoch == 0
            seen: list[int] = []
            watcher.add_listener(lambda d: seen.append(d.epoch))
            split = layout.split(0)
            _publish(replica.dags, split)
            dag = await watcher.wait_for(lambda d: d.epoch == 1, within=5)
            assert [s.segment_id for s in dag.active()] == [2, 3, 1]
            assert dag.brokers()[3] == "http://broker-3:8080"
            _publish(replica.dags, layout)  # an older epoch (e.g. a lagging cache)
            _publish(replica.dags, split, controller="http://leader:8080")
            dag = await watcher.wait_for(lambda d: d.controller_url is not None, within=5)
            assert dag.epoch == 1
            assert seen == [1, 1], "the older epoch was not accepted"
    finally:
        await replica.stop()


async def test_unknown_topic_is_an_error() -> None:
    replica = await start_operator()
    try:
        with pytest.raises(TopicNotFoundError):
            async with DagWatcher(replica.url, "ns", "missing"):
                pass
    finally:
        await replica.stop()


async def test_watcher_reconnects_to_a_restarted_server() -> None:
    replica = await start_operator()
    layout = SegmentLayout.initial(1)
    _publish(replica.dags, layout)
    port = int(replica.url.rsplit(":", 1)[1])
    watcher = DagWatcher(replica.url, "ns", "t")
    try:
        await watcher.start()
        assert watcher.sessions_opened == 1
        await replica.stop()
        # A fresh server on the same port with a newer DAG.
        again = await start_operator(dags=replica.dags, port=port)
        _publish(again.dags, layout.split(0))
        dag = await watcher.wait_for(lambda d: d.epoch == 1, within=20)
        assert dag.epoch == 1
        assert watcher.sessions_opened >= 2
        await again.stop()
    finally:
        await watcher.close()
