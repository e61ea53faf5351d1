"""The Spark side of the recommender: read a window of load history, aggregate per segment.

Everything that touches rows is a DataFrame expression (no Python UDFs, nothing per row on the
driver). Per ``(namespace, topic, segmentId, range)`` the job computes: sample count, first/last
sample time, the mean and approximate p95 of the four rates, the sums needed for the
least-squares slope of ``msgRateIn`` over time, the time of the last sample at or above the
topic's merge thresholds, and the 16-bin key histogram summed over the window. It does so in two
aggregation levels (per minute, then per segment; see :data:`P95_RESOLUTION`). Row quality
(rows read, rows rejected per reason, rows outside the window) is collected in the same scan
with an :class:`~pyspark.sql.Observation`, so bad rows are counted without a second pass.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalable_topics.core.evaluator import METRICS
from scalable_topics.core.policy import DEFAULT_POLICY, AutoScalePolicy

from .history import (
    CORRUPT_COLUMN,
    HIST_BINS,
    RATE_FIELDS,
    REJECT_REASONS,
    reject_reason,
    schema,
    window_partitions,
)
from .rules import SegmentStats, Window

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

TopicKey = tuple[str, str]
PERCENTILE_ACCURACY = 1000
# The p95 is taken over 60 s buckets: the broker's rates are already rolling 60 s averages, so
# the six 10 s samples of a minute say little more than their mean, and the quantile sketches
# (the costly part of the aggregation) see one value per minute instead of six.
P95_RESOLUTION = 60.0
AQE_EMPTY_RELATION_RULE = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


def merge_thresholds(policy: AutoScalePolicy) -> tuple[float, float, float, float]:
    """The four merge thresholds in :data:`history.RATE_FIELDS` order."""
    return tuple(policy.merge_threshold(name) for name, _, _ in METRICS)  # type: ignore[return-value]


def build_session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    app_name: str = "scalable-topics-recommender",
) -> SparkSession:
    """A SparkSession; ``master`` defaults to ``local[*]`` unless ``spark-submit`` chose one."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        builder = builder.master("local[*]")
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def executors(spark: SparkSession) -> list[dict[str, Any]]:
    """The executors the application has had (the driver left out), with the tasks each ran:
    ``[{"id", "host", "tasks"}]`` from Spark's status store, empty with a ``local`` master
    (tasks run in the driver). Shows where a Kubernetes run's work went (the executor Pods'
    addresses)."""
    # Reachable only through the py4j gateway (the status store behind Spark's UI and REST API).
    summaries: Any = spark.sparkContext._jsc.sc().statusStore().executorList(False)
    found = []
    for i in range(summaries.size()):
        summary = summaries.apply(i)
        if summary.id() == "driver":
            continue
        host = str(summary.hostPort()).rsplit(":", 1)[0]
        found.append({"id": str(summary.id()), "host": host, "tasks": int(summary.totalTasks())})
    return sorted(found, key=lambda e: e["id"])


# -- reading ----------------------------------------------------------------------------------


def _filesystem(spark: SparkSession, root: str) -> tuple[Any, Any]:
    """Hadoop's FileSystem for ``root`` (local, HDFS, s3a, … alike) and its ``Path`` class."""
    # The Hadoop FS API is only reachable through the py4j gateway.
    jvm: Any = spark._jvm
    path_cls = jvm.org.apache.hadoop.fs.Path
    fs = path_cls(root).getFileSystem(spark._jsc.hadoopConfiguration())
    return fs, path_cls


def existing_partitions(spark: SparkSession, root: str, window: Window) -> list[str]:
    """The window's ``dt=/hour=`` directories that exist under ``root`` (full paths)."""
    fs, path_cls = _filesystem(spark, root)
    base = root.rstrip("/")
    found = []
    for part in window_partitions(window.start, window.end):
        full = f"{base}/{part}"
        if fs.exists(path_cls(full)):
            found.append(full)
    return found


def detect_format(spark: SparkSession, paths: Sequence[str]) -> str:
    """``parquet`` when the partitions hold ``*.parquet`` files and no JSON, else ``json``."""
    fs, path_cls = _filesystem(spark, paths[0])
    names: list[str] = []
    for path in paths:
        names.extend(str(status.getPath().getName()) for status in fs.listStatus(path_cls(path)))
    has_parquet = any(n.endswith(".parquet") for n in names)
    has_json = any(".json" in n for n in names)
    return "parquet" if has_parquet and not has_json else "json"


