"""The load history in an object store, against a real S3 server (MinIO, built from its Go
module): the brokers' writer (boto3) puts the history's objects, the recommender reads them
through Hadoop's ``s3a://`` filesystem (hadoop-aws and the AWS SDK resolved by Maven), with
the settings of the standard AWS variables a Secret provides."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

from scalable_topics.localcluster.nodekubelet import NodeKubelet
from scalable_topics.localcluster.restclient import PODS, PVCS, client_from_kubeconfig
from scalable_topics.recommender.history import generate_records
from scalable_topics.recommender.s3a import ensure_jars
from scalable_topics.recommender.writer import TopicStore
from segment_broker.load import LoadRecord, SegmentRates
from segment_broker.s3history import S3HistoryWriter, s3_client

from .conftest import ClusterNamespace, eventually
from .s3_server import S3Server, minio_server
from .test_recommender_job import NOW, RECOMMENDER, create_topics, traffic
from .test_recommender_k8s import BASE_NS, JOBS, REPO

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with minio_server(tmp_path_factory.mktemp("minio")) as server:
        yield server


@pytest.fixture
def aws_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    return s3.env()


def load_record(r: dict[str, Any]) -> LoadRecord:
    return LoadRecord(
        ts=r["ts"],
        namespace=r["namespace"],
        topic=r["topic"],
        segment_id=r["segmentId"],
        descriptor=r["descriptor"],
        range_start=r["rangeStart"],
        range_end=r["rangeEnd"],
        rates=SegmentRates(r["msgRateIn"], r["bytesRateIn"], r["msgRateOut"], r["bytesRateOut"]),
        messages_in=r["messagesIn"],
        key_hist=tuple(r["keyHist"]),
    )


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def keys(client: Any, bucket: str, prefix: str) -> list[str]:
    out: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(o["Key"] for o in page.get("Contents", []))
    return sorted(out)


def test_broker_writer_puts_one_object_per_flush_and_retries_under_the_same_key(
    aws_env: dict[str, str],
) -> None:
    client = s3_client()
    start = NOW - 7200
    clock = Clock(start)
    writer = S3HistoryWriter(
        "s3://history-retry/load", broker_id="segment-broker-0", clock=clock, flush_every=60.0
    )
    batches = [
        [load_record(r) for r in group]
        for _, group in groupby(
            generate_records(traffic(), start=start, end=start + 120), key=lambda r: r["ts"]
        )
    ]
    # The bucket does not exist yet: the flush fails, the lines stay buffered.
    for batch in batches[:6]:
        clock.now = batch[0].ts
        writer.write(batch)
    assert writer.uploaded == 0 and writer.pending() == 6 * 9
    client.create_bucket(Bucket="history-retry")
    for batch in batches[6:]:
        clock.now = batch[0].ts
        writer.write(batch)
    writer.close()
    assert writer.pending() == 0 and writer.dropped == 0
    found = keys(client, "history-retry", "load/")
    first = round((start + 10) * 1000)
    # 2026-11-22T22:30Z: all in one hour; the failed flush's key got the superset.
    assert found[0] == f"load/dt=2026-11-22/hour=22/segment-broker-0-{first}.jsonl"
    assert len(found) == writer.uploaded
    lines: list[dict[str, Any]] = []
    for key in found:
        body = client.get_object(Bucket="history-retry", Key=key)["Body"].read().decode()
        lines.extend(json.loads(line) for line in body.splitlines())
    assert len(lines) == len(batches) * 9  # every record once: no duplicate from the retry
    assert lines[0] == next(iter(generate_records(traffic(), start=start, end=start + 10)))


def test_recommender_reads_the_brokers_objects_through_s3a(
    aws_env: dict[str, str], tmp_path: Path
) -> None:
    client = s3_client()
    client.create_bucket(Bucket="history")
    writer = S3HistoryWriter("s3://history/prod/load", broker_id="segment-broker-1")
    records = generate_records(traffic(), start=NOW - 7200, end=NOW)
    for _, group in groupby(records, key=lambda r: r["ts"]):
        writer.write([load_record(r) for r in group])
    writer.close()
    # Objects in the three hours the 2 h of samples touch (one flush per hour change here).
    parts = {k.split("/")[2] + "/" + k.split("/")[3] for k in keys(client, "history", "prod/")}
    assert parts == {"dt=2026-11-22/hour=22", "dt=2026-11-22/hour=23", "dt=2026-11-23/hour=00"}

    jars = ensure_jars()
    env = {**os.environ, **aws_env}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    argv = [
        sys.executable,
        "-m",
        "scalable_topics.recommender",
        "--history=s3://history/prod/load",  # the brokers' setting, read as s3a://
        f"--now={NOW}",
        "--dry-run",
        f"--s3a-jars={jars[0].parent}",
        "--master=local[2]",
        "--conf=spark.ui.enabled=false",
        "--conf=spark.driver.host=127.0.0.1",
        "--conf=spark.driver.bindAddress=127.0.0.1",
        f"--output={tmp_path / 'summary.json'}",
    ]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["partitions"] == [
        "s3a://history/prod/load/dt=2026-11-22/hour=23",
        "s3a://history/prod/load/dt=2026-11-23/hour=00",
    ]
    assert summary["quality"]["valid"] == 9 * 360
    assert summary["quality"]["unparseable"] == 0
    topics = {t["name"]: t["recommendation"] for t in summary["topics"]}
    assert [(a["kind"], a["segments"], a.get("at")) for a in topics["orders"]["actions"]] == [
        ("split", [1], 0x47FF),
        ("merge", [2, 3], None),
    ]
    # The secret key is not in what the job printed (Spark redacts it).
    assert aws_env["AWS_SECRET_ACCESS_KEY"] not in result.stdout + result.stderr


async def test_cronjob_on_kubernetes_reads_the_history_from_s3(
    s3: S3Server, local_cluster: ClusterNamespace, local_node: NodeKubelet, tmp_path: Path
) -> None:
    """``manifests/overlays/local`` with the ``load-history-s3`` component: no history claim;
    the driver Pod and its executor Pods (Spark on Kubernetes, as in the base) read the objects
    the brokers' writer put, with the Secret's URL and credentials; executors get no Secret."""
    ns = local_cluster.namespace
    client = s3_client_for(s3)
    bucket = f"history-{ns}"
    client.create_bucket(Bucket=bucket)
    now = time.time()
    writer = S3HistoryWriter(f"s3://{bucket}/load", broker_id="segment-broker-0", client=client)
    records = list(generate_records(traffic(ns, now), start=now - 7200, end=now))
    written = [r["ts"] for r in records]
    for _, group in groupby(records, key=lambda r: r["ts"]):
        writer.write([load_record(r) for r in group])
    writer.close()

    jars = (await asyncio.to_thread(ensure_jars))[0]
    overlay = s3_overlay(tmp_path / "overlay", ns, jars.parent)
    admin = client_from_kubeconfig(local_cluster.kubeconfig)
    store = await asyncio.to_thread(TopicStore.connect, str(local_cluster.kubeconfig))
    try:
        await create_topics(local_cluster, store, {"orders": 4})
        literals = [f"--from-literal={k}={v}" for k, v in s3.env().items()]
        await local_cluster.kubectl(
            "create",
            "secret",
            "generic",
            "scalable-topics-load-history-s3",
            f"--from-literal=url=s3://{bucket}/load",
            *literals,
        )
        await local_cluster.kubectl("apply", "-k", str(overlay))
        claims, _ = await admin.list(PVCS, ns)
        assert claims == []  # no shared volume
        await local_cluster.kubectl("create", "job", "from-s3", f"--from=cronjob/{RECOMMENDER}")
        seen: dict[str, dict[str, Any]] = {}

        async def job_finished() -> bool:
            pods, _ = await admin.list(PODS, ns, label_selector="spark-role=executor")
            seen.update({p["metadata"]["name"]: p for p in pods})
            job = await admin.get(JOBS, ns, "from-s3")
            status = job.get("status") or {}
            if status.get("failed"):
                logs = await local_cluster.kubectl("logs", "job/from-s3", "--tail=80", check=False)
                raise AssertionError(f"recommender job failed: {logs.stdout}{logs.stderr}")
            return bool(status.get("succeeded"))

        await eventually(job_finished, within=420, interval=0.5)
        assert len(seen) == 2
        for pod in seen.values():
            (container,) = pod["spec"]["containers"]
            assert not container.get("envFrom")
            names = {e["name"] for e in container.get("env") or []}
            assert "AWS_SECRET_ACCESS_KEY" not in names
            assert {v["name"] for v in pod["spec"].get("volumes") or []}.isdisjoint({"history"})
            # Spark fetched the jars into the executor's own working directory ("./"), not
            # into one shared by every Pod (two executors would race on the same file).
            name = pod["metadata"]["name"]
            work = local_node.agent.layout.work_dir(ns, name, "executor")
            assert (work / jars.name).is_file(), sorted(p.name for p in work.iterdir())
        assert not (REPO / jars.name).exists()
        log = (await local_cluster.kubectl("logs", "job/from-s3")).stdout
        summary = json.loads(next(x for x in reversed(log.splitlines()) if x.startswith("{")))
        assert summary["partitions"][0].startswith(f"s3a://{bucket}/load/dt=")
        # The CronJob's window ends when the job runs, a little after the history was written:
        # every record in it is read, the oldest ones it has left behind are not.
        start, end = summary["window"]["start"], summary["window"]["end"]
        assert summary["quality"]["valid"] == sum(start < ts <= end for ts in written) > 9 * 300
        assert len(summary["executors"]) == 2
        assert s3.secret_key not in log
        obj = await asyncio.to_thread(store.get_topic, ns, "orders")
        assert obj is not None
        rec = obj["status"]["recommendation"]
        assert [(a["kind"], a["segments"]) for a in rec["actions"]][:1] == [("split", [1])]
    finally:
        await local_cluster.kubectl("delete", "-k", str(overlay), "--wait=false", check=False)
        await admin.close()
        store.close()


def s3_client_for(server: S3Server) -> Any:
    """A boto3 client of ``server`` without touching the process environment."""
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
        config=Config(s3={"addressing_style": "path"}),
    )


def s3_overlay(overlay: Path, ns: str, jars: Path) -> Path:
    """``manifests/overlays/local`` + the ``load-history-s3`` component in ``ns``, without
    operator or brokers, the CronJob suspended, and the job given the cached s3a ``jars``."""
    overlay.mkdir(parents=True)

    def patch(api: str, kind: str, name: str, **body: Any) -> dict[str, Any]:
        meta = {"name": name} if kind == "Namespace" else {"name": name, "namespace": BASE_NS}
        return {"apiVersion": api, "kind": kind, "metadata": meta, **body}

    patches: list[dict[str, Any]] = [
        {"patch": json.dumps(p)}
        for p in (
            patch("v1", "Namespace", BASE_NS, **{"$patch": "delete"}),
            patch("apps/v1", "Deployment", "scalable-topics-operator", spec={"replicas": 0}),
            patch("apps/v1", "StatefulSet", "segment-broker", spec={"replicas": 0}),
            patch("batch/v1", "CronJob", RECOMMENDER, spec={"suspend": True}),
        )
    ]
    # This machine has no image with the jars baked in: the cached ones, shipped by Spark.
    patches.append(
        {
            "target": {"kind": "CronJob", "name": RECOMMENDER},
            "patch": json.dumps(
                [
                    {
                        "op": "add",
                        "path": "/spec/jobTemplate/spec/template/spec/containers/0/args/-",
                        "value": f"--s3a-jars={jars}",
                    }
                ]
            ),
        }
    )
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": ns,
        "resources": [os.path.relpath(REPO / "manifests/overlays/local", overlay)],
        "components": [os.path.relpath(REPO / "manifests/components/load-history-s3", overlay)],
        "patches": patches,
    }
    (overlay / "kustomization.yaml").write_text(json.dumps(kustomization))
    return overlay
