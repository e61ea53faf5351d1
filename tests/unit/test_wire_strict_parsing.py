"""Strict parsing of what clients send: ids in paths and JSON, JSON objects (docs/protocol.md)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalable_topics.core import wire
from scalable_topics.core.wire import WireError


@given(st.integers(0, wire.MAX_ID))
def test_every_id_round_trips_through_its_decimal_text(value: int) -> None:
    assert wire.parse_id(str(value)) == value
    assert wire.check_id(value) == value


@pytest.mark.parametrize(
    "text",
    [
        "+7",
        " 7",
        "7 ",
        "7\n",
        "-1",
        "-0",
        "007",
        "00",
        "7_0",
        "0x7",
        "7.0",
        "1e3",
        "",
        "\u0667",  # ARABIC-INDIC DIGIT SEVEN: int() takes it
        "\uff17",  # FULLWIDTH DIGIT SEVEN
        str(2**63),
        "18446744073709551616",
        "9" * 5000,
    ],
)
def test_ids_that_int_would_take_or_that_exceed_63_bits_are_refused(text: str) -> None:
    with pytest.raises(WireError) as info:
        wire.parse_id(text)
    assert info.value.kind == "bad_id"
    assert "0..2^63-1" in str(info.value)


@given(st.text(max_size=25))
def test_parse_id_accepts_exactly_the_canonical_decimals(text: str) -> None:
    canonical = text.isascii() and text.isdigit() and str(int(text)) == text
    try:
        value = wire.parse_id(text)
    except WireError:
        assert not canonical or int(text) > wire.MAX_ID
    else:
        assert canonical and str(value) == text


@pytest.mark.parametrize("value", [-1, 2**63, 2**70, True, 7.0, "7", None, [7]])
def test_check_id_refuses_what_is_not_a_63_bit_integer(value: object) -> None:
    with pytest.raises(WireError):
        wire.check_id(value)


def _nested(depth: int) -> bytes:
    """``{"a": [[...]]}`` with ``depth`` levels counting the outer object."""
    return b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_json_nesting_is_bounded_without_recursion_errors() -> None:
    assert wire.parse_json_object(_nested(wire.MAX_JSON_DEPTH))
    for depth in (wire.MAX_JSON_DEPTH + 1, 5000, 200_000):
        with pytest.raises(WireError, match="deeper"):
            wire.parse_json_object(_nested(depth))
    deep_object = b'{"a":' * 5000 + b"1" + b"}" * 5000
    with pytest.raises(WireError, match="deeper"):
        wire.parse_json_object(deep_object)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[1]",
        b'"x"',
        b"{nope",
        b'{"a":NaN}',
        b'{"a":-Infinity}',
        b'{"a":"\\ud800"}',
        b'{"\\udfff":1}',
        b'{"a":"\xff"}',
        b'{"a":' + b"1" * 5000 + b"}",
    ],
)
def test_malformed_json_objects_are_wire_errors(body: bytes) -> None:
    with pytest.raises(WireError) as info:
        wire.parse_json_object(body, "HELLO")
    assert info.value.kind == "bad_json"
    assert str(info.value).startswith("HELLO ")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), json_values, max_size=4))
def test_well_formed_objects_parse_to_themselves(body: dict[str, object]) -> None:
    assert wire.parse_json_object(json.dumps(body).encode()) == body


def test_hello_decoder_uses_the_strict_parser() -> None:
    with pytest.raises(WireError, match="deeper"):
        wire.decode_hello(bytes((wire.FRAME_HELLO, 1, 0)) + _nested(3000))
    assert wire.decode_hello(bytes((wire.FRAME_HELLO, 1, 0))) == (1, {})
