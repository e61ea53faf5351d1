"""The DAG watch client against the real session server (in-process, no brokers needed)."""

from __future__ import annotations

import time

import pytest

from scalable_topics.client import DagWatcher, TopicNotFoundError
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.sessions import dag_message
from tests.memory_dags import MemoryDagSource

from .client_harness import start_operator
from .conftest import eventually

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


async def test_a_topic_deleted_while_watched_ends_the_watcher_at_once() -> None:
    replica = await start_operator()
    _publish(replica.dags, SegmentLayout.initial(1))
    watcher = DagWatcher(replica.url, "ns", "t")
    try:
        await watcher.start()
        failures: list[TopicNotFoundError] = []
        watcher.add_failure_listener(failures.append)
        replica.dags.delete("ns", "t")
        with pytest.raises(TopicNotFoundError) as gone:
            await watcher.wait_for(lambda d: False, within=2)
        assert gone.value.deleted and str(gone.value) == "topic ns/t was deleted"
        assert failures == [gone.value] and watcher.failure is gone.value
        late: list[TopicNotFoundError] = []
        watcher.add_failure_listener(late.append)
        assert late == [gone.value], "a listener added afterwards hears of it at once"
    finally:
        await watcher.close()
        await replica.stop()


async def test_a_topic_unknown_on_reconnect_is_given_up_only_after_gone_after() -> None:
    """A replica that answers "not found" on reconnect may only lag: the topic coming back
    keeps the watcher going; unknown for ``gone_after`` seconds, it is gone."""
    replica = await start_operator()
    layout = SegmentLayout.initial(1)
    _publish(replica.dags, layout)
    port = int(replica.url.rsplit(":", 1)[1])
    watcher = DagWatcher(replica.url, "ns", "t", gone_after=1.5)
    again = None
    try:
        await watcher.start()
        await replica.stop()
        again = await start_operator(port=port)  # knows no topic yet
        await eventually(lambda: watcher.topic_unknown_since is not None, within=10)
        _publish(again.dags, layout.split(0))
        await watcher.wait_for(lambda d: d.epoch == 1, within=10)
        assert watcher.failure is None and watcher.topic_unknown_since is None

        await again.stop()
        again = await start_operator(port=port)
        await eventually(lambda: watcher.topic_unknown_since is not None, within=10)
        since = watcher.topic_unknown_since
        assert since is not None
        with pytest.raises(TopicNotFoundError) as gone:
            await watcher.wait_for(lambda d: False, within=10)
        assert time.monotonic() - since >= 1.5
        assert gone.value.deleted and str(gone.value) == "topic ns/t was deleted"
    finally:
        await watcher.close()
        if again is not None:
            await again.stop()
