"""The recommender's s3a settings: from the standard AWS variables, and the history URI."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scalable_topics.recommender.__main__ import parser, session_conf
from scalable_topics.recommender.s3a import JarsUnavailable, hadoop_conf, jars_in, spark_uri

ENV = {
    "AWS_ACCESS_KEY_ID": "id",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_REGION": "eu-west-1",
}


def test_hadoop_conf_from_the_aws_variables() -> None:
    conf = hadoop_conf(ENV)
    assert conf == {
        "spark.hadoop.fs.s3a.access.key": "id",
        "spark.hadoop.fs.s3a.secret.key": "secret",
        "spark.hadoop.fs.s3a.aws.credentials.provider": (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        ),
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
    }
    # On AWS itself (no endpoint, no keys: the pod's IAM role): nothing but the region.
    assert hadoop_conf({"AWS_REGION": "us-east-1"}) == {
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1"
    }
    session = hadoop_conf({**ENV, "AWS_SESSION_TOKEN": "t"})
    assert session["spark.hadoop.fs.s3a.session.token"] == "t"
    assert session["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "TemporaryAWSCredentialsProvider"
    )


def test_brokers_s3_url_is_read_as_s3a() -> None:
    assert spark_uri("s3://bucket/prefix") == "s3a://bucket/prefix"
    assert spark_uri("s3a://bucket/prefix") == "s3a://bucket/prefix"
    assert spark_uri("/var/lib/load-history") == "/var/lib/load-history"


def _args(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["--history", *argv])


def test_session_conf_only_for_s3_history_and_conf_wins() -> None:
    assert session_conf(_args("/var/lib/load-history"), ENV) == {}
    conf = session_conf(
        _args("s3://b/p", "--conf", "spark.hadoop.fs.s3a.endpoint=http://other"), ENV
    )
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://other"
    assert conf["spark.hadoop.fs.s3a.access.key"] == "id"


def test_s3a_jars_directory_must_hold_jars(tmp_path: Path) -> None:
    with pytest.raises(JarsUnavailable, match="no jars"):
        jars_in(str(tmp_path))