def read_history(
    spark: SparkSession, root: str, paths: Sequence[str], fmt: str
) -> tuple[DataFrame, bool]:
    """The rows of ``paths`` with the explicit schema; returns ``(frame, has_corrupt_column)``."""
    reader = spark.read.option("basePath", root)
    if fmt == "parquet":
        return (
            reader.schema(schema(with_corrupt=False))
            .option("pathGlobFilter", "*.parquet")
            .parquet(*paths),
            False,
        )
    if fmt != "json":
        raise ValueError(f"unknown history format {fmt!r}: use json or parquet")
    frame = (
        reader.schema(schema(with_corrupt=True))
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .option("pathGlobFilter", "*.json*")
        .json(list(paths))
    )
    return frame, True


# -- aggregation ------------------------------------------------------------------------------


@dataclass
class Analysis:
    """What the job learned from the window."""

    stats: list[SegmentStats] = field(default_factory=list)
    quality: dict[str, int] = field(default_factory=dict)
    partitions: list[str] = field(default_factory=list)
    input_files: list[str] = field(default_factory=list)
    format: str = "json"

    def by_topic(self) -> dict[TopicKey, list[SegmentStats]]:
        topics: dict[TopicKey, list[SegmentStats]] = {}
        for s in self.stats:
            topics.setdefault((s.namespace, s.topic), []).append(s)
        return topics


