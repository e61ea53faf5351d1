"""Why a segment refuses an append, a seal or a read."""

from __future__ import annotations

from .log import Corruption
from .meta import SealInfo


class SegmentSealedError(Exception):
    """Appending to a sealed segment. ``seal`` is None while the seal is being made durable
    (wait for ``Segment.sealed_event``)."""

    def __init__(self, seal: SealInfo | None) -> None:
        super().__init__("segment is sealed")
        self.seal = seal


class SegmentNotWritableError(Exception):
    """Appending to a fenced segment: it was created not writable (a split or merge child whose
    parents are not sealed yet) and has not been activated."""


class SegmentReleasingError(SegmentNotWritableError):
    """Appending to a segment fenced for an ownership transfer (``fence_reason`` "releasing"):
    the entry is neither stored nor acknowledged and the producer stays connected; it re-sends
    at the new owner named in the close frame (docs/protocol.md, "Ownership transfer")."""


class SegmentGoneError(Exception):
    """The segment was deleted or the broker is shutting down."""


class SegmentCorruptedError(Exception):
    """The segment is quarantined: its log is damaged at ``corruption.position`` and it takes
    no appends, seal or retention until an operator truncates it (``Segment.truncate``)."""

    def __init__(self, name: str, corruption: Corruption) -> None:
        super().__init__(
            f"segment {name} is corrupted at position {corruption.position} "
            f"({corruption.file} offset {corruption.offset}: {corruption.reason}); it is "
            "quarantined until an operator truncates it"
        )
        self.corruption = corruption
