"""Malformed frames close only their own connection: fuzzed HELLO, SEND and consumer frames
against a real broker process, while a well-behaved producer keeps producing."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import aiohttp
import pytest
import yarl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalable_topics.client.segment import SegmentAdmin, SegmentConsumer, SegmentProducer
from scalable_topics.core import wire
from scalable_topics.core.wire import Message
from segment_broker.testing import BrokerProcess

from .conftest import metric_samples

pytestmark = pytest.mark.integration

NS, TOPIC = "fuzz", "t"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("fuzz") / "data")
    proc.start()

    async def setup() -> None:
        await proc.wait_ready()
        async with (
            aiohttp.ClientSession() as s,
            s.put(
                f"{proc.url}/admin/v1/segments/{NS}/{TOPIC}/0",
                json={
                    "range": {"start": 0, "end": 0xFFFF},
                    "buckets": 2,
                    "subscriptions": [{"name": "s", "type": "Queue"}],
                },
            ) as resp,
        ):
            assert resp.status in (200, 201)

    asyncio.run(setup())
    yield proc
    proc.terminate()


TERMINATOR = b"\xff"
"""Not a frame type of either direction: closes any connection that is still open, so every
exchange ends with a close whose code says how the fuzzed frames were taken."""


async def _exchange(url: str, frames: list[bytes]) -> tuple[int | None, list[bytes]]:
    """Send frames (then TERMINATOR) on a fresh connection; return the close code and the
    frames the server sent."""
    received: list[bytes] = []
    frames = [*frames, TERMINATOR]
    async with aiohttp.ClientSession() as s, s.ws_connect(url) as ws:
        for f in frames:
            if ws.closed:
                break
            try:
                await ws.send_bytes(f)
            except (ConnectionResetError, aiohttp.ClientError):
                break
        async with asyncio.timeout(10):
            while True:
                msg = await ws.receive()
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                received.append(msg.data)
        return ws.close_code, received


def _hello(body: dict[str, object]) -> bytes:
    return wire.encode_hello(wire.PROTOCOL_VERSION, body)


async def _healthy_produce(url: str) -> int:
    async with (
        aiohttp.ClientSession() as s,
        s.ws_connect(f"{url}/ws/v1/produce/{NS}/{TOPIC}/0") as ws,
    ):
        await ws.send_bytes(_hello({"producerName": "healthy"}))
        ok = await ws.receive()
        assert ok.data[0] == wire.FRAME_HELLO_OK
        last = wire.decode_hello_ok(ok.data)[1]["lastSequenceId"]
        entry = wire.encode_entry("healthy", last + 1, [Message(value=b"ok", key=b"k")])
        await ws.send_bytes(wire.encode_send([entry]))
        ack = await ws.receive()
        assert ack.data[0] == wire.FRAME_SEND_ACK, ack
        return wire.decode_send_ack(ack.data)[0].position


ACCEPTABLE = {wire.CLOSE_PROTOCOL_ERROR, wire.CLOSE_UNSUPPORTED_VERSION}


def _valid_entry() -> bytes:
    return wire.encode_entry("fuzzer", 1, [Message(value=b"v", key=b"k")])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    hello=st.one_of(st.binary(max_size=64), st.just(b"")),
    frames=st.lists(st.binary(max_size=200), max_size=3),
)
def test_garbage_hello_and_frames(broker: BrokerProcess, hello: bytes, frames: list[bytes]) -> None:
    url = f"{broker.url}/ws/v1/produce/{NS}/{TOPIC}/0"
    code, _ = asyncio.run(_exchange(url, [hello, *frames]))
    assert code in ACCEPTABLE


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 64),
)
def test_mutated_send_frames(broker: BrokerProcess, flips: list[tuple[int, int]], cut: int) -> None:
    frame = bytearray(wire.encode_send([_valid_entry(), _valid_entry()]))
    for index, mask in flips:
        frame[index % len(frame)] ^= mask
    if cut:
        del frame[len(frame) - cut % len(frame) :]
    url = f"{broker.url}/ws/v1/produce/{NS}/{TOPIC}/0"
    code, received = asyncio.run(_exchange(url, [_hello({"producerName": "fuzzer"}), bytes(frame)]))
    assert code in ACCEPTABLE
    assert received and received[0][0] == wire.FRAME_HELLO_OK


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    frame=st.one_of(
        st.binary(max_size=40),
        st.builds(lambda n: struct.pack("<BI", wire.FRAME_FLOW, n), st.integers(0, 2**32 - 1)),
        st.builds(
            lambda kind, positions: struct.pack(
                f"<BBH{len(positions)}q", wire.FRAME_ACK, kind, len(positions), *positions
            ),
            st.integers(0, 3),
            st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
        ),
    )
)
def test_garbage_consumer_frames(broker: BrokerProcess, frame: bytes) -> None:
    url = f"{broker.url}/ws/v1/consume/{NS}/{TOPIC}/0/s"
    hello = _hello({"consumerName": "fuzz-consumer", "buckets": [0, 1], "permits": 0})
    code, _ = asyncio.run(_exchange(url, [hello, frame]))
    assert code in ACCEPTABLE | {wire.CLOSE_BUCKET_CONFLICT}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"range": json_values, "buckets": json_values, "subscriptions": json_values},
            optional={"retention": json_values},
        ),
    ),
    route=st.sampled_from(["", "/terminate", "/subscriptions/x"]),
)
def test_admin_answers_garbage_bodies_with_client_errors(
    broker: BrokerProcess, body: object, route: str
) -> None:
    async def call() -> int:
        method = "POST" if route == "/terminate" else "PUT"
        url = f"{broker.url}/admin/v1/segments/{NS}/other/7{route}"
        async with aiohttp.ClientSession() as s, s.request(method, url, json=body) as resp:
            return resp.status

    assert asyncio.run(call()) in (200, 201, 400, 404, 409)


async def _protocol_errors(url: str, kind: str) -> float:
    samples = await metric_samples(url)
    return samples.get(("segment_broker_protocol_errors_total", (("kind", kind),)), 0.0)


def test_a_connection_cannot_write_under_another_producers_name(broker: BrokerProcess) -> None:
    """The attack of issue 11: a connection named ``other-app`` sends an entry as ``victim``
    with sequence id 2^63-1. It is closed with 4000, nothing of its batch is stored, and the
    real ``victim`` (connected before and after) keeps being stored and acknowledged."""
    topic = "names"

    async def attack(url: str) -> tuple[int | None, str, list[bytes]]:
        """Returns the close code and reason (None, "" when the broker acknowledged the batch
        instead of closing) and the frames received."""
        forged = wire.encode_entry("victim", 2**63 - 1, [Message(b"forged")])
        own = wire.encode_entry("other-app", 0, [Message(b"own")])
        received: list[bytes] = []
        async with aiohttp.ClientSession() as s, s.ws_connect(url) as ws:
            await ws.send_bytes(_hello({"producerName": "other-app"}))
            await ws.send_bytes(wire.encode_send([own, forged]))
            async with asyncio.timeout(10):
                while (msg := await ws.receive()).type == aiohttp.WSMsgType.BINARY:
                    received.append(msg.data)
                    if msg.data[0] == wire.FRAME_SEND_ACK:
                        return None, "", received
            return ws.close_code, str(msg.extra), received

    async def run() -> None:
        async with SegmentAdmin(broker.url) as admin:
            await admin.create_segment(NS, topic, 1, 0, 0xFFFF, subscriptions={"s": "Queue"})
            victim = await SegmentProducer.connect(broker.url, NS, topic, 1, "victim")
            before = await (await victim.send_entry([Message(b"v0")]))
            assert (before.position, before.duplicate) == (0, False)

            url = f"{broker.url}/ws/v1/produce/{NS}/{topic}/1"
            refused_before = await _protocol_errors(broker.url, "wrong_producer")
            code, reason, received = await attack(url)

            later = [await (await victim.send_entry([Message(f"v{i}".encode())])) for i in (1, 2)]
            assert [(a.position, a.duplicate) for a in later] == [(1, False), (2, False)]
            assert victim.failure is None
            assert code == wire.CLOSE_PROTOCOL_ERROR
            assert "'other-app'" in reason and "'victim'" in reason
            assert [f[0] for f in received] == [wire.FRAME_HELLO_OK, wire.FRAME_ERROR]
            error = wire.decode_json_frame(received[1])
            assert error["code"] == wire.ERR_PROTOCOL
            assert "must name producer 'other-app'" in error["message"]
            await victim.close()
            restarted = await SegmentProducer.connect(broker.url, NS, topic, 1, "victim")
            assert restarted.last_sequence_id == later[-1].sequence_id
            after = await (await restarted.send_entry([Message(b"v3")]))
            assert (after.position, after.duplicate) == (3, False)
            await restarted.close()
            attacker = await SegmentProducer.connect(broker.url, NS, topic, 1, "other-app")
            assert attacker.last_sequence_id == -1, "nothing of the refused batch was stored"
            await attacker.close()

            stats = await admin.stats(NS, topic, 1)
            assert (stats["lastPosition"], stats["counters"]["duplicates"]) == (3, 0)
            consumer = await SegmentConsumer.connect(broker.url, NS, topic, 1, "s", "c")
            values: list[bytes] = []
            for _ in range(4):
                entry = await consumer.receive()
                assert entry is not None
                values.extend(m.value for m in entry.messages())
            assert values == [b"v0", b"v1", b"v2", b"v3"]
            await consumer.close()
            assert await _protocol_errors(broker.url, "wrong_producer") == refused_before + 1

    asyncio.run(run())


def _deep_json(depth: int) -> bytes:
    return b'{"producerName":"p","consumerName":"c","x":' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("route", ["produce/{ns}/{t}/0", "consume/{ns}/{t}/0/s"])
def test_deeply_nested_hello_is_a_protocol_error(broker: BrokerProcess, route: str) -> None:
    url = f"{broker.url}/ws/v1/" + route.format(ns=NS, t=TOPIC)
    hello = bytes((wire.FRAME_HELLO,)) + struct.pack("<H", wire.PROTOCOL_VERSION) + _deep_json(5000)
    code, received = asyncio.run(_exchange(url, [hello]))
    assert code == wire.CLOSE_PROTOCOL_ERROR
    assert wire.decode_json_frame(received[-1])["code"] == wire.ERR_PROTOCOL


BAD_IDS = ["+7", "%207", "7%20", "18446744073709551616", "9223372036854775808", "007", "7_0"]
"""Percent-encoded as they appear in a URL (``%20`` is a space)."""


@pytest.mark.parametrize("segment_id", BAD_IDS)
def test_malformed_segment_ids_are_refused(broker: BrokerProcess, segment_id: str) -> None:
    """Segment 7 exists, so a lenient parser would serve ``+7`` as segment 7."""

    async def run() -> None:
        async with SegmentAdmin(broker.url) as admin:
            await admin.create_segment(NS, TOPIC, 7, 0, 0xFFFF, subscriptions={"s": "Queue"})
        base = f"{broker.url}/admin/v1/segments/{NS}/{TOPIC}/{segment_id}"
        calls: list[tuple[str, str, object]] = [
            ("GET", base, None),
            ("DELETE", base, None),
            ("POST", base + "/activate", None),
            ("PUT", base, {"range": {"start": 0, "end": 0xFFFF}}),
            ("PUT", base + "/subscriptions/x", {"type": "Queue"}),
        ]
        async with aiohttp.ClientSession() as s:
            for method, url, body in calls:
                async with s.request(method, yarl.URL(url, encoded=True), json=body) as resp:
                    assert resp.status == 400, (method, url, await resp.text())
                    error = (await resp.json())["error"]
                    assert error["code"] == "BadRequest"
                    assert "0..2^63-1" in error["message"]
        assert (await SegmentAdmin(broker.url).stats(NS, TOPIC, 7))["segmentId"] == 7

    asyncio.run(run())
    hellos: list[tuple[str, dict[str, object]]] = [
        (f"produce/{NS}/{TOPIC}/{segment_id}", {"producerName": "p"}),
        (f"consume/{NS}/{TOPIC}/{segment_id}/s", {"consumerName": "c"}),
    ]
    for route, hello in hellos:
        url = yarl.URL(f"{broker.url}/ws/v1/{route}", encoded=True)
        code, received = asyncio.run(_exchange(str(url), [_hello(hello)]))
        assert code == wire.CLOSE_PROTOCOL_ERROR, (route, received)
        assert "0..2^63-1" in wire.decode_json_frame(received[-1])["message"]


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("", b'{"range":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        ("/terminate", b'{"successors":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        ("/subscriptions/x", b'{"type":' + b'{"a":' * 5000 + b"1" + b"}" * 5001),
        ("", b'{"range":{"start":0,"end":5},"retention":[1]}'),
        ("", b'{"range":{"start":0,"end":NaN}}'),
        (
            "/terminate",
            b'{"successors":[{"segmentId":18446744073709551616,"range":{"start":0,"end":5}}]}',
        ),
        ("/terminate", b'{"successors":[{"segmentId":-1,"range":{"start":0,"end":5}}]}'),
    ],
)
def test_hostile_admin_bodies_are_bad_requests(
    broker: BrokerProcess, route: str, body: bytes
) -> None:
    async def call() -> tuple[int, str]:
        async with SegmentAdmin(broker.url) as admin:
            await admin.create_segment(NS, "hostile", 3, 0, 0xFFFF)
        method = "POST" if route == "/terminate" else "PUT"
        url = f"{broker.url}/admin/v1/segments/{NS}/hostile/3{route}"
        async with aiohttp.ClientSession() as s, s.request(method, url, data=body) as resp:
            return resp.status, (await resp.json())["error"]["code"]

    assert asyncio.run(call()) == (400, "BadRequest")


def test_broker_survives_the_fuzzing(broker: BrokerProcess) -> None:
    """Runs last in this module: the broker process is alive, serves a healthy producer, and
    counted the protocol errors."""

    async def check() -> str:
        before = await _healthy_produce(broker.url)
        after = await _healthy_produce(broker.url)
        assert after == before + 1
        async with aiohttp.ClientSession() as s, s.get(broker.url + "/metrics") as resp:
            return await resp.text()

    assert broker.proc is not None and broker.proc.poll() is None
    metrics = asyncio.run(check())
    counted = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("segment_broker_protocol_errors_total{")
    ]
    assert sum(counted) > 0
    assert "Traceback" not in broker.logs()
