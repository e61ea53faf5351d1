"""The recommender job with a real Spark (``local[2]``) on generated history, and end to end
against the real API server (a namespace of the session's control plane): run in this process,
and as the CronJob of ``manifests/overlays/local`` fired by the real CronJob controller, its Job's
Pod run by our kubelet under the recommender's ServiceAccount and Roles."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import SparkContext

from scalable_topics.core.layout import HashRange, SegmentLayout
from scalable_topics.core.policy import DEFAULT_POLICY
from scalable_topics.localcluster.nodekubelet import NodeKubelet
from scalable_topics.localcluster.restclient import (
    PODS,
    PVCS,
    Resource,
    RestClient,
    client_from_kubeconfig,
)
from scalable_topics.recommender.__main__ import parser, run
from scalable_topics.recommender.history import (
    SegmentTraffic,
    generate_records,
    partition_dir,
    write_jsonl,
)
from scalable_topics.recommender.job import analyse, build_session
from scalable_topics.recommender.rules import SegmentStats, Window, plan_topic
from scalable_topics.recommender.writer import TopicStore

from .conftest import ClusterNamespace, eventually

pytestmark = [pytest.mark.spark, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
RECOMMENDER = "scalable-topics-recommender"
HISTORY_CLAIM = "scalable-topics-load-history"
SINGLE_MACHINE = REPO / "manifests" / "components" / "recommender-single-machine"
BASE_NS = "scalable-topics"
"""The namespace of ``manifests/``, replaced by the test's own."""
JOBS = Resource("batch", "v1", "jobs")
CRONJOBS = Resource("batch", "v1", "cronjobs")
# 2026-11-23T00:30:00Z: the 1 h window (23:30, 00:30] spans two hour partitions.
NOW = 1_795_393_800.0
WINDOW = Window(NOW - 3600, NOW, 10.0)
LOWER_QUARTER = [10.0] * 4 + [0.0] * 12


def _const(rate: float) -> Any:
    return lambda _t: rate


def traffic(namespace: str = "default", now: float = NOW) -> list[SegmentTraffic]:
    """Generated from two hours before ``now`` (so the window also excludes rows)."""
    quarters = SegmentLayout.initial(4).active()
    start = now - 7200

    def hot_until(ts: float, rate: float) -> Any:
        return lambda t: rate if start + t <= ts else 30.0

    orders = [_const(3000.0), _const(15000.0), _const(20.0), _const(30.0)]
    payments = [_const(3000.0), _const(3000.0), _const(20.0), hot_until(now - 1200, 3000.0)]
    segments = []
    for topic, rates in (("orders", orders), ("payments", payments)):
        for s, rate in zip(quarters, rates, strict=True):
            skewed = topic == "orders" and s.segment_id == 1
            segments.append(
                SegmentTraffic(
                    namespace,
                    topic,
                    s.segment_id,
                    s.hash_range.start,
                    s.hash_range.end,
                    rate,
                    key_weights=LOWER_QUARTER if skewed else None,
                )
            )
    # A linear ramp, for the trend: 1000/s at the window start, +3600/s per hour.
    segments.append(
        SegmentTraffic(namespace, "ramp", 0, 0, 0xFFFF, lambda t: 1000.0 + max(0.0, t - 3600.0))
    )
    return segments


UNPARSEABLE = ['{"ts": 1795393000.0, "namespace": "default", "topic"', '{"ts": "soon"}']


