"""The peers: NATS JetStream and Redis Streams, their servers and their Python clients.

Server side (`start_nats`, `start_redis`) runs in the orchestrator; the adapters run in the
pinned load-generator process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

from bench._load import consume_batches
from bench._procs import Server, ensure_debian_package, free_port, start_server, tcp_open

NATS_DURABILITY = (
    "JetStream file storage, R1, **ack before fsync** (nats-server 2.9.10 has no "
    "`sync_interval`; it flushes to disk on its own schedule)"
)
REDIS_DURABILITY = "AOF `appendfsync always`: ack after fsync (group commit per event-loop pass)"

REDIS_GROUP = "g"


def _run(endpoint: dict[str, Any]) -> int:
    """Each payload size gets its own stream (`endpoint["run"]`), so runs can interleave."""
    return int(endpoint.get("run", 0))


def nats_version(binary: str) -> str:
    r = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return (r.stdout or r.stderr).strip()


def start_nats(workdir: Path) -> tuple[Server, dict[str, Any], str]:
    binary = ensure_debian_package("nats-server", "nats-server")
    port = free_port()
    store = workdir / "jetstream"
    store.mkdir()
    conf = workdir / "nats.conf"
    conf.write_text(
        f"listen: 127.0.0.1:{port}\n"
        "max_payload: 1MB\n"
        f'jetstream {{\n  store_dir: "{store}"\n  max_memory_store: 256MB\n'
        "  max_file_store: 64GB\n}\n"
    )
    server = start_server(
        "nats-server", [binary, "-c", str(conf)], workdir, port, lambda: tcp_open(port)
    )
    return server, {"url": f"nats://127.0.0.1:{port}"}, nats_version(binary)


def start_redis(workdir: Path) -> tuple[Server, dict[str, Any], str]:
    binary = ensure_debian_package("redis-server", "redis-server")
    port = free_port()
    conf = workdir / "redis.conf"
    conf.write_text(
        "bind 127.0.0.1\n"
        f"port {port}\n"
        "protected-mode yes\n"
        "daemonize no\n"
        f'dir "{workdir}"\n'
        'save ""\n'
        "appendonly yes\n"
        "appendfsync always\n"
        "auto-aof-rewrite-percentage 0\n"
        "io-threads 1\n"
    )
    r = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    version = r.stdout.strip()

    def ready() -> bool:
        import socket

        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    server = start_server("redis-server", [binary, str(conf)], workdir, port, ready)
    return server, {"host": "127.0.0.1", "port": port}, version


# --- NATS JetStream client side ---------------------------------------------------------------


class NatsProducer:
    def __init__(self, nc: Any, js: Any, subject: str, payload: bytes) -> None:
        self.nc = nc
        self.js = js
        self.subject = subject
        self.payload = payload

    async def send(self, n: int) -> None:
        publish = self.js.publish_async
        subject, payload = self.subject, self.payload
        futures = [await publish(subject, payload) for _ in range(n)]
        await asyncio.gather(*futures)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.close()


class NatsConsumer:
    """Pull consumer, `fetch(batch)` then one ack of the last message (AckPolicy.ALL).

    AckAll is the JetStream counterpart of the cumulative ack our consumers use.
    """

    def __init__(self, nc: Any, sub: Any, batch: int) -> None:
        self.nc = nc
        self.sub = sub
        self.batch = batch

    async def consume(self, max_messages: int, duration: float) -> tuple[int, float]:
        import nats.errors

        async def take(remaining: int) -> int | None:
            try:
                msgs = await self.sub.fetch(min(self.batch, remaining), timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                return None
            if not msgs:
                return None
            await msgs[-1].ack()
            return len(msgs)

        return await consume_batches(max_messages, duration, take)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.close()


class NatsAdapter:
    def __init__(self, endpoint: dict[str, Any]) -> None:
        self.url = str(endpoint["url"])
        run = _run(endpoint)
        self.stream = f"BENCH{run}"
        self.subject = f"bench.{run}"

    async def _connect(self, window: int = 4000) -> tuple[Any, Any]:
        import nats

        nc = await nats.connect(self.url, max_reconnect_attempts=0, connect_timeout=5)
        return nc, nc.jetstream(publish_async_max_pending=window, timeout=30)

    async def reset(self) -> None:
        from nats.js.api import StorageType
        from nats.js.errors import NotFoundError

        nc, js = await self._connect()
        try:
            with contextlib.suppress(NotFoundError):
                await js.delete_stream(self.stream)
            await js.add_stream(
                name=self.stream,
                subjects=[self.subject],
                storage=StorageType.FILE,
                num_replicas=1,
            )
        finally:
            await nc.close()

    async def producer(self, payload_size: int, batch: int, window: int) -> NatsProducer:
        nc, js = await self._connect(window)
        return NatsProducer(nc, js, self.subject, os.urandom(payload_size))

    async def consumer(self, batch: int) -> NatsConsumer:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        nc, js = await self._connect()
        config = ConsumerConfig(
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=batch * 4,
            max_waiting=16,
        )
        sub = await js.pull_subscribe(
            self.subject, durable="bench", stream=self.stream, config=config
        )
        return NatsConsumer(nc, sub, batch)


async def nats_adapter(endpoint: dict[str, Any]) -> NatsAdapter:
    return NatsAdapter(endpoint)


# --- Redis Streams client side ----------------------------------------------------------------


class RedisProducer:
    """XADD pipelined: one pipeline (no MULTI) per batch over a blocking pool of
    `window / batch` connections (a batch waits for a free connection, as a bounded client
    would)."""

    def __init__(self, client: Any, key: str, payload: bytes) -> None:
        self.client = client
        self.key = key
        self.fields = {b"d": payload}

    async def send(self, n: int) -> None:
        key, fields = self.key, self.fields
        async with self.client.pipeline(transaction=False) as pipe:
            for _ in range(n):
                pipe.xadd(key, fields)
            await pipe.execute()

    async def close(self) -> None:
        await self.client.aclose()


class RedisConsumer:
    """XREADGROUP COUNT batch, then one XACK with every id of the batch."""

    def __init__(self, client: Any, key: str, batch: int) -> None:
        self.client = client
        self.key = key
        self.batch = batch

    async def consume(self, max_messages: int, duration: float) -> tuple[int, float]:
        c, key = self.client, self.key

        async def take(remaining: int) -> int | None:
            count = min(self.batch, remaining)
            resp = await c.xreadgroup(REDIS_GROUP, "c1", {key: ">"}, count=count)
            if not resp:
                return None
            ids = [mid for mid, _ in resp[0][1]]
            if not ids:
                return None
            await c.xack(key, REDIS_GROUP, *ids)
            return len(ids)

        return await consume_batches(max_messages, duration, take)

    async def close(self) -> None:
        await self.client.aclose()


class RedisAdapter:
    def __init__(self, endpoint: dict[str, Any]) -> None:
        self.host = str(endpoint["host"])
        self.port = int(endpoint["port"])
        self.key = f"bench{_run(endpoint)}"

    def _client(self, connections: int = 4) -> Any:
        import redis.asyncio

        pool = redis.asyncio.BlockingConnectionPool(
            host=self.host,
            port=self.port,
            max_connections=connections,
            timeout=60,
            socket_timeout=60,
        )
        return redis.asyncio.Redis.from_pool(pool)

    async def reset(self) -> None:
        c = self._client()
        try:
            await c.delete(self.key)
            await c.xgroup_create(self.key, REDIS_GROUP, id="0", mkstream=True)
        finally:
            await c.aclose()

    async def producer(self, payload_size: int, batch: int, window: int) -> RedisProducer:
        client = self._client(max(1, window // batch) + 2)
        return RedisProducer(client, self.key, os.urandom(payload_size))

    async def consumer(self, batch: int) -> RedisConsumer:
        return RedisConsumer(self._client(), self.key, batch)


async def redis_adapter(endpoint: dict[str, Any]) -> RedisAdapter:
    return RedisAdapter(endpoint)
