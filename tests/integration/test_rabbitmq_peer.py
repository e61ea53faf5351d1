"""RabbitMQ streams as the benchmark's peer (bench/_rabbitmq.py): Debian's rabbitmq-server with
the stream plugin from a temporary directory, StreamBench.java on RabbitMQ's Java stream client
producing with confirms and consuming from the first offset, then a stop that leaves no VM and no
epmd behind."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from bench import _native, _rabbitmq

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not _rabbitmq.START_SCRIPT.exists() and os.geteuid() != 0,
        reason="rabbitmq-server is not installed and installing it needs root "
        "(apt-get install rabbitmq-server)",
    ),
    pytest.mark.skipif(
        not shutil.which("javac") or not shutil.which("mvn"),
        reason="the stream client needs a JDK and, once, Maven (apt-get install "
        "openjdk-17-jdk-headless maven)",
    ),
]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""


def test_rabbitmq_streams_take_confirmed_messages_give_them_back_and_stop(tmp_path: Path) -> None:
    server, endpoint, version = _rabbitmq.start_rabbitmq(tmp_path)
    assert isinstance(server, _rabbitmq.RabbitServer)
    try:
        assert version.startswith("RabbitMQ 3.")
        assert _command(server.pid) == "beam.smp", "the measured pid is the VM, not a shell"
        _native.rabbit_reset(endpoint, 100)
        produced = _native.rabbit_produce(endpoint, 100, duration=1.0, warmup=0.3, window=512)
        assert produced.errors == 0 and produced.first_error is None
        assert produced.acked == produced.sent > 0
        assert produced.recorded == produced.acked
        assert 0 < produced.p50_ms <= produced.p99_ms <= produced.max_ms
        assert produced.client_cpu > 0
        consumed = _native.rabbit_consume(endpoint, 100, duration=30.0)
        # The consumer reads from the first offset: the warm-up's messages too.
        assert consumed.received >= produced.acked
        assert server.cpu() > 0

        _native.rabbit_reset(endpoint, 100)
        assert _native.rabbit_consume(endpoint, 100, duration=5.0).received == 0
    finally:
        server.stop()
    assert not server.alive()
    assert not _listening(endpoint["port"])
    assert not _listening(server.epmd_port), "the VM's epmd is stopped with it"
