"""``python -m scalable_topics.recommender`` (also runnable as a ``spark-submit`` script).

Reads a window of load history with Spark, plans each topic with the core evaluator and writes
``status.recommendation`` with a compare-and-swap (or prints it with ``--dry-run``). Prints a
JSON summary on stdout. Exit status: 0 on success (topics that vanished or could not be planned
are reported, not fatal), 1 when a write failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

# Absolute imports: spark-submit runs this file as a plain script.
from scalable_topics.core.policy import (
    CLUSTER_DEFAULTS_CONFIGMAP,
    DEFAULT_POLICY,
    parse_cluster_defaults,
    parse_duration,
)
from scalable_topics.core.resources import format_time
from scalable_topics.recommender import s3a
from scalable_topics.recommender.job import analyse, build_session, executors, merge_thresholds
from scalable_topics.recommender.rules import (
    DEFAULT_TOLERANCE,
    Window,
    infer_layout,
    plan_topic,
    recommendation,
    ring_covered,
)
from scalable_topics.recommender.topics import TopicState, segment_buckets, topic_state
from scalable_topics.recommender.writer import TopicStore, WriteResult

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("scalable_topics.recommender")


def _duration(text: str) -> float:
    try:
        value = float(parse_duration(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {text!r}")
    return value


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _consumers(text: str) -> tuple[str, str, int]:
    topic, sep, count = text.rpartition("=")
    namespace, slash, name = topic.partition("/")
    if not sep or not slash or not namespace or not name or not count.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/TOPIC=COUNT, got {text!r}")
    return namespace, name, int(count)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scalable_topics.recommender",
        description="Compute autoscale recommendations from the segments' load history.",
    )
    p.add_argument("--history", required=True, help="load history root (dir or Hadoop URI)")
    p.add_argument("--window", type=_duration, default=3600.0, help="window length (1h)")
    p.add_argument("--now", type=float, help="end of the window, Unix seconds (default: now)")
    p.add_argument("--interval", type=_duration, default=10.0, help="sampling interval (10s)")
    p.add_argument("--format", choices=("auto", "json", "parquet"), default="auto")
    p.add_argument("--master", help="Spark master (default local[*] unless spark-submit set it)")
    p.add_argument(
        "--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE", help="Spark conf"
    )
    p.add_argument(
        "--s3a-jars",
        metavar="DIR",
        help="jars for s3a:// history (hadoop-aws and the AWS SDK) when the image lacks them: "
        "a directory, or 'maven' to resolve them into ~/.cache/scalable-topics",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else ~/.kube)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--namespace", help="only topics of this namespace (default: all)")
    p.add_argument(
        "--defaults-namespace",
        default=os.environ.get("POD_NAMESPACE", "scalable-topics"),
        help="namespace of the ConfigMap scalable-topics-autoscale-defaults (the operator's; "
        "default: $POD_NAMESPACE, else scalable-topics)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the recommendations instead of writing them (no cluster needed)",
    )
    p.add_argument(
        "--stream-consumers",
        type=_consumers,
        action="append",
        default=[],
        metavar="NS/TOPIC=N",
        help="consumer count of a stream subscription, for topics read without a cluster",
    )
    p.add_argument(
        "--split-tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="split at the midpoint unless the traffic median is further than this share "
        "of the range from it (1/16)",
    )
    p.add_argument(
        "--refresh-after",
        type=_duration,
        default=300.0,
        help="rewrite an unchanged recommendation with actions once it is this old (5m)",
    )
    p.add_argument(
        "--output",
        default="-",
        help="write the JSON summary here instead of stdout (under spark-submit the driver's "
        "stderr is merged into stdout)",
    )
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    return p


def _use_cluster(args: argparse.Namespace) -> bool:
    return (
        not args.dry_run
        or args.kubeconfig is not None
        or bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    )


def session_conf(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings: for ``s3a://`` history the S3 settings from the AWS variables and the
    ``--s3a-jars``; ``--conf`` wins over both."""
    conf: dict[str, str] = {}
    if s3a.spark_uri(args.history).startswith("s3a://"):
        conf.update(s3a.hadoop_conf(os.environ if env is None else env))
    if args.s3a_jars:
        jars = s3a.ensure_jars() if args.s3a_jars == "maven" else s3a.jars_in(args.s3a_jars)
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    conf.update(dict(args.conf))
    return conf


