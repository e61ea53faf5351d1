"""Pod spec → process translation: $(VAR) expansion, env assembly, mount-path rewriting."""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import pytest

from scalable_topics.localcluster.podspec import (
    MountRewriter,
    PodLayout,
    PodSpecError,
    container_command,
    container_env,
    container_mounts,
    env_suffix,
    expand,
    field_value,
    referenced_objects,
    resolve_executable,
    volume_sources,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "alpha"),
        ("x-$(A)-$(B)-y", "x-alpha-beta-y"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("cost $5", "cost $5"),
        ("$(A", "$(A"),
        ("trailing $", "trailing $"),
        ("$(A)$(A)", "alphaalpha"),
        ("", ""),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "alpha", "B": "beta"}) == expected


def test_rewriter_matches_whole_path_prefixes_longest_first(tmp_path: Path) -> None:
    rw = MountRewriter(
        [("/data", tmp_path / "d"), ("/data/logs", tmp_path / "l"), ("/etc/cfg/", tmp_path / "c")]
    )
    assert rw("/data") == f"{tmp_path}/d"
    assert rw("/data/x/y") == f"{tmp_path}/d/x/y"
    assert rw("/data/logs/a") == f"{tmp_path}/l/a"
    assert rw("--dir=/data/logs") == f"--dir={tmp_path}/l"
    assert rw("/database") == "/database"
    assert rw("/var/data") == "/var/data"
    assert rw("a:/data:/etc/cfg/x") == f"a:{tmp_path}/d:{tmp_path}/c/x"
    assert rw("/data.old") == "/data.old"
    assert MountRewriter([])("/data") == "/data"


def test_rewriter_output_is_not_rewritten_again(tmp_path: Path) -> None:
    local = Path("/data/cluster/volumes/x")
    rw = MountRewriter([("/data", local)])
    assert rw("/data/f") == "/data/cluster/volumes/x/f"


def pod(**status: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": "web-0",
            "namespace": "ns1",
            "uid": "u-1",
            "labels": {"app": "web"},
        },
        "spec": {"nodeName": "local", "serviceAccountName": "sa"},
        "status": {"podIP": "127.0.0.7", "hostIP": "127.0.0.1", **status},
    }


def test_field_refs() -> None:
    p = pod()
    assert field_value(p, "metadata.name") == "web-0"
    assert field_value(p, "metadata.namespace") == "ns1"
    assert field_value(p, "metadata.uid") == "u-1"
    assert field_value(p, "status.podIP") == "127.0.0.7"
    assert field_value(p, "spec.nodeName") == "local"
    assert field_value(p, "spec.serviceAccountName") == "sa"
    assert field_value(p, "metadata.labels['app']") == "web"
    with pytest.raises(PodSpecError):
        field_value(p, "spec.nonsense")


def test_env_order_expansion_and_references() -> None:
    container = {
        "name": "c",
        "envFrom": [
            {"configMapRef": {"name": "cm"}, "prefix": "CM_"},
            {"secretRef": {"name": "absent", "optional": True}},
        ],
        "env": [
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "URL", "value": "http://$(IP):8080/$(UNDEFINED)"},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "level"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "s", "key": "x", "optional": True}},
            },
            {"name": "CM_level", "value": "override"},
        ],
    }
    objects = {
        ("ConfigMap", "cm"): {"data": {"level": "debug"}},
        ("Secret", "s"): {"data": {"pw": base64.b64encode(b"hunter2").decode()}},
        ("Secret", "absent"): None,
    }
    env = container_env(container, pod(), objects)
    assert env == {
        "CM_level": "override",
        "IP": "127.0.0.7",
        "URL": "http://127.0.0.7:8080/$(UNDEFINED)",
        "LEVEL": "debug",
        "PW": "hunter2",
    }


def test_missing_required_key_is_a_config_error() -> None:
    container = {
        "name": "c",
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope"}}}],
    }
    with pytest.raises(PodSpecError, match="couldn't find key nope"):
        container_env(container, pod(), {("ConfigMap", "cm"): {"data": {}}})
    with pytest.raises(PodSpecError, match='configmap "other" not found'):
        container_env({"name": "c", "envFrom": [{"configMapRef": {"name": "other"}}]}, pod(), {})


def test_referenced_objects_cover_env_and_volumes() -> None:
    p = {
        "spec": {
            "containers": [
                {
                    "envFrom": [{"secretRef": {"name": "s1"}}],
                    "env": [
                        {
                            "name": "A",
                            "valueFrom": {
                                "configMapKeyRef": {"name": "c1", "key": "k", "optional": True}
                            },
                        }
                    ],
                }
            ],
            "volumes": [
                {"name": "v1", "configMap": {"name": "c2"}},
                {"name": "v2", "secret": {"secretName": "s2"}},
                {"name": "v3", "projected": {"sources": [{"configMap": {"name": "c3"}}]}},
            ],
        }
    }
    assert referenced_objects(p) == {
        ("Secret", "s1", False),
        ("ConfigMap", "c1", True),
        ("ConfigMap", "c2", False),
        ("Secret", "s2", False),
        ("ConfigMap", "c3", False),
    }


def test_python_runs_with_current_interpreter() -> None:
    for name in ("python", "python3", "python3.11", "/usr/local/bin/python3"):
        assert resolve_executable(name) == sys.executable


