"""A manual move is recorded with a compare-and-swap on the Segment as the leader's cache holds
it. A broker's load report lands on the same Segment every few seconds, so the cached copy may
be one write behind when ``kubectl stopic move`` arrives: the move is then checked again on the
Segment as the API server has it, and rejected only if the Segment keeps changing or no longer
allows the move (CI found ``stopic move`` rejected with "segment 1 changed while the move was
recorded" right after a load report).

``_Segments`` keeps the API server's rule for a status patch that carries a resourceVersion:
409 unless it is the current one."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from scalable_topics.brokeradmin import AdminError
from scalable_topics.controller.brokers import BrokerAdmin, BrokerPod
from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.kube import Conflict, KubeApi
from scalable_topics.controller.transfer import (
    MAX_STEPS,
    MOVE_RECORD_ATTEMPTS,
    RETRY_AFTER,
    MoveRejected,
    TransferExecutor,
)
from scalable_topics.core.resources import ManualRequest
from scalable_topics.core.transfer import Action, BrokerView, Endpoint, Transfer, TransferPhase

NS, TOPIC, NAME = "ns", "orders", "orders-1"


class _Segments:
    """The API server's Segment store, for the two calls a move's record makes."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.reports_per_write = 0
        """Load reports that land between each read and the next status patch."""
        self.gets = 0

    def report_load(self, rate: float) -> None:
        self.body["status"]["load"] = {"msgRateIn": rate}
        self.body["metadata"]["resourceVersion"] = str(
            int(self.body["metadata"]["resourceVersion"]) + 1
        )

    async def get_segment(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        return copy.deepcopy(self.body) if (namespace, name) == (NS, NAME) else None

    async def patch_segment_status(
        self, namespace: str, name: str, status: dict[str, Any], *, resource_version: str
    ) -> dict[str, Any]:
        for _ in range(self.reports_per_write):
            self.report_load(float(self.body["metadata"]["resourceVersion"]))
        if resource_version != self.body["metadata"]["resourceVersion"]:
            raise Conflict(name)
        self.body["status"].update(status)
        self.report_load(self.body["status"]["load"]["msgRateIn"])
        return copy.deepcopy(self.body)


def _segment() -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "namespace": NS, "uid": "u1", "resourceVersion": "10"},
        "spec": {"topic": TOPIC, "segmentId": 1},
        "status": {
            "state": "Active",
            "broker": {"pod": "b0", "url": "http://b0:8080"},
            "load": {"msgRateIn": 0.0},
        },
    }


def _executor(store: _Segments) -> tuple[TransferExecutor, list[str]]:
    cache = TopicCache(controller_url=lambda ns, name: "")
    for pod in ("b0", "b1"):
        cache.brokers[pod] = BrokerPod(pod, f"http://{pod}:8080", ready=True)
    cache.put_segment(copy.deepcopy(store.body))

    async def events(*_: object) -> None:
        return None

    executor = TransferExecutor(
        cast(KubeApi, store), cast(BrokerAdmin, None), cache, events=events, clock=lambda: 0.0
    )
    driven: list[str] = []

    async def drive(topic: dict[str, Any], sid: int) -> dict[str, Any]:
        segment = executor.cache.segments[(NS, TOPIC)][sid]
        driven.append(segment["status"]["transfer"]["requestId"])
        return topic

    executor.drive = drive  # type: ignore[method-assign]
    return executor, driven


TOPIC_BODY = {"metadata": {"namespace": NS, "name": TOPIC}, "status": {}}
MOVE = ManualRequest(id="r1", op="move", segments=[1], to="b1")


async def test_a_load_report_after_the_cached_read_does_not_reject_the_move() -> None:
    store = _Segments(_segment())
    executor, driven = _executor(store)
    store.report_load(120.0)  # the broker's report: the cache is one write behind

    await executor.start(TOPIC_BODY, MOVE)

    assert driven == ["r1"]
    assert store.body["status"]["transfer"]["destination"]["pod"] == "b1"
    assert store.body["status"]["load"] == {"msgRateIn": 120.0}, "the report was kept"
    assert store.gets == 1


async def test_a_segment_that_keeps_changing_rejects_the_move_and_records_nothing() -> None:
    store = _Segments(_segment())
    executor, driven = _executor(store)
    store.reports_per_write = 1

    with pytest.raises(MoveRejected, match="kept changing"):
        await executor.start(TOPIC_BODY, MOVE)

    assert driven == []
    assert "transfer" not in store.body["status"]
    assert store.gets == MOVE_RECORD_ATTEMPTS


async def test_the_fresh_read_is_checked_again() -> None:
    """Between the cached read and the write, another move was recorded: the fresh read says
    so, and this one is rejected for it rather than written over it."""
    store = _Segments(_segment())
    executor, driven = _executor(store)
    store.body["status"]["transfer"] = Transfer(
        id="move-other",
        segment_id=1,
        source=Endpoint("b0", "http://b0:8080"),
        destination=Endpoint("b1", "http://b1:8080"),
        trigger="load",
    ).to_status()
    store.report_load(5.0)

    with pytest.raises(MoveRejected, match="already moving"):
        await executor.start(TOPIC_BODY, MOVE)

    assert driven == []
    assert store.body["status"]["transfer"]["id"] == "move-other"


