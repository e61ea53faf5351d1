"""Where a new segment goes (``controller.brokers.choose_broker``): the least loaded ready broker,
and a split's child beside its parent while that keeps the brokers within one segment of each
other."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scalable_topics.controller.brokers import BrokerPod, choose_broker


def _pods(*names: str, cordoned: str = "", unready: str = "") -> list[BrokerPod]:
    return [
        BrokerPod(n, f"http://{n}:8080", ready=n != unready, cordoned=n == cordoned) for n in names
    ]


def _chosen(pods: list[BrokerPod], load: dict[str, int], beside: str | None = None) -> str:
    pod = choose_broker(pods, load, beside=beside)
    assert pod is not None
    return pod.name


def test_the_least_loaded_ready_broker_is_chosen() -> None:
    pods = _pods("a", "b", "c", cordoned="c")
    assert _chosen(pods, {"a": 3, "b": 2, "c": 0}) == "b"
    assert _chosen(pods, {"a": 2, "b": 2}) == "a"
    assert choose_broker(_pods("a", unready="a"), {}) is None


def test_a_split_child_goes_beside_its_parent_while_the_brokers_stay_balanced() -> None:
    pods = _pods("a", "b")
    # "a" counts the parent, which the split seals: 3 - 1 is not above b's 2.
    assert _chosen(pods, {"a": 3, "b": 2}, beside="a") == "a"
    assert _chosen(pods, {"a": 4, "b": 2}, beside="a") == "b"
    for unusable in (_pods("a", "b", cordoned="a"), _pods("a", "b", unready="a")):
        assert _chosen(unusable, {"a": 0, "b": 5}, beside="a") == "b"
    assert _chosen(pods, {"a": 1, "b": 2}, beside="gone") == "a"


@given(
    base=st.integers(min_value=0, max_value=50),
    above=st.lists(st.booleans(), min_size=1, max_size=6),
    home=st.integers(min_value=0, max_value=5),
    children=st.integers(min_value=1, max_value=2),
)
def test_splits_beside_their_parent_keep_the_brokers_within_one_segment(
    base: int, above: list[bool], home: int, children: int
) -> None:
    """Active segments per broker within one of each other (as least-loaded placement keeps
    them) stay so after a split: its parent counted until sealed, children placed one by
    one."""
    names = [f"broker-{i}" for i in range(len(above))]
    parent_home = names[home % len(names)]
    load = {n: base + int(up) for n, up in zip(names, above, strict=True)}
    load[parent_home] += 1
    for _ in range(children):
        chosen = choose_broker(_pods(*names), load, beside=parent_home)
        assert chosen is not None
        load[chosen.name] += 1
    load[parent_home] -= 1
    assert max(load.values()) - min(load.values()) <= 1
