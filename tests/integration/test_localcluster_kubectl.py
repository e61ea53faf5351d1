"""Real ``kubectl`` (v1.32) against the embedded API server."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import yaml

from scalable_topics.localcluster.cluster import LocalCluster

from .conftest import KubectlResult, eventually

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "localcluster"
REPO = Path(__file__).resolve().parents[2]
Kubectl = Callable[..., Awaitable[KubectlResult]]


def _widget(**spec_changes: object) -> str:
    doc = yaml.safe_load((FIXTURES / "widget.yaml").read_text())
    doc["spec"].update(spec_changes)
    return yaml.safe_dump(doc)


async def _setup_crd(kubectl: Kubectl) -> None:
    out = await kubectl("apply", "-f", str(FIXTURES / "widgets-crd.yaml"))
    assert "widgets.test.stopic.io created" in out.stdout
    await kubectl(
        "wait", "--for=condition=Established", "crd/widgets.test.stopic.io", "--timeout=20s"
    )


async def _pod_with_log(kubectl: Kubectl, cluster: LocalCluster, name: str, text: str) -> Path:
    """A pod in ``default`` (this cluster runs no kubelet: it stays Pending) whose container
    ``app`` has logged ``text``, written where the kubelet would keep the log."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
    }
    await kubectl("apply", "-f", "-", input=json.dumps(pod))
    log_path = cluster.data_dir / "pods" / "default" / name / "app.log"
    log_path.parent.mkdir(parents=True)
    log_path.write_text(text)
    return log_path


async def test_custom_resource_get_apply_describe(kubectl: Kubectl) -> None:
    await _setup_crd(kubectl)
    strict = await kubectl("apply", "-f", "-", input=_widget(unknownField="x"), check=False)
    assert strict.returncode != 0
    assert 'strict decoding error: unknown field "spec.unknownField"' in strict.stderr
    warned = await kubectl("apply", "--validate=warn", "-f", "-", input=_widget(unknownField="x"))
    assert 'Warning: unknown field "spec.unknownField"' in warned.stderr

    table = (await kubectl("get", "widgets")).stdout.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "MODE", "READY", "AGE"]
    assert table[1].split()[:3] == ["alpha", "4", "Stream"]
    wide = (await kubectl("get", "wg", "-o", "wide")).stdout.splitlines()
    assert wide[0].split() == ["NAME", "SIZE", "MODE", "READY", "TEAM", "AGE"]
    assert wide[1].split()[:4] == ["alpha", "4", "Stream", "blue"]

    obj = (await kubectl("get", "widget", "alpha", "-o", "json")).json()
    assert "unknownField" not in obj["spec"], "unknown fields are pruned"
    assert obj["spec"]["mode"] == "Stream" and obj["spec"]["replicas"] == 1, "defaults applied"
    assert obj["spec"]["config"] == {"anything": {"goes": "here"}}, "preserved unknown fields"
    assert obj["metadata"]["generation"] == 1

    await kubectl("apply", "-f", str(FIXTURES / "widget.yaml"))
    await kubectl("apply", "-f", "-", input=_widget(maxSegments=32))
    obj2 = (await kubectl("get", "widget", "alpha", "-o", "json")).json()
    assert obj2["spec"]["maxSegments"] == 32
    assert obj2["metadata"]["generation"] == 2
    assert int(obj2["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])
    assert obj2["metadata"]["uid"] == obj["metadata"]["uid"]

    await kubectl("annotate", "widget", "alpha", "example.com/note=hello")
    await kubectl("label", "widget", "alpha", "env=dev")
    obj3 = (await kubectl("get", "widget", "alpha", "-o", "json")).json()
    assert obj3["metadata"]["generation"] == 2, "metadata changes do not bump generation"
    assert obj3["metadata"]["labels"]["env"] == "dev"
    assert obj3["metadata"]["annotations"]["example.com/note"] == "hello"
    assert (
        await kubectl("get", "wg", "-l", "env=dev", "-o", "name")
    ).stdout.strip() == "widget.test.stopic.io/alpha"
    assert (await kubectl("get", "wg", "-l", "env notin (dev)", "-o", "name")).stdout.strip() == ""

    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "alpha.test1", "namespace": "default"},
        "involvedObject": {
            "apiVersion": "test.stopic.io/v1",
            "kind": "Widget",
            "name": "alpha",
            "namespace": "default",
            "uid": obj["metadata"]["uid"],
        },
        "reason": "SegmentsPlanned",
        "message": "planned four segments",
        "type": "Normal",
        "source": {"component": "widget-test"},
        "count": 1,
        "firstTimestamp": obj["metadata"]["creationTimestamp"],
        "lastTimestamp": obj["metadata"]["creationTimestamp"],
    }
    await kubectl("create", "-f", "-", input=json.dumps(event))
    described = (await kubectl("describe", "widget", "alpha")).stdout
    assert "Initial Segments:  4" in described
    assert "Max Segments:      32" in described
    assert "SegmentsPlanned" in described and "planned four segments" in described


