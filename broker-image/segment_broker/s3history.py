"""The load history in an object store (S3 API), for clusters without a shared volume.

``SEGMENT_BROKER_LOAD_HISTORY_DIR=s3://bucket/prefix`` selects it; the credentials, endpoint and
region come from the standard AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL`` for an S3-compatible server, ``AWS_REGION``), which a Secret provides
(docs/load-history.md).

Objects cannot be appended to, so the layout is the directory one with one object per broker
and flush instead of one file per broker and hour::

    <prefix>/dt=YYYY-MM-DD/hour=HH/<broker-id>-<first ts in ms>.jsonl

Records are buffered and flushed every ``flush_every`` seconds (60 by default: 60 objects per
broker and hour instead of 360 at the 10 s sampling interval), and whenever a record falls in a
new hour. A failed upload is logged and its lines kept for the next flush, under the same key
(the first record's time), so a retry replaces the object with a superset rather than adding a
duplicate; beyond ``max_lines`` buffered lines the oldest are dropped (the history is
telemetry). :meth:`close` flushes what is left.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from .load import LoadRecord, _default_broker_id, history_partition

log = logging.getLogger(__name__)


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> ``(bucket, prefix)`` (prefix without slashes at its ends)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"expected s3://bucket[/prefix], got {url!r}")
    return parts.netloc, parts.path.strip("/")


def s3_client() -> Any:
    """A boto3 S3 client from the standard AWS variables (path-style addressing, which every
    S3-compatible server supports)."""
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    return boto3.client(
        "s3", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3})
    )


class S3HistoryWriter:
    def __init__(
        self,
        url: str,
        *,
        broker_id: str | None = None,
        client: Any = None,
        flush_every: float = 60.0,
        max_lines: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bucket, self.prefix = parse_url(url)
        self.broker_id = broker_id or _default_broker_id()
        if not self.broker_id or "/" in self.broker_id:
            raise ValueError(f"invalid broker id {self.broker_id!r}")
        self.client = client if client is not None else s3_client()
        self.flush_every = flush_every
        self.max_lines = max_lines
        self.clock = clock
        self.dropped = 0
        self.uploaded = 0
        self._lock = threading.Lock()
        # partition -> (first ts of the buffered lines, lines)
        self._buffer: dict[str, tuple[float, list[str]]] = {}
        self._last_flush = clock()

    def key_for(self, partition: str, first_ts: float) -> str:
        name = f"{partition}/{self.broker_id}-{round(first_ts * 1000)}.jsonl"
        return f"{self.prefix}/{name}" if self.prefix else name

    def write(self, records: Iterable[LoadRecord]) -> None:
        with self._lock:
            new_partition = False
            for r in records:
                partition = history_partition(r.ts)
                line = r.to_line()
                if partition not in self._buffer:
                    new_partition = new_partition or bool(self._buffer)
                    self._buffer[partition] = (r.ts, [])
                self._buffer[partition][1].append(line)
            self._trim()
            if new_partition or self.clock() - self._last_flush >= self.flush_every:
                self._flush()

    def close(self) -> None:
        with self._lock:
            self._flush()

    def pending(self) -> int:
        """Lines buffered, not yet uploaded."""
        with self._lock:
            return sum(len(lines) for _, lines in self._buffer.values())

    def _trim(self) -> None:
        excess = sum(len(lines) for _, lines in self._buffer.values()) - self.max_lines
        for partition in sorted(self._buffer):
            if excess <= 0:
                break
            _, lines = self._buffer[partition]
            cut = min(excess, len(lines))
            del lines[:cut]
            self.dropped += cut
            excess -= cut
            if not lines:
                del self._buffer[partition]

    def _flush(self) -> None:
        self._last_flush = self.clock()
        for partition in sorted(self._buffer):
            first, lines = self._buffer[partition]
            key = self.key_for(partition, first)
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body="".join(lines).encode("utf-8"),
                    ContentType="application/x-ndjson",
                )
            except Exception:
                log.exception("load history upload of s3://%s/%s failed", self.bucket, key)
                continue
            self.uploaded += 1
            del self._buffer[partition]
