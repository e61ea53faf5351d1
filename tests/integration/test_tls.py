"""Optional TLS (issue 16, docs/security.md): real broker processes and the real session server
serving HTTPS/WSS with certificates made by openssl for this run; the SDK verifies them against
a CA bundle and fails at once, naming TLS verification, with the wrong one."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from scalable_topics.client import DagWatcher, ScalableTopicProducer, StreamConsumer
from scalable_topics.client.segment import TLSVerificationError
from scalable_topics.credentials import TLS_VERIFICATION_FAILED, server_ssl_context

from .client_harness import KeyedLoad, TopicEnv, broker_processes, start_operator

pytestmark = pytest.mark.integration

NS = "tls"
SUBS = {"stream": "Stream"}
KEYS = [f"k-{i}" for i in range(8)]


@dataclass(frozen=True)
class Pki:
    ca: str
    other_ca: str
    cert: str
    key: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "1", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate it signs for 127.0.0.1, and an unrelated second CA."""
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "other-ca")
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1",
        cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "server.ext",
        cwd=d,
    )  # fmt: skip
    return Pki(
        str(d / "ca.crt"), str(d / "other-ca.crt"), str(d / "server.crt"), str(d / "server.key")
    )


def _broker_tls(pki: Pki) -> list[str]:
    return ["--tls-cert-file", pki.cert, "--tls-key-file", pki.key]


async def test_produce_and_consume_over_tls(pki: Pki, tmp_path: Path) -> None:
    """Brokers and the session server on TLS: the DAG advertises https (wss) URLs, and a
    producer and a consumer given the CA bundle work end to end."""
    with broker_processes(tmp_path, 1, args=_broker_tls(pki), ca_file=pki.ca) as procs:
        assert procs[0].url.startswith("https://")
        operator = await start_operator(ssl_context=server_ssl_context(pki.cert, pki.key))
        env = TopicEnv(
            operator, [p.url for p in procs], NS, "orders", subscriptions=SUBS, ca_file=pki.ca
        )
        try:
            await env.create(2)
            async with DagWatcher(operator.url, NS, "orders", ca_file=pki.ca) as watcher:
                dag = watcher.dag
                assert dag.controller_url is not None
                assert dag.controller_url.startswith("https://127.0.0.1:")
                assert set(dag.brokers().values()) == {procs[0].url}
            load = KeyedLoad(KEYS)
            async with ScalableTopicProducer(operator.url, NS, "orders", ca_file=pki.ca) as p:
                await load.run(p, 5)
            assert not load.errors
            assert len(load.acked) == len(KEYS) * 5
            consumer = StreamConsumer(operator.url, NS, "orders", "stream", "w", ca_file=pki.ca)
            await consumer.start()
            got: set[tuple[str, int]] = set()
            async with asyncio.timeout(30):
                while len(got) < len(load.acked):
                    msg = await consumer.receive()
                    got.add(KeyedLoad.parse(msg.value))
                    await consumer.ack(msg)
            assert got == set(load.acked)
            await consumer.close()
        finally:
            await env.close()
            await operator.stop()


@pytest.mark.parametrize("ca", ["none", "other"])
async def test_an_unverified_operator_fails_at_once(
    pki: Pki, ca: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the CA bundle, or with another CA's, the DAG watch (so a producer's and a
    consumer's start) raises TLSVerificationError at once: no retry loop until a timeout."""
    monkeypatch.delenv("SCALABLE_TOPICS_CA_FILE", raising=False)
    ca_file = None if ca == "none" else pki.other_ca
    operator = await start_operator(ssl_context=server_ssl_context(pki.cert, pki.key))
    try:
        began = time.monotonic()
        producer = ScalableTopicProducer(operator.url, NS, "orders", ca_file=ca_file)
        with pytest.raises(TLSVerificationError) as raised:
            await producer.start()
        await producer.close()
        consumer = StreamConsumer(operator.url, NS, "orders", "stream", "w", ca_file=ca_file)
        with pytest.raises(TLSVerificationError):
            await consumer.start()
        await consumer.close()
        assert time.monotonic() - began < 10, "refused at once, not after the start timeout"
        assert raised.value.code == TLS_VERIFICATION_FAILED
        assert "TLS verification of wss://127.0.0.1" in str(raised.value)
        assert "certificate verify failed" in str(raised.value)
    finally:
        await operator.stop()


async def test_an_unverified_broker_fails_the_messages(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator on plain HTTP, the broker on TLS, the producer with another CA: its
    messages fail with TLSVerificationError (the broker's URL named), not retried forever; the
    CA bundle from ``$SCALABLE_TOPICS_CA_FILE`` is the default."""
    with broker_processes(tmp_path, 1, args=_broker_tls(pki), ca_file=pki.ca) as procs:
        operator = await start_operator()
        env = TopicEnv(
            operator, [p.url for p in procs], NS, "audit", subscriptions=SUBS, ca_file=pki.ca
        )
        try:
            await env.create(1)
            monkeypatch.setenv("SCALABLE_TOPICS_CA_FILE", pki.other_ca)
            async with ScalableTopicProducer(operator.url, NS, "audit") as producer:
                future = await producer.send_async(b"x", key="k")
                async with asyncio.timeout(10):
                    with pytest.raises(TLSVerificationError, match="TLS verification of wss://"):
                        await future
            monkeypatch.setenv("SCALABLE_TOPICS_CA_FILE", pki.ca)
            async with ScalableTopicProducer(operator.url, NS, "audit") as producer:
                await producer.send(b"y", key="k")
        finally:
            await env.close()
            await operator.stop()


async def _stopic(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scalable_topics.cli.main", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_stopic_verifies_with_ca_file(pki: Pki, tmp_path: Path) -> None:
    """``stopic --ca-file``: the right CA produces over TLS; another CA exits with one line
    naming TLS verification."""
    with broker_processes(tmp_path, 1, args=_broker_tls(pki), ca_file=pki.ca) as procs:
        operator = await start_operator(ssl_context=server_ssl_context(pki.cert, pki.key))
        env = TopicEnv(
            operator, [p.url for p in procs], NS, "cli", subscriptions=SUBS, ca_file=pki.ca
        )
        try:
            await env.create(1)
            common = ["-n", NS, "--service-url", operator.url, "--count", "3"]
            code, err = await _stopic("produce", "cli", *common, "--ca-file", pki.other_ca)
            assert code != 0
            assert "TLS verification of https://127.0.0.1" in err, err
            code, err = await _stopic("produce", "cli", *common, "--ca-file", pki.ca)
            assert code == 0, err
            assert (await env.stats(0))["lastPosition"] >= 0
        finally:
            await env.close()
            await operator.stop()
