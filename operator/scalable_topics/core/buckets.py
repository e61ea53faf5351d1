"""Entry buckets (DESIGN §3, PIP-486): how many buckets a segment has and where they lie.

A segment divides the 16-bit ``hashB`` ring (the low half of the key hash) into ``N`` equal-width
buckets; bucket ``i`` starts at ``i * 65536 // N``. ``N`` is fixed for the segment's life:

- at creation of a topic with ``S`` segments and bucket budget ``T``: ``max(1, T // S)``;
- for a split child: ``max(1, N // 2)`` (a split divides the parent's buckets between the two
  children, so the topic's total stays close to ``T``);
- for a merge child: ``N1 + N2 + ...``;
- always at most ``N_MAX``.

Changing ``N`` is a **rebucket rollover**: the segment is sealed and a successor with the same
hash range and the new ``N`` takes the new writes. :func:`rebucket` is that operation on a
:class:`SegmentLayout`; it reuses the DAG's seal → successor ordering, so per-key order holds
across the change exactly as it does across a split.

Bucket counts are not part of PIP-468's layout metadata: they are decided when a segment is
created and kept with the segment's own record. :func:`child_buckets` and :func:`layout_buckets`
compute them from the parents' counts right after an operation, while the parents are still in
the DAG.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from .hashing import RING_MAX, RING_SIZE
from .layout import SegmentInfo, SegmentLayout, SegmentState, descriptor

__all__ = [
    "DEFAULT_BUCKET_BUDGET",
    "N_MAX",
    "bucket_boundaries",
    "bucket_of",
    "bucket_range",
    "child_buckets",
    "initial_buckets",
    "initial_layout_buckets",
    "layout_buckets",
    "merge_child_buckets",
    "rebucket",
    "split_child_buckets",
]

N_MAX = 1024
DEFAULT_BUCKET_BUDGET = 4


def _check_positive_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def _check_count(n: object) -> int:
    """A bucket count usable on the ring: 1..65536 (one hash per bucket at most)."""
    count = _check_positive_int(n, "bucket count")
    if count > RING_SIZE:
        raise ValueError(f"bucket count must be at most {RING_SIZE}, got {count}")
    return count


def _check_n_max(n_max: object) -> int:
    return _check_count(n_max)


# -- geometry on the hashB ring ---------------------------------------------------------------


def bucket_boundaries(n: int) -> list[int]:
    """The first ``hashB`` of each of the ``n`` buckets: ``[i * 65536 // n for i in range(n)]``."""
    count = _check_count(n)
    return [i * RING_SIZE // count for i in range(count)]


def bucket_of(hash_b: int, n: int) -> int:
    """Index of the bucket (of ``n``) that holds ``hash_b``.

    Bucket ``i`` holds ``h`` iff ``i * 65536 // n <= h < (i + 1) * 65536 // n``, which solves to
    ``i = ((h + 1) * n - 1) // 65536``.
    """
    count = _check_count(n)
    if not isinstance(hash_b, int) or isinstance(hash_b, bool) or not 0 <= hash_b <= RING_MAX:
        raise ValueError(f"hashB {hash_b!r} is outside the 16-bit ring")
    return ((hash_b + 1) * count - 1) // RING_SIZE


def bucket_range(i: int, n: int) -> tuple[int, int]:
    """The ``hashB`` range of bucket ``i`` of ``n`` as ``(start, end)``, **both inclusive** (the
    same convention as :class:`HashRange` and PIP-486's ``entry_hash_min``/``entry_hash_max``)."""
    count = _check_count(n)
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < count:
        raise ValueError(f"bucket index {i!r} is outside 0..{count - 1}")
    return i * RING_SIZE // count, (i + 1) * RING_SIZE // count - 1


# -- bucket counts ----------------------------------------------------------------------------


def initial_buckets(
    budget: int = DEFAULT_BUCKET_BUDGET, segments: int = 1, n_max: int = N_MAX
) -> int:
    """Bucket count of a segment created alongside ``segments - 1`` others: ``max(1, T // S)``,
    capped at ``n_max``."""
    _check_positive_int(budget, "bucket budget")
    _check_positive_int(segments, "segment count")
    return min(_check_n_max(n_max), max(1, budget // segments))


def split_child_buckets(n: int) -> int:
    """Bucket count of each child of a segment with ``n`` buckets: ``max(1, n // 2)``."""
    return max(1, _check_count(n) // 2)


def merge_child_buckets(*ns: int, n_max: int = N_MAX) -> int:
    """Bucket count of the child of merged segments with ``ns`` buckets: the sum, capped."""
    if len(ns) < 2:
        raise ValueError(f"a merge has two or more parents, got bucket counts {list(ns)}")
    return min(_check_n_max(n_max), sum(_check_count(n) for n in ns))


def child_buckets(
    layout: SegmentLayout,
    child_id: int,
    parent_buckets: Mapping[int, int],
    *,
    rebucketed: int | None = None,
    n_max: int = N_MAX,
) -> int:
    """Bucket count of ``child_id`` from its parents' counts, by how the child was created.

    - two or more parents: a merge child (sum of the parents' counts, capped at ``n_max``);
    - one parent with a narrower range: a split child (half the parent's count, at least 1);
    - one parent with the same range: a rebucket successor, whose count is the new ``N`` the
      rollover chose, passed as ``rebucketed`` (it cannot be derived from the DAG).

    Raises ``ValueError`` for a segment without parents (use :func:`initial_buckets`), for a
    missing parent count, and for a single parent narrower than the child, which only happens
    once some of a merge child's parents were pruned: by then the count must come from the
    segment's record, not be recomputed.
    """
    child = layout.get(child_id)
    parents = [layout.get(p) for p in child.parent_ids]
    if not parents:
        raise ValueError(
            f"segment {descriptor(child)} has no parents in the layout: its bucket count is "
            "set at creation (initial_buckets) or kept in its record"
        )
    counts = []
    for parent in parents:
        if parent.segment_id not in parent_buckets:
            raise ValueError(
                f"cannot compute buckets of segment {descriptor(child)}: bucket count of parent "
                f"{descriptor(parent)} is unknown"
            )
        counts.append(_check_count(parent_buckets[parent.segment_id]))
    if len(parents) >= 2:
        return merge_child_buckets(*counts, n_max=n_max)
    (parent,) = parents
    if parent.hash_range == child.hash_range:
        if rebucketed is None:
            raise ValueError(
                f"segment {descriptor(child)} is a rebucket successor of {descriptor(parent)}: "
                "its bucket count is the rollover's new N, pass it as rebucketed="
            )
        return min(_check_n_max(n_max), _check_count(rebucketed))
    if parent.hash_range.start <= child.hash_range.start and child.hash_range.end <= (
        parent.hash_range.end
    ):
        return split_child_buckets(counts[0])
    raise ValueError(
        f"segment {descriptor(child)} has a single parent {descriptor(parent)} with a narrower "
        "range (its other merge parents were pruned): its bucket count must come from its record"
    )


def initial_layout_buckets(
    layout: SegmentLayout, budget: int = DEFAULT_BUCKET_BUDGET, n_max: int = N_MAX
) -> dict[int, int]:
    """Bucket counts of a freshly created topic: every active segment gets ``max(1, T // S)``."""
    active = layout.active()
    per_segment = initial_buckets(budget, len(active), n_max)
    return {s.segment_id: per_segment for s in active}


def layout_buckets(
    layout: SegmentLayout,
    known: Mapping[int, int],
    *,
    rebucketed: Mapping[int, int] | None = None,
    n_max: int = N_MAX,
) -> dict[int, int]:
    """Bucket counts of every segment of ``layout``: ``known`` ones as given, the others derived
    from their parents with :func:`child_buckets`, parents first.

    ``rebucketed`` maps each rebucket successor to the ``N`` its rollover chose. Counts of
    segments no longer in the layout are dropped from the result. Raises ``ValueError`` when a
    segment's count cannot be derived (a root not in ``known``, a successor not in
    ``rebucketed``).
    """
    rebucketed = rebucketed or {}
    counts = {i: _check_count(n) for i, n in known.items() if i in layout.segments}
    for segment_id in sorted(
        layout.segments, key=lambda i: (layout.segments[i].created_at_epoch, i)
    ):
        if segment_id not in counts:
            counts[segment_id] = child_buckets(
                layout, segment_id, counts, rebucketed=rebucketed.get(segment_id), n_max=n_max
            )
    return counts


# -- the rollover on the DAG ------------------------------------------------------------------


def rebucket(layout: SegmentLayout, segment_ids: Iterable[int]) -> SegmentLayout:
    """Rebucket rollover: seal each named active segment and give it a same-range successor.

    Successor ids are ``next_segment_id``, ``+1``, ... in argument order; each successor has the
    sealed segment as its only parent (so a rollover adds nothing to ``merge_depth``). The whole
    operation is one layout change: ``epoch + 1`` once, which is both the predecessors'
    ``sealedAtEpoch`` and the successors' ``createdAtEpoch``. The new bucket count itself is not
    part of the layout (see :func:`child_buckets`).
    """
    ids = list(segment_ids)
    if not ids:
        raise ValueError("cannot rebucket: no segment named")
    if len(set(ids)) != len(ids):
        raise ValueError(f"cannot rebucket {ids}: a segment is named twice")
    for segment_id in ids:
        if segment_id not in layout.segments:
            raise ValueError(f"cannot rebucket segment {segment_id}: not found")
        segment = layout.segments[segment_id]
        if not segment.active:
            raise ValueError(
                f"cannot rebucket segment {descriptor(segment)}: it is {segment.state.value}, "
                "not ACTIVE"
            )
    epoch = layout.epoch + 1
    segments = dict(layout.segments)
    for offset, segment_id in enumerate(ids):
        old = layout.segments[segment_id]
        successor_id = layout.next_segment_id + offset
        segments[segment_id] = replace(
            old, state=SegmentState.SEALED, child_ids=(successor_id,), sealed_at_epoch=epoch
        )
        segments[successor_id] = SegmentInfo(
            successor_id, old.hash_range, parent_ids=(segment_id,), created_at_epoch=epoch
        )
    return SegmentLayout(epoch, layout.next_segment_id + len(ids), segments, layout.properties)
