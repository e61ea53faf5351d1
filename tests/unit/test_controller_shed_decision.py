"""The leader's load-shedding decision scans every Segment: it is made at most once per
``SHED_DECISION_SECONDS`` and shared by the reconciles that ask in between, so a resync pass
over N topics costs O(N), not O(N²); starting a move forgets it."""

from __future__ import annotations

from typing import Any, cast

import pytest

from scalable_topics.controller.brokers import BrokerAdmin, BrokerPod
from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.kube import KubeApi
from scalable_topics.controller.transfer import SHED_DECISION_SECONDS, TransferExecutor
from scalable_topics.core.transfer import ShedPolicy


def _segment(pod: str, rate: float, *, transfer: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {
        "state": "Active",
        "broker": {"pod": pod, "url": f"http://{pod}:8080"},
        "load": {"msgRateIn": rate},
    }
    if transfer:
        status["transfer"] = {"id": "t1"}
    return {"metadata": {"name": "x"}, "status": status}


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _executor(clock: _Clock) -> TransferExecutor:
    cache = TopicCache(controller_url=lambda ns, name: "")
    for pod in ("b0", "b1"):
        cache.brokers[pod] = BrokerPod(pod, f"http://{pod}:8080", ready=True)
    for i in range(50):
        cache.segments[("ns", f"t{i}")] = {0: _segment("b0", 100.0), 1: _segment("b0", 90.0)}

    async def events(*_: object) -> None:
        return None

    executor = TransferExecutor(
        cast(KubeApi, None), cast(BrokerAdmin, None), cache, events=events, clock=lambda: 0.0
    )
    executor.shed_policy = ShedPolicy(margin=0.5, cooldown=0.0, min_rate=10.0)
    executor._decision_clock = clock
    return executor


def test_one_decision_serves_every_ask_within_its_lifetime(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    executor = _executor(clock)
    scans: list[int] = []
    real = executor._segment_rates

    def counted() -> Any:
        scans.append(1)
        return real()

    monkeypatch.setattr(executor, "_segment_rates", counted)
    first = executor._shed_move()
    assert first is not None and first.source == "b0" and first.destination == "b1"
    for _ in range(1000):
        assert executor._shed_move() is first
    assert len(scans) == 1
    clock.now += SHED_DECISION_SECONDS
    assert executor._shed_move() == first
    assert len(scans) == 2


def test_a_running_move_means_no_decision_until_it_is_looked_at_again() -> None:
    clock = _Clock()
    executor = _executor(clock)
    executor.cache.segments[("ns", "t7")][0] = _segment("b0", 100.0, transfer=True)
    assert executor._shed_move() is None
    executor.cache.segments[("ns", "t7")][0] = _segment("b0", 100.0)
    assert executor._shed_move() is None, "the decision is a second old at most"
    clock.now += SHED_DECISION_SECONDS
    assert executor._shed_move() is not None
