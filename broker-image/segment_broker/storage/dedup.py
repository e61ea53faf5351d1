"""Producer de-duplication: per producer name, the last sequence id stored and its recent
``(sequence id, position)`` pairs, so a retried entry is answered with its original position.

At each roll the segment writes ``dedup-<base>.json``, every producer's last entry below
``<base>``; :func:`rebuild` starts from the newest usable snapshot and replays the log after it.
"""

from __future__ import annotations

import bisect
import logging
import re
import struct
from array import array
from pathlib import Path

from scalable_topics.core.wire import ENTRY_HEADER_SIZE

from .fsutil import read_json
from .log import SegmentLog, scan_records

log = logging.getLogger(__name__)

DEDUP_NAME = re.compile(r"^dedup-(\d{20})\.json$")
_RECENT_PER_PRODUCER = 4096


class ProducerState:
    """Last sequence id of one producer plus its recent ``(sequence id, position)`` pairs, so a
    retried entry is answered with its original position. Kept in compact arrays: a segment
    may see many producers."""

    __slots__ = ("last_seq", "positions", "seqs")

    def __init__(self, last_seq: int = -1) -> None:
        self.last_seq = last_seq
        self.seqs = array("q")
        self.positions = array("q")

    def record(self, seq: int, position: int) -> None:
        self.last_seq = seq
        self.seqs.append(seq)
        self.positions.append(position)
        if len(self.seqs) > 2 * _RECENT_PER_PRODUCER:
            del self.seqs[:_RECENT_PER_PRODUCER]
            del self.positions[:_RECENT_PER_PRODUCER]

    def lookup(self, seq: int) -> int:
        i = bisect.bisect_left(self.seqs, seq)
        if i < len(self.seqs) and self.seqs[i] == seq:
            return self.positions[i]
        return -1

    def last_below(self, base: int) -> tuple[int, int] | None:
        """``(seq, position)`` of this producer's last entry below position ``base``."""
        i = bisect.bisect_left(self.positions, base) - 1
        if i >= 0:
            return self.seqs[i], self.positions[i]
        return None


def snapshot_path(directory: Path, base: int) -> Path:
    return directory / f"dedup-{base:020d}.json"


def snapshot_below(producers: dict[str, ProducerState], base: int) -> dict[str, tuple[int, int]]:
    """Every producer's ``(sequence id, position)`` of its last entry below position ``base``."""
    snapshot: dict[str, tuple[int, int]] = {}
    for name, st in producers.items():
        found = st.last_below(base)
        if found is not None:
            snapshot[name] = found
    return snapshot


def rebuild(
    directory: Path,
    segment_log: SegmentLog,
    producers: dict[str, ProducerState],
    segment_name: str,
) -> None:
    """Fill ``producers`` from the newest usable snapshot and a replay of the log after it;
    delete the snapshots below the log's first position.

    The snapshot taken when the second-to-last file was started is used (so at least one
    whole file of history is replayed and recent retries get their exact positions back).
    """
    snapshots = {int(m.group(1)): p for p in directory.iterdir() if (m := DEDUP_NAME.match(p.name))}
    files = segment_log.files
    start = max(0, len(files) - 2)
    while start > 0 and files[start].base not in snapshots:
        start -= 1
    base = files[start].base
    if base in snapshots:
        for name, (seq, pos) in read_json(snapshots[base]).items():
            st = ProducerState(int(seq))
            st.seqs.append(int(seq))
            st.positions.append(int(pos))
            producers[name] = st
    elif base != 0:
        log.warning("%s: no dedup snapshot at %d; dedup history starts there", segment_name, base)
    for lf in files[start:]:
        data = lf.path.read_bytes()[: lf.size]
        for pos, off, _length in scan_records(data):
            if pos >= lf.next_position:
                break
            e = off + 16
            name_len = struct.unpack_from("<H", data, e + 2)[0]
            seq = struct.unpack_from("<Q", data, e + 4)[0]
            name = data[e + ENTRY_HEADER_SIZE : e + ENTRY_HEADER_SIZE + name_len].decode()
            known = producers.get(name)
            if known is None:
                producers[name] = known = ProducerState()
            if seq > known.last_seq:
                known.record(seq, pos)
    for path in snapshots.values():
        if int(DEDUP_NAME.match(path.name).group(1)) < segment_log.first_position:  # type: ignore[union-attr]
            path.unlink(missing_ok=True)


def drop_snapshots_above(directory: Path, position: int) -> None:
    """Delete the snapshots of bases above ``position`` (a truncation cuts the log there)."""
    for path in directory.iterdir():
        m = DEDUP_NAME.match(path.name)
        if m is not None and int(m.group(1)) > position:
            path.unlink()
