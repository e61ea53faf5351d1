"""A small, real stand-in for the operator around the client SDK's tests and the split benchmark.

* Brokers are real ``python -m segment_broker`` processes (``segment_broker.testing``).
* The operator's session server is the real one (``controller.sessions.make_app`` with a real
  ``controller.consumers.ConsumerHub``), fed by :class:`MemoryDagSource`, an in-memory
  implementation of the ``DagSource`` interface built from ``SegmentLayout``s.
* :class:`TopicEnv` executes splits and merges against the brokers' admin API in the order of
  DESIGN §5 (children created with every subscription, parents terminated with their
  successors, then the new layout published and handed to the hub).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from scalable_topics.client.segment import SegmentAdmin, Successor
from scalable_topics.controller.brokers import BrokerPod, choose_broker
from scalable_topics.controller.consumers import ConsumerHub
from scalable_topics.controller.sessions import make_app
from scalable_topics.core.buckets import initial_layout_buckets, layout_buckets
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.sessions import DagMessage, dag_message
from segment_broker.testing import BrokerProcess, free_port
from tests.memory_dags import MemoryDagSource


@dataclass
class SwitchRouting:
    """Shard routing: this replica leads while ``leader`` is its own URL."""

    own_url: str
    leader: str

    def leads(self, namespace: str, name: str) -> bool:
        return self.leader == self.own_url

    def leader_url(self, namespace: str, name: str) -> str:
        return self.leader


@dataclass
class OperatorReplica:
    """One operator replica's session server on a loopback port."""

    url: str
    dags: MemoryDagSource
    routing: SwitchRouting
    hub: ConsumerHub
    runner: web.AppRunner
    persisted: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_operator(
    *,
    dags: MemoryDagSource | None = None,
    leader: str | None = None,
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
) -> OperatorReplica:
    """With ``ssl_context`` the session server serves HTTPS/WSS and advertises ``https://``."""
    port = port or free_port()
    url = f"{'https' if ssl_context is not None else 'http'}://127.0.0.1:{port}"
    dags = dags or MemoryDagSource()
    routing = SwitchRouting(url, leader or url)
    persisted: dict[tuple[str, str, str], dict[str, Any]] = {}

    async def persist(ns: str, topic: str, sub: str, status: dict[str, Any]) -> None:
        persisted[(ns, topic, sub)] = status

    hub = ConsumerHub(persist=persist, on_consumers_changed=lambda ns, t: None)
    app = make_app(dags, routing, hub, health=lambda: True, ready=lambda: True, heartbeat=5.0)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(
        runner, "127.0.0.1", port, reuse_address=True, ssl_context=ssl_context
    ).start()
    return OperatorReplica(url, dags, routing, hub, runner, persisted)


