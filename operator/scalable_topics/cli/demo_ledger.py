"""What the demo's clients sent and received (:class:`Ledger`) and what one run of its three
phases showed (:class:`Outcome`, also the in-cluster load's result line)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class Ledger:
    """What the demo's clients sent and received, by message number (``order <n> for <key>``):
    none lost is every acknowledged number received; key order held is no number received for
    the first time after a higher one of the same key. A message received again (a redelivery
    after its segment moved to another consumer) counts once, as ``redelivered``."""

    acked: set[int] = field(default_factory=set)
    received: set[int] = field(default_factory=set)
    last: dict[str, int] = field(default_factory=dict)
    """Per key, the highest number received."""
    redelivered: int = 0
    out_of_order: int = 0
    foreign: int = 0
    """Messages not of the demo's form (someone else producing to the topic)."""

    def received_message(self, key: str | None, value: bytes) -> None:
        words = value.split()
        if key is None or len(words) != 4 or words[0] != b"order" or not words[1].isdigit():
            self.foreign += 1
            return
        number = int(words[1])
        if number in self.received:
            self.redelivered += 1
            return
        self.received.add(number)
        if number < self.last.get(key, -1):
            self.out_of_order += 1
        else:
            self.last[key] = number

    def missing(self) -> int:
        return len(self.acked - self.received)


@dataclass
class Outcome:
    """What one run of the three phases showed (:meth:`.demo_phases.DemoPhases.drive`)."""

    epochs: list[int]
    """The topic's epoch at the start and after each phase that completed."""
    sent: int
    acked: int
    failed: int
    received: int
    redelivered: int
    out_of_order: int
    lost: int
    keys: int
    verified: bool
    """Whether the consumers read until every acknowledged message was received."""

    def ok(self) -> bool:
        return (
            self.verified
            and len(self.epochs) == 4
            and self.acked > 0
            and self.lost == 0
            and self.out_of_order == 0
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        return cls(**json.loads(text))

    def report(self) -> list[str]:
        phases = ["split on load", "split on consumers", "merged when cold"]
        steps = [
            f"{name} (epoch {a} -> {b})"
            for name, a, b in zip(phases, self.epochs, self.epochs[1:], strict=False)
        ]
        order = "held" if self.out_of_order == 0 else f"BROKEN ({self.out_of_order} messages)"
        return [
            f"messages: sent {self.sent}, acknowledged {self.acked}, failed {self.failed}, "
            f"received {self.received} ({self.redelivered} redelivered)",
            f"lost: {self.lost}" + ("" if self.verified else " (not checked)"),
            f"per-key order: {order} over {self.keys} keys",
            f"DAG: {', '.join(steps) or 'no change'}",
        ]