def aggregate(
    spark: SparkSession,
    frame: DataFrame,
    has_corrupt_column: bool,
    window: Window,
    thresholds: Mapping[TopicKey, tuple[float, float, float, float]] | None = None,
    default_thresholds: tuple[float, float, float, float] | None = None,
) -> tuple[DataFrame, Any]:
    """The per-segment aggregate frame and the :class:`Observation` of row quality.

    ``thresholds`` maps topics whose merge thresholds differ from ``default_thresholds`` (the
    operator default policy's when omitted); it is broadcast, so it may list every topic.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    defaults = default_thresholds or merge_thresholds(DEFAULT_POLICY)
    observation = Observation("load-history")
    reason = reject_reason(has_corrupt_column)
    in_window = (F.col("ts") > F.lit(window.start)) & (F.col("ts") <= F.lit(window.end))
    checked = frame.withColumn("_reject", reason).observe(
        observation,
        F.count(F.lit(1)).alias("rows"),
        *[F.count(F.when(F.col("_reject") == r, 1)).alias(r) for r in REJECT_REASONS],
        F.count(F.when(F.col("_reject").isNull() & ~in_window, 1)).alias("outsideWindow"),
    )
    rows = checked.where(F.col("_reject").isNull() & in_window)

    limit_cols = [f"_merge_{name}" for name in RATE_FIELDS]
    if thresholds:
        table = spark.createDataFrame(
            [(ns, topic, *values) for (ns, topic), values in thresholds.items()],
            ["namespace", "topic", *limit_cols],
        )
        rows = rows.join(F.broadcast(table), ["namespace", "topic"], "left")
        for col, default in zip(limit_cols, defaults, strict=True):
            rows = rows.withColumn(col, F.coalesce(F.col(col), F.lit(default)))
    else:
        for col, default in zip(limit_cols, defaults, strict=True):
            rows = rows.withColumn(col, F.lit(default))

    hot = F.lit(False)
    for name, col in zip(RATE_FIELDS, limit_cols, strict=True):
        hot = hot | (F.col(name) >= F.col(col))
    t = F.col("ts") - F.lit(window.start)
    x = F.col("msgRateIn")
    keys = ["namespace", "topic", "segmentId", "rangeStart", "rangeEnd"]
    # Level 1: per segment and p95 bucket (one broker rate window, 60 s), plain sums that a
    # codegen'd hash aggregate computes cheaply.
    buckets = rows.groupBy(*keys, F.floor(t / F.lit(P95_RESOLUTION)).alias("_bucket")).agg(
        F.count(F.lit(1)).alias("n"),
        F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"),
        F.max(F.when(hot, F.col("ts"))).alias("last_hot_ts"),
        F.sum(t).alias("st"),
        F.sum(t * t).alias("stt"),
        F.sum(x).alias("sx"),
        F.sum(t * x).alias("stx"),
        F.sum(F.coalesce(F.col("messagesIn"), F.lit(0))).alias("messages_in"),
        *[F.sum(name).alias(f"sum_{name}") for name in RATE_FIELDS],
        *[F.sum(F.col("keyHist")[i]).alias(f"h{i}") for i in range(HIST_BINS)],
    )
    # Level 2: per segment. Exact sums of sums; the p95 sketches see one value per bucket (the
    # bucket's mean rate) instead of one per sample.
    grouped = buckets.groupBy(*keys).agg(
        F.sum("n").alias("n"),
        F.min("first_ts").alias("first_ts"),
        F.max("last_ts").alias("last_ts"),
        F.max("last_hot_ts").alias("last_hot_ts"),
        *[F.sum(c).alias(c) for c in ("st", "stt", "sx", "stx", "messages_in")],
        *[F.sum(f"sum_{name}").alias(f"sum_{name}") for name in RATE_FIELDS],
        *[
            F.percentile_approx(F.col(f"sum_{name}") / F.col("n"), 0.95, PERCENTILE_ACCURACY).alias(
                f"p95_{name}"
            )
            for name in RATE_FIELDS
        ],
        *[F.sum(f"h{i}").alias(f"h{i}") for i in range(HIST_BINS)],
    )
    n = F.col("n").cast("double")
    denominator = n * F.col("stt") - F.col("st") * F.col("st")
    slope = F.when(
        denominator > 0, (n * F.col("stx") - F.col("st") * F.col("sx")) / denominator
    ).otherwise(F.lit(0.0))
    result = grouped.select(
        "namespace",
        "topic",
        "segmentId",
        "rangeStart",
        "rangeEnd",
        "n",
        "first_ts",
        "last_ts",
        "last_hot_ts",
        "messages_in",
        slope.alias("slope"),
        (F.lit(window.start) + F.col("st") / n).alias("mid_ts"),
        *[(F.col(f"sum_{name}") / n).alias(f"mean_{name}") for name in RATE_FIELDS],
        *[f"p95_{name}" for name in RATE_FIELDS],
        F.array(*[F.col(f"h{i}") for i in range(HIST_BINS)]).alias("hist"),
    )
    return result, observation


def _to_stats(row: Any) -> SegmentStats:
    return SegmentStats(
        namespace=row["namespace"],
        topic=row["topic"],
        segment_id=int(row["segmentId"]),
        range_start=int(row["rangeStart"]),
        range_end=int(row["rangeEnd"]),
        samples=int(row["n"]),
        first_ts=float(row["first_ts"]),
        last_ts=float(row["last_ts"]),
        mean={name: float(row[f"mean_{name}"]) for name in RATE_FIELDS},
        p95={name: float(row[f"p95_{name}"]) for name in RATE_FIELDS},
        slope=float(row["slope"]),
        mid_ts=float(row["mid_ts"]),
        last_hot_ts=None if row["last_hot_ts"] is None else float(row["last_hot_ts"]),
        hist=[int(v) for v in row["hist"]],
        messages_in=int(row["messages_in"] or 0),
    )


def _dedupe(stats: list[SegmentStats], quality: dict[str, int]) -> list[SegmentStats]:
    """One aggregate per segment id: a history that reports two ranges for one id keeps the
    range with the most samples (and counts the conflict)."""
    best: dict[tuple[str, str, int], SegmentStats] = {}
    conflicts = 0
    for s in stats:
        key = (s.namespace, s.topic, s.segment_id)
        other = best.get(key)
        if other is None:
            best[key] = s
            continue
        conflicts += 1
        if (s.samples, s.last_ts) > (other.samples, other.last_ts):
            best[key] = s
    quality["conflictingRanges"] = conflicts
    return sorted(best.values(), key=lambda s: (s.namespace, s.topic, s.range_start))


def analyse(
    spark: SparkSession,
    root: str,
    window: Window,
    *,
    fmt: str = "auto",
    thresholds: Mapping[TopicKey, tuple[float, float, float, float]] | None = None,
    default_thresholds: tuple[float, float, float, float] | None = None,
) -> Analysis:
    """Read the window's partitions under ``root`` and aggregate them per segment."""
    paths = existing_partitions(spark, root, window)
    empty_quality = {"rows": 0, **dict.fromkeys(REJECT_REASONS, 0), "outsideWindow": 0}
    if not paths:
        log.warning(
            "no load history under %s for the window (%s, %s]", root, window.start, window.end
        )
        return Analysis(quality={**empty_quality, "valid": 0, "conflictingRanges": 0})
    chosen = detect_format(spark, paths) if fmt == "auto" else fmt
    # When a stage turns out empty, adaptive execution swaps the rest of the plan for an empty
    # relation and the Observation's metrics are lost (Observation.get then fails). Keep AQE,
    # without that one rule.
    spark.conf.set("spark.sql.adaptive.optimizer.excludedRules", AQE_EMPTY_RELATION_RULE)
    frame, has_corrupt = read_history(spark, root, paths, chosen)
    result, observation = aggregate(
        spark, frame, has_corrupt, window, thresholds, default_thresholds
    )
    collected = result.collect()
    metrics = {key: int(value) for key, value in observation.get.items()}
    quality = {**empty_quality, **metrics}
    rejected = sum(quality[r] for r in REJECT_REASONS)
    quality["valid"] = quality["rows"] - rejected - quality["outsideWindow"]
    stats = _dedupe([_to_stats(row) for row in collected], quality)
    return Analysis(
        stats=stats,
        quality=quality,
        partitions=paths,
        input_files=sorted(frame.inputFiles()),
        format=chosen,
    )
