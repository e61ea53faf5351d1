"""Operator scale: N topics reconciled by one operator replica, and its API writes at rest.

The local cluster (the real control plane and our kubelet, ``LocalCluster``) runs;
``kubectl apply -k manifests/overlays/local``
starts three broker pods and the operator Deployment, scaled to one replica with the operator's
default Lease timings and resync interval (``DEFAULT_ARGS``); the recommender's CronJob is
suspended. N ScalableTopics with two segments each are created through the API at once; the
figure is the time from the first create until every topic is ``Ready`` (each one: finalizer,
initial layout, two Segment resources placed on brokers, two segments created on their brokers,
status written).

Then the topics are left alone for a window that covers at least two full resync passes of the
operator (every topic re-reconciled) and the writes the API server receives are counted. The
``resourceVersion`` is etcd's revision, bumped by every write of every client (the
controller-manager and the kubelet's node heartbeats included), so its delta is the number of
writes; a watch per resource attributes them (topics, Segments, Leases, Events, Pods).

    python -m bench.run --only operator [--quick]
    python -m bench.operator [--topics 1000] [--window 70]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench._procs import cpu_by_role
from bench._scratch import scratch_root
from bench.report import Report, Section

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "scalable-topics"
TOPIC_NAMESPACE = "bench"
TARGET_TOPICS = 1000
TARGET_SECONDS = {1000: 60.0, 10000: 300.0}
"""Seconds until every topic is Ready, per topic count that has a target (issue 17: 10,000 in
five minutes); a run of another count reports its figures without one."""
SEGMENTS_PER_TOPIC = 2
RSS = "process_resident_memory_bytes"
DEFAULT_ARGS = ("--lease-duration", "--renew-deadline", "--retry-period", "--resync-interval")
"""Flags of the local overlay's operator that the benchmark drops, so that the operator runs with
its own defaults, as the base manifests deploy it. The overlay's Lease timings (6/4/1 s instead of
15/10/2 s) make fail-over tests fast: at 10,000 topics on two cores the API server answers a
renewal in seconds, and losing the Lease restarts every topic's work. Its resync every 30 s
(instead of 60 s) makes tests that wait for a periodic pass fast: at 10,000 topics it is a pass
over 330 topics a second (the operator at rest used 0.29 of a core with it, 0.24 without)."""
CPU_ROLES = {
    "kube-apiserver": "kube-apiserver",
    "etcd": "etcd ",
    "operator": "scalable_topics.controller",
    "brokers": "segment_broker",
    "kube-controller-manager": "kube-controller-manager",
    "kube-scheduler": "kube-scheduler",
    "bench (creates, watch, kubelet)": "bench.",
}
"""Where the cores go while the topics become Ready: the role of a process is the first whose
text its command line contains (``_procs.cpu_by_role``)."""
RESYNC_SECONDS = 60.0
"""The operator's default ``--resync-interval`` (``ControllerSettings.resync_interval``)."""


async def _kubectl(kubectl: Path, kubeconfig: Path, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(kubeconfig.parent)}
    proc = await asyncio.create_subprocess_exec(
        str(kubectl),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"kubectl {' '.join(args)}: {err.decode()}")
    return out.decode()