def test_executables_are_found_in_venv_bin_then_path(tmp_path: Path) -> None:
    venv = tmp_path / "bin"
    venv.mkdir()
    tool = venv / "mytool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert resolve_executable("mytool", venv_bin=venv) == str(tool)
    assert resolve_executable("sh", venv_bin=venv) == "/usr/bin/sh" or resolve_executable(
        "sh", venv_bin=venv
    ).endswith("/sh")
    with pytest.raises(PodSpecError):
        resolve_executable("surely-not-a-command-xyz", venv_bin=venv)


def test_volume_layout(tmp_path: Path) -> None:
    layout = PodLayout(tmp_path)
    p = {
        "metadata": {"name": "web-0", "namespace": "ns1"},
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "host", "hostPath": {"path": "/tmp"}},
            ]
        },
    }
    assert volume_sources(p, layout) == {
        "data": tmp_path / "volumes/ns1/data-web-0",
        "scratch": tmp_path / "pods/ns1/web-0/volumes/scratch",
        "host": Path("/tmp"),
    }
    assert layout.log_path("ns1", "web-0", "main") == tmp_path / "pods/ns1/web-0/main.log"


def test_container_command_rewrites_mounts_everywhere(tmp_path: Path) -> None:
    volumes = {"data": tmp_path / "claim", "cfg": tmp_path / "cfg"}
    container = {
        "name": "server",
        "command": ["python3", "-m", "http.server"],
        "args": ["--bind", "$(POD_IP)", "--directory", "/var/lib/data/www", "$(ROOT)"],
        "workingDir": "/var/lib/data",
        "volumeMounts": [
            {"name": "data", "mountPath": "/var/lib/data"},
            {"name": "cfg", "mountPath": "/etc/app", "subPath": "app"},
        ],
    }
    env = {"POD_IP": "127.0.0.9", "ROOT": "/etc/app/root.conf", "KUBECONFIG": "/mine"}
    mounts = container_mounts(container, volumes)
    base = {"PATH": os.environ.get("PATH", ""), "KUBECONFIG": "/home/user/.kube/config"}
    extra = {"KUBECONFIG": "/cluster/kubeconfig", "POD_NAME": "web-0"}
    cmd = container_command(container, env, mounts, extra, base)
    assert cmd.argv == [
        sys.executable,
        "-m",
        "http.server",
        "--bind",
        "127.0.0.9",
        "--directory",
        f"{tmp_path}/claim/www",
        f"{tmp_path}/cfg/app/root.conf",
    ]
    assert cmd.cwd == tmp_path / "claim"
    assert cmd.env["ROOT"] == f"{tmp_path}/cfg/app/root.conf"
    assert cmd.env["KUBECONFIG"] == "/mine"  # the container's own value wins
    assert cmd.env["POD_NAME"] == "web-0"
    assert cmd.env["LOCALCLUSTER_MOUNT_DATA"] == str(tmp_path / "claim")
    assert cmd.env["LOCALCLUSTER_MOUNT_CFG"] == str(tmp_path / "cfg" / "app")


def test_cluster_kubeconfig_overrides_the_callers(tmp_path: Path) -> None:
    container = {"name": "c", "command": ["python", "-c", "pass"]}
    cmd = container_command(container, {}, [], {"KUBECONFIG": "/cluster"}, {"KUBECONFIG": "/user"})
    assert cmd.env["KUBECONFIG"] == "/cluster"


def test_no_command_cannot_run() -> None:
    with pytest.raises(PodSpecError) as err:
        container_command({"name": "c", "image": "nginx"}, {}, [], {}, {})
    assert err.value.reason == "CreateContainerError"


def test_unknown_volume_mount_is_rejected() -> None:
    with pytest.raises(PodSpecError):
        container_mounts({"volumeMounts": [{"name": "ghost", "mountPath": "/x"}]}, {})


def test_env_suffix() -> None:
    assert env_suffix("data") == "DATA"
    assert env_suffix("broker-data.v1") == "BROKER_DATA_V1"


def test_tmp_mount_becomes_tmpdir(tmp_path: Path) -> None:
    container = {
        "name": "c",
        "command": ["python", "-c", "pass"],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    mounts = container_mounts(container, {"tmp": tmp_path / "t"})
    cmd = container_command(container, {}, mounts, {}, {"TMPDIR": "/elsewhere"})
    assert cmd.env["TMPDIR"] == str(tmp_path / "t")
    own = container_command(container, {"TMPDIR": "/x"}, mounts, {}, {})
    assert own.env["TMPDIR"] == "/x"


def test_args_expand_the_service_variables_under_the_containers_own() -> None:
    """As a kubelet does: ``$(KUBERNETES_SERVICE_HOST)`` in args names the API server (Spark's
    ``k8s://`` master in the recommender CronJob), and the container's own variables win."""
    container = {
        "name": "driver",
        "command": ["python", "-m", "job"],
        "args": [
            "--master=k8s://https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)",
            "$(KUBERNETES_SERVICE_PORT_HTTPS)",
        ],
    }
    services = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": "6443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "6443",
    }
    own = {"KUBERNETES_SERVICE_PORT_HTTPS": "7443"}
    cmd = container_command(container, own, [], services, {}, services)
    assert cmd.argv[3:] == ["--master=k8s://https://127.0.0.1:6443", "7443"]
    assert cmd.env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
