"""The fence of a split/merge child (DESIGN §5: no window in which a parent and its children
both accept writes): a segment created not writable refuses appends until activated, and both
states survive a restart."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scalable_topics.core import wire
from scalable_topics.core.wire import Message
from segment_broker.storage.segment import (
    FENCE_FILE,
    Retention,
    Segment,
    SegmentMeta,
    SegmentNotWritableError,
    SegmentSealedError,
    StorageSettings,
)

META = SegmentMeta("ns", "t", 3, 0, 0x7FFF, 1, 0.0, Retention())


async def _reopen(path: Path, executor: ThreadPoolExecutor) -> Segment:
    seg = Segment(path, META, StorageSettings(), executor)
    await seg.open()
    return seg


def _entry(seq: int) -> tuple[bytes, wire.EntryHeader]:
    e = wire.encode_entry("p", seq, [Message(b"v", key=b"k")])
    return e, wire.decode_entry_header(e)


async def test_fenced_segment_refuses_appends_until_activated_across_restarts(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "child"
    Segment.create_blocking(path, META, {"s": "Exclusive"}, writable=False)
    seg = await _reopen(path, executor)
    assert not seg.writable
    with pytest.raises(SegmentNotWritableError):
        seg.append(*_entry(0))
    assert seg.log.next_position == 0, "a refused entry is not staged"
    await seg.close()

    seg = await _reopen(path, executor)
    assert not seg.writable, "the fence is durable"
    await seg.activate()
    await seg.activate()
    assert seg.writable and seg.writable_event.is_set()
    assert not (path / FENCE_FILE).exists()
    assert seg.append(*_entry(0)) == (0, False)
    await seg.close()

    seg = await _reopen(path, executor)
    assert seg.writable, "activation is durable"
    assert seg.visible_position == 0
    await seg.close()


async def test_writable_create_clears_a_fence_left_by_an_interrupted_create(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "seg"
    Segment.create_blocking(path, META, {}, writable=False)
    (path / "segment.json").unlink()  # the crash came before the identity file
    Segment.create_blocking(path, META, {}, writable=True)
    seg = await _reopen(path, executor)
    assert seg.writable
    await seg.close()


async def test_a_sealed_segment_stays_sealed_when_activated(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "seg"
    Segment.create_blocking(path, META, {}, writable=False)
    seg = await _reopen(path, executor)
    await seg.terminate([])
    await seg.activate()
    with pytest.raises(SegmentSealedError):
        seg.append(*_entry(0))
    await seg.close()
