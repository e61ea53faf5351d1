"""Key hashing check values (DESIGN §3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalable_topics.core.hashing import RING_MAX, RING_SIZE, bucket_hash, key_hash, segment_hash


def test_ring_constants() -> None:
    assert RING_SIZE == 65536
    assert RING_MAX == 0xFFFF


def test_hello_check_values() -> None:
    assert key_hash("hello") == 0x248BFA47
    assert segment_hash("hello") == 0x248B
    assert bucket_hash("hello") == 0xFA47


def test_key_1_check_value() -> None:
    assert key_hash("key-1") == 0x98B115A0
    assert segment_hash("key-1") == 0x98B1
    assert bucket_hash("key-1") == 0x15A0


@pytest.mark.parametrize("key", ["hello", "key-1", "", "ünïcødé-ключ", "🙂"])
def test_bytes_and_str_agree(key: str) -> None:
    assert key_hash(key) == key_hash(key.encode("utf-8"))
    assert segment_hash(key) == segment_hash(key.encode("utf-8"))
    assert bucket_hash(key) == bucket_hash(key.encode("utf-8"))


def test_empty_key_is_murmur_of_nothing() -> None:
    assert key_hash("") == 0


@given(st.text())
def test_halves_recompose_the_raw_hash(key: str) -> None:
    raw = key_hash(key)
    assert 0 <= raw <= 0xFFFFFFFF
    assert 0 <= segment_hash(key) <= RING_MAX
    assert 0 <= bucket_hash(key) <= RING_MAX
    assert (segment_hash(key) << 16) | bucket_hash(key) == raw
    assert key_hash(key.encode("utf-8")) == raw
