"""An idle segment costs its broker nothing between its traffic: the store's loops of every
second visit only the segments with traffic in their rates window (sampling) and the ones with
rolled files (time retention), and what they report is what visiting every segment gave."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scalable_topics.core.subscriptions import BrokerSubscriptionType
from segment_broker.metrics import BrokerMetrics
from segment_broker.storage.segment import Retention, StorageSettings
from segment_broker.store import RATE_SAMPLES, HostedSegment, SegmentStore
from tests.unit.test_broker_storage import _append_durably
from tests.unit.test_broker_storage_pipeline import _until

SUBSCRIPTIONS = {"s": BrokerSubscriptionType.EXCLUSIVE}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SegmentStore]:
    s = SegmentStore(tmp_path, StorageSettings(roll_bytes=1000), BrokerMetrics())
    await s.open()
    yield s
    await s.close()


async def _host(
    store: SegmentStore, topic: str, retention: Retention | None = None
) -> HostedSegment:
    hosted, created = await store.create(
        "ns", topic, 0, 0, 0xFFFF, 1, dict(SUBSCRIPTIONS), retention or Retention()
    )
    assert created
    return hosted


async def test_a_segment_without_traffic_is_not_sampled(store: SegmentStore) -> None:
    idle = await _host(store, "idle")
    busy = await _host(store, "busy")
    await _append_durably(busy.segment, 3, b"x")
    assert store._moving == {("ns", "busy", 0)}
    assert len(idle.samples) == 1, "one sample when hosted: the zero its rates start from"
    await _until(lambda: len(busy.samples) >= 3, "three samples of the busy segment")
    assert len(idle.samples) == 1
    assert idle.rates() == dict.fromkeys(
        ("msgRateIn", "bytesRateIn", "msgRateOut", "bytesRateOut"), 0.0
    )
    assert busy.rates()["msgRateIn"] > 0


async def test_a_dispatch_makes_a_segment_sampled(store: SegmentStore) -> None:
    hosted = await _host(store, "read")
    await _append_durably(hosted.segment, 2, b"x")
    store._moving.clear()
    messages_out = hosted.segment.messages_out
    dispatch = hosted.dispatchers["s"].on_out
    assert dispatch is not None
    dispatch(2, 10)
    assert store._moving == {("ns", "read", 0)}
    assert hosted.segment.messages_out == messages_out, "the dispatcher counts, not the hook"


async def test_rates_after_a_rest_cover_ten_seconds(store: SegmentStore) -> None:
    """A segment that rested a minute and then wrote 50 messages in a second: 5 messages a
    second over the ten seconds, as if it had been sampled every second."""
    hosted = await _host(store, "rest")
    t0 = hosted.samples[0][0]
    assert not hosted.sample(t0 + 1.0), "no traffic: the window is flat"
    hosted.segment.messages_in += 50
    assert hosted.sample(t0 + 60.0)
    assert len(hosted.samples) == RATE_SAMPLES
    assert hosted.rates()["msgRateIn"] == pytest.approx(5.0)
    for second in range(1, RATE_SAMPLES - 1):
        assert hosted.sample(t0 + 60.0 + second), "the 50 are still in the window"
    assert not hosted.sample(t0 + 60.0 + RATE_SAMPLES - 1), "ten seconds later it is flat again"
    assert hosted.rates()["msgRateIn"] == 0.0


async def test_a_young_segment_that_rested_is_not_diluted_by_time_before_it_existed(
    store: SegmentStore,
) -> None:
    hosted = await _host(store, "young")
    t0 = hosted.samples[0][0]
    hosted.segment.messages_in += 30
    hosted.sample(t0 + 3.0)
    assert hosted.rates()["msgRateIn"] == pytest.approx(10.0)


async def test_time_retention_reaches_an_idle_segment(store: SegmentStore) -> None:
    """Files consumed while still young are deleted once they are old, by the pass of every
    second, with no traffic or cursor change to make the segment due."""
    rolled = await _host(store, "rolled", Retention(time_ms=1500))
    single = await _host(store, "single", Retention(time_ms=1500))
    await _append_durably(rolled.segment, 60, b"z" * 40)
    await _append_durably(single.segment, 2, b"z")
    files = len(rolled.segment.log.files)
    assert files > 3
    for lf in rolled.segment.log.files:
        os.utime(lf.path)  # as young as they can be, however long the writes took
    cursor = rolled.segment.cursors["s"]
    cursor.ack_cumulative(59)
    single.segment.cursors["s"].ack_cumulative(1)
    await _until(lambda: not cursor.dirty, "the ack's housekeeping round")
    assert len(rolled.segment.log.files) == files, "younger than the retention time"
    await _until(lambda: len(rolled.segment.log.files) == 1, "the consumed files deleted")
    await _until(lambda: rolled.segment not in store._rolled, "the segment out of the rolled ones")
    assert single.segment not in store._rolled, "one file: nothing time retention could delete"
