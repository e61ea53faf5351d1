"""Loopback only (issue 21, item 3): after ``make run``'s demo has produced and consumed, no
socket of the local cluster's processes (the four control plane components, our kubelet, the
operator's and brokers' Pods) is connected to, or listening on, an address outside 127.0.0.0/8;
the components' environment is scrubbed of an enclosing cluster's and of proxies, and the Pods
reach the API server in-cluster at ``KUBERNETES_SERVICE_HOST=127.0.0.1`` and its port.

The test's own environment (that of ``make run``'s terminal, which the kubelet inherits) names a
proxy, an in-cluster API server and a kubeconfig on 10.x addresses, so any of them leaking into
a component or a Pod would show. ``NO_PROXY`` keeps the test's own API client direct."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml

from scalable_topics.cli.demo import Demo
from scalable_topics.kubeapi import api_client
from scalable_topics.localcluster.cluster import LocalCluster
from scalable_topics.localcluster.controlplane import COMPONENTS

from .conftest import eventually

pytestmark = pytest.mark.integration

LEAKED_ENV = {
    "HTTPS_PROXY": "http://10.255.0.1:3128",
    "http_proxy": "http://10.255.0.1:3128",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBECONFIG": "/nonexistent/enclosing-cluster.kubeconfig",
    "NO_PROXY": "127.0.0.1,localhost",
}
_LISTEN = "0A"


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of ``/proc/net/tcp{,6}``: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return ipaddress.ip_address(socket.inet_ntop(family, swapped))


def _loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def sockets(pid: int) -> list[tuple[str, str, str, str]]:
    """(table, local, remote, state) of every TCP and UDP socket process ``pid`` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                found.append((table, fields[1], fields[2], fields[3]))
    return found


def outside_loopback(pid: int) -> list[str]:
    """Sockets of ``pid`` connected to (or, listening, bound to) a non-loopback address."""
    bad = []
    for table, local, remote, state in sockets(pid):
        local_ip, remote_ip = _address(local.split(":")[0]), _address(remote.split(":")[0])
        if state == _LISTEN or remote_ip.is_unspecified:
            if not _loopback(local_ip):
                bad.append(f"{table} bound to {local_ip}")
        elif not _loopback(remote_ip):
            bad.append(f"{table} {local_ip} -> {remote_ip}")
    return bad


def kubeconfig_user(path: Path) -> dict[str, str]:
    """The credentials of the kubeconfig's (only) user."""
    config = yaml.safe_load(path.read_text())
    [user] = config["users"]
    return dict(user["user"])


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if b"=" in item)


async def test_nothing_of_the_cluster_leaves_loopback_after_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in LEAKED_ENV.items():
        monkeypatch.setenv(key, value)
    data = tmp_path / "run"
    async with LocalCluster(data, stop_grace=0.5) as cluster:
        demo = Demo(data, phase_timeout=120, kubeconfig=cluster.kubeconfig)
        demo.kubectl_path = cluster.kubectl
        api = await api_client(str(cluster.kubeconfig))
        producer: asyncio.Task[None] | None = None
        consumer: asyncio.Task[None] | None = None
        stop_consumer = asyncio.Event()
        try:
            service_url = await demo.start_stack(api)
            # Authentication is on (overlays/local-secure): the clients present demo-client's
            # token.
            await demo.client_credentials(api)
            await demo.fresh_topic(api)
            demo.rate = 200.0
            producer = asyncio.create_task(demo.produce(service_url))
            consumer = asyncio.create_task(demo.consume(service_url, "loopback", stop_consumer))
            await eventually(lambda: demo.acked >= 500 and demo.consumed >= 200, within=120)
            # ... and nobody without a token gets anything.
            dag = f"{service_url}/v1/topics/default/orders/dag"
            async with aiohttp.ClientSession() as anonymous, anonymous.get(dag) as response:
                assert response.status == 401, await response.text()

            pids = cluster.pids
            components = {name: pids[name] for name in COMPONENTS}
            pods = {name: pid for name, pid in pids.items() if name not in COMPONENTS}
            operators = [pid for name, pid in pods.items() if "/scalable-topics-operator-" in name]
            brokers = [pid for name, pid in pods.items() if "/segment-broker-" in name]
            assert len(operators) == 2 and len(brokers) == 3, pods

            everyone = {**pids, "kubelet (this process)": os.getpid()}
            bad = {name: outside_loopback(pid) for name, pid in everyone.items()}
            assert not {name: b for name, b in bad.items() if b}, bad
            # The check reads real connections: the API server has clients, every Pod a
            # connection to it (watches, leases, status writes).
            for pid in [components["kube-apiserver"], *operators, *brokers]:
                assert any(state == "01" for _, _, _, state in sockets(pid)), pid

            port = str(urlsplit(cluster.url).port)
            for name, pid in components.items():
                env = environ(pid)
                assert not set(env) & set(LEAKED_ENV), (name, sorted(set(env) & set(LEAKED_ENV)))
            for pid in operators + brokers:
                env = environ(pid)
                assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
                assert env["KUBERNETES_SERVICE_PORT"] == port
                assert not set(env) & {"HTTPS_PROXY", "http_proxy", "NO_PROXY"}, env
                # In-cluster credentials: the Pod's own ServiceAccount token, not a copy of
                # the admin kubeconfig.
                kubeconfig = Path(env["KUBECONFIG"])
                assert kubeconfig.parent.parent.parent == data / "pods"
                user = kubeconfig_user(kubeconfig)
                assert set(user) == {"tokenFile"}, user
                assert Path(user["tokenFile"]).is_relative_to(kubeconfig.parent), user
        finally:
            demo.stop.set()
            stop_consumer.set()
            tasks = [t for t in (producer, consumer) if t is not None]
            await asyncio.gather(*tasks, return_exceptions=True)
            await api.close()
