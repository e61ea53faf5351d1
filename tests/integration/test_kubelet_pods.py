"""Bare pods on the embedded kubelet: init containers, ConfigMaps/Secrets, probes, deletion."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from scalable_topics.localcluster.restclient import CONFIGMAPS, PODS, SECRETS

from .kubelet_harness import Harness, JsonObj, eventually, free_port, running_cluster

pytestmark = pytest.mark.integration

NS = "default"


def pod(name: str, spec: JsonObj) -> JsonObj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


async def phase_is(h: Harness, name: str, phase: str) -> JsonObj:
    async def probe() -> JsonObj | None:
        p = await h.pod(NS, name)
        return p if p and p["status"].get("phase") == phase else None

    return await eventually(probe, what=f"pod {name} {phase}")


async def test_init_containers_config_and_volumes(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        await h.client.create(
            CONFIGMAPS,
            NS,
            {"metadata": {"name": "app"}, "data": {"greeting": "hello", "app.conf": "mode=fast\n"}},
        )
        await h.client.create(
            SECRETS,
            NS,
            {
                "metadata": {"name": "creds"},
                "data": {"token": base64.b64encode(b"s3cret").decode()},
            },
        )
        main = (
            "import os, pathlib; "
            "print(os.environ['GREETING'], os.environ['TOKEN'], os.environ['CFG_greeting']); "
            "print(pathlib.Path('/etc/app/app.conf').read_text().strip()); "
            "print(pathlib.Path('/work/init.txt').read_text().strip()); "
            "print(os.environ['LOCALCLUSTER_MOUNT_SCRATCH'] == os.getcwd())"
        )
        spec = {
            "restartPolicy": "Never",
            "initContainers": [
                {
                    "name": "init",
                    "command": [
                        "python",
                        "-c",
                        "import sys; open(sys.argv[1], 'w').write('from init')",
                    ],
                    "args": ["/work/init.txt"],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/work"}],
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "command": ["python3", "-c", main],
                    "workingDir": "/work",
                    "env": [
                        {
                            "name": "GREETING",
                            "valueFrom": {"configMapKeyRef": {"name": "app", "key": "greeting"}},
                        },
                        {
                            "name": "TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}},
                        },
                    ],
                    "envFrom": [{"configMapRef": {"name": "app"}, "prefix": "CFG_"}],
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/work"},
                        {"name": "config", "mountPath": "/etc/app", "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "config", "configMap": {"name": "app"}},
            ],
        }
        await h.client.create(PODS, NS, pod("feature", spec))
        done = await phase_is(h, "feature", "Succeeded")
        init = done["status"]["initContainerStatuses"][0]
        assert init["state"]["terminated"]["reason"] == "Completed"
        log = (h.data_dir / "pods" / NS / "feature" / "main.log").read_text().splitlines()
        assert log == ["hello s3cret hello", "mode=fast", "from init", "True"]
        conditions = {c["type"]: c["status"] for c in done["status"]["conditions"]}
        assert conditions["Initialized"] == "True" and conditions["Ready"] == "False"


async def test_missing_configmap_blocks_until_created(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        spec = {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "command": ["python", "-c", "import os; print(os.environ['V'])"],
                    "env": [
                        {
                            "name": "V",
                            "valueFrom": {"configMapKeyRef": {"name": "late", "key": "v"}},
                        }
                    ],
                }
            ],
        }
        await h.client.create(PODS, NS, pod("waiter", spec))

        async def blocked() -> bool:
            p = await h.pod(NS, "waiter")
            statuses = (p or {}).get("status", {}).get("containerStatuses") or [{}]
            waiting = statuses[0].get("state", {}).get("waiting") or {}
            return waiting.get("reason") == "CreateContainerConfigError"

        await eventually(blocked, what="CreateContainerConfigError")
        await h.client.create(
            CONFIGMAPS, NS, {"metadata": {"name": "late"}, "data": {"v": "arrived"}}
        )
        await phase_is(h, "waiter", "Succeeded")
        assert (h.data_dir / "pods" / NS / "waiter" / "main.log").read_text() == "arrived\n"


async def test_failing_liveness_probe_restarts_the_container(tmp_path: Path) -> None:
    port = free_port()
    async with running_cluster(tmp_path) as h:
        spec = {
            "containers": [
                {
                    "name": "main",
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                    "livenessProbe": {
                        "tcpSocket": {"port": port},
                        "periodSeconds": 1,
                        "failureThreshold": 1,
                    },
                }
            ],
            "terminationGracePeriodSeconds": 1,
        }
        await h.client.create(PODS, NS, pod("unhealthy", spec))

        async def restarted() -> JsonObj | None:
            p = await h.pod(NS, "unhealthy")
            statuses = (p or {}).get("status", {}).get("containerStatuses") or [{}]
            return p if statuses[0].get("restartCount", 0) >= 1 else None

        p = await eventually(restarted, what="liveness restart")
        assert p["status"]["phase"] == "Running"


async def test_graceful_deletion_sends_sigterm_first(tmp_path: Path) -> None:
    marker = tmp_path / "got-sigterm"
    code = (
        "import signal, sys, time, pathlib\n"
        "def bye(*_):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('bye')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('up', flush=True)\n"
        "time.sleep(3600)\n"
    )
    async with running_cluster(tmp_path) as h:
        spec = {"containers": [{"name": "main", "command": ["python", "-c", code]}]}
        await h.client.create(PODS, NS, pod("polite", spec))
        log = h.data_dir / "pods" / NS / "polite" / "main.log"

        async def up() -> bool:
            return log.exists() and "up" in log.read_text()

        await eventually(up, what="process up")
        await h.client.delete(PODS, NS, "polite")

        async def gone() -> bool:
            return await h.pod(NS, "polite") is None

        await eventually(gone, what="pod deleted")
        assert marker.read_text() == "bye"


async def test_exec_readiness_probe_and_projected_volume(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        await h.client.create(CONFIGMAPS, NS, {"metadata": {"name": "proj"}, "data": {"k": "v"}})
        probe = "import os, sys; sys.exit(0 if os.path.exists('/flags/ready') else 1)"
        spec = {
            "containers": [
                {
                    "name": "main",
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                    "readinessProbe": {
                        "exec": {"command": ["python", "-c", probe]},
                        "periodSeconds": 1,
                        "failureThreshold": 1,
                    },
                    "volumeMounts": [
                        {"name": "flags", "mountPath": "/flags"},
                        {"name": "meta", "mountPath": "/etc/meta"},
                    ],
                }
            ],
            "volumes": [
                {"name": "flags", "emptyDir": {}},
                {
                    "name": "meta",
                    "projected": {
                        "sources": [
                            {
                                "configMap": {
                                    "name": "proj",
                                    "items": [{"key": "k", "path": "cm/k"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}
                                    ]
                                }
                            },
                        ]
                    },
                },
            ],
        }
        await h.client.create(PODS, NS, pod("gated", spec))
        flags = h.data_dir / "pods" / NS / "gated" / "volumes" / "flags"
        meta = h.data_dir / "pods" / NS / "gated" / "volumes" / "meta"

        async def running_unready() -> JsonObj | None:
            p = await h.pod(NS, "gated")
            if not p or p["status"].get("phase") != "Running":
                return None
            conditions = {c["type"]: c["status"] for c in p["status"].get("conditions") or []}
            return p if conditions.get("Ready") == "False" else None

        await eventually(running_unready, what="running but not ready")
        assert (meta / "cm" / "k").read_text() == "v"
        assert (meta / "name").read_text() == "gated"
        (flags / "ready").touch()

        async def ready() -> bool:
            p = await h.pod(NS, "gated")
            conditions = {
                c["type"]: c["status"] for c in (p or {}).get("status", {}).get("conditions") or []
            }
            return conditions.get("Ready") == "True"

        await eventually(ready, what="ready after the flag file appears")
        (flags / "ready").unlink()
        await eventually(lambda: running_unready(), what="unready again")


async def test_startup_probe_gates_readiness(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        check = "import os, sys; sys.exit(0 if os.path.exists('/flags/started') else 1)"
        spec = {
            "containers": [
                {
                    "name": "main",
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                    "startupProbe": {
                        "exec": {"command": ["python", "-c", check]},
                        "periodSeconds": 1,
                        "failureThreshold": 60,
                    },
                    "volumeMounts": [{"name": "flags", "mountPath": "/flags"}],
                }
            ],
            "volumes": [{"name": "flags", "emptyDir": {}}],
        }
        await h.client.create(PODS, NS, pod("slow-start", spec))

        async def container(started: bool, ready: bool) -> bool:
            p = await h.pod(NS, "slow-start")
            statuses = (p or {}).get("status", {}).get("containerStatuses") or [{}]
            cs = statuses[0]
            return bool(cs.get("state", {}).get("running")) and (
                cs.get("started"),
                cs.get("ready"),
            ) == (started, ready)

        await eventually(lambda: container(False, False), what="running, not started")
        flags = h.data_dir / "pods" / NS / "slow-start" / "volumes" / "flags"
        (flags / "started").touch()
        await eventually(lambda: container(True, True), what="started and ready")
