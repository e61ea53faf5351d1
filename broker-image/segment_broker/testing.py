"""Helpers to run real brokers in tests: in-process (a real aiohttp server on a loopback port)
or as a subprocess (``python -m segment_broker``) that a test can SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
from aiohttp import web

from scalable_topics.credentials import tls_connector

from .config import BrokerConfig
from .load import LoadTracker
from .metrics import BrokerMetrics
from .server import Broker
from .tools.launch import broker_command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RunningBroker:
    broker: Broker
    url: str
    runner: web.AppRunner

    async def stop(self) -> None:
        await self.broker.stop()
        await self.runner.cleanup()


async def start_broker(
    config: BrokerConfig,
    *,
    metrics: BrokerMetrics | None = None,
    tracker: LoadTracker | None = None,
) -> RunningBroker:
    port = config.port or free_port()
    config = replace(config, port=port, host="127.0.0.1")
    broker = Broker(config, metrics=metrics, tracker=tracker)
    runner = web.AppRunner(broker.make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    await broker.start()
    return RunningBroker(broker, f"http://127.0.0.1:{port}", runner)


@contextlib.asynccontextmanager
async def running_broker(
    data_dir: Path,
    *,
    metrics: BrokerMetrics | None = None,
    tracker: LoadTracker | None = None,
    **settings: object,
) -> AsyncIterator[RunningBroker]:
    """An in-process broker on a free loopback port, stopped cleanly on exit."""
    config = BrokerConfig(data_dir=str(data_dir), port=0, **settings)  # type: ignore[arg-type]
    rb = await start_broker(config, metrics=metrics, tracker=tracker)
    try:
        yield rb
    finally:
        await rb.stop()


class BrokerProcess:
    """``python -m segment_broker`` as a child process."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        args: Sequence[str] = (),
        ca_file: str | None = None,
    ) -> None:
        """With ``--tls-cert-file`` in ``args`` the broker serves HTTPS: :attr:`url` is
        ``https://`` and :meth:`wait_ready` verifies it against ``ca_file``."""
        self.data_dir = data_dir
        self.port = port or free_port()
        scheme = "https" if "--tls-cert-file" in args else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.ca_file = ca_file
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"broker-{self.port}.log"

    def start(self) -> None:
        cmd = broker_command(self.port, self.data_dir, *self.args)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        log.close()

    async def wait_ready(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        connector = tls_connector(self.ca_file) if self.ca_file else None
        async with aiohttp.ClientSession(connector=connector) as session:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.logs()}")
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(self.url + "/readyz") as resp:
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.05)
        raise TimeoutError(f"broker not ready after {within} s: {self.logs()}")

    def freeze(self) -> None:
        """SIGSTOP: every thread stops where it is; ``kill`` still ends it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def kill(self) -> None:
        """SIGKILL: no flush, no shutdown hooks."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""
