"""The segment broker's admin HTTP API (docs/protocol.md, "Admin HTTP") as one client.

The SDK uses it as ``scalable_topics.client.SegmentAdmin`` (one broker); the controller holds one
per broker pod over a shared HTTP session (``controller.brokers.BrokerAdmin``). Every call is
idempotent on the broker (create returns the existing segment, terminate of a sealed segment
returns the same seal, activate of an open one is a no-op), which is what lets a new leader
replay any step of an operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import aiohttp

from .core.subscriptions import BrokerSubscriptionType
from .core.wire import Successor
from .credentials import tls_connector

ADMIN_PREFIX = "/admin/v1/segments"


class AdminError(Exception):
    """The broker answered with an error (``status`` ≥ 400 and its error ``code``), or could not
    be reached or did not answer in time (``status`` 0, code ``Unreachable``)."""

    def __init__(self, url: str, status: int, code: str, message: str) -> None:
        super().__init__(f"broker {url}: {code}: {message}" if url else f"{code}: {message}")
        self.url = url
        self.status = status
        self.code = code
        self.message = message


def http_base(url: str) -> str:
    """``http(s)://host:port`` of a broker given as an HTTP or WebSocket URL."""
    url = url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url[5:]
    if url.startswith("wss://"):
        return "https://" + url[6:]
    return url