def _bad_records() -> list[str]:
    good: dict[str, Any] = {
        "ts": NOW - 100,
        "namespace": "default",
        "topic": "orders",
        "segmentId": 0,
        "descriptor": "0000-3fff-0",
        "rangeStart": 0,
        "rangeEnd": 0x3FFF,
        "msgRateIn": 1e9,
        "bytesRateIn": 1.0,
        "msgRateOut": 1.0,
        "bytesRateOut": 1.0,
        "messagesIn": 10,
        "keyHist": [1] * 16,
    }
    lines = list(UNPARSEABLE)
    lines.append(json.dumps({k: v for k, v in good.items() if k != "topic"}))
    lines.append(json.dumps({**good, "bytesRateIn": -5.0}))
    lines.append(json.dumps({**good, "keyHist": [1] * 15}))
    lines.append(json.dumps({**good, "rangeStart": 0x5000}))
    return lines


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = build_session(
        "local[2]",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    yield session
    session.stop()
    # Close the Python side of the JVM gateway here, not in the garbage collector at the
    # worker's exit: py4j logs each connection it closes, and by then pytest has closed the
    # stream a handler writes to ("--- Logging error ---" at the end of a CI log).
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("history")
    write_jsonl(root, generate_records(traffic(), start=NOW - 7200, end=NOW))
    # Malformed rows inside the window (a truncated line, wrong types, missing fields, …).
    with (root / partition_dir(NOW - 100) / "broker-1.jsonl").open("a") as f:
        f.write("\n".join(_bad_records()) + "\n")
    # A partition outside the window full of junk (and one far in the past that is valid):
    # neither may be read.
    junk = root / partition_dir(NOW - 5 * 3600)
    junk.mkdir(parents=True)
    (junk / "broker-0.jsonl").write_text("garbage\n" * 50)
    future = root / partition_dir(NOW + 3600)
    future.mkdir(parents=True)
    (future / "broker-0.jsonl").write_text("garbage\n" * 50)
    return root


@pytest.fixture(scope="module")
def analysis(spark: Any, history: Path) -> Any:
    return analyse(spark, str(history), WINDOW)


def _stats(analysis: Any, topic: str) -> list[SegmentStats]:
    return analysis.by_topic()[("default", topic)]  # type: ignore[no-any-return]


def test_partition_pruning_reads_only_the_window(analysis: Any, history: Path) -> None:
    expected = [str(history / "dt=2026-11-22/hour=23"), str(history / "dt=2026-11-23/hour=00")]
    assert analysis.partitions == expected
    assert analysis.input_files
    assert all(
        any(f"/{d}/" in f for d in ("dt=2026-11-22/hour=23", "dt=2026-11-23/hour=00"))
        for f in analysis.input_files
    )
    # The junk partitions would have added 100 unparseable rows.
    assert analysis.quality["unparseable"] == len(UNPARSEABLE)
    # Rows of the read partitions that fall before the window are left out, not rejected.
    assert analysis.quality["outsideWindow"] > 0


def test_missing_partitions_are_skipped(spark: Any, history: Path) -> None:
    gap = Window(NOW - 6 * 3600, NOW - 4 * 3600 - 1, 10.0)
    result = analyse(spark, str(history), gap)
    assert [Path(p).name for p in result.partitions] == ["hour=19"]
    assert result.quality["unparseable"] == 50 and result.stats == []


def test_malformed_rows_are_counted_and_skipped(analysis: Any) -> None:
    q = analysis.quality
    assert q["unparseable"] == 2
    assert q["missingField"] == 1
    assert q["negativeRate"] == 1
    assert q["badHistogram"] == 1
    assert q["badRange"] == 1
    assert q["valid"] == 9 * 360
    assert q["rows"] == q["valid"] + q["outsideWindow"] + 6
    # None of the bad rows (msgRateIn 1e9) reached the aggregate.
    orders0 = next(s for s in _stats(analysis, "orders") if s.segment_id == 0)
    assert orders0.samples == 360 and orders0.mean["msgRateIn"] == pytest.approx(3000)


def test_per_segment_aggregates(analysis: Any) -> None:
    orders = {s.segment_id: s for s in _stats(analysis, "orders")}
    hot = orders[1]
    assert hot.samples == 360
    assert hot.first_ts == WINDOW.start + 10 and hot.last_ts == NOW
    assert hot.p95["msgRateIn"] == pytest.approx(15000)
    assert hot.mean["bytesRateIn"] == pytest.approx(15000 * 1024)
    assert sum(hot.hist[:4]) == sum(hot.hist) == hot.messages_in == 15000 * 10 * 360
    assert hot.last_hot_ts == NOW
    assert orders[2].last_hot_ts is None
    payments3 = next(s for s in _stats(analysis, "payments") if s.segment_id == 3)
    assert payments3.last_hot_ts == NOW - 1200
    (ramp,) = _stats(analysis, "ramp")
    assert ramp.slope == pytest.approx(1.0, rel=1e-6)
    assert ramp.estimate_at(NOW) == pytest.approx(1000 + 3600, rel=1e-3)
    # percentile_approx with accuracy 100: rank error <= 1 % of 360 samples (10/s per sample).
    assert ramp.p95["msgRateIn"] == pytest.approx(1000 + 0.95 * 3600, abs=50)


def test_plans_from_spark_aggregates(analysis: Any) -> None:
    layout = SegmentLayout.initial(4)
    orders = plan_topic(_stats(analysis, "orders"), layout, DEFAULT_POLICY, WINDOW)
    kinds = [(a["kind"], a["segments"], a["at"]) for a in orders.actions]
    # The hot segment's keys all lie in its lower quarter: the split lands at the traffic median
    # (end of its lower eighth), not at the midpoint 0x5fff.
    median_at = 0x4000 + 0x4000 // 8 - 1
    assert kinds == [("split", [1], median_at), ("merge", [2, 3], None)]
    assert median_at != HashRange(0x4000, 0x7FFF).midpoint()
    payments = plan_topic(_stats(analysis, "payments"), layout, DEFAULT_POLICY, WINDOW)
    assert payments.actions == []  # segment 3 was hot 20 minutes ago: no merge


def test_per_topic_merge_thresholds(spark: Any, history: Path) -> None:
    strict = (10.0, 1e9, 1e9, 1e9)  # msgRateIn >= 10 counts as not cold for "orders"
    result = analyse(spark, str(history), WINDOW, thresholds={("default", "orders"): strict})
    orders = {s.segment_id: s for s in result.by_topic()[("default", "orders")]}
    assert orders[2].last_hot_ts == NOW
    payments = {s.segment_id: s for s in result.by_topic()[("default", "payments")]}
    assert payments[2].last_hot_ts is None


def test_parquet_history_gives_the_same_aggregates(
    spark: Any, history: Path, analysis: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    from scalable_topics.recommender.history import schema

    moment = F.timestamp_seconds("ts")
    frame = (
        spark.read.schema(schema(with_corrupt=False))
        .json([str(history / "dt=2026-11-22/hour=23"), str(history / "dt=2026-11-23/hour=00")])
        .where(F.col("ts").isNotNull())
        .withColumn("dt", F.date_format(moment, "yyyy-MM-dd"))
        .withColumn("hour", F.date_format(moment, "HH"))
    )
    out = tmp_path / "parquet"
    frame.write.partitionBy("dt", "hour").parquet(str(out))
    result = analyse(spark, str(out), WINDOW)
    assert result.format == "parquet"
    assert result.partitions == [
        str(out / "dt=2026-11-22/hour=23"),
        str(out / "dt=2026-11-23/hour=00"),
    ]
    _same(result.stats, analysis.stats)
    # Parquet cannot hold unparseable lines, but rows that fail the checks are still rejected.
    assert result.quality["unparseable"] == 0
    assert result.quality["badHistogram"] == 1 and result.quality["negativeRate"] == 1


def _same(a: list[SegmentStats], b: list[SegmentStats]) -> None:
    def key(s: SegmentStats) -> tuple[str, int]:
        return (s.topic, s.segment_id)

    for x, y in zip(sorted(a, key=key), sorted(b, key=key), strict=True):
        assert (x.topic, x.segment_id, x.samples, list(x.hist)) == (
            y.topic,
            y.segment_id,
            y.samples,
            list(y.hist),
        )
        assert x.mean == pytest.approx(y.mean) and x.slope == pytest.approx(y.slope)
        assert x.last_hot_ts == y.last_hot_ts


async def create_topics(
    cluster: ClusterNamespace, store: TopicStore, segments: dict[str, int]
) -> None:
    """ScalableTopics in ``cluster``'s namespace with their initial layouts in status (as the
    operator writes them)."""
    await cluster.apply_crds()
    for name, n in segments.items():
        topic = {
            "apiVersion": "scalabletopics.io/v1alpha1",
            "kind": "ScalableTopic",
            "metadata": {"name": name},
            "spec": {"initialSegments": n},
        }
        await cluster.kubectl("create", "-f", "-", input=json.dumps(topic))

    def set_layouts() -> None:
        for name, n in segments.items():
            obj = store.get_topic(cluster.namespace, name)
            assert obj is not None
            obj["status"] = {"layout": SegmentLayout.initial(n).to_metadata()}
            store.custom.replace_namespaced_custom_object_status(
                "scalabletopics.io", "v1alpha1", cluster.namespace, "scalabletopics", name, obj
            )

    await asyncio.to_thread(set_layouts)


async def test_job_writes_recommendations_to_the_cluster(
    spark: Any, local_cluster: ClusterNamespace, tmp_path: Path
) -> None:
    ns = local_cluster.namespace
    history = tmp_path / "history"
    write_jsonl(history, generate_records(traffic(ns), start=NOW - 7200, end=NOW))
    store = await asyncio.to_thread(TopicStore.connect, str(local_cluster.kubeconfig))
    await create_topics(local_cluster, store, {"orders": 4, "ramp": 1})
    argv = [
        "--history",
        str(history),
        "--window",
        "1h",
        "--now",
        str(NOW),
        "--kubeconfig",
        str(local_cluster.kubeconfig),
        "--namespace",
        ns,
    ]
    summary = await asyncio.to_thread(run, parser().parse_args(argv), spark)
    results = {t["name"]: t for t in summary["topics"]}
    assert results["orders"]["result"] == "written"
    assert results["payments"]["skipped"] == "topic not found"
    assert results["ramp"]["result"] == "written"
    obj = await asyncio.to_thread(store.get_topic, ns, "orders")
    assert obj is not None
    rec = obj["status"]["recommendation"]
    assert rec["basedOnEpoch"] == 0 and rec["window"] == "1h"
    assert rec["computedAt"] == "2026-11-23T00:30:00Z"
    assert [(a["kind"], a["segments"], a.get("at")) for a in rec["actions"]] == [
        ("split", [1], 0x47FF),
        ("merge", [2, 3], None),
    ]
    assert "15,000" in rec["actions"][0]["detail"]
    version = obj["metadata"]["resourceVersion"]
    ramp = await asyncio.to_thread(store.get_topic, ns, "ramp")
    assert ramp is not None and ramp["status"]["recommendation"]["actions"] == []

    # A second run on the same data changes nothing, so nothing is written.
    summary = await asyncio.to_thread(run, parser().parse_args(argv), spark)
    assert {t["name"]: t.get("result") for t in summary["topics"]}["orders"] == "unchanged"
    obj = await asyncio.to_thread(store.get_topic, ns, "orders")
    assert obj is not None and obj["metadata"]["resourceVersion"] == version
    store.close()


def recommender_overlay(directory: Path, namespace: str) -> Path:
    """``manifests/overlays/local`` in ``namespace`` with its CronJob firing every minute in the
    single-machine variant (``local[2]``), and neither operator nor brokers (nothing but the
    job touches the topics)."""
    directory.mkdir(parents=True, exist_ok=True)

    def patch(api: str, kind: str, name: str, **body: Any) -> dict[str, Any]:
        meta = {"name": name} if kind == "Namespace" else {"name": name, "namespace": BASE_NS}
        return {"apiVersion": api, "kind": kind, "metadata": meta, **body}

    patches = [
        patch("v1", "Namespace", BASE_NS, **{"$patch": "delete"}),
        patch("apps/v1", "Deployment", "scalable-topics-operator", spec={"replicas": 0}),
        patch("apps/v1", "StatefulSet", "segment-broker", spec={"replicas": 0}),
        patch(
            "batch/v1",
            "CronJob",
            RECOMMENDER,
            spec={"schedule": "* * * * *", "suspend": False},
        ),
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "resources": [os.path.relpath(REPO / "manifests" / "overlays" / "local", directory)],
        # The Kubernetes mode of the overlay is test_recommender_k8s.py's.
        "components": [os.path.relpath(SINGLE_MACHINE, directory)],
        "patches": [{"patch": json.dumps(patch)} for patch in patches],
    }
    (directory / "kustomization.yaml").write_text(json.dumps(kustomization))
    return directory


async def write_history_on_claim(
    local_cluster: ClusterNamespace, local_node: NodeKubelet, admin: RestClient
) -> None:
    """Once the history claim is Bound, two hours of the brokers' load history, ending now, in
    the claim's directory on the node (what the recommender's Pods read)."""
    ns = local_cluster.namespace

    async def claim_bound() -> bool:
        claim = await admin.get(PVCS, ns, HISTORY_CLAIM)
        return (claim.get("status") or {}).get("phase") == "Bound"

    await eventually(claim_bound, within=60)
    now = time.time()
    history = local_node.agent.layout.claim_dir(ns, HISTORY_CLAIM)
    write_jsonl(history, generate_records(traffic(ns, now), start=now - 7200, end=now))


async def test_cronjob_fires_and_its_pod_writes_recommendations(
    local_cluster: ClusterNamespace, local_node: NodeKubelet, tmp_path: Path
) -> None:
    """The real CronJob controller creates the Job, the Job controller its Pod, the scheduler
    binds it to our node, and the recommender in it (Spark ``local[2]``) reads the history
    claim and writes ``status.recommendation`` with its own ServiceAccount's rights."""
    ns = local_cluster.namespace
    overlay = recommender_overlay(tmp_path / "overlay", ns)
    store = await asyncio.to_thread(TopicStore.connect, str(local_cluster.kubeconfig))
    admin = client_from_kubeconfig(local_cluster.kubeconfig)
    try:
        await create_topics(local_cluster, store, {"orders": 4})
        await local_cluster.kubectl("apply", "-k", str(overlay))
        await write_history_on_claim(local_cluster, local_node, admin)

        async def job_finished() -> bool:
            jobs, _ = await admin.list(JOBS, ns)
            ours = [j for j in jobs if _owner_kind(j) == "CronJob"]
            if any((j.get("status") or {}).get("failed") for j in ours):
                raise AssertionError(f"recommender job failed: {await _pod_logs(local_cluster)}")
            return any((j.get("status") or {}).get("succeeded") for j in ours)

        # The next minute boundary, then Spark's start on a shared machine.
        await eventually(job_finished, within=240, interval=1.0)
        await admin.patch(CRONJOBS, ns, RECOMMENDER, {"spec": {"suspend": True}})

        pods, _ = await admin.list(
            PODS, ns, label_selector="app.kubernetes.io/name=scalable-topics-recommender"
        )
        assert pods, "the job's pod is gone"
        pod = pods[0]
        assert pod["spec"]["nodeName"] == local_node.node_name
        assert pod["spec"]["serviceAccountName"] == "scalable-topics-recommender"
        assert pod["status"]["phase"] == "Succeeded"

        obj = await asyncio.to_thread(store.get_topic, ns, "orders")
        assert obj is not None
        rec = obj["status"]["recommendation"]
        assert rec["basedOnEpoch"] == 0 and rec["window"] == "1h"
        assert [(a["kind"], a["segments"]) for a in rec["actions"]][:1] == [("split", [1])]
    finally:
        await local_cluster.kubectl("delete", "-k", str(overlay), "--wait=false", check=False)
        await admin.close()
        store.close()


def _owner_kind(obj: dict[str, Any]) -> str | None:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return str(owners[0].get("kind")) if owners else None


async def _pod_logs(cluster: ClusterNamespace) -> str:
    result = await cluster.kubectl(
        "logs", "-l", "app.kubernetes.io/name=scalable-topics-recommender", "--tail=40", check=False
    )
    return result.stdout + result.stderr


def test_dry_run_without_a_cluster_infers_layouts(
    spark: Any, history: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    args = parser().parse_args(
        [
            "--history",
            str(history),
            "--now",
            str(NOW),
            "--dry-run",
            "--stream-consumers",
            "default/ramp=2",
        ]
    )
    summary = run(args, spark)
    topics = {t["name"]: t for t in summary["topics"]}
    orders = topics["orders"]["recommendation"]
    assert orders["basedOnEpoch"] is None
    assert [a["kind"] for a in orders["actions"]] == ["split", "merge"]
    ramp = topics["ramp"]["recommendation"]
    assert [(a["kind"], a["reason"]) for a in ramp["actions"]] == [("split", "consumer-count")]
    assert summary["quality"]["unparseable"] == 2
    shutil.rmtree(history / "does-not-exist", ignore_errors=True)
