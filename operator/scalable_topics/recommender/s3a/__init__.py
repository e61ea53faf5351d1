"""The load history in an object store: Spark's ``s3a://`` filesystem for the recommender.

Two parts:

- **Jars.** ``s3a://`` is Hadoop's ``hadoop-aws`` module and the AWS SDK bundle it depends on;
  the pyspark wheel carries neither. An image bakes them into ``pyspark/jars``; elsewhere
  :func:`ensure_jars` resolves them with Maven from ``pom.xml`` next to this module
  (``hadoop.version`` must be the wheel's ``hadoop-client``, which it checks) into
  ``~/.cache/scalable-topics/hadoop-aws-<version>/lib`` once, with Maven's repository at
  ``~/.cache/scalable-topics/m2`` (the Kafka benchmark's layout), and the job passes them as
  ``spark.jars`` (``--s3a-jars DIR``). ``python -m scalable_topics.recommender.s3a`` resolves
  them and prints the directory.
- **Settings.** :func:`hadoop_conf` turns the standard AWS variables (from a Secret:
  ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``) into
  ``spark.hadoop.fs.s3a.*`` settings. They travel with the Spark configuration to the
  executors, so executor pods need no Secret of their own; Spark redacts the keys in its UI and
  logs (``spark.redaction.regex``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

POM = Path(__file__).resolve().parent / "pom.xml"
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


class JarsUnavailable(RuntimeError):
    """Maven is missing or failed: ``s3a://`` cannot be read without the jars."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "scalable-topics"


def pom_property(pom: Path, name: str, *, release: bool = False) -> str:
    """The value of ``<properties><name>`` in ``pom``; ``release``: it must be a version like
    3.5.0 (a pin, not a range or LATEST). One reader for every pom of ours (the s3a jars,
    Kafka's, RabbitMQ's stream client)."""
    root = ET.parse(pom).getroot()
    found = root.find(f"m:properties/m:{name}", _POM_NS)
    value = (found.text or "").strip() if found is not None else ""
    if not value:
        raise ValueError(f"{pom}: no <properties><{name}>")
    if release and not re.fullmatch(r"\d+\.\d+\.\d+", value):
        raise ValueError(f"{pom}: {name} must be a release like 3.5.0, got {value!r}")
    return value


def hadoop_version(pom: Path = POM) -> str:
    return pom_property(pom, "hadoop.version", release=True)


def wheel_hadoop_version() -> str | None:
    """The ``hadoop-client-api`` version of the installed pyspark, if it has one."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    for jar in jars.glob("hadoop-client-api-*.jar"):
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    return None


def resolve_command(mvn: str, pom: Path, out: Path, repo: Path) -> list[str]:
    """``mvn dependency:copy-dependencies`` of ``pom``'s runtime scope into ``out``."""
    return [
        mvn,
        "-B",
        "-q",
        "-f",
        str(pom),
        f"-Dmaven.repo.local={repo}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={out}",
    ]


class MavenMissing(RuntimeError):
    """``mvn`` is not on PATH: jars from Maven Central cannot be resolved here."""


def resolve_into(
    pom: Path,
    lib: Path,
    repo: Path,
    *,
    timeout: float,
    check: Callable[[list[str]], None] = lambda names: None,
) -> None:
    """``pom``'s runtime jars into ``lib``, Maven's repository at ``repo``: resolved into
    ``lib.partial`` and renamed only once ``check`` accepted the jar names, so that an
    interrupted or refused resolution never leaves a ``lib`` that looks complete."""
    mvn = shutil.which("mvn")
    if not mvn:
        raise MavenMissing("mvn not found")
    staging = lib.with_name(lib.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = resolve_command(mvn, pom, staging, repo)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"mvn failed ({res.returncode}):\n{(res.stdout + res.stderr)[-3000:]}")
    check(sorted(p.name for p in staging.iterdir()))
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)


def check_jars(names: Sequence[str], version: str) -> None:
    missing = [] if f"hadoop-aws-{version}.jar" in names else [f"hadoop-aws-{version}.jar"]
    if not any(n.startswith("bundle-") for n in names):
        missing.append("bundle-*.jar (the AWS SDK)")
    if missing:
        raise JarsUnavailable(f"s3a jars incomplete: missing {', '.join(missing)}")


def ensure_jars(pom: Path = POM, cache: Path | None = None) -> list[Path]:
    """The ``s3a://`` jars, resolved with Maven once into the cache and then reused."""
    version = hadoop_version(pom)
    shipped = wheel_hadoop_version()
    if shipped is not None and shipped != version:
        raise JarsUnavailable(
            f"hadoop.version {version} in {pom} differs from pyspark's hadoop-client {shipped}"
        )
    root = cache or cache_root()
    home = root / f"hadoop-aws-{version}"
    lib = home / "lib"
    marker = home / "complete"
    if not marker.exists():
        print(f"resolving hadoop-aws {version} with Maven into {lib}", file=sys.stderr, flush=True)
        try:
            resolve_into(
                pom,
                lib,
                root / "m2",
                timeout=1800,
                check=lambda names: check_jars(names, version),
            )
        except MavenMissing:
            raise JarsUnavailable(
                "mvn not found: the s3a jars come from Maven Central through Maven "
                "(apt-get install maven), or bake them into the image's pyspark/jars"
            ) from None
        except JarsUnavailable:
            raise
        except RuntimeError as exc:  # mvn failed
            raise JarsUnavailable(str(exc)) from None
        marker.write_text(version + "\n")
    jars = sorted(lib.glob("*.jar"))
    check_jars([p.name for p in jars], version)
    return jars


def jars_in(directory: str | Path) -> list[Path]:
    """The ``*.jar`` files of ``directory`` (``--s3a-jars``); an error when there are none."""
    jars = sorted(Path(directory).glob("*.jar"))
    if not jars:
        raise JarsUnavailable(f"no jars in {directory}")
    return jars


def spark_uri(history: str) -> str:
    """The brokers' ``s3://bucket/prefix`` as Hadoop's ``s3a://`` (Hadoop 3 has no ``s3://``
    filesystem), so both read the same setting; anything else unchanged."""
    return "s3a://" + history.removeprefix("s3://") if history.startswith("s3://") else history


def hadoop_conf(env: Mapping[str, str]) -> dict[str, str]:
    """``spark.hadoop.fs.s3a.*`` settings from the standard AWS variables that are set.

    An endpoint (an S3-compatible server rather than AWS) gets path-style requests
    (``http://host:port/bucket/key``), which every such server supports, and plain HTTP when
    its URL says ``http``.
    """
    conf: dict[str, str] = {}
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        conf["spark.hadoop.fs.s3a.access.key"] = env["AWS_ACCESS_KEY_ID"]
        conf["spark.hadoop.fs.s3a.secret.key"] = env["AWS_SECRET_ACCESS_KEY"]
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        )
        if env.get("AWS_SESSION_TOKEN"):
            conf["spark.hadoop.fs.s3a.session.token"] = env["AWS_SESSION_TOKEN"]
            conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            )
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            endpoint.startswith("https:")
        ).lower()
    return conf


def main() -> int:
    try:
        jars = ensure_jars()
    except (JarsUnavailable, ValueError) as exc:
        print(f"s3a: {exc}", file=sys.stderr)
        return 1
    print(jars[0].parent)
    return 0