class SegmentAdmin:
    """Admin calls to one broker. Pass ``session`` to share an HTTP session (it is then not
    closed here)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        session: aiohttp.ClientSession | None = None,
        timeout: float = 30.0,
        ca_file: str | None = None,
    ) -> None:
        """``ca_file`` (else ``$SCALABLE_TOPICS_CA_FILE``) verifies an ``https`` broker when
        no ``session`` is passed."""
        self.url = http_base(url)
        self._owned = session is None
        self._session = session or aiohttp.ClientSession(connector=tls_connector(ca_file))
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def _call(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        try:
            async with self._session.request(
                method,
                self.url + ADMIN_PREFIX + path,
                json=body,
                headers=self._headers,
                timeout=self._timeout,
            ) as resp:
                try:
                    data: Any = await resp.json(content_type=None)
                except ValueError:
                    data = {"error": {"code": "BadResponse", "message": await resp.text()}}
                if resp.status >= 400:
                    err = data.get("error", {}) if isinstance(data, dict) else {}
                    raise AdminError(
                        self.url,
                        resp.status,
                        str(err.get("code", resp.status)),
                        f"{method} {path}: {err.get('message', '')}",
                    )
                return data if isinstance(data, dict) else {}
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AdminError(self.url, 0, "Unreachable", f"{method} {path}: {exc!r}") from None

    async def _call_or_missing(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        try:
            return await self._call(method, path, body)
        except AdminError as exc:
            if exc.status == 404:
                return None
            raise

    @staticmethod
    def _path(namespace: str, topic: str, segment_id: int) -> str:
        return f"/{namespace}/{topic}/{segment_id}"

    async def create_segment(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        start: int,
        end: int,
        *,
        buckets: int = 1,
        subscriptions: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        retention: Mapping[str, int | None] | None = None,
        writable: bool = True,
        zero_load_recorded: bool = False,
    ) -> dict[str, Any]:
        """Create (or find) the segment with a cursor at position 0 for each subscription
        (name → type); returns its stats. ``writable=False`` creates it fenced until
        :meth:`activate`; a create never changes the fence of an existing segment.
        ``zero_load_recorded``: the caller records a new segment's zero load in its Segment
        itself, and the broker writes only a move from zero."""
        pairs = subscriptions.items() if isinstance(subscriptions, Mapping) else subscriptions
        body: dict[str, Any] = {
            "range": {"start": start, "end": end},
            "buckets": buckets,
            "subscriptions": [{"name": n, "type": t} for n, t in pairs],
            "writable": writable,
        }
        if zero_load_recorded:
            body["zeroLoadRecorded"] = True
        if retention:
            body["retention"] = dict(retention)
        return await self._call("PUT", self._path(namespace, topic, segment_id), body)

    async def terminate(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        successors: Sequence[Successor] = (),
        *,
        open_after: Sequence[int] = (),
    ) -> dict[str, Any]:
        """Seal (idempotent); producers are redirected to ``successors`` without a lookup.
        ``open_after``: successors hosted on the same broker that it activates once the seal is
        durable (a split's children placed with their parent), saving the caller's round trip.
        Returns ``{"sealed", "lastPosition", "successors", "sealedAt", "opened"}``."""
        body: dict[str, Any] = {"successors": [s.to_json() for s in successors]}
        if open_after:
            body["open"] = list(open_after)
        return await self._call(
            "POST", self._path(namespace, topic, segment_id) + "/terminate", body
        )

    async def announce_successors(
        self, namespace: str, topic: str, segment_id: int, successors: Sequence[Successor]
    ) -> dict[str, Any]:
        """Name a segment's successors to its producers ahead of its seal (protocol v5
        ``SEALING``), once they exist fenced on their brokers: the producers connect to them
        while the controller records its phase and seals. Nothing is said of a segment that
        is sealed or being sealed. Returns ``{"producersTold"}``."""
        return await self._call(
            "POST",
            self._path(namespace, topic, segment_id) + "/successors",
            {"successors": [s.to_json() for s in successors]},
        )

    async def activate(self, namespace: str, topic: str, segment_id: int) -> dict[str, Any]:
        """Lift a fenced segment's fence durably (idempotent); returns its summary."""
        return await self._call("POST", self._path(namespace, topic, segment_id) + "/activate")

    async def truncate(
        self, namespace: str, topic: str, segment_id: int, position: int, acknowledge_loss: str
    ) -> dict[str, Any]:
        """Cut a corrupted (quarantined) segment's log at ``position``, its first damaged
        record, losing every entry from there on, and serve it again. ``acknowledge_loss``
        must name the segment, ``"<namespace>/<topic>/<id>"``. Returns its summary and
        ``truncated`` (``position``, ``droppedBytes``, ``droppedFiles``)."""
        return await self._call(
            "POST",
            self._path(namespace, topic, segment_id) + "/truncate",
            {"position": position, "acknowledgeLoss": acknowledge_loss},
        )

    async def delete_segment(self, namespace: str, topic: str, segment_id: int) -> bool:
        """Delete the segment and its data; ``False`` when the broker does not have it."""
        path = self._path(namespace, topic, segment_id)
        return await self._call_or_missing("DELETE", path) is not None

    async def stats(self, namespace: str, topic: str, segment_id: int) -> dict[str, Any]:
        return await self._call("GET", self._path(namespace, topic, segment_id))

    async def find_stats(
        self, namespace: str, topic: str, segment_id: int
    ) -> dict[str, Any] | None:
        """The segment's stats, or ``None`` when the broker does not host it."""
        return await self._call_or_missing("GET", self._path(namespace, topic, segment_id))

    async def list_segments(
        self, namespace: str | None = None, topic: str | None = None
    ) -> list[dict[str, Any]]:
        """Summaries of the hosted segments: all, or one topic's (give both names)."""
        query = (
            ""
            if namespace is None or topic is None
            else "?" + urlencode({"namespace": namespace, "topic": topic})
        )
        return list((await self._call("GET", query))["segments"])

    async def create_subscription(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        name: str,
        sub_type: str = BrokerSubscriptionType.EXCLUSIVE,
        *,
        initial_position: str = "earliest",
    ) -> dict[str, Any]:
        return await self._call(
            "PUT",
            self._path(namespace, topic, segment_id) + f"/subscriptions/{name}",
            {"type": sub_type, "initialPosition": initial_position},
        )

    async def delete_subscription(
        self, namespace: str, topic: str, segment_id: int, name: str
    ) -> bool:
        path = self._path(namespace, topic, segment_id) + f"/subscriptions/{name}"
        return await self._call_or_missing("DELETE", path) is not None

    async def close(self) -> None:
        if self._owned:
            await self._session.close()

    async def __aenter__(self) -> SegmentAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