def _ready(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=1, context=context) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def broker_processes(
    base: Path, count: int = 2, *, args: Sequence[str] = (), ca_file: str | None = None
) -> Iterator[list[BrokerProcess]]:
    """``count`` real broker processes, ready, stopped on exit (``args`` for each; with TLS
    on, ``ca_file`` verifies their readiness probe)."""
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    procs = []
    try:
        for i in range(count):
            data = base / f"broker-{i}"
            data.mkdir(parents=True, exist_ok=True)
            proc = BrokerProcess(data, args=args, ca_file=ca_file)
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + 60
        for proc in procs:
            while not _ready(proc.url, context):
                if proc.proc is not None and proc.proc.poll() is not None:
                    raise RuntimeError(f"broker exited: {proc.logs()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"broker not ready: {proc.logs()}")
                time.sleep(0.05)
        yield procs
    finally:
        for proc in procs:
            proc.terminate()


async def wait_ready(url: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(_ready, url):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready")
        await asyncio.sleep(0.05)


class TopicEnv:
    """One topic on real brokers, published through an operator replica's session server."""

    def __init__(
        self,
        operator: OperatorReplica,
        broker_urls: list[str],
        namespace: str,
        topic: str,
        *,
        subscriptions: Mapping[str, str],
        bucket_budget: int = 4,
        grace_period: float = 30.0,
        ca_file: str | None = None,
        operator_placement: bool = False,
    ) -> None:
        self.operator = operator
        self.operator_placement = operator_placement
        """Place a split's children as the operator does (``choose_broker``: beside their
        parent while the brokers stay balanced, opened by the parent's seal) instead of on the
        brokers after the parent's, which keeps the tests' re-routes crossing brokers."""
        self.opened_by_seal: list[int] = []
        """The children the last split's or merge's seals opened (``terminate {open}``)."""
        self.broker_urls = broker_urls
        self.namespace = namespace
        self.topic = topic
        self.subscriptions = dict(subscriptions)
        self.bucket_budget = bucket_budget
        self.grace_period = grace_period
        self.layout = SegmentLayout.initial(1)
        self.buckets: dict[int, int] = {}
        self.placement: dict[int, str] = {}
        self.admins = {url: SegmentAdmin(url, ca_file=ca_file) for url in broker_urls}
        self.operators = [operator]
        self.controller_url: str | None = operator.url
        """The ``controllerUrl`` the DAG announces (tests may make it stale)."""

    @property
    def service_url(self) -> str:
        return self.operator.url

    async def create(self, segments: int) -> None:
        self.layout = SegmentLayout.initial(segments)
        self.buckets = initial_layout_buckets(self.layout, self.bucket_budget)
        for i, segment in enumerate(self.layout.active()):
            await self._create_segment(segment.segment_id, i)
        self.publish()
        for replica in self.operators:
            replica.hub.restore(
                self.namespace,
                self.topic,
                self.layout,
                [],
                grace_period=self.grace_period,
                strategies={n: "sticky" for n, t in self.subscriptions.items() if t != "Queue"},
                queues=[n for n, t in self.subscriptions.items() if t == "Queue"],
            )

    async def _create_segment(
        self, segment_id: int, slot: int, *, writable: bool = True, url: str | None = None
    ) -> None:
        url = url or self.broker_urls[slot % len(self.broker_urls)]
        info = self.layout.segments[segment_id]
        await self.admins[url].create_segment(
            self.namespace,
            self.topic,
            segment_id,
            info.hash_range.start,
            info.hash_range.end,
            buckets=self.buckets[segment_id],
            subscriptions=self.subscriptions,
            writable=writable,
        )
        self.placement[segment_id] = url

    def publish(self) -> DagMessage:
        message = dag_message(
            self.namespace,
            self.topic,
            self.layout,
            brokers=self.placement,
            buckets=self.buckets,
            controller_url=self.controller_url,
        )
        for replica in self.operators:
            replica.dags.publish(message)
        return message

    async def _apply(
        self, new: SegmentLayout, parents: list[int], *, early_push: float | None = None
    ) -> list[int]:
        """DESIGN §5 steps 3-6 for a committed-to-be layout ``new``.

        ``early_push`` publishes the new DAG that many seconds *before* terminating the parents:
        the race where a producer hears of the split from the DAG watch before its parent's
        ``SEALED`` frame arrives. As the operator does, the children are created fenced and
        opened only once every parent is sealed."""
        children = await self._create_children(new, parents)
        successors = [
            Successor(
                c,
                new.segments[c].hash_range.start,
                new.segments[c].hash_range.end,
                self.placement[c],
            )
            for c in children
        ]
        if early_push is not None:
            self.publish()
            await asyncio.sleep(early_push)
        sealed = await asyncio.gather(
            *(
                self.admins[self.placement[p]].terminate(
                    self.namespace,
                    self.topic,
                    p,
                    successors,
                    open_after=[
                        c
                        for c in children
                        if self.operator_placement
                        and new.segments[c].parent_ids == (p,)
                        and self.placement[c] == self.placement[p]
                    ],
                )
                for p in parents
            )
        )
        self.opened_by_seal = sorted(sid for reply in sealed for sid in reply.get("opened", []))
        await asyncio.gather(
            *(
                self.admins[self.placement[c]].activate(self.namespace, self.topic, c)
                for c in children
            )
        )
        self.publish()
        for replica in self.operators:
            replica.hub.layout_changed(self.namespace, self.topic, new)
        return children

    async def _create_children(self, new: SegmentLayout, parents: list[int]) -> list[int]:
        """Make ``new`` the layout and create its new segments on their brokers, fenced."""
        children = sorted(set(new.segments) - set(self.layout.segments))
        load = Counter(self.placement[s.segment_id] for s in self.layout.active())
        self.buckets = layout_buckets(new, self.buckets)
        self.layout = new
        for child in children:
            slot = self.broker_urls.index(self.placement[parents[0]]) + 1 + children.index(child)
            url = None
            if self.operator_placement:
                pods = [BrokerPod(u, u, ready=True) for u in self.broker_urls]
                beside = self.placement[parents[0]] if len(parents) == 1 else None
                chosen = choose_broker(pods, load, beside=beside)
                assert chosen is not None
                url = chosen.url
                load[url] += 1
            await self._create_segment(child, slot, writable=False, url=url)
        return children

    async def announce_split(self, segment_id: int) -> list[int]:
        """Create a split's children (fenced) and publish the new DAG, without sealing the
        parent on its broker or telling the session server: the window in which a client has
        heard of a seal its broker has not made yet."""
        children = await self._create_children(self.layout.split(segment_id), [segment_id])
        self.publish()
        return children

    async def split(
        self, segment_id: int, at: int | None = None, *, early_push: float | None = None
    ) -> list[int]:
        new = self.layout.split(segment_id, at)
        return await self._apply(new, [segment_id], early_push=early_push)

    async def merge(self, *segment_ids: int) -> list[int]:
        return await self._apply(self.layout.merge(*segment_ids), list(segment_ids))

    async def stats(self, segment_id: int) -> dict[str, Any]:
        url = self.placement[segment_id]
        return await self.admins[url].stats(self.namespace, self.topic, segment_id)

    async def all_acknowledged(self, segment_id: int, subscription: str) -> bool:
        """The broker holds nothing of the segment unacknowledged for ``subscription``, and no
        entry acknowledged only in part (protocol v4 batch indexes)."""
        sub = (await self.stats(segment_id))["subscriptions"][subscription]
        return bool(sub["backlog"] == 0 and sub["partiallyAcked"] == 0)

    async def close(self) -> None:
        for admin in self.admins.values():
            await admin.close()


@dataclass
class KeyedLoad:
    """Sends ``key:n`` values for a fixed set of keys, in rounds, and records what was
    acknowledged (and where)."""

    keys: list[str]
    acked: dict[tuple[str, int], Any] = field(default_factory=dict)
    ack_times: dict[tuple[str, int], float] = field(default_factory=dict)
    sent: int = 0
    errors: list[BaseException] = field(default_factory=list)
    _waiters: list[tuple[int, asyncio.Event]] = field(default_factory=list)

    async def wait_acked(self, count: int) -> None:
        """Until at least ``count`` messages are acknowledged."""
        if len(self.acked) >= count:
            return
        event = asyncio.Event()
        self._waiters.append((count, event))
        await event.wait()

    @staticmethod
    def value(key: str, n: int) -> bytes:
        return f"{key}:{n}".encode()

    @staticmethod
    def parse(value: bytes) -> tuple[str, int]:
        key, _, n = value.decode().rpartition(":")
        return key, int(n)

    async def run(
        self,
        producer: Any,
        rounds: int,
        *,
        first: int = 0,
        pause: float = 0.0,
        window: int = 2000,
    ) -> None:
        """Send ``rounds`` messages per key (values ``first`` on), at most ``window``
        unacknowledged."""
        pending: set[asyncio.Future[Any]] = set()
        for n in range(first, first + rounds):
            for key in self.keys:
                future = await producer.send_async(self.value(key, n), key=key)
                future.add_done_callback(self._recorder(key, n))
                pending.add(future)
                future.add_done_callback(pending.discard)
                self.sent += 1
                while len(pending) >= window:
                    await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
            if pause:
                await asyncio.sleep(pause)
        if pending:
            await asyncio.wait(set(pending))

    def _recorder(self, key: str, n: int) -> Any:
        def record(future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                return
            if future.exception() is not None:
                self.errors.append(future.exception())  # type: ignore[arg-type]
                return
            self.acked[(key, n)] = future.result()
            self.ack_times[(key, n)] = time.monotonic()
            for count, event in self._waiters:
                if len(self.acked) >= count:
                    event.set()

        return record


def check_order(received: list[tuple[str, int]], acked: Mapping[tuple[str, int], Any]) -> None:
    """Every acknowledged message was received, and each key's values came in order (a value
    may repeat only right where a redelivery restarts, never go back past a newer one already
    seen after its first delivery)."""
    seen: dict[str, int] = {}
    got = set()
    for key, n in received:
        last = seen.get(key, -1)
        assert n >= last or (key, n) in got, f"key {key}: {n} after {last}"
        if n > last:
            assert n == last + 1 or (key, last + 1) not in acked, (
                f"key {key}: {n} after {last}, {last + 1} missing"
            )
        seen[key] = max(last, n)
        got.add((key, n))
    missing = set(acked) - got
    assert not missing, (
        f"{len(missing)} acknowledged messages never received, e.g. {sorted(missing)[:5]}"
    )
