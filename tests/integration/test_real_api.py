"""Our CRDs and our REST client against the real API server (issue 21): the API server is the
judge of the CRDs' schema (types, bounds, patterns, defaults, list-map keys, pruning) and CEL
rules, so every admission case the unit tests once ran through a miniature validator runs
here; ``localcluster.restclient`` (the kubelet's client) meets a real server's status codes
and its informer relists.

One control plane serves the whole module (the fixtures are ``test_real_controlplane``'s).
The case tables live with the unit tests (tests/unit/test_crds.py), which check the models
against the same cases.
"""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from scalable_topics.core import crds
from scalable_topics.core import resources as r
from scalable_topics.core.jsontypes import JsonObj
from scalable_topics.core.layout import HashRange
from scalable_topics.localcluster.controlplane import ControlPlane
from scalable_topics.localcluster.restclient import (
    CONFIGMAPS,
    ApiError,
    Informer,
    Resource,
    RestClient,
    client_from_kubeconfig,
)

from ..unit.test_crds import (
    ADMISSION_CASES,
    ROOT_CASES,
    STRUCTURAL_BREAKAGES,
    TRANSITION_CASES,
    segment,
    status_examples,
    topic,
)
from .conftest import SEGMENTS, TOPICS, eventually
from .test_real_controlplane import kube, kubectl, plane  # noqa: F401  (module fixtures)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(120, func_only=True),
]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "manifests" / "examples"
NS = "default"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
STRICT = {"fieldValidation": "Strict"}
DRY_RUN = {**STRICT, "dryRun": "All"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def admin(plane: ControlPlane) -> AsyncIterator[RestClient]:  # noqa: F811
    """The admin client, once our CRDs are Established."""
    client = client_from_kubeconfig(plane.kubeconfig)
    for manifest in crds.crd_manifests():
        await client.create(CRDS, None, manifest)
    names = [m["metadata"]["name"] for m in crds.crd_manifests()]
    await kubectl(
        plane, "wait", "--for=condition=Established", *[f"crd/{n}" for n in names], "--timeout=60s"
    )
    yield client
    await client.close()


def named(obj: JsonObj, name: str) -> JsonObj:
    body = copy.deepcopy(obj)
    body["metadata"] = {**body.get("metadata", {}), "name": name}
    return body


async def create(admin: RestClient, res: Resource, body: JsonObj, *, dry_run: bool) -> JsonObj:
    params = DRY_RUN if dry_run else STRICT
    return await admin.request("POST", res.path(NS), params=params, body=body)


async def rejection(admin: RestClient, res: Resource, body: JsonObj) -> str | None:
    """The API server's message when it refuses to create ``body`` (dry run), else ``None``."""
    try:
        await create(admin, res, body, dry_run=True)
    except ApiError as exc:
        assert exc.status == 422, exc
        return exc.message
    return None


async def replaced(admin: RestClient, res: Resource, name: str, spec: JsonObj) -> str | None:
    """Update the stored object's spec to ``spec`` (dry run): the refusal, else ``None``."""
    current = await admin.get(res, NS, name)
    current["spec"] = spec
    try:
        await admin.request("PUT", res.path(NS, name), params=DRY_RUN, body=current)
    except ApiError as exc:
        assert exc.status == 422, exc
        return exc.message
    return None


def field_and_message(error: str) -> tuple[str, str]:
    """``.spec.range: range.start must be <= range.end`` → the path as the API server writes
    it and the rule's message."""
    path, _, message = error.partition(": ")
    return path.removeprefix("."), message


@pytest.mark.parametrize(("spec", "admission_rejects", "model_rejects"), ADMISSION_CASES)
async def test_admission_cases(
    admin: RestClient, spec: JsonObj, admission_rejects: bool, model_rejects: bool
) -> None:
    refused = await rejection(admin, TOPICS, topic(spec))
    assert (refused is not None) is admission_rejects, refused


@pytest.mark.parametrize(
    ("obj", "error", "model_rejects"), [case for case in ROOT_CASES if "status" not in case[0]]
)
async def test_initial_segments_within_the_topics_own_bounds(
    admin: RestClient, obj: JsonObj, error: str | None, model_rejects: bool
) -> None:
    """On create. The API server drops a status sent with it: "the operator has seen it" is
    the update in the next test."""
    refused = await rejection(admin, TOPICS, obj)
    if error is None:
        assert refused is None
    else:
        assert refused is not None and error.removeprefix(": ") in refused, refused
        assert "<nil>: Invalid value: " in refused, "a rule of the whole object"


async def test_a_topic_with_a_status_may_lower_max_segments_below_initial(
    admin: RestClient,
) -> None:
    name = "seen"
    await create(admin, TOPICS, named(topic({"initialSegments": 5}), name), dry_run=False)
    lowered = {"initialSegments": 5, "autoScale": {"maxSegments": 3}}
    refused = await replaced(admin, TOPICS, name, lowered)
    assert refused is not None and r.TOPIC_RULES[0]["message"] in refused, refused
    await admin.patch_status(TOPICS, NS, name, {"activeSegments": 5})
    assert await replaced(admin, TOPICS, name, lowered) is None


async def test_status_writes_pass_for_a_topic_stored_before_the_rules(
    plane: ControlPlane,  # noqa: F811
    admin: RestClient,
) -> None:
    """A topic that breaks the root rules and the name limit, stored under a CRD without them
    (as one created before they existed), still takes the operator's status writes."""
    (topic_crd,) = [c for c in crds.crd_manifests() if c["spec"]["names"]["kind"] == r.TOPIC_KIND]
    lax = copy.deepcopy(topic_crd)
    schema = lax["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["x-kubernetes-validations"]
    del schema["properties"]["metadata"]
    name = "x" * (r.MAX_TOPIC_NAME + 1)
    stored = named(topic({"initialSegments": 5, "autoScale": {"maxSegments": 3}}), name)
    try:
        current = await admin.get(CRDS, None, topic_crd["metadata"]["name"])
        lax["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await admin.request("PUT", CRDS.path(None, lax["metadata"]["name"]), body=lax)

        async def stored_under_the_lax_crd() -> bool:
            try:
                await create(admin, TOPICS, stored, dry_run=False)
            except ApiError as exc:
                assert exc.status == 422, exc
                return False
            return True

        await eventually(stored_under_the_lax_crd, within=30, interval=0.5)
    finally:
        current = await admin.get(CRDS, None, topic_crd["metadata"]["name"])
        strict = {**topic_crd, "metadata": {**topic_crd["metadata"]}}
        strict["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await admin.request("PUT", CRDS.path(None, strict["metadata"]["name"]), body=strict)

    async def rules_back() -> bool:
        return await rejection(admin, TOPICS, named(stored, "again")) is not None

    await eventually(rules_back, within=30, interval=0.5)
    written = await admin.patch_status(TOPICS, NS, name, {"conditions": []})
    assert written["status"] == {"conditions": []}


@pytest.mark.parametrize(("old", "new", "error"), TRANSITION_CASES)
async def test_transition_rules_on_update(
    admin: RestClient, old: JsonObj, new: JsonObj, error: str | None
) -> None:
    name = f"t{TRANSITION_CASES.index((old, new, error))}"
    await create(admin, TOPICS, named(topic(old), name), dry_run=False)
    refused = await replaced(admin, TOPICS, name, new)
    if error is None:
        assert refused is None
    else:
        path, message = field_and_message(error)
        assert refused is not None and path in refused and message in refused, refused


async def test_segment_admission(admin: RestClient) -> None:
    assert await rejection(admin, SEGMENTS, segment()) is None
    inverted = await rejection(admin, SEGMENTS, segment(range={"start": 9, "end": 1}))
    assert inverted is not None and "range.start must be <= range.end" in inverted
    beyond = await rejection(admin, SEGMENTS, segment(range={"start": 0, "end": 65536}))
    assert beyond is not None and "spec.range.end" in beyond and "65535" in beyond
    assert await rejection(admin, SEGMENTS, {**segment(), "spec": None}) is not None
    body = r.segment_manifest(
        topic="orders",
        namespace=NS,
        topic_uid="u",
        segment_id=4,
        hash_range=HashRange(0, 9),
        parents=[1, 2],
        buckets=3,
    )
    assert await rejection(admin, SEGMENTS, body) is None

    await create(admin, SEGMENTS, segment(), dry_run=False)
    name = segment()["metadata"]["name"]
    assert await replaced(admin, SEGMENTS, name, segment(buckets=2)["spec"]) is None
    changed = await replaced(admin, SEGMENTS, name, segment(buckets=4)["spec"])
    assert changed is not None and "Segment spec is immutable" in changed


async def test_defaults_are_the_models(admin: RestClient) -> None:
    empty = await create(admin, TOPICS, named(topic(), "defaulted"), dry_run=True)
    assert empty["spec"] == {"initialSegments": 1, "entryBuckets": 4, "consumerGracePeriod": "60s"}
    assert r.parse_topic_spec(empty["spec"]) == r.parse_topic_spec({})
    subscribed = topic({"subscriptions": [{"name": "s", "type": "Stream"}]})
    sub = await create(admin, TOPICS, subscribed, dry_run=True)
    assert sub["spec"]["subscriptions"][0]["assignment"] == "sticky"


async def test_examples_pass_admission_with_nothing_pruned(plane: ControlPlane) -> None:  # noqa: F811
    """``kubectl apply`` validates strictly: a field the schema would prune fails it."""
    applied = await kubectl(plane, "apply", "--dry-run=server", "-n", NS, "-f", str(EXAMPLES))
    assert "(server dry run)" in applied.stdout
    assert "orders" in applied.stdout


@pytest.mark.parametrize("which", sorted(status_examples()))
async def test_what_components_write_into_status_survives_the_schema(
    admin: RestClient, which: str
) -> None:
    name = f"status-{which}"
    await create(admin, TOPICS, named(topic(), name), dry_run=False)
    status = status_examples()[which]
    written = await admin.request(
        "PATCH",
        TOPICS.path(NS, name, "status"),
        params=DRY_RUN,
        body={"status": status},
        content_type="application/merge-patch+json",
    )
    assert written["status"] == status


async def test_kubectl_get_wide_and_describe_of_a_topic(
    plane: ControlPlane,  # noqa: F811
    admin: RestClient,
) -> None:
    """Every printer column, the wide ones too, read from what the operator writes; and
    ``kubectl describe`` prints "Sealed At Epoch" for sealed segments only."""
    name = "described"
    await create(admin, TOPICS, named(topic({"initialSegments": 2}), name), dry_run=False)
    status = {
        **status_examples()["sealed-layout"],
        "activeSegments": 3,
        "controller": {"pod": "operator-0"},
        "conditions": [r.condition("Ready", True, r.Reason.RECONCILED, now=0.0)],
    }
    await admin.patch_status(TOPICS, NS, name, status)

    wide = (await kubectl(plane, "get", "stopic", name, "-o", "wide")).stdout.splitlines()
    (topic_crd,) = [c for c in crds.crd_manifests() if c["spec"]["names"]["kind"] == r.TOPIC_KIND]
    columns = topic_crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert wide[0].split() == ["NAME", *(c["name"].upper() for c in columns)]
    # Columns are fixed-width; a field the status lacks prints as an empty cell.
    starts = [m.start() for m in re.finditer(r"\S+", wide[0])]
    cells = [wide[1][a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    row = dict(zip(wide[0].split(), cells, strict=True))
    assert (row["NAME"], row["ACTIVE"], row["READY"]) == (name, "3", "True")
    assert (row["AUTOSCALE"], row["AUTOSCALE-RESULT"]) == ("", "")  # no status.autoScale yet
    assert (row["EPOCH"], row["CONTROLLER"], row["INITIAL"]) == (
        str(status["epoch"]),
        "operator-0",
        "2",
    )
    assert row["REASON"] == r.Reason.RECONCILED

    described = (await kubectl(plane, "describe", "stopic", name)).stdout
    sealed = [s for s in status["layout"]["segments"].values() if "sealedAtEpoch" in s]
    assert sealed and described.count("Sealed At Epoch:") == len(sealed), described
    assert "Sealed At Epoch:  0" not in described


STRICTER_THAN_THE_API_SERVER = {
    # kube-apiserver 1.37 accepts a type beside x-kubernetes-int-or-string; the checker keeps
    # refusing it (the int-or-string form is anyOf [integer, string] without a type).
    ".a: x-kubernetes-int-or-string must not set a type",
}


@pytest.mark.parametrize(("schema", "problem"), STRUCTURAL_BREAKAGES)
async def test_what_the_structural_checker_finds_the_api_server_refuses(
    admin: RestClient, schema: JsonObj, problem: str
) -> None:
    """``crds.structural_problems`` (which ``make crds`` runs) flags only what the real API
    server would refuse in a CRD."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "breakages.check.scalabletopics.io"},
        "spec": {
            "group": "check.scalabletopics.io",
            "scope": "Namespaced",
            "names": {"kind": "Breakage", "plural": "breakages", "singular": "breakage"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
    try:
        await admin.request("POST", CRDS.path(), params=DRY_RUN, body=crd)
    except ApiError as refused:
        assert refused.status in (400, 422), refused
        assert problem not in STRICTER_THAN_THE_API_SERVER
    else:
        assert problem in STRICTER_THAN_THE_API_SERVER, "the API server took it"


async def test_rest_client_status_codes(admin: RestClient) -> None:
    created = await admin.create(CONFIGMAPS, NS, {"metadata": {"name": "a"}, "data": {"k": "1"}})
    patched = await admin.patch(CONFIGMAPS, NS, "a", {"data": {"k": "2"}})
    assert patched["data"] == {"k": "2"}
    assert int(patched["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    with pytest.raises(ApiError) as conflict:
        await admin.create(CONFIGMAPS, NS, {"metadata": {"name": "a"}})
    assert conflict.value.status == 409 and conflict.value.reason == "AlreadyExists"
    assert await admin.get_or_none(CONFIGMAPS, NS, "missing") is None
    assert await admin.delete(CONFIGMAPS, NS, "missing") is None


async def test_informer_follows_changes_and_relists(admin: RestClient) -> None:
    events: list[tuple[str, str]] = []
    informer = Informer(admin, CONFIGMAPS)
    informer.add_handler(lambda t, o: events.append((t, o["metadata"]["name"])))
    try:
        await admin.create(CONFIGMAPS, NS, {"metadata": {"name": "before"}})
        informer.start()
        await informer.synced.wait()
        assert (NS, "before") in informer.cache
        await admin.create(CONFIGMAPS, NS, {"metadata": {"name": "during"}})
        await eventually(lambda: ("ADDED", "during") in events, within=30)
        await informer.stop()
        await admin.delete(CONFIGMAPS, NS, "before")
        await admin.create(CONFIGMAPS, NS, {"metadata": {"name": "after"}})
        events.clear()
        informer.start()
        await eventually(
            lambda: ("DELETED", "before") in events and (NS, "after") in informer.cache,
            within=30,
        )
        assert (NS, "before") not in informer.cache
    finally:
        await informer.stop()