async def test_a_draining_pod_is_announced_drained_only_once_the_moves_source_released_it() -> None:
    """The ``Owned`` commit names the destination, but the source deletes its copy only at the
    release after it: ``Drained`` (the pod can be stopped) waits for the record to be cleared."""
    body = _segment()
    body["status"]["broker"] = {"pod": "b1", "url": "http://b1:8080"}
    body["status"]["transfer"] = Transfer(
        id="t1",
        segment_id=1,
        source=Endpoint("b0", "http://b0:8080"),
        destination=Endpoint("b1", "http://b1:8080"),
    ).to_status() | {"phase": "Owned"}
    store = _Segments(body)
    cache = TopicCache(controller_url=lambda ns, name: "")
    cache.brokers["b0"] = BrokerPod("b0", "http://b0:8080", ready=True, cordoned=True)
    cache.brokers["b1"] = BrokerPod("b1", "http://b1:8080", ready=True)
    cache.put_segment(copy.deepcopy(body))
    posted: list[tuple[str, str]] = []

    async def events(target: dict[str, Any], _type: str, reason: str, _message: str) -> None:
        posted.append((target["metadata"]["name"], reason))

    executor = TransferExecutor(
        cast(KubeApi, store), cast(BrokerAdmin, None), cache, events=events, clock=lambda: 0.0
    )
    topic = {"metadata": {"namespace": NS, "name": TOPIC}, "status": {"operation": {"id": "x"}}}

    await executor.drain(topic)
    assert posted == [], "b0 still holds the log until the release"

    del body["status"]["transfer"]
    cache.put_segment(copy.deepcopy(body))
    await executor.drain(topic)
    await executor.drain(topic)
    assert posted == [("b0", "Drained")]


class _Unreached:
    """Broker admin clients for the steps these tests take: writes to the Segment only."""

    def at(self, url: str) -> object:
        return url


def _moving(store: _Segments) -> tuple[TransferExecutor, list[tuple[tuple[str, str], float]]]:
    """An executor driving a transfer recorded on the store's Segment (source b0 fenced by a
    leader that died), with the brokers' answers given by the test's ``_view``."""
    store.body["status"]["transfer"] = Transfer(
        id="t1",
        segment_id=1,
        source=Endpoint("b0", "http://b0:8080"),
        destination=Endpoint("b1", "http://b1:8080"),
    ).to_status()
    executor, _ = _executor(store)
    del executor.drive  # the real one
    executor.brokers = cast(BrokerAdmin, _Unreached())
    requeued: list[tuple[tuple[str, str], float]] = []
    executor.requeue = lambda: lambda key, delay: requeued.append((key, delay))
    return executor, requeued


async def test_a_load_report_before_a_phase_write_is_read_again_and_the_move_goes_on() -> None:
    """The fresh leader's cache can be one load report behind the Segment when it writes the
    next phase: the compare-and-swap fails (nothing written), the Segment is read again and the
    step taken again, instead of failing the whole reconcile into the retry back-off."""
    store = _Segments(_segment())
    executor, requeued = _moving(store)
    store.report_load(80.0)

    async def view(topic: Any, transfer: Transfer) -> tuple[BrokerView, BrokerView]:
        copy_ = BrokerView(up=True, present=True, last_position=5, cursors_digest="d")
        if transfer.phase is TransferPhase.RELEASING:
            return BrokerView(True, True, 5, fenced=True, cursors_digest="d"), copy_
        return BrokerView(up=False), copy_  # Assigned: commits without the source

    executor._view = view  # type: ignore[method-assign]
    await executor.drive(TOPIC_BODY, 1)

    assert store.gets == 1, "read again after the conflict"
    assert store.body["status"]["transfer"]["phase"] == "Owned"
    assert store.body["status"]["broker"]["pod"] == "b1"
    assert store.body["status"]["load"] == {"msgRateIn": 80.0}
    assert requeued == [((NS, TOPIC), RETRY_AFTER)], "then waits for the source to answer"


async def test_a_transfer_not_finished_within_its_steps_is_looked_at_again() -> None:
    store = _Segments(_segment())
    executor, requeued = _moving(store)
    failed: list[Action] = []

    async def view(topic: Any, transfer: Transfer) -> tuple[BrokerView, BrokerView]:
        return BrokerView(True, True, 5), BrokerView(up=True)

    async def execute(topic: Any, segment: Any, transfer: Any, action: Action) -> Any:
        failed.append(action)
        raise AdminError("http://b1:8080", 503, "Unavailable", "busy")

    executor._view = view  # type: ignore[method-assign]
    executor._execute = execute  # type: ignore[method-assign]
    await executor.drive(TOPIC_BODY, 1)

    assert failed == [Action.COPY] * MAX_STEPS
    assert requeued == [((NS, TOPIC), RETRY_AFTER)]
    assert store.body["status"]["transfer"]["phase"] == "Releasing", "nothing rolled back"
