"""The load history in an object store, against a real S3 server (MinIO, built from its Go
module): the brokers' writer (boto3) puts the history's objects, the recommender reads them
through Hadoop's ``s3a://`` filesystem (hadoop-aws and the AWS SDK resolved by Maven), with
the settings of the standard AWS variables a Secret provides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

from scalable_topics.recommender.history import generate_records
from scalable_topics.recommender.s3a import ensure_jars
from segment_broker.load import LoadRecord, SegmentRates
from segment_broker.s3history import S3HistoryWriter, s3_client

from .s3_server import S3Server, minio_server
from .test_recommender_job import NOW, traffic

pytestmark = [pytest.mark.spark, pytest.mark.integration]


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
