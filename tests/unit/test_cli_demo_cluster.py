"""The pure parts of ``stopic demo --existing-cluster``: image replacement in the rendered
manifests, the load's delivery ledger and outcome, and the command line's opt-in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalable_topics.cli.demo import Ledger, Outcome
from scalable_topics.cli.demo_cluster import (
    BROKER_IMAGE,
    OPERATOR_IMAGE,
    RESULT_PREFIX,
    image_repository,
    load_result,
    set_images,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("scalable-topics/operator:0.1.0", "scalable-topics/operator"),
        ("scalable-topics/operator", "scalable-topics/operator"),
        ("localhost:5000/st/operator:1.2", "localhost:5000/st/operator"),
        ("localhost:5000/st/operator", "localhost:5000/st/operator"),
        ("ghcr.io/x/segment-broker@sha256:abc", "ghcr.io/x/segment-broker"),
    ],
)
def test_image_repository(image: str, repository: str) -> None:
    assert image_repository(image) == repository


def test_set_images_replaces_the_projects_images_in_every_pod_template() -> None:
    base = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "manifests/base")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    documents = [d for d in yaml.safe_load_all(base) if d]
    images = {OPERATOR_IMAGE: "reg.example/op:dev", BROKER_IMAGE: "reg.example/broker:dev"}
    # operator Deployment, broker StatefulSet, recommender CronJob
    assert set_images(documents, images) == 3
    found = {
        d["kind"]: yaml.safe_dump(d) for d in documents if d["kind"] in ("Deployment", "CronJob")
    }
    assert "reg.example/op:dev" in found["Deployment"] and "reg.example/op:dev" in found["CronJob"]
    # ... and the image Spark gives the recommender's executor Pods.
    assert "scalable-topics/" not in yaml.safe_dump_all(documents)
    assert "--conf=spark.kubernetes.container.image=reg.example/op:dev" in found["CronJob"]
    [sts] = [d for d in documents if d["kind"] == "StatefulSet"]
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "reg.example/broker:dev"


def test_set_images_leaves_other_images() -> None:
    documents = [{"spec": {"initContainers": [{"image": "busybox:1"}], "containers": []}}]
    assert set_images(documents, {OPERATOR_IMAGE: "x"}) == 0
    assert documents[0]["spec"]["initContainers"][0]["image"] == "busybox:1"


def test_ledger_counts_loss_order_and_redeliveries() -> None:
    ledger = Ledger()
    ledger.acked.update({0, 1, 2, 3, 4})
    for number, key in [(0, "a"), (1, "b"), (3, "a"), (0, "a"), (2, "a")]:
        ledger.received_message(key, f"order {number} for {key}".encode())
    ledger.received_message("a", b"not the demo's")
    assert ledger.redelivered == 1  # 0 again
    assert ledger.out_of_order == 1  # 2 of key a after 3
    assert ledger.missing() == 1  # 4 never arrived
    assert ledger.foreign == 1
    assert ledger.last == {"a": 3, "b": 1}


def outcome(**changes: object) -> Outcome:
    values: dict[str, object] = {
        "epochs": [0, 1, 2, 3],
        "sent": 10,
        "acked": 10,
        "failed": 0,
        "received": 10,
        "redelivered": 2,
        "out_of_order": 0,
        "lost": 0,
        "keys": 5,
        "verified": True,
    }
    values.update(changes)
    return Outcome(**values)  # type: ignore[arg-type]


def test_outcome_ok_only_when_complete_verified_lossless_and_in_order() -> None:
    assert outcome().ok()
    assert not outcome(lost=1).ok()
    assert not outcome(out_of_order=1).ok()
    assert not outcome(verified=False).ok()
    assert not outcome(epochs=[0, 1, 2]).ok()
    assert not outcome(acked=0).ok()


def test_outcome_report_and_its_log_line() -> None:
    result = outcome(epochs=[0, 1, 3, 4])
    assert result.report() == [
        "messages: sent 10, acknowledged 10, failed 0, received 10 (2 redelivered)",
        "lost: 0",
        "per-key order: held over 5 keys",
        "DAG: split on load (epoch 0 -> 1), split on consumers (epoch 1 -> 3), "
        "merged when cold (epoch 3 -> 4)",
    ]
    log = f"[10:00:00] phase 1\n{RESULT_PREFIX}{outcome(lost=7).to_json()}\n"
    log += f"{RESULT_PREFIX}{result.to_json()}\nstopping\n"
    assert load_result(log) == result
    assert load_result("[10:00:00] phase 1\n") is None


@pytest.mark.parametrize(
    "flag", [["--kubeconfig", "k"], ["--context", "c"], ["--operator-image", "i"], ["--cleanup"]]
)
def test_cluster_flags_need_the_opt_in(flag: list[str]) -> None:
    """``stopic demo`` touches no cluster of the user's without --existing-cluster: the flags
    that name one are a usage error on their own."""
    result = subprocess.run(
        [sys.executable, "-m", "scalable_topics.cli.main", "demo", *flag],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "is for --existing-cluster only" in result.stderr


def test_a_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scalable_topics.cli.main", "demo", "--existing-cluster"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "none")},
    )
    assert result.returncode == 1
    assert f"kubeconfig {tmp_path / 'none'}: no such file" in result.stderr
