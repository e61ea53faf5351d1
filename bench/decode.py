"""The Python SDK's consumer decode, in process: what one core turns delivered entries into.

The broker serves millions of messages a second to a Go consumer (``bench/broker.py``, system
``ours-go``); a Python application gets what the SDK decodes. Each case decodes the same entry
(keyed messages of one producer batch, as the broker benchmark sends them) repeatedly, as a
consumer's read loop hands it over (a slice of a received frame), through

- ``entry_messages``: the SDK consumers' path (one ``Message`` tuple per message);
- ``ReceivedEntry.messages()``: the low-level client's general decoder (``wire.Message``).

Reported: messages per second, the best of the rounds (the machine's other load only lowers a
round).

    python -m bench.run --only decode [--quick]
    python -m bench.decode               # prints the figures
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from bench.report import Report
from scalable_topics.client.consumers.common import entry_messages
from scalable_topics.client.segment import ReceivedEntry
from scalable_topics.core import wire

CASES = ((100, 256), (1024, 64))
"""(value bytes, messages per entry)."""
ENTRIES_PER_ROUND = 200


def _entry(value_size: int, messages: int) -> ReceivedEntry:
    batch = [wire.Message(value=b"x" * value_size, key=b"key-%d" % i) for i in range(messages)]
    framed = bytes(16) + wire.encode_entry("bench", 1, batch)
    return ReceivedEntry(0, 0, memoryview(framed)[16:])


def rate(
    decode: Callable[[ReceivedEntry], Sequence[object]], item: ReceivedEntry, rounds: int
) -> float:
    """Messages per second, best of ``rounds``."""
    best = 0.0
    for _ in range(rounds):
        n = 0
        t0 = time.perf_counter()
        for _ in range(ENTRIES_PER_ROUND):
            n += len(decode(item))
        best = max(best, n / (time.perf_counter() - t0))
    return best


DECODERS: dict[str, Callable[[ReceivedEntry], Sequence[object]]] = {
    "entry_messages": lambda item: entry_messages(0, item),
    "ReceivedEntry.messages": ReceivedEntry.messages,
}


def measure(rounds: int) -> dict[tuple[str, int], float]:
    return {
        (name, size): rate(decode, _entry(size, count), rounds)
        for size, count in CASES
        for name, decode in DECODERS.items()
    }


def run(report: Report, quick: bool) -> None:
    rounds = 3 if quick else 15
    rates = measure(rounds)
    section = report.section("decode", "Python SDK consumer decode (in process, one core)")
    rows: list[list[str | float | int | None]] = []
    for (name, size), value in rates.items():
        section.figure("decode_msgs_per_s", value, "msg/s", decoder=name, payload=str(size))
        rows.append([name, size, round(value)])
    section.table("Messages decoded per second", ["decoder", "value B", "msg/s"], rows)
    section.note(
        f"Entries of {', '.join(f'{c} x {s} B' for s, c in CASES)} keyed messages, "
        f"{ENTRIES_PER_ROUND} per round, best of {rounds} rounds."
    )


def main() -> None:
    for (name, size), value in measure(15).items():
        print(f"{name:<24} {size:>5} B  {value:>12,.0f} msg/s")


if __name__ == "__main__":
    main()
