"""A real Prometheus (Debian's ``prometheus``) scrapes a live stack, and every query of every
panel of the Grafana dashboards (docs/dashboards/*.json) returns at least one series.

The operator and broker pods are found the way Prometheus' ``kubernetes_sd`` ``kubernetes-pods``
job finds them: by their ``prometheus.io/*`` annotations, the port being the annotation's or else
each declared container port (the manifests declare none, so overlays may move ports); the test
writes them as a ``file_sd`` file with the pod's namespace and name as labels and
``honor_labels: true``, as the ``PodMonitor`` in manifests/monitoring does. Prometheus dials only
the pods' loopback (127.x) addresses. It also loads the alert rules, which must evaluate
without error on the live series.

Under a producer and a stream consumer, the topic is split once (operations, sealed segments,
drain checks), and one client breaks the protocol (a text frame for a HELLO), since the
dashboard's protocol-errors panel has nothing to show without one. A panel query that stays
empty fails the test naming the panel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from scalable_topics.client import ScalableTopicProducer, StreamConsumer
from segment_broker.testing import free_port
from tests.chaos.scenario import service_url
from tests.prometheus_binaries import prometheus_binary

from .client_harness import KeyedLoad
from .operator_harness import JsonObj, eventually, operator_stack, topic_body

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "docs" / "dashboards").glob("*.json"))
RULES = REPO / "docs" / "dashboards" / "scalable-topics.rules.yaml"
PART_OF = "app.kubernetes.io/part-of=scalable-topics"
BROKER_LABEL = "app.kubernetes.io/name=segment-broker"
OPERATOR_LABEL = "app.kubernetes.io/name=scalable-topics-operator"
TOPIC = "metered"
SUB = "billing"
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>\w+)\)$")


def scrape_groups(pods: list[JsonObj]) -> list[JsonObj]:
    """``file_sd`` target groups for the pods annotated ``prometheus.io/scrape: "true"``,
    with the relabelling of the usual ``kubernetes-pods`` job."""
    groups: list[JsonObj] = []
    for pod in pods:
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        if annotations.get("prometheus.io/scrape") != "true":
            continue
        ip = str((pod.get("status") or {}).get("podIP") or "")
        assert ip.startswith("127."), f"{meta['name']}: Prometheus may dial only 127.x, not {ip!r}"
        if "prometheus.io/port" in annotations:
            ports = [int(annotations["prometheus.io/port"])]
        else:
            ports = [
                int(port["containerPort"])
                for container in pod["spec"]["containers"]
                for port in container.get("ports") or []
            ]
        for port in ports:
            groups.append(
                {
                    "targets": [f"{ip}:{port}"],
                    "labels": {
                        "__metrics_path__": annotations.get("prometheus.io/path", "/metrics"),
                        "namespace": meta["namespace"],
                        "pod": meta["name"],
                    },
                }
            )
    return groups


@contextlib.asynccontextmanager
async def running_prometheus(directory: Path, groups: list[JsonObj]) -> AsyncIterator[str]:
    """Prometheus on 127.0.0.1 scraping ``groups`` every second; yields its URL."""
    binary = prometheus_binary("prometheus")
    config_file = write_config(directory, groups)
    port = free_port()
    log_path = directory / "prometheus.log"
    with log_path.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                assert proc.returncode is None, log_path.read_text(errors="replace")[-3000:]
                async with http.get(url + "/-/ready") as response:
                    return response.status == 200

            await eventually(ready, 60, "Prometheus ready")
        yield url
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def write_config(directory: Path, groups: list[JsonObj]) -> Path:
    """prometheus.yml (JSON is YAML) with the targets as a ``file_sd`` file and the rules."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "targets.json").write_text(json.dumps(groups))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "scalable-topics-pods",
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(directory / "targets.json")]}],
            }
        ],
    }
    (directory / "prometheus.yml").write_text(json.dumps(config))
    return directory / "prometheus.yml"


async def api(http: aiohttp.ClientSession, url: str, path: str, **params: str) -> Any:
    async with http.get(url + path, params=params) as response:
        body = await response.json()
    assert body.get("status") == "success", (path, params, body)
    return body["data"]


async def query(http: aiohttp.ClientSession, url: str, promql: str) -> list[JsonObj]:
    data = await api(http, url, "/api/v1/query", query=promql)
    return list(data["result"])


def panel_queries(dashboard: JsonObj) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' panels included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[JsonObj]) -> None:
        for panel in panels:
            walk(panel.get("panels") or [])
            for target in panel.get("targets") or []:
                if target.get("expr"):
                    found.append((str(panel.get("title")), str(target["expr"])))

    walk(dashboard.get("panels") or [])
    return found


def substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    return expr


