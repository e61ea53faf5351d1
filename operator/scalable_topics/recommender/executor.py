"""Spark executor entry point for the operator image (Spark on Kubernetes, client mode).

The driver creates executor pods from ``spark.kubernetes.container.image`` and passes their
settings in environment variables, with the single argument ``executor``; Spark's own images
turn that into a JVM command in ``entrypoint.sh``. The operator image carries Spark as the
``pyspark`` wheel (jars included) rather than a Spark distribution, so the executor pod template
(``manifests/base/recommender-cronjob.yaml``) runs ``python -m
scalable_topics.recommender.executor`` instead, which builds the same command and ``exec``s it.
The job uses no Python UDFs, so executors need no Python workers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
REQUIRED = (
    "SPARK_DRIVER_URL",
    "SPARK_EXECUTOR_ID",
    "SPARK_EXECUTOR_CORES",
    "SPARK_APPLICATION_ID",
    "SPARK_EXECUTOR_POD_IP",
    "SPARK_EXECUTOR_POD_NAME",
    "SPARK_EXECUTOR_MEMORY",
)


def spark_home(env: Mapping[str, str]) -> str:
    if env.get("SPARK_HOME"):
        return env["SPARK_HOME"]
    import pyspark

    return str(Path(pyspark.__file__).resolve().parent)


def command(env: Mapping[str, str]) -> list[str]:
    """The executor JVM command line, as Spark's ``entrypoint.sh executor`` builds it."""
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        raise ValueError(f"not started by a Spark driver: {', '.join(missing)} unset")
    java = f"{env['JAVA_HOME']}/bin/java" if env.get("JAVA_HOME") else "java"
    java_opts = [
        value
        for _, value in sorted(
            (
                (int(key.rsplit("_", 1)[1]), value)
                for key, value in env.items()
                if key.startswith("SPARK_JAVA_OPT_") and key.rsplit("_", 1)[1].isdigit()
            ),
        )
    ]
    memory = env["SPARK_EXECUTOR_MEMORY"]
    classpath = ":".join(
        part for part in (env.get("SPARK_CLASSPATH"), f"{spark_home(env)}/jars/*") if part
    )
    return [
        java,
        *java_opts,
        f"-Xms{memory}",
        f"-Xmx{memory}",
        "-cp",
        classpath,
        BACKEND,
        "--driver-url",
        env["SPARK_DRIVER_URL"],
        "--executor-id",
        env["SPARK_EXECUTOR_ID"],
        "--cores",
        env["SPARK_EXECUTOR_CORES"],
        "--app-id",
        env["SPARK_APPLICATION_ID"],
        "--hostname",
        env["SPARK_EXECUTOR_POD_IP"],
        "--resourceProfileId",
        env.get("SPARK_RESOURCE_PROFILE_ID", "0"),
        "--podName",
        env["SPARK_EXECUTOR_POD_NAME"],
    ]


def environment(env: Mapping[str, str]) -> dict[str, str]:
    """The executor JVM's environment: ``SPARK_LOCAL_IP`` defaults to the Pod's address.

    The executor advertises ``--hostname`` (the Pod IP), but Spark still resolves the local
    host for its own bindings, and where the host name resolves to a loopback address it takes
    the first non-loopback interface instead (the local cluster's Pods share the host's name
    and interfaces, and must stay on their loopback addresses).
    """
    out = dict(env)
    if not out.get("SPARK_LOCAL_IP") and out.get("SPARK_EXECUTOR_POD_IP"):
        out["SPARK_LOCAL_IP"] = out["SPARK_EXECUTOR_POD_IP"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["executor"]:
        print("usage: python -m scalable_topics.recommender.executor executor", file=sys.stderr)
        return 2
    try:
        cmd = command(os.environ)
    except ValueError as exc:
        print(f"executor: {exc}", file=sys.stderr)
        return 2
    os.execvpe(cmd[0], cmd, environment(os.environ))


if __name__ == "__main__":
    sys.exit(main())
