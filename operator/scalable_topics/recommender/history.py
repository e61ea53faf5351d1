"""The load history as the recommender reads it (contract: ``docs/load-history.md``).

Brokers append one record per segment per interval under ``<root>/dt=YYYY-MM-DD/hour=HH/``
(UTC, Hive-style partitions). This module holds the explicit Spark schema, the list of partition
directories a window touches (so a job reads only those), the per-row validity rules, and two
synthetic generators: a small pure-Python one for tests and a Spark one (no Python per row) for
the benchmark.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalable_topics.core.hashing import RING_MAX

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

HIST_BINS = 16
DEFAULT_INTERVAL = 10.0
CORRUPT_COLUMN = "_corrupt_record"
RATE_FIELDS = ("msgRateIn", "bytesRateIn", "msgRateOut", "bytesRateOut")
REQUIRED_FIELDS = (
    "ts",
    "namespace",
    "topic",
    "segmentId",
    "rangeStart",
    "rangeEnd",
    *RATE_FIELDS,
    "keyHist",
)

# Why a row is rejected, in the order the checks are reported (the first that applies wins).
REJECT_REASONS = ("unparseable", "missingField", "badRange", "negativeRate", "badHistogram")


def schema(*, with_corrupt: bool = True) -> StructType:
    """The record schema (types per ``docs/load-history.md``); never inferred from the data."""
    from pyspark.sql.types import (
        ArrayType,
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    fields = [
        StructField("ts", DoubleType()),
        StructField("namespace", StringType()),
        StructField("topic", StringType()),
        StructField("segmentId", LongType()),
        StructField("descriptor", StringType()),
        StructField("rangeStart", LongType()),
        StructField("rangeEnd", LongType()),
        StructField("msgRateIn", DoubleType()),
        StructField("bytesRateIn", DoubleType()),
        StructField("msgRateOut", DoubleType()),
        StructField("bytesRateOut", DoubleType()),
        StructField("messagesIn", LongType()),
        StructField("keyHist", ArrayType(LongType())),
    ]
    if with_corrupt:
        fields.append(StructField(CORRUPT_COLUMN, StringType()))
    return StructType(fields)


def reject_reason(has_corrupt_column: bool) -> Column:
    """A column naming why a row is unusable (one of :data:`REJECT_REASONS`), null when valid."""
    from pyspark.sql import functions as F

    missing = F.lit(False)
    for name in REQUIRED_FIELDS:
        missing = missing | F.col(name).isNull()
    negative = F.lit(False)
    for name in RATE_FIELDS:
        negative = negative | (F.col(name) < 0) | F.isnan(F.col(name))
    bad_range = (
        (F.col("rangeStart") < 0)
        | (F.col("rangeEnd") > RING_MAX)
        | (F.col("rangeStart") > F.col("rangeEnd"))
        | (F.col("segmentId") < 0)
        | F.isnan(F.col("ts"))
    )
    bad_hist = (F.size("keyHist") != HIST_BINS) | F.exists(
        "keyHist", lambda v: v.isNull() | (v < 0)
    )
    reason = F.when(missing, F.lit("missingField"))
    if has_corrupt_column:
        reason = F.when(F.col(CORRUPT_COLUMN).isNotNull(), F.lit("unparseable")).when(
            missing, F.lit("missingField")
        )
    return (
        reason.when(bad_range, F.lit("badRange"))
        .when(negative, F.lit("negativeRate"))
        .when(bad_hist, F.lit("badHistogram"))
    )


# -- partitions -------------------------------------------------------------------------------


def partition_dir(ts: float) -> str:
    """``dt=YYYY-MM-DD/hour=HH`` of an instant (UTC)."""
    moment = datetime.fromtimestamp(ts, UTC)
    return f"dt={moment:%Y-%m-%d}/hour={moment:%H}"


def window_partitions(start: float, end: float) -> list[str]:
    """Every ``dt=/hour=`` directory that may hold a record with ``start < ts <= end``.

    A record's partition is the hour of its own ``ts`` (the end of its interval), so the hours
    from ``start``'s to ``end``'s, inclusive, are enough.
    """
    if end < start:
        raise ValueError(f"window end {end} is before its start {start}")
    hour = datetime.fromtimestamp(start, UTC).replace(minute=0, second=0, microsecond=0)
    last = datetime.fromtimestamp(end, UTC)
    dirs = []
    while hour <= last:
        dirs.append(f"dt={hour:%Y-%m-%d}/hour={hour:%H}")
        hour += timedelta(hours=1)
    return dirs


# -- synthetic history ------------------------------------------------------------------------


def bin_bounds(range_start: int, range_end: int) -> list[int]:
    """The 17 bin edges of a segment's histogram: bin ``i`` is ``[edges[i], edges[i+1])``."""
    size = range_end - range_start + 1
    return [range_start + i * size // HIST_BINS for i in range(HIST_BINS + 1)]


def histogram(range_start: int, range_end: int, hashes: Iterable[tuple[int, int]]) -> list[int]:
    """Bin ``(segment_hash, messages)`` pairs the way the broker does."""
    edges = bin_bounds(range_start, range_end)
    hist = [0] * HIST_BINS
    for value, messages in hashes:
        if not range_start <= value <= range_end:
            continue
        for i in range(HIST_BINS):
            if edges[i] <= value < edges[i + 1]:
                hist[i] += messages
                break
    return hist


@dataclass(frozen=True)
class SegmentTraffic:
    """One synthetic segment: its range and how its load evolves over the generated span.

    ``msg_rate_in`` is a function of the offset (seconds) from the start of the span, so tests
    can build ramps, steps and cold stretches. ``key_weights`` gives each histogram bin's share of
    the keys (uniform when omitted).
    """

    namespace: str
    topic: str
    segment_id: int
    range_start: int
    range_end: int
    msg_rate_in: Any  # Callable[[float], float]
    bytes_per_msg: float = 1024.0
    fanout: float = 1.0
    key_weights: Sequence[float] | None = None

    @property
    def descriptor(self) -> str:
        return f"{self.range_start:04x}-{self.range_end:04x}-{self.segment_id}"


def generate_records(
    segments: Sequence[SegmentTraffic],
    *,
    start: float,
    end: float,
    interval: float = DEFAULT_INTERVAL,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    """Records for every interval end ``ts`` in ``(start, end]``, for every segment."""
    rng = random.Random(seed)
    steps = math.floor((end - start) / interval + 1e-9)
    for step in range(1, steps + 1):
        ts = start + step * interval
        for seg in segments:
            rate = max(0.0, float(seg.msg_rate_in(ts - start)))
            messages = round(rate * interval)
            weights = list(seg.key_weights or [1.0] * HIST_BINS)
            total = sum(weights)
            hist = [0] * HIST_BINS
            if messages and total > 0:
                for i, w in enumerate(weights):
                    hist[i] = int(messages * w / total)
                hist[rng.randrange(HIST_BINS)] += messages - sum(hist)
            yield {
                "ts": ts,
                "namespace": seg.namespace,
                "topic": seg.topic,
                "segmentId": seg.segment_id,
                "descriptor": seg.descriptor,
                "rangeStart": seg.range_start,
                "rangeEnd": seg.range_end,
                "msgRateIn": rate,
                "bytesRateIn": rate * seg.bytes_per_msg,
                "msgRateOut": rate * seg.fanout,
                "bytesRateOut": rate * seg.bytes_per_msg * seg.fanout,
                "messagesIn": messages,
                "keyHist": hist,
            }


def write_jsonl(
    root: Path, records: Iterable[Mapping[str, Any]], *, broker: str = "broker-0"
) -> dict[str, int]:
    """Append records to ``<root>/dt=/hour=/<broker>.jsonl``; returns lines per partition."""
    handles: dict[str, Any] = {}
    counts: dict[str, int] = {}
    try:
        for record in records:
            part = partition_dir(float(record["ts"]))
            if part not in handles:
                directory = root / part
                directory.mkdir(parents=True, exist_ok=True)
                handles[part] = (directory / f"{broker}.jsonl").open("a", encoding="utf-8")
            handles[part].write(json.dumps(record, separators=(",", ":")) + "\n")
            counts[part] = counts.get(part, 0) + 1
    finally:
        for handle in handles.values():
            handle.close()
    return counts


@dataclass(frozen=True)
class SyntheticFleet:
    """A benchmark fleet: ``topics`` topics times ``segments`` equal segments each.

    Segment ``k`` of every topic is hot (about 14,000 msg/s, above the default split threshold,
    70 % of its keys in the lower quarter of its range) when ``k % hot_every == 1``, cold
    (about 40 msg/s) in adjacent pairs when ``k % cold_every`` is 2 or 3, and warm (about
    3,000 msg/s) otherwise; every rate gets +-10 % noise per sample. So each topic has real
    splits and merges to plan.
    """

    topics: int
    segments: int
    namespace: str = "bench"
    hot_every: int = 16
    cold_every: int = 8


def generate_spark(
    spark: SparkSession,
    fleet: SyntheticFleet,
    *,
    start: float,
    end: float,
    interval: float = DEFAULT_INTERVAL,
) -> DataFrame:
    """The same records as :func:`generate_records`, built column-wise by Spark from ``range``.

    Row ``id`` encodes ``(topic, segment, step)``, so no Python runs per row and the data for
    tens of millions of rows is produced at Spark's speed.
    """
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.session.timeZone", "UTC")  # partitions are UTC hours
    steps = math.floor((end - start) / interval + 1e-9)
    per_topic = fleet.segments * steps
    size = (RING_MAX + 1) // fleet.segments
    rows = spark.range(0, fleet.topics * per_topic)
    topic_idx = F.floor(F.col("id") / per_topic)
    seg = (F.floor(F.col("id") / steps) % fleet.segments).cast("long")
    step = (F.col("id") % steps) + 1
    range_start = seg * size
    range_end = F.when(seg == fleet.segments - 1, F.lit(RING_MAX)).otherwise(range_start + size - 1)
    hot = (seg % fleet.hot_every) == 1
    cold = (seg % fleet.cold_every).isin(2, 3)
    noise = F.rand(seed=7) * 0.2 + 0.9
    base = F.when(hot, F.lit(14_000.0)).when(cold, F.lit(40.0)).otherwise(F.lit(3_000.0))
    rate = base * noise
    messages = F.round(rate * interval).cast("long")
    # Hot segments put 70 % of their keys in the first four bins; others are uniform.
    hist = F.transform(
        F.sequence(F.lit(0), F.lit(HIST_BINS - 1)),
        lambda i: (
            F.when(
                hot,
                F.when(i < 4, F.floor(messages * 0.7 / 4)).otherwise(F.floor(messages * 0.3 / 12)),
            )
            .otherwise(F.floor(messages / HIST_BINS))
            .cast("long")
        ),
    )
    ts = F.lit(start) + step * F.lit(interval)
    moment = F.timestamp_seconds(ts)
    return rows.select(
        ts.alias("ts"),
        F.lit(fleet.namespace).alias("namespace"),
        F.format_string("topic-%05d", topic_idx.cast("int")).alias("topic"),
        seg.alias("segmentId"),
        F.format_string(
            "%04x-%04x-%d", range_start.cast("int"), range_end.cast("int"), seg.cast("int")
        ).alias("descriptor"),
        range_start.alias("rangeStart"),
        range_end.cast("long").alias("rangeEnd"),
        rate.alias("msgRateIn"),
        (rate * 1024.0).alias("bytesRateIn"),
        rate.alias("msgRateOut"),
        (rate * 1024.0).alias("bytesRateOut"),
        messages.alias("messagesIn"),
        hist.alias("keyHist"),
        F.date_format(moment, "yyyy-MM-dd").alias("dt"),
        F.date_format(moment, "HH").alias("hour"),
    )