async def variable_values(
    http: aiohttp.ClientSession, url: str, dashboard: JsonObj
) -> tuple[dict[str, str], list[str]]:
    """Each query variable's values as Grafana would find them (``label_values``), as the
    regular expression a multi-value variable becomes; and the variables that found none."""
    values: dict[str, str] = {}
    empty: list[str] = []
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") != "query":
            continue
        match = LABEL_VALUES.match(str(variable["query"]).strip())
        assert match, f"variable {variable['name']}: unsupported query {variable['query']!r}"
        selector = substitute(match["selector"], values)
        found = {
            str(s["metric"][match["label"]])
            for s in await query(http, url, selector)
            if match["label"] in s["metric"]
        }
        if not found:
            empty.append(f"variable {variable['name']}: {selector}")
        values[str(variable["name"])] = "(" + "|".join(sorted(found)) + ")"
    return values, empty


async def empty_queries(http: aiohttp.ClientSession, url: str) -> list[str]:
    empty: list[str] = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        values, missing = await variable_values(http, url, dashboard)
        empty += [f"{path.name}: {m}" for m in missing]
        for title, expr in panel_queries(dashboard):
            promql = substitute(expr, values)
            if not await query(http, url, promql):
                empty.append(f"{path.name}: panel {title!r}: {promql}")
    return empty


async def break_the_protocol(http: aiohttp.ClientSession, broker_url: str) -> None:
    """A client that sends a text frame where the binary HELLO belongs."""
    path = f"/ws/v1/produce/default/{TOPIC}/1"
    async with http.ws_connect(broker_url.replace("http", "ws", 1) + path) as ws:
        await ws.send_str("hello")
        msg = await ws.receive(timeout=15)
        while msg.type == aiohttp.WSMsgType.BINARY:  # the ERROR frame before the close
            msg = await ws.receive(timeout=15)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg


async def consume(consumer: StreamConsumer) -> None:
    while True:
        await consumer.ack(await consumer.receive())


async def test_every_dashboard_query_returns_series_from_a_real_prometheus(
    tmp_path: Path,
) -> None:
    assert DASHBOARDS
    prometheus_binary("prometheus")  # skip before building a stack when it cannot be had
    async with operator_stack(tmp_path, operator_replicas=2) as stack:
        await stack.apply_topic(topic_body(TOPIC, segments=2, autoScale={"enabled": False}))
        await stack.wait_ready(TOPIC, 90)
        pods = await stack.pods(PART_OF)
        groups = scrape_groups(pods)
        scraped = {g["labels"]["pod"] for g in groups}
        brokers = {p["metadata"]["name"] for p in await stack.pods(BROKER_LABEL)}
        operators = {p["metadata"]["name"] for p in await stack.pods(OPERATOR_LABEL)}
        assert brokers and operators and brokers | operators <= scraped, (scraped, pods)

        url = await service_url(stack)
        producer = await ScalableTopicProducer(url, "default", TOPIC).start()
        consumer = StreamConsumer(url, "default", TOPIC, SUB, "reader")
        await consumer.start()
        load = KeyedLoad([f"k{i}" for i in range(8)])
        tasks = [
            asyncio.create_task(load.run(producer, 1_000_000, pause=0.05)),
            asyncio.create_task(consume(consumer)),
        ]
        try:
            await asyncio.wait_for(load.wait_acked(200), 60)
            await stack.request(TOPIC, {"id": "s1", "op": "split", "segments": [0]})
            topic = await stack.wait_request(TOPIC, "s1", 90)
            assert topic["status"]["lastRequest"]["result"] == "Succeeded"
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
                running_prometheus(tmp_path / "prometheus", groups) as prom,
            ):
                await break_the_protocol(http, next(iter((await stack.broker_urls()).values())))

                async def all_up() -> bool:
                    active = (await api(http, prom, "/api/v1/targets"))["activeTargets"]
                    for target in active:
                        host = urlsplit(target["scrapeUrl"]).hostname or ""
                        assert host.startswith("127."), target["scrapeUrl"]
                    return len(active) == len(groups) and all(t["health"] == "up" for t in active)

                await eventually(all_up, 60, f"{len(groups)} targets up")

                last: list[str] = []

                async def every_query_answered() -> bool:
                    nonlocal last
                    assert not load.errors, load.errors[:3]
                    for task in tasks:
                        assert not task.done() or task.cancelled(), task
                    last = await empty_queries(http, prom)
                    return not last

                try:
                    await eventually(every_query_answered, 180, "every panel query answered")
                except AssertionError:
                    raise AssertionError(
                        "dashboard queries with no series:\n" + "\n".join(last)
                    ) from None

                rules = await api(http, prom, "/api/v1/rules")
                evaluated = [r for g in rules["groups"] for r in g["rules"]]
                assert evaluated, rules
                for rule in evaluated:
                    assert rule["health"] == "ok", rule
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await consumer.close()
            await producer.close()