def run(args: argparse.Namespace, spark: SparkSession | None = None) -> dict[str, Any]:
    """One run of the job; a given ``spark`` session is used and left running."""
    now = args.now if args.now is not None else time.time()
    window = Window(now - args.window, now, args.interval)
    store = TopicStore.connect(args.kubeconfig, args.context) if _use_cluster(args) else None
    states: dict[tuple[str, str], TopicState] = {}
    buckets: dict[tuple[str, str], dict[int, int]] = {}
    if store is not None:
        annotations = store.namespace_policies(args.namespace)
        cluster, problems = parse_cluster_defaults(store.cluster_defaults(args.defaults_namespace))
        for problem in problems:
            log.warning("ConfigMap %s: %s (default kept)", CLUSTER_DEFAULTS_CONFIGMAP, problem)
        for key, obj in store.list_topics(args.namespace).items():
            states[key] = topic_state(
                obj, namespace_policy=annotations.get(key[0]), cluster=cluster
            )
            for note in states[key].notes:
                log.warning("%s/%s: %s", *key, note)
        buckets = segment_buckets(store.list_segments(args.namespace))

    defaults = merge_thresholds(DEFAULT_POLICY)
    thresholds = {
        key: merge_thresholds(state.policy)
        for key, state in states.items()
        if merge_thresholds(state.policy) != defaults
    }
    own_session = spark is None
    session = spark if spark is not None else build_session(args.master, session_conf(args))
    started = time.monotonic()
    try:
        history = s3a.spark_uri(args.history)
        analysis = analyse(session, history, window, fmt=args.format, thresholds=thresholds)
        used = executors(session)
    finally:
        if own_session:
            session.stop()  # release executors before the (slow) API round trips
    spark_seconds = time.monotonic() - started

    passed_consumers: dict[tuple[str, str], dict[str, int]] = {}
    for namespace, name, count in args.stream_consumers:
        passed_consumers.setdefault((namespace, name), {})["cli"] = count

    computed_at = format_time(now)
    topics: list[dict[str, Any]] = []
    failed = False
    for key, stats in sorted(analysis.by_topic().items()):
        namespace, name = key
        if args.namespace and namespace != args.namespace:
            continue
        entry: dict[str, Any] = {"namespace": namespace, "name": name}
        topics.append(entry)
        if store is not None:
            state = states.get(key)
            if state is None:
                entry["skipped"] = "topic not found"
                continue
            if state.problem is not None or state.layout is None:
                entry["skipped"] = state.problem or "no layout"
                continue
            layout, policy, generation = state.layout, state.policy, state.generation
            consumers = {**state.stream_consumers, **passed_consumers.get(key, {})}
            epoch: int | None = layout.epoch
        else:
            layout = infer_layout(stats, window)
            if not ring_covered(layout):
                entry["warning"] = "latest samples do not cover the ring; layout is partial"
            policy, generation, epoch = DEFAULT_POLICY, None, None
            consumers = passed_consumers.get(key, {})
        plan = plan_topic(
            stats,
            layout,
            policy,
            window,
            stream_consumers=consumers,
            buckets=buckets.get(key),
            tolerance=args.split_tolerance,
        )
        rec = recommendation(
            plan,
            computed_at=computed_at,
            window=window,
            based_on_epoch=epoch,
            based_on_generation=generation,
        )
        if args.dry_run or store is None:
            entry["recommendation"] = rec
            continue
        outcome = store.write_recommendation(
            namespace, name, rec, now=now, refresh_after=args.refresh_after
        )
        entry.update(
            result=outcome.result.value,
            conflicts=outcome.conflicts,
            actions=len(rec["actions"]),
            recommendedSegments=rec["recommendedSegments"],
        )
        if outcome.result is WriteResult.CONFLICT:
            failed = True
        log.info("%s/%s: %s (%d conflicts)", namespace, name, outcome.result, outcome.conflicts)
    if store is not None:
        store.close()
    return {
        "computedAt": computed_at,
        "window": {"start": window.start, "end": window.end},
        "format": analysis.format,
        "partitions": analysis.partitions,
        "inputFiles": len(analysis.input_files),
        "quality": analysis.quality,
        "segments": len(analysis.stats),
        "sparkSeconds": round(spark_seconds, 3),
        "executors": used,
        "topics": topics,
        "failed": failed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        summary = run(args)
    except s3a.JarsUnavailable as exc:
        print(f"recommender: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(summary, indent=2 if args.dry_run else None) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
