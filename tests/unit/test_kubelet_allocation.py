"""Pod address allocation on loopback (the kubelet's IPAllocator)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from scalable_topics.localcluster import kubelet as kubelet_module
from scalable_topics.localcluster.kubelet import IPAllocator


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


def test_a_running_node_claims_its_subnet_machine_wide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clusters that drew (or stored) the same subnet: the second to claim it draws another,
    its stored addresses dropped; once the first releases, the subnet can be claimed again."""
    first = IPAllocator(tmp_path / "a.json", subnet="127.9.7")
    second_path = tmp_path / "b.json"
    second_path.write_text(json.dumps({"subnet": "127.9.7", "pods": {"ns/p": {"ip": "127.9.7.2"}}}))
    second = IPAllocator(second_path)
    assert second.subnet == "127.9.7"
    first.claim()
    try:
        monkeypatch.setattr(kubelet_module, "_random_subnet", lambda: "127.9.6")
        second.claim()
        try:
            assert second.subnet == "127.9.6" and second.get("ns/p") is None
            assert json.loads(second_path.read_text())["subnet"] == "127.9.6"
            first.claim()  # idempotent while held
            assert first.subnet == "127.9.7"
        finally:
            second.release_claim()
    finally:
        first.release_claim()
    third = IPAllocator(tmp_path / "c.json", subnet="127.9.7")
    third.claim()
    third.release_claim()
    assert third.subnet == "127.9.7"
