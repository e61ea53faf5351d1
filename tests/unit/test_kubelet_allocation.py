"""Pod address allocation and the small pure helpers of the workload controllers."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scalable_topics.localcluster import kubelet as kubelet_module
from scalable_topics.localcluster.kubelet import IPAllocator
from scalable_topics.localcluster.restclient import PODS, Informer, RestClient
from scalable_topics.localcluster.workloads import (
    ControllerManager,
    Expectations,
    merge_condition,
    template_hash,
)


def test_addresses_are_unique_and_persisted(tmp_path: Path) -> None:
    path = tmp_path / "ips.json"
    alloc = IPAllocator(path, subnet="127.9.8")
    a = alloc.allocate("ns/web-0", sticky=True, live_keys=set())
    b = alloc.allocate("ns/api-x", sticky=False, live_keys=set())
    assert a == "127.9.8.2" and b == "127.9.8.3"
    assert alloc.allocate("ns/web-0", sticky=True, live_keys=set()) == a
    reloaded = IPAllocator(path)
    assert reloaded.subnet == "127.9.8"
    assert reloaded.get("ns/web-0") == a and reloaded.get("ns/api-x") == b


def test_each_cluster_draws_its_own_loopback_subnet(tmp_path: Path) -> None:
    first = IPAllocator(tmp_path / "a.json")
    second = IPAllocator(tmp_path / "b.json")
    assert first.subnet.startswith("127.") and not first.subnet.startswith("127.0.")
    assert IPAllocator(tmp_path / "a.json").subnet == first.subnet, "kept across restarts"
    subnets = {IPAllocator(tmp_path / f"{i}.json").subnet for i in range(20)}
    assert len(subnets | {second.subnet}) > 1, "subnets are drawn at random"


def test_pod_subnets_avoid_the_service_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real control plane's ClusterIPs are 127.16.0.0/16: a draw landing there is redrawn,
    and a subnet stored there before is replaced (its entries with it)."""
    draws = iter([15, 0, 4, 7])  # 127.16.0 first, then 127.5.7
    monkeypatch.setattr(secrets, "randbelow", lambda _: next(draws))
    assert IPAllocator(tmp_path / "a.json").subnet == "127.5.7"
    stale = tmp_path / "b.json"
    stale.write_text(json.dumps({"subnet": "127.16.3", "pods": {"ns/p": {"ip": "127.16.3.2"}}}))
    monkeypatch.setattr(kubelet_module, "_random_subnet", lambda: "127.9.9")
    replaced = IPAllocator(stale)
    assert replaced.subnet == "127.9.9" and replaced.get("ns/p") is None
    assert json.loads(stale.read_text())["subnet"] == "127.9.9"


def test_sticky_addresses_survive_release(tmp_path: Path) -> None:
    alloc = IPAllocator(tmp_path / "ips.json")
    web = alloc.allocate("ns/web-0", sticky=True, live_keys=set())
    api = alloc.allocate("ns/api-x", sticky=False, live_keys=set())
    alloc.release("ns/web-0")
    alloc.release("ns/api-x")
    assert alloc.get("ns/web-0") == web
    assert alloc.get("ns/api-x") is None
    assert alloc.allocate("ns/other", sticky=False, live_keys=set()) == api


def test_exhausted_pool_reclaims_sticky_addresses_of_absent_pods(tmp_path: Path) -> None:
    alloc = IPAllocator(tmp_path / "ips.json", first=2, last=3)
    old = alloc.allocate("ns/db-0", sticky=True, live_keys=set())
    live = alloc.allocate("ns/db-1", sticky=True, live_keys=set())
    assert alloc.allocate("ns/x", sticky=False, live_keys={"ns/db-0", "ns/db-1"}) is None
    assert alloc.allocate("ns/x", sticky=False, live_keys={"ns/db-1"}) == old
    assert alloc.get("ns/db-0") is None and alloc.get("ns/db-1") == live


def test_template_hash_is_stable_and_sensitive() -> None:
    t1 = {"metadata": {"labels": {"a": "1"}}, "spec": {"containers": [{"name": "c"}]}}
    t2 = {"spec": {"containers": [{"name": "c"}]}, "metadata": {"labels": {"a": "1"}}}
    t3 = {"metadata": {"labels": {"a": "2"}}, "spec": {"containers": [{"name": "c"}]}}
    assert template_hash(t1) == template_hash(t2)
    assert template_hash(t1) != template_hash(t3)
    assert len(template_hash(t1)) == 10


def test_expectations_cover_unobserved_creates_and_deletes() -> None:
    e = Expectations()
    e.expect_create("owner", "p-1")
    assert e.pending_creates("owner", seen=set()) == {"p-1"}
    assert e.pending_creates("owner", seen={"p-1"}) == set()
    e.expect_delete("owner", "p-2")
    assert e.pending_deletes("owner", still_live={"p-2"}) == {"p-2"}
    assert e.pending_deletes("owner", still_live=set()) == set()


def test_condition_transition_time_only_moves_on_change() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    t1 = datetime(2026, 1, 2, tzinfo=UTC)
    first = merge_condition([], "Available", True, "R", "m", t0)
    same = merge_condition([first], "Available", True, "R", "m", t1)
    flipped = merge_condition([same], "Available", False, "R", "m", t1)
    assert same["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert flipped["lastTransitionTime"] == "2026-01-02T00:00:00Z"


def failed_pod(finished: str) -> dict[str, object]:
    return {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": 1, "finishedAt": finished}}}
            ],
        }
    }


def test_job_pod_failure_backoff_doubles_from_the_last_failure() -> None:
    client = RestClient("http://127.0.0.1:1", "token")
    cm = ControllerManager(client, Informer(client, PODS), job_backoff_base=10, job_backoff_cap=360)
    pods = [failed_pod("2026-01-01T00:00:00Z"), failed_pod("2026-01-01T00:01:00Z")]
    at = datetime(2026, 1, 1, 0, 1, 5, tzinfo=UTC)
    assert cm.job_backoff_left(pods, failed=2, now=at) == 15.0  # 20 s after 00:01:00
    assert cm.job_backoff_left(pods, failed=1, now=at) == 5.0
    assert cm.job_backoff_left(pods, failed=9, now=at) == 355.0  # capped at 6 min
    assert cm.job_backoff_left(pods, failed=0, now=at) == 0.0
    later = datetime(2026, 1, 1, 1, 0, 0, tzinfo=UTC)
    assert cm.job_backoff_left(pods, failed=2, now=later) == 0.0
