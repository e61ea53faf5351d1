"""The leader's load-shedding decision: made at most once per ``SHED_DECISION_SECONDS`` and
shared by the reconciles that ask in between, so a resync pass over N topics costs O(N), not
O(N²); starting a move forgets it. It weighs the segments the cache indexes as they come and go
(Active, placed, a rate above zero), not a scan of every Segment."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalable_topics.controller.brokers import BrokerAdmin, BrokerPod
from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.kube import KubeApi
from scalable_topics.controller.transfer import SHED_DECISION_SECONDS, TransferExecutor
from scalable_topics.core.transfer import ShedPolicy


def _segment(
    topic: str, sid: int, pod: str, rate: float, *, transfer: bool = False, state: str = "Active"
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "state": state,
        "broker": {"pod": pod, "url": f"http://{pod}:8080"},
        "load": {"msgRateIn": rate},
    }
    if transfer:
        status["transfer"] = {"id": "t1"}
    return {
        "metadata": {"name": f"{topic}-{sid}", "namespace": "ns", "uid": f"{topic}-{sid}"},
        "spec": {"topic": topic, "segmentId": sid},
        "status": status,
    }


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
        cache.put_segment(_segment(f"t{i}", 0, "b0", 100.0))
        cache.put_segment(_segment(f"t{i}", 1, "b0", 90.0))

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
    real = executor.cache.active_rates

    def counted() -> Any:
        scans.append(1)
        return real()

    monkeypatch.setattr(executor.cache, "active_rates", counted)
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
    executor.cache.put_segment(_segment("t7", 0, "b0", 100.0, transfer=True))
    assert executor._shed_move() is None
    executor.cache.put_segment(_segment("t7", 0, "b0", 100.0))
    assert executor._shed_move() is None, "the decision is a second old at most"
    clock.now += SHED_DECISION_SECONDS
    assert executor._shed_move() is not None


def _scanned(cache: TopicCache) -> set[tuple[tuple[str, str, int], str, float]] | None:
    """What the decision weighed when it scanned every cached Segment."""
    found = set()
    for (ns, name), segments in cache.segments.items():
        for sid, segment in segments.items():
            status = segment.get("status") or {}
            if status.get("transfer"):
                return None
            rate = float((status.get("load") or {}).get("msgRateIn") or 0.0)
            pod = (status.get("broker") or {}).get("pod")
            if status.get("state") == "Active" and pod and rate > 0:
                found.add(((ns, name, sid), pod, rate))
    return found


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "put", "put", "drop", "drop_topic"]),
            st.sampled_from(["t0", "t1", "t2"]),
            st.integers(0, 2),
            st.sampled_from(["b0", "b1"]),
            st.sampled_from([0.0, 5.0, 50.0]),
            st.booleans(),
            st.sampled_from(["Active", "Active", "Sealed"]),
        ),
        max_size=40,
    )
)
def test_the_rate_index_is_what_a_scan_of_every_segment_finds(
    steps: list[tuple[str, str, int, str, float, bool, str]],
) -> None:
    cache = TopicCache(controller_url=lambda ns, name: "")
    for op, topic, sid, pod, rate, transfer, state in steps:
        body = _segment(topic, sid, pod, rate, transfer=transfer, state=state)
        if op == "put":
            cache.put_segment(body)
        elif op == "drop":
            cache.drop_segment(body)
        else:
            cache.drop_topic("ns", topic)
        indexed = cache.active_rates()
        scanned = _scanned(cache)
        if scanned is None:
            assert indexed is None
        else:
            assert indexed is not None
            assert {(r.key, r.broker, r.rate) for r in indexed} == scanned