async def test_status_wait_patch_scale_and_finalizers(kubectl: Kubectl) -> None:
    await _setup_crd(kubectl)
    await kubectl("apply", "-f", str(FIXTURES / "widget.yaml"))

    waiter = asyncio.ensure_future(
        kubectl("wait", "--for=condition=Ready", "widget/alpha", "--timeout=30s", check=False)
    )
    status = {
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled"}],
            "replicas": 1,
            "selector": "app=alpha",
        }
    }
    await kubectl(
        "patch", "widget", "alpha", "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )
    result = await waiter
    assert result.returncode == 0, result.stderr
    assert "condition met" in result.stdout
    table = (await kubectl("get", "widgets")).stdout.splitlines()
    assert table[1].split()[3] == "True"

    # A write to the main resource ignores status; a status write ignores the spec.
    await kubectl("patch", "widget", "alpha", "--type=merge", "-p", '{"status":{"replicas":99}}')
    await kubectl(
        "patch",
        "widget",
        "alpha",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"spec":{"maxSegments":99}}',
    )
    obj = (await kubectl("get", "widget", "alpha", "-o", "json")).json()
    assert obj["status"]["replicas"] == 1
    assert obj["spec"]["maxSegments"] == 16
    assert obj["metadata"]["generation"] == 1

    await kubectl("patch", "widget", "alpha", "--type=merge", "-p", '{"spec":{"tags":["x"]}}')
    await kubectl(
        "patch",
        "widget",
        "alpha",
        "--type=json",
        "-p",
        '[{"op":"test","path":"/spec/tags/0","value":"x"},{"op":"add","path":"/spec/tags/-","value":"y"}]',
    )
    failed = await kubectl(
        "patch",
        "widget",
        "alpha",
        "--type=json",
        "-p",
        '[{"op":"test","path":"/spec/tags/0","value":"nope"}]',
        check=False,
    )
    assert failed.returncode != 0
    await kubectl("scale", "widget", "alpha", "--replicas=3")
    obj = (await kubectl("get", "widget", "alpha", "-o", "json")).json()
    assert obj["spec"]["tags"] == ["x", "y"]
    assert obj["spec"]["replicas"] == 3
    assert obj["metadata"]["generation"] == 4

    # Strategic merge patch is for built-ins only, as on a real server.
    smp = await kubectl("patch", "widget", "alpha", "-p", '{"spec":{"tags":["z"]}}', check=False)
    assert smp.returncode != 0 and "not supported" in smp.stderr

    await kubectl(
        "patch",
        "widget",
        "alpha",
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":["test.stopic.io/hold"]}}',
    )
    await kubectl("delete", "widget", "alpha", "--wait=false")
    held = (await kubectl("get", "widget", "alpha", "-o", "json")).json()
    assert held["metadata"]["deletionTimestamp"]
    deleter = asyncio.ensure_future(
        kubectl("wait", "--for=delete", "widget/alpha", "--timeout=30s", check=False)
    )
    await kubectl(
        "patch",
        "widget",
        "alpha",
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/metadata/finalizers"}]',
    )
    assert (await deleter).returncode == 0
    gone = await kubectl("get", "widget", "alpha", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


async def test_invalid_objects_are_rejected_with_the_field(kubectl: Kubectl) -> None:
    await _setup_crd(kubectl)
    bad = await kubectl(
        "apply", "-f", "-", input=_widget(initialSegments=0, mode="Bogus"), check=False
    )
    assert bad.returncode != 0
    assert 'The Widget "alpha" is invalid' in bad.stderr
    assert (
        "spec.initialSegments: Invalid value: 0: "
        "spec.initialSegments in body should be greater than or equal to 1" in bad.stderr
    )
    assert 'spec.mode: Unsupported value: "Bogus"' in bad.stderr

    cel = await kubectl("apply", "-f", "-", input=_widget(maxSegments=2), check=False)
    assert cel.returncode != 0
    assert (
        "spec.maxSegments: Invalid value" in cel.stderr
        and "maxSegments must be at least initialSegments" in cel.stderr
    )

    await kubectl("apply", "-f", str(FIXTURES / "widget.yaml"))
    immutable = await kubectl("apply", "-f", "-", input=_widget(initialSegments=5), check=False)
    assert immutable.returncode != 0
    assert (
        "spec.initialSegments: Invalid value" in immutable.stderr
        and "initialSegments is immutable" in immutable.stderr
    )


async def test_builtin_workloads_apply_scale_and_logs(
    local_cluster: LocalCluster, kubectl: Kubectl
) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "python:3.11",
                            "command": ["python", "-m", "http.server"],
                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        }
                    ]
                },
            },
        },
    }
    await kubectl("apply", "-f", "-", input=json.dumps(deployment))
    deployment["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"] = "3"  # type: ignore[index]
    out = await kubectl("apply", "-f", "-", input=json.dumps(deployment))
    assert "configured" in out.stdout
    got = (await kubectl("get", "deploy", "web", "-o", "json")).json()
    assert got["spec"]["template"]["spec"]["containers"][0]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "3"},
    ]
    assert got["metadata"]["generation"] == 2
    await kubectl("scale", "deployment/web", "--replicas=3")
    assert (await kubectl("get", "deploy", "web", "-o", "jsonpath={.spec.replicas}")).stdout == "3"
    header = (await kubectl("get", "deploy")).stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]

    await _pod_with_log(kubectl, local_cluster, "logger", "line one\nline two\nline three\n")
    pods = (await kubectl("get", "pods")).stdout.splitlines()
    assert pods[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert pods[1].split()[:4] == ["logger", "0/1", "Pending", "0"]
    assert (await kubectl("logs", "logger")).stdout == "line one\nline two\nline three\n"
    assert (await kubectl("logs", "logger", "--tail=1")).stdout == "line three\n"


async def test_namespace_deletion_removes_content(kubectl: Kubectl) -> None:
    await kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}}),
    )
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "doomed"},
        "data": {"a": "b"},
    }
    await kubectl("apply", "-f", "-", input=json.dumps(cm))
    await kubectl("delete", "namespace", "doomed", "--timeout=30s")
    gone = await kubectl("get", "namespace", "doomed", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    created = await kubectl("get", "configmap", "c", "-n", "doomed", check=False)
    assert "No resources found" in created.stderr or created.returncode != 0


@pytest.mark.skipif(not list((REPO / "crds").glob("*.yaml")), reason="no project CRDs yet")
async def test_project_crds_apply(kubectl: Kubectl) -> None:
    out = await kubectl("apply", "-f", str(REPO / "crds"))
    assert "created" in out.stdout
    crds = (await kubectl("get", "crd", "-o", "json")).json()["items"]
    assert {c["spec"]["group"] for c in crds} >= {"scalabletopics.io"}


def _topic(name: str, **spec: object) -> str:
    return json.dumps(
        {
            "apiVersion": "scalabletopics.io/v1alpha1",
            "kind": "ScalableTopic",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


async def test_project_crd_admission(kubectl: Kubectl) -> None:
    """What the ScalableTopic CRD rejects, through kubectl: a name too long to be the label
    value on its Segments, and initialSegments outside the topic's own min/maxSegments."""
    await kubectl("apply", "-f", str(REPO / "crds"))
    await kubectl(
        "wait",
        "--for=condition=Established",
        "crd/scalabletopics.scalabletopics.io",
        "--timeout=20s",
    )
    long_name = "t" * 64
    bad = await kubectl("apply", "-f", "-", input=_topic(long_name), check=False)
    assert bad.returncode != 0
    assert f'The ScalableTopic "{long_name}" is invalid' in bad.stderr
    assert "metadata.name: Too long: may not be more than 63 bytes" in bad.stderr
    await kubectl("apply", "-f", "-", input=_topic("t" * 63))

    above = _topic("above", initialSegments=5, autoScale={"maxSegments": 3})
    bad = await kubectl("apply", "-f", "-", input=above, check=False)
    assert bad.returncode != 0
    assert (
        'The ScalableTopic "above" is invalid: <nil>: Invalid value: "object": '
        "spec.initialSegments must be <= spec.autoScale.maxSegments" in bad.stderr
    ), bad.stderr
    below = _topic("below", initialSegments=2, autoScale={"minSegments": 4})
    bad = await kubectl("apply", "-f", "-", input=below, check=False)
    assert bad.returncode != 0
    assert "spec.initialSegments must be >= spec.autoScale.minSegments" in bad.stderr
    # Bounds the topic does not set come from its namespace: the operator decides.
    await kubectl("apply", "-f", "-", input=_topic("above", initialSegments=5))
    # Once the topic has a status (the operator saw it), maxSegments may go below it.
    await kubectl(
        "patch",
        "stopic",
        "above",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"activeSegments": 5}}',
    )
    await kubectl("apply", "-f", "-", input=above)


async def test_follow_logs_and_watch_tables(local_cluster: LocalCluster, kubectl: Kubectl) -> None:
    log_path = await _pod_with_log(kubectl, local_cluster, "chatty", "first\n")
    store = local_cluster.store
    assert store is not None

    watcher = asyncio.ensure_future(
        kubectl("get", "pods", "-w", "--request-timeout=5s", check=False)
    )
    await eventually(lambda: store.watcher_count("/pods") > 0)
    url = f"{local_cluster.url}/api/v1/namespaces/default/pods/chatty/log?follow=true"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        assert await resp.content.readline() == b"first\n"
        with log_path.open("a") as fh:
            fh.write("second\n")
        assert await asyncio.wait_for(resp.content.readline(), 30) == b"second\n"
        await kubectl("label", "pod", "chatty", "seen=yes")
        await kubectl("delete", "pod", "chatty")
        assert await asyncio.wait_for(resp.content.read(), 30) == b"", (
            "the stream ends with the pod"
        )
    followed = await kubectl("logs", "chatty", check=False)
    assert "NotFound" in followed.stderr

    watched = (await asyncio.wait_for(watcher, 30)).stdout.splitlines()
    assert watched[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert len([line for line in watched[1:] if line.startswith("chatty")]) >= 3


async def test_kubectl_create_generators_send_protobuf(kubectl: Kubectl) -> None:
    await kubectl("create", "namespace", "gen")
    await kubectl(
        "create", "configmap", "c", "-n", "gen", "--from-literal=a=b", "--from-literal=c=d"
    )
    await kubectl("create", "secret", "generic", "s", "-n", "gen", "--from-literal=pw=hunter2")
    await kubectl("create", "serviceaccount", "bot", "-n", "gen")
    cm = (await kubectl("get", "configmap", "c", "-n", "gen", "-o", "json")).json()
    assert cm["data"] == {"a": "b", "c": "d"}
    secret = (await kubectl("get", "secret", "s", "-n", "gen", "-o", "json")).json()
    assert secret["type"] == "Opaque"
    assert base64.b64decode(secret["data"]["pw"]) == b"hunter2"
    assert (
        await kubectl("get", "sa", "bot", "-n", "gen", "-o", "name")
    ).stdout.strip() == "serviceaccount/bot"
    unsupported = await kubectl("create", "deployment", "d", "--image=x", "-n", "gen", check=False)
    assert unsupported.returncode != 0 and "not supported" in unsupported.stderr
