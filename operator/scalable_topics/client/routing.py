"""Pure parts of the producer: where a key goes, how messages become entries.

No I/O here, so every decision the producer makes about routing, re-routing and batching is
unit-testable.

**Routing table.** The producer routes by the segment hash of the key (DESIGN §3) over the
active segments *as the producer knows them*. Two sources feed it:

* the DAG watch (authoritative, but it arrives after the split/merge is committed, DESIGN §5
  step 6);
* ``SEALED`` frames from brokers (§5 step 4): they name the successors of a sealed segment, so
  the producer switches without waiting for the DAG push. A successor's range is clipped to the
  sealed segment's range, so a merge child learnt from one sealed parent does not capture the
  keys of a sibling parent the producer has not seen sealed yet.

**Pinning keeps a key's order.** When a DAG update retires a segment while the producer still
has messages in flight to it, the segment stays *pinned*: its keys keep going to its
connection until that connection ends with ``SEALED``; then its unacknowledged messages and the
ones queued behind them are re-routed to the successors, in order, in one step. A key's newer
message therefore never reaches a child before an older one re-routed from the parent.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from scalable_topics.core.sessions import DagMessage
from scalable_topics.core.wire import Successor, bucket_of

__all__ = [
    "Route",
    "RoutingTable",
    "plan_entries",
]


@dataclass(frozen=True, slots=True)
class Route:
    """The part ``[start, end]`` of the ring that goes to segment ``segment_id``."""

    segment_id: int
    start: int
    end: int

    def contains(self, hash_value: int) -> bool:
        return self.start <= hash_value <= self.end


class RoutingTable:
    """Active segments as the producer knows them (see the module docstring)."""

    def __init__(self) -> None:
        self._dag: DagMessage | None = None
        self._seals: dict[int, tuple[Successor, ...]] = {}
        self._urls: dict[int, str] = {}
        self._buckets: dict[int, int] = {}
        self._pinned: dict[int, Route] = {}
        self._base: list[Route] = []
        self._starts: list[int] = []

    # -- inputs ---------------------------------------------------------------------------------

    def update_dag(self, dag: DagMessage, busy: Callable[[int], bool] = lambda _: False) -> None:
        """Take a newer DAG. A retired segment for which ``busy`` is true gets pinned."""
        if self._dag is not None and dag.epoch < self._dag.epoch:
            return
        before = self._base
        self._dag = dag
        for segment in dag.segments:
            if segment.broker_url:
                self._urls[segment.segment_id] = segment.broker_url
            if segment.buckets is not None:
                self._buckets[segment.segment_id] = segment.buckets
        for segment_id in list(self._seals):
            if segment_id not in {s.segment_id for s in dag.segments}:
                del self._seals[segment_id]
        self._rebuild()
        present = {r.segment_id for r in self._base}
        for route in before:
            if (
                route.segment_id not in present
                and route.segment_id not in self._pinned
                and route.segment_id not in self._seals
                and busy(route.segment_id)
            ):
                self._pinned[route.segment_id] = route
        for segment_id in list(self._pinned):
            if segment_id in present:
                del self._pinned[segment_id]

    def seal(self, segment_id: int, successors: Sequence[Successor]) -> None:
        """Segment ``segment_id`` was sealed with these successors (from ``SEALED``)."""
        self._seals[segment_id] = tuple(successors)
        for s in successors:
            if s.broker_url:
                self._urls.setdefault(s.segment_id, s.broker_url)
        self._pinned.pop(segment_id, None)
        self._rebuild()

    def _rebuild(self) -> None:
        dag = self._dag
        if dag is None:
            return
        work = [Route(s.segment_id, s.hash_range.start, s.hash_range.end) for s in dag.active()]
        base: list[Route] = []
        guard = 0
        while work:
            route = work.pop()
            guard += 1
            successors = self._seals.get(route.segment_id)
            if not successors or guard > 100_000:
                base.append(route)
                continue
            for s in successors:
                start, end = max(route.start, s.start), min(route.end, s.end)
                if start <= end:
                    work.append(Route(s.segment_id, start, end))
        base.sort(key=lambda r: r.start)
        self._base = base
        self._starts = [r.start for r in base]

    # -- queries --------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return -1 if self._dag is None else self._dag.epoch

    def route(self, hash_value: int) -> Route:
        if self._pinned:
            for pinned in self._pinned.values():
                if pinned.contains(hash_value):
                    return pinned
        index = bisect.bisect_right(self._starts, hash_value) - 1
        if index >= 0:
            route = self._base[index]
            if route.start <= hash_value <= route.end:
                return route
        raise LookupError(f"no route for hash 0x{hash_value:04x}")

    def routes(self) -> list[Route]:
        """The current routes by range start (pinned ones excluded)."""
        return list(self._base)

    def segment_ids(self) -> list[int]:
        """Distinct segments that take new messages, by range start (round-robin targets)."""
        seen: dict[int, None] = {}
        for route in self._base:
            if route.segment_id not in self._pinned:
                seen.setdefault(route.segment_id, None)
        return list(seen)

    def pinned(self) -> list[int]:
        return sorted(self._pinned)

    def broker_url(self, segment_id: int) -> str | None:
        return self._urls.get(segment_id)

    def buckets(self, segment_id: int) -> int | None:
        return self._buckets.get(segment_id)

    def is_sealed(self, segment_id: int) -> bool:
        """The producer learnt (from ``SEALED`` or the DAG) that the segment takes no writes."""
        if segment_id in self._seals:
            return True
        if self._dag is None:
            return False
        for s in self._dag.segments:
            if s.segment_id == segment_id:
                return s.state.value == "SEALED"
        return False


# -- batching ---------------------------------------------------------------------------------

M = TypeVar("M")


def plan_entries(
    items: Iterable[M],
    *,
    bucket_hash_of: Callable[[M], int | None],
    size_of: Callable[[M], int],
    buckets: int,
    max_messages: int,
    max_bytes: int,
) -> list[list[M]]:
    """Cut ``items`` (in send order) into entries that each hold one entry bucket's keys
    (PIP-486: ``bucket(hashB min) == bucket(hashB max)``), at most ``max_messages`` messages and
    about ``max_bytes`` bytes (an entry always takes at least one message).

    Unkeyed messages go into their own entries. Items keep their relative order inside a lane,
    and a key always falls in one lane, so per-key order is kept across the entries. Entries come
    out ordered by their first item's position in ``items``.
    """
    lanes: dict[int, list[list[M]]] = {}
    sizes: dict[int, int] = {}
    order: list[tuple[int, list[M]]] = []
    for item in items:
        hb = bucket_hash_of(item)
        lane = -1 if hb is None else (bucket_of(hb, buckets) if buckets > 1 else 0)
        chunks = lanes.get(lane)
        size = size_of(item)
        if (
            chunks is None
            or len(chunks[-1]) >= max_messages
            or (sizes[lane] + size > max_bytes and chunks[-1])
        ):
            chunk: list[M] = []
            if chunks is None:
                chunks = lanes[lane] = []
            chunks.append(chunk)
            sizes[lane] = 0
            order.append((lane, chunk))
        chunks[-1].append(item)
        sizes[lane] += size
    return [chunk for _, chunk in order]