async def _until(probe: Any, within: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {within}s")
        await asyncio.sleep(interval)


def _ready(topic: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (topic.get("status") or {}).get("conditions") or []
    )


async def measure(topics: int, window: float, work: Path) -> dict[str, Any]:
    from scalable_topics.localcluster.cluster import LocalCluster
    from scalable_topics.localcluster.restclient import PODS, Resource, client_from_kubeconfig

    topics_res = Resource("scalabletopics.io", "v1alpha1", "scalabletopics")
    segments_res = Resource("scalabletopics.io", "v1alpha1", "segments")
    deployments = Resource("apps", "v1", "deployments")
    cronjobs = Resource("batch", "v1", "cronjobs")
    namespaces = Resource("", "v1", "namespaces")

    result: dict[str, Any] = {"topics": topics}
    async with LocalCluster(work / "cluster", kubelet=True) as cluster:
        api = client_from_kubeconfig(cluster.kubeconfig)
        try:
            kubectl = cluster.kubectl
            await _kubectl(kubectl, cluster.kubeconfig, "apply", "-f", str(REPO / "crds"))
            await _kubectl(
                kubectl,
                cluster.kubeconfig,
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=60s",
            )
            overlay = REPO / "manifests" / "overlays" / "local"
            await _kubectl(kubectl, cluster.kubeconfig, "apply", "-k", str(overlay))
            operator = await api.get(deployments, NAMESPACE, "scalable-topics-operator")
            pod_spec = operator["spec"]["template"]["spec"]
            for container in pod_spec["containers"]:
                container["args"] = [
                    arg
                    for arg in container.get("args", [])
                    if arg.split("=", 1)[0] not in DEFAULT_ARGS
                ]
            template = {"spec": {"containers": pod_spec["containers"]}}
            await api.patch(
                deployments,
                NAMESPACE,
                "scalable-topics-operator",
                {"spec": {"replicas": 1, "template": template}},
            )
            # The recommender's Spark job (every 10 minutes, executors as Pods) would share the
            # two cores with what is measured; it has a benchmark of its own.
            await api.patch(
                cronjobs, NAMESPACE, "scalable-topics-recommender", {"spec": {"suspend": True}}
            )

            async def pods_ready() -> bool:
                items, _ = await api.list(PODS, NAMESPACE)
                ready = [
                    p
                    for p in items
                    if not p["metadata"].get("deletionTimestamp")
                    and any(
                        c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (p.get("status") or {}).get("conditions") or []
                    )
                ]
                return len(ready) == 4 and len(items) == 4

            await _until(pods_ready, 120, "3 brokers and 1 operator ready")
            result["operator_rss_at_rest"] = (await _operator_metrics(api))[RSS]
            created = await api.create(namespaces, None, {"metadata": {"name": TOPIC_NAMESPACE}})
            ready_within = max(900.0, topics * 0.15)
            ready: set[str] = set()
            all_ready = asyncio.Event()

            async def watch_ready() -> None:
                # A watch, not a polled list: listing 1,000 topics every half second would load
                # the API server as much as the operator does.
                since = str(created["metadata"]["resourceVersion"])
                async for _etype, obj in api.watch(
                    topics_res, since, timeout_seconds=int(ready_within)
                ):
                    name = str((obj.get("metadata") or {}).get("name", ""))
                    if name.startswith("t-") and _ready(obj) and name not in ready:
                        ready.add(name)
                        if len(ready) % max(1, topics // 10) == 0:
                            timeline.append((time.monotonic() - started, len(ready)))
                        if len(ready) == topics:
                            all_ready.set()
                            return

            cpu_before = cpu_by_role(CPU_ROLES)
            requests_before = await _api_requests(kubectl, cluster.kubeconfig)
            timeline: list[tuple[float, int]] = []
            """(seconds since the first create, topics Ready) at every tenth of the topics."""
            started = time.monotonic()
            watcher = asyncio.create_task(watch_ready())

            for i in range(topics):
                await api.create(
                    topics_res,
                    TOPIC_NAMESPACE,
                    {
                        "apiVersion": "scalabletopics.io/v1alpha1",
                        "kind": "ScalableTopic",
                        "metadata": {"name": f"t-{i:04d}"},
                        "spec": {
                            "initialSegments": SEGMENTS_PER_TOPIC,
                            "subscriptions": [{"name": "s", "type": "Stream"}],
                            # Idle topics older than the merge window (5 min) would merge
                            # their two cold segments: a 10,000-topic run lasts longer.
                            "autoScale": {"minSegments": SEGMENTS_PER_TOPIC},
                        },
                    },
                )
            result["create_seconds"] = time.monotonic() - started

            try:
                await asyncio.wait_for(all_ready.wait(), ready_within)
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            result["ready_seconds"] = time.monotonic() - started
            cpu_after = cpu_by_role(CPU_ROLES)
            requests_after = await _api_requests(kubectl, cluster.kubeconfig)
            result["api_requests"] = _requests_between(requests_before, requests_after)
            result["cpu_seconds"] = _cpu_between(cpu_before, cpu_after)
            result["ready_timeline"] = timeline
            items, _ = await api.list(topics_res, TOPIC_NAMESPACE)
            assert sum(1 for t in items if _ready(t)) == topics
            items, _ = await api.list(segments_res, TOPIC_NAMESPACE)
            result["segments"] = len(items)
            assert len(items) == topics * SEGMENTS_PER_TOPIC, len(items)

            # Let the last reconciles finish, and the brokers make their first load report of
            # every new segment (one write each, within their 10 s interval), before the
            # window opens.
            await asyncio.sleep(15)
            rest_before = await _api_requests(kubectl, cluster.kubeconfig)
            rest_cpu_before = cpu_by_role(CPU_ROLES)
            writes, total = await _count_writes(api, window)
            rest_cpu_after = cpu_by_role(CPU_ROLES)
            rest_after = await _api_requests(kubectl, cluster.kubeconfig)
            result["rest_cpu_seconds"] = _cpu_between(rest_cpu_before, rest_cpu_after)
            result["rest_requests"] = _requests_between(rest_before, rest_after)
            result["window_seconds"] = window
            result["writes"] = dict(writes)
            result["writes_total"] = total
            metrics = await _operator_metrics(api)
            result["operator_rss"] = metrics.pop(RSS)
            result["operator_metrics"] = metrics
        finally:
            await api.close()
    return result


def _cpu_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds of each role between two ``cpu_by_role`` readings."""
    return {role: round(after.get(role, 0.0) - before.get(role, 0.0), 1) for role in CPU_ROLES}


def _requests_between(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    """Requests served between two ``_api_requests`` readings, by kind (those with any)."""
    return {key: count for key, count in sorted((after - before).items()) if count}


def _cpu_rows(cpu: dict[str, float], seconds: float) -> list[list[Any]]:
    """A CPU table's rows: each role that used any, with its share of a core."""
    return [[role, s, round(s / seconds, 2)] for role, s in cpu.items() if s]


async def _api_requests(kubectl: Path, kubeconfig: Path) -> Counter[str]:
    """Requests the API server has served, by verb and resource (its own
    ``apiserver_request_total``), as ``"VERB resource[/subresource]"``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = await _kubectl(kubectl, kubeconfig, "get", "--raw", "/metrics")
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            counts[f"{labels.get('verb', '')} {resource}"] += int(sample.value)
    return counts


async def _count_writes(api: Any, window: float) -> tuple[Counter[str], int]:
    """Writes at the API server during ``window`` seconds, by resource (watch events)."""
    from scalable_topics.localcluster.restclient import Resource

    watched = {
        "ScalableTopic": Resource("scalabletopics.io", "v1alpha1", "scalabletopics"),
        "Segment": Resource("scalabletopics.io", "v1alpha1", "segments"),
        "Lease": Resource("coordination.k8s.io", "v1", "leases"),
        "Event": Resource("", "v1", "events"),
        "Pod": Resource("", "v1", "pods"),
    }
    _, rv0 = await api.list(watched["Lease"])
    seen: list[tuple[str, int]] = []

    async def watch(kind: str, res: Any) -> None:
        async for etype, obj in api.watch(res, rv0, timeout_seconds=int(window) + 60):
            if etype != "BOOKMARK":
                seen.append((kind, int((obj.get("metadata") or {}).get("resourceVersion", 0))))

    tasks = [asyncio.create_task(watch(k, r)) for k, r in watched.items()]
    await asyncio.sleep(window)  # the measurement window itself
    _, rv1 = await api.list(watched["Lease"])
    await asyncio.sleep(1)  # let the watches deliver what happened up to rv1
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    counts = Counter(kind for kind, rv in seen if rv <= int(rv1))
    return counts, int(rv1) - int(rv0)


async def _operator_metrics(api: Any) -> dict[str, float]:
    from scalable_topics.localcluster.restclient import PODS

    items, _ = await api.list(
        PODS, NAMESPACE, label_selector="app.kubernetes.io/name=scalable-topics-operator"
    )
    pod = items[0]
    port = 18081
    for arg in pod["spec"]["containers"][0].get("args") or []:
        if arg.startswith("--port="):
            port = int(arg.split("=", 1)[1])
    url = f"http://{pod['status']['podIP']}:{port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        text = await response.text()
    wanted: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(
            r"^(scalable_topic_(?:status_writes_total|reconciles_total|reads_total)\{[^}]*\}|"
            r"process_resident_memory_bytes) (\S+)$",
            line,
        )
        if match:
            wanted[match.group(1)] = float(match.group(2))
    return wanted


def _record(section: Section, r: dict[str, Any]) -> None:
    topics = r["topics"]
    segments = r["segments"]
    section.figure("ready_seconds", r["ready_seconds"], "s", topics=str(topics))
    section.figure("topics_per_second", topics / r["ready_seconds"], "topics/s")
    per_topic = (r["operator_rss"] - r["operator_rss_at_rest"]) / topics
    section.figure("operator_memory_per_topic", per_topic / 1024, "KiB", topics=str(topics))
    hours = r["window_seconds"] / 3600.0
    writes = r["writes"]
    per_segment = (writes.get("ScalableTopic", 0) + writes.get("Segment", 0)) / segments / hours
    section.figure("topic_and_segment_writes_per_segment_hour", per_segment, "writes/segment/h")
    section.figure("lease_writes_per_hour", writes.get("Lease", 0) / hours, "writes/h")
    section.table(
        f"API writes during {r['window_seconds']:.0f} s at rest ({topics} topics, {segments} "
        f"segments; resync every {RESYNC_SECONDS:.0f} s)",
        ["resource", "writes", "per hour"],
        [[k, v, round(v / hours)] for k, v in sorted(writes.items())]
        + [["all (resourceVersion delta)", r["writes_total"], round(r["writes_total"] / hours)]],
    )
    if r.get("cpu_seconds"):
        cpu = r["cpu_seconds"]
        section.table(
            f"CPU while {topics} topics became Ready ({r['ready_seconds']:.0f} s, "
            f"{os.cpu_count()} cores)",
            ["process", "CPU seconds", "cores on average"],
            [
                *_cpu_rows(cpu, r["ready_seconds"]),
                [
                    "all",
                    round(sum(cpu.values()), 1),
                    round(sum(cpu.values()) / r["ready_seconds"], 2),
                ],
            ],
        )
    if r.get("rest_cpu_seconds"):
        cpu = r["rest_cpu_seconds"]
        section.table(
            f"CPU during the {r['window_seconds']:.0f} s at rest ({topics} topics; the resync "
            "passes over every topic, the auto-scaler's evaluations, the brokers' load sampling)",
            ["process", "CPU seconds", "cores on average"],
            _cpu_rows(cpu, r["window_seconds"]),
        )
    if r.get("api_requests"):
        rows = sorted(r["api_requests"].items(), key=lambda kv: -kv[1])
        section.table(
            f"API requests while {topics} topics became Ready (the API server's "
            "apiserver_request_total), most first",
            ["request", "count", "per topic"],
            [[key, n, round(n / topics, 2)] for key, n in rows if n >= topics / 20]
            + [["all", sum(n for _, n in rows), round(sum(n for _, n in rows) / topics, 2)]],
        )
    if r.get("rest_requests"):
        rows = sorted(r["rest_requests"].items(), key=lambda kv: -kv[1])
        minutes = r["window_seconds"] / 60.0
        section.table(
            f"API requests during the {r['window_seconds']:.0f} s at rest, every client's "
            "(the bench's own watches and listings included), most first",
            ["request", "count", "per topic per minute"],
            [[key, n, round(n / topics / minutes, 3)] for key, n in rows]
            + [
                [
                    "all",
                    sum(n for _, n in rows),
                    round(sum(n for _, n in rows) / topics / minutes, 3),
                ]
            ],
        )
    if r.get("ready_timeline"):
        section.note(
            "Topics Ready over time (s since the first create): "
            + ", ".join(f"{n:,} at {t:.0f} s" for t, n in r["ready_timeline"])
        )
    section.note(
        f"{topics} topics created in {r['create_seconds']:.1f} s; all Ready "
        f"{r['ready_seconds']:.1f} s after the first create. Operator resident memory "
        f"{r['operator_rss_at_rest'] / 2**20:.0f} MiB before the first topic, "
        f"{r['operator_rss'] / 2**20:.0f} MiB after the window ({per_topic / 1024:.1f} KiB per "
        "topic). Operator counters: "
        + ", ".join(f"{k} = {v:g}" for k, v in sorted(r["operator_metrics"].items()))
    )
    section.note(
        "Steady-state writes per segment exclude the shard Lease renewals (per shard, not per "
        "segment: one every retry period) and broker load reports (`Segment.status.load`, "
        "written only when a rate moves by more than 25 %; none while idle)."
    )
    if r["window_seconds"] < 2 * RESYNC_SECONDS:
        section.note("Quick mode: the window is shorter than a resync pass.")
    if topics in TARGET_SECONDS:
        section.target(
            f"{topics:,} topics Ready with one operator",
            r["ready_seconds"] <= TARGET_SECONDS[topics],
            f"{r['ready_seconds']:.1f} s",
            f"<= {TARGET_SECONDS[topics]:.0f} s",
        )


async def run(report: Report, quick: bool) -> None:
    section = report.section("operator", "Operator: topics reconciled by one replica")
    topics = 100 if quick else TARGET_TOPICS
    window = 20.0 if quick else 2 * RESYNC_SECONDS + 10
    work = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    try:
        section.data = await measure(topics, window, work)
        _record(section, section.data)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.operator")
    parser.add_argument("--topics", type=int, default=TARGET_TOPICS)
    parser.add_argument("--window", type=float, default=2 * RESYNC_SECONDS + 10)
    args = parser.parse_args(argv)
    with scratch_root() as work:
        result = asyncio.run(measure(args.topics, args.window, work))
    report = Report(quick=False, command="python -m bench.operator")
    section = report.section("operator", "Operator: topics reconciled by one replica")
    _record(section, result)
    print(report.to_markdown())


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
