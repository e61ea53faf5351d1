"""End to end on a Kubernetes cluster where Scalable Topics is deployed, with ``kubectl`` only.

Only ``kubectl`` is used, as a platform team would: the test needs no network path to pods, so
it runs from a laptop or a CI runner outside the cluster. Everything happens in a fresh namespace
that is deleted at the end. The cluster is ``conftest.deployed_cluster``'s: inside ``make test``
the local control plane (``stopic local up`` + ``kubectl apply`` of the CRDs and the local
overlay); a cluster of your own (kind, k3d, a real one, with ``make deploy`` done) when
``SCALABLE_TOPICS_E2E_KUBECONFIG`` names its kubeconfig:

    SCALABLE_TOPICS_E2E_KUBECONFIG=/path/kubeconfig .venv/bin/pytest tests/e2e
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .conftest import TIMEOUT, DeployedCluster

pytestmark = pytest.mark.e2e


class Kubectl:
    def __init__(self, kubeconfig: str, namespace: str, binary: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.binary = binary

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [self.binary, "--kubeconfig", self.kubeconfig, "-n", self.namespace, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr or result.stdout}")
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))


def eventually(what: str, probe: Callable[[], Any], within: float = TIMEOUT) -> Any:
    """Poll ``probe`` until it returns something truthy; the last value is in the failure."""
    deadline = time.monotonic() + within
    value: Any = None
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out after {within:.0f}s waiting for {what}; last: {value!r}")


@pytest.fixture(scope="module")
def kubectl(deployed_cluster: DeployedCluster) -> Iterator[Kubectl]:
    namespace = f"stopic-e2e-{uuid.uuid4().hex[:6]}"
    run = Kubectl(str(deployed_cluster.kubeconfig), namespace, deployed_cluster.kubectl)
    run("create", "namespace", namespace)
    try:
        yield run
    finally:
        run("delete", "namespace", namespace, "--wait=false", check=False)


TOPIC = """
apiVersion: scalabletopics.io/v1alpha1
kind: ScalableTopic
metadata:
  name: e2e
spec:
  initialSegments: 2
  subscriptions:
    - name: billing
      type: Stream
  autoScale:
    mode: recommend
"""


def topic(kubectl: Kubectl) -> dict[str, Any]:
    body: dict[str, Any] = kubectl.json("get", "scalabletopic", "e2e")
    return body


def request_done(kubectl: Kubectl, request_id: str) -> dict[str, Any] | None:
    status = topic(kubectl).get("status") or {}
    last = status.get("lastRequest") or {}
    return status if last.get("id") == request_id else None


def run_request(kubectl: Kubectl, request_id: str, op: str, segments: list[int]) -> dict[str, Any]:
    """Apply a ``scalabletopics.io/request`` and return the status once it Succeeded."""
    request = json.dumps({"id": request_id, "op": op, "segments": segments})
    kubectl(
        "annotate", "scalabletopic", "e2e", f"scalabletopics.io/request={request}", "--overwrite"
    )
    status: dict[str, Any] = eventually(op, lambda: request_done(kubectl, request_id))
    assert status["lastRequest"]["result"] == "Succeeded", status["lastRequest"]
    return status


def test_topic_lifecycle_split_merge_delete(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=TOPIC)
    kubectl("wait", "--for=condition=Ready", "scalabletopic/e2e", f"--timeout={TIMEOUT:.0f}s")
    status = topic(kubectl)["status"]
    assert status["epoch"] == 0 and status["activeSegments"] == 2

    status = run_request(kubectl, "e2e-split", "split", [0])
    assert status["epoch"] == 1 and status["activeSegments"] == 3

    def segment_states() -> dict[int, str]:
        items = kubectl.json("get", "segments", "-l", "scalabletopics.io/topic=e2e")["items"]
        return {
            int(s["spec"]["segmentId"]): (s.get("status") or {}).get("state", "") for s in items
        }

    after_split = {0: "Sealed", 1: "Active", 2: "Active", 3: "Active"}
    eventually("Segments matching the DAG", lambda: segment_states() == after_split)
    described = kubectl("describe", "scalabletopic", "e2e")
    assert "#0 0000-7fff -> #2 0000-3fff, #3 4000-7fff" in described, described
    assert "Split" in described

    status = run_request(kubectl, "e2e-merge", "merge", [2, 3])
    assert status["epoch"] == 2 and status["activeSegments"] == 2

    kubectl("delete", "scalabletopic", "e2e", f"--timeout={TIMEOUT:.0f}s")
    eventually(
        "the Segments to be gone",
        lambda: not kubectl.json("get", "segments", "-l", "scalabletopics.io/topic=e2e")["items"],
    )
