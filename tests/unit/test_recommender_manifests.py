"""The recommender's CronJob, RBAC and executor launcher agree with the code they run."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scalable_topics.recommender.__main__ import parser
from scalable_topics.recommender.executor import BACKEND, command, environment

BASE = Path(__file__).resolve().parents[2] / "manifests" / "base"
SERVICE_VARS = {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}


def docs(name: str) -> dict[str, dict[str, Any]]:
    return {
        f"{d['kind']}/{d['metadata']['name']}": d
        for d in yaml.safe_load_all((BASE / name).read_text())
        if d
    }


def test_cronjob_schedule_and_args_match_the_cli() -> None:
    cron = docs("recommender-cronjob.yaml")["CronJob/scalable-topics-recommender"]
    spec = cron["spec"]
    assert spec["schedule"] == "*/10 * * * *" and spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "scalable_topics.recommender"]
    env = {e["name"]: e for e in container["env"]}
    # Every $(VAR) in the args comes from the container's env (downward API) or is one of the
    # API server's Service variables every kubelet sets.
    for arg in container["args"]:
        for var in re.findall(r"\$\((\w+)\)", arg):
            assert var in env or var in SERVICE_VARS, var
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    args = parser().parse_args([re.sub(r"\$\((\w+)\)", "x", a) for a in container["args"]])
    conf = dict(args.conf)
    # The API server by the Service variables, not by name: no cluster DNS needed.
    assert args.master == "k8s://https://x:x"
    assert conf["spark.kubernetes.driver.pod.name"] == "x"
    assert conf["spark.driver.host"] == "scalable-topics-recommender-driver.x.svc"
    assert conf["spark.kubernetes.container.image"] == container["image"]
    assert {conf["spark.driver.port"], conf["spark.driver.blockManager.port"]} == {"7078", "7079"}
    # The history is read by executors too: they mount the same claim at the same path.
    mount = conf["spark.kubernetes.executor.volumes.persistentVolumeClaim.history.mount.path"]
    assert args.history == mount
    claim = conf[
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.history.options.claimName"
    ]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["history"]["persistentVolumeClaim"]["claimName"] == claim
    assert "PersistentVolumeClaim/" + claim in docs("recommender-history-pvc.yaml")
    # The driver Service selects this pod and exposes the fixed ports.
    service = docs("recommender-rbac.yaml")["Service/scalable-topics-recommender-driver"]
    labels = pod["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert service["spec"]["clusterIP"] == "None"
    assert {p["port"] for p in service["spec"]["ports"]} == {7078, 7079}


def test_executor_template_runs_an_importable_launcher() -> None:
    config_map = docs("recommender-cronjob.yaml")["ConfigMap/scalable-topics-recommender-executor"]
    template = yaml.safe_load(config_map["data"]["executor-pod.yaml"])
    (container,) = template["spec"]["containers"]
    assert container["name"] == "executor"
    module = container["command"][-1]
    assert container["command"][:2] == ["python", "-m"]
    assert callable(importlib.import_module(module).main)


def test_rbac_is_narrow() -> None:
    rbac = docs("recommender-rbac.yaml")
    cluster_rules = rbac["ClusterRole/scalable-topics-recommender"]["rules"]
    verbs = {r: set(rule["verbs"]) for rule in cluster_rules for r in rule["resources"]}
    assert verbs == {
        "scalabletopics": {"get", "list"},
        "segments": {"get", "list"},
        "scalabletopics/status": {"update", "patch"},
        "namespaces": {"get", "list"},
    }
    role = rbac["Role/scalable-topics-recommender-spark"]
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {"pods", "services", "configmaps"}
    assert all({"create", "delete", "watch"} <= set(rule["verbs"]) for rule in role["rules"])


SPARK_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@driver.svc:7078",
    "SPARK_EXECUTOR_ID": "3",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_APPLICATION_ID": "spark-abc",
    "SPARK_EXECUTOR_POD_IP": "10.0.0.7",
    "SPARK_EXECUTOR_POD_NAME": "stopic-recommender-exec-3",
    "SPARK_EXECUTOR_MEMORY": "2g",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_JAVA_OPT_10": "-Dspark.b=2",
    "SPARK_JAVA_OPT_2": "-Dspark.a=1",
    "JAVA_HOME": "/usr/lib/jvm/java-17",
    "SPARK_HOME": "/opt/pyspark",
}


def test_executor_command_matches_sparks_entrypoint() -> None:
    cmd = command(SPARK_ENV)
    assert cmd[:5] == [
        "/usr/lib/jvm/java-17/bin/java",
        "-Dspark.a=1",
        "-Dspark.b=2",
        "-Xms2g",
        "-Xmx2g",
    ]
    assert cmd[5:8] == ["-cp", "/opt/pyspark/jars/*", BACKEND]
    flags = dict(zip(cmd[8::2], cmd[9::2], strict=True))
    assert flags == {
        "--driver-url": SPARK_ENV["SPARK_DRIVER_URL"],
        "--executor-id": "3",
        "--cores": "1",
        "--app-id": "spark-abc",
        "--hostname": "10.0.0.7",
        "--resourceProfileId": "0",
        "--podName": "stopic-recommender-exec-3",
    }


def test_executor_command_needs_the_driver_env() -> None:
    env = {k: v for k, v in SPARK_ENV.items() if k != "SPARK_DRIVER_URL"}
    with pytest.raises(ValueError, match="SPARK_DRIVER_URL"):
        command(env)
    # Without SPARK_HOME, the jars come with the pyspark wheel.
    cmd = command({k: v for k, v in SPARK_ENV.items() if k != "SPARK_HOME"})
    assert cmd[cmd.index("-cp") + 1].endswith("pyspark/jars/*")


def test_executor_binds_its_pod_address() -> None:
    assert environment(SPARK_ENV)["SPARK_LOCAL_IP"] == "10.0.0.7"
    assert environment({**SPARK_ENV, "SPARK_LOCAL_IP": "10.0.0.8"})["SPARK_LOCAL_IP"] == "10.0.0.8"
