"""Subscription cursors: a mark-delete position plus individually acknowledged ranges above it.

``ack_floor`` is the first position that is *not* known to be acknowledged: every position below
it is acknowledged (Pulsar's mark-delete position is ``ack_floor - 1``). Individually acked
positions above the floor are kept as sorted, disjoint, half-open ranges ``[start, end)``; when
the lowest range touches the floor, the floor jumps over it.

Cursors are persisted as small JSON files, replaced atomically (temp + fsync + rename + fsync of
the directory) by the segment's cursor flusher, which batches updates (default every 100 ms).
A crash may therefore redeliver up to that much acknowledged work: delivery is at least once.

``partial`` holds the batch indexes acknowledged of entries that are not acknowledged as a whole
(protocol version 4, Pulsar's batch-index acknowledgement): a consumer that leaves in the middle
of an entry acknowledges the messages it processed, and the entry's next consumer is told to
skip them. It is persisted with the rest and dropped once the entry is acknowledged.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scalable_topics.core.subscriptions import BrokerSubscriptionType


@dataclass
class Cursor:
    name: str
    type: BrokerSubscriptionType
    ack_floor: int = 0
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    acked_above: int = 0
    """Number of positions inside the individually acked ranges."""
    partial: dict[int, frozenset[int]] = field(default_factory=dict)
    """Unacknowledged position -> batch indexes of its messages acknowledged."""
    dirty: bool = False
    version: int = 0
    on_touch: Callable[[], object] | None = field(default=None, repr=False, compare=False)
    """Called when the cursor changes (its segment then has something to persist)."""

    def is_acked(self, position: int) -> bool:
        if position < self.ack_floor:
            return True
        i = bisect.bisect_right(self.starts, position) - 1
        return i >= 0 and position < self.ends[i]

    def next_unacked(self, position: int) -> int:
        """Smallest position ``>= position`` that is not acknowledged."""
        if position < self.ack_floor:
            position = self.ack_floor
        i = bisect.bisect_right(self.starts, position) - 1
        if i >= 0 and position < self.ends[i]:
            return self.ends[i]
        return position

    def ack(self, position: int) -> bool:
        """Acknowledge one position; False when it already was."""
        if position < self.ack_floor:
            return False
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(starts, position) - 1
        if i >= 0 and position < ends[i]:
            return False
        joins_left = i >= 0 and ends[i] == position
        joins_right = i + 1 < len(starts) and starts[i + 1] == position + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1]
            del ends[i + 1]
        elif joins_left:
            ends[i] = position + 1
        elif joins_right:
            starts[i + 1] = position
            i += 1
        else:
            i += 1
            starts.insert(i, position)
            ends.insert(i, position + 1)
        self.acked_above += 1
        if self.partial:
            self.partial.pop(position, None)
        self._advance_floor()
        self._touch()
        return True

    def ack_partial(self, position: int, indexes: frozenset[int]) -> bool:
        """Acknowledge some messages of an entry; False when nothing new was acknowledged."""
        if self.is_acked(position):
            return False
        before = self.partial.get(position, frozenset())
        after = before | indexes
        if after == before:
            return False
        self.partial[position] = after
        self._touch()
        return True

    def ack_cumulative(self, position: int) -> bool:
        """Acknowledge every position up to and including ``position``."""
        if position < self.ack_floor:
            return False
        target = position + 1
        starts, ends = self.starts, self.ends
        k = 0
        while k < len(starts) and starts[k] < target:
            self.acked_above -= min(ends[k], target) - starts[k]
            if ends[k] > target:
                starts[k] = target
                break
            k += 1
        if k:
            del starts[:k]
            del ends[:k]
        self.ack_floor = target
        self._advance_floor()
        self._drop_acked_partials()
        self._touch()
        return True

    def truncate(self, position: int) -> bool:
        """Forget every acknowledgement at or above ``position`` (the log was cut there and
        those positions will hold new entries); True when something changed."""
        changed = False
        if self.ack_floor > position:
            self.ack_floor = position
            changed = True
        while self.ends and self.ends[-1] > position:
            if self.starts[-1] >= position:
                self.acked_above -= self.ends[-1] - self.starts[-1]
                del self.starts[-1]
                del self.ends[-1]
            else:
                self.acked_above -= self.ends[-1] - position
                self.ends[-1] = position
            changed = True
        for p in [p for p in self.partial if p >= position]:
            del self.partial[p]
            changed = True
        if changed:
            self._touch()
        return changed

    def _drop_acked_partials(self) -> None:
        if self.partial:
            for p in [p for p in self.partial if p < self.ack_floor]:
                del self.partial[p]

    def _advance_floor(self) -> None:
        if self.starts and self.starts[0] == self.ack_floor:
            self.acked_above -= self.ends[0] - self.starts[0]
            self.ack_floor = self.ends[0]
            del self.starts[0]
            del self.ends[0]

    def _touch(self) -> None:
        self.dirty = True
        self.version += 1
        if self.on_touch is not None:
            self.on_touch()

    def backlog(self, next_position: int) -> int:
        """Entries written (positions below ``next_position``) and not acknowledged."""
        if next_position <= self.ack_floor:
            return 0
        above = self.acked_above
        if self.ends and self.ends[-1] > next_position:
            above = sum(
                max(0, min(e, next_position) - s)
                for s, e in zip(self.starts, self.ends, strict=True)
            )
        return next_position - self.ack_floor - above

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type.value,
            "ackFloor": self.ack_floor,
            "ackedRanges": [[s, e] for s, e in zip(self.starts, self.ends, strict=True)],
            **(
                {"partialAcks": [[p, sorted(ix)] for p, ix in sorted(self.partial.items())]}
                if self.partial
                else {}
            ),
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Cursor:
        cur = cls(name=str(body["name"]), type=BrokerSubscriptionType(body["type"]))
        cur.ack_floor = int(body["ackFloor"])
        for s, e in body.get("ackedRanges", []):
            if int(e) > int(s) >= cur.ack_floor:
                cur.starts.append(int(s))
                cur.ends.append(int(e))
                cur.acked_above += int(e) - int(s)
        cur._advance_floor()
        for p, indexes in body.get("partialAcks", []):
            if indexes and not cur.is_acked(int(p)):
                cur.partial[int(p)] = frozenset(int(i) for i in indexes)
        return cur
