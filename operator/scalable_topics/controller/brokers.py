"""The controller's side of the brokers: which broker pods are ready, where a segment goes, and
the admin HTTP calls of DESIGN §6 (``docs/protocol.md`` has their shapes).

Every call here is idempotent on the broker (create returns the existing segment, terminate of a
sealed segment returns the same seal, delete of a missing segment is a no-op), which is what
lets a new leader replay any step of an operation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..core.layout import HashRange

log = logging.getLogger(__name__)

BROKER_LABEL_SELECTOR = "app.kubernetes.io/name=segment-broker"


class BrokerError(Exception):
    """A broker answered with an error or could not be reached."""

    def __init__(self, url: str, message: str, *, code: str = "BrokerError") -> None:
        super().__init__(f"broker {url}: {message}")
        self.url = url
        self.code = code


@dataclass(frozen=True)
class BrokerPod:
    name: str
    url: str
    ready: bool


@dataclass(frozen=True)
class Successor:
    segment_id: int
    hash_range: HashRange
    broker_url: str

    def to_json(self) -> dict[str, Any]:
        return {
            "segmentId": self.segment_id,
            "range": self.hash_range.to_dict(),
            "brokerUrl": self.broker_url,
        }


def choose_broker(brokers: Iterable[BrokerPod], load: Mapping[str, int]) -> BrokerPod | None:
    """The ready broker hosting the fewest active segments (ties by name, for stable tests)."""
    ready = [b for b in brokers if b.ready]
    if not ready:
        return None
    return min(ready, key=lambda b: (load.get(b.name, 0), b.name))


class BrokerAdmin:
    """Admin HTTP client for segment brokers, with an optional bearer token."""

    def __init__(self, *, token: str | None = None, timeout: float = 10.0) -> None:
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @staticmethod
    def _path(namespace: str, topic: str, segment_id: int) -> str:
        return f"/admin/v1/segments/{namespace}/{topic}/{segment_id}"

    async def _call(
        self,
        method: str,
        url: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        missing_ok: bool = False,
    ) -> dict[str, Any]:
        try:
            async with self._client().request(method, url + path, json=body) as response:
                payload: Any = await response.json(content_type=None)
                if response.status == 404 and missing_ok:
                    return {}
                if response.status >= 400:
                    error = payload.get("error", {}) if isinstance(payload, dict) else {}
                    code = str(error.get("code", response.status))
                    raise BrokerError(
                        url, f"{method} {path}: {code}: {error.get('message', '')}", code=code
                    )
                return payload if isinstance(payload, dict) else {}
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BrokerError(url, f"{method} {path}: {exc!r}", code="Unreachable") from None

    async def create_segment(
        self,
        url: str,
        namespace: str,
        topic: str,
        segment_id: int,
        hash_range: HashRange,
        *,
        subscriptions: Sequence[tuple[str, str]],
        buckets: int,
        retention: Mapping[str, Any] | None = None,
        writable: bool = True,
    ) -> dict[str, Any]:
        """Create (or find) the segment with a cursor at the start for each subscription.

        ``writable=False`` creates it fenced (produce refused until :meth:`activate`); the
        fence of an existing segment is left as it is."""
        body: dict[str, Any] = {
            "range": hash_range.to_dict(),
            "buckets": buckets,
            "subscriptions": [{"name": n, "type": t} for n, t in subscriptions],
            "writable": writable,
        }
        if retention:
            body["retention"] = dict(retention)
        return await self._call("PUT", url, self._path(namespace, topic, segment_id), body)

    async def terminate(
        self,
        url: str,
        namespace: str,
        topic: str,
        segment_id: int,
        successors: Sequence[Successor],
    ) -> dict[str, Any]:
        """Seal the segment; producers are redirected to ``successors`` without a lookup."""
        return await self._call(
            "POST",
            url,
            self._path(namespace, topic, segment_id) + "/terminate",
            {"successors": [s.to_json() for s in successors]},
        )

    async def activate(self, url: str, namespace: str, topic: str, segment_id: int) -> None:
        """Open a fenced segment for produce (idempotent)."""
        await self._call("POST", url, self._path(namespace, topic, segment_id) + "/activate")

    async def delete_segment(self, url: str, namespace: str, topic: str, segment_id: int) -> None:
        await self._call("DELETE", url, self._path(namespace, topic, segment_id), missing_ok=True)

    async def stats(
        self, url: str, namespace: str, topic: str, segment_id: int
    ) -> dict[str, Any] | None:
        """The segment's stats, or ``None`` when the broker does not host it."""
        result = await self._call(
            "GET", url, self._path(namespace, topic, segment_id), missing_ok=True
        )
        return result or None

    async def create_subscription(
        self, url: str, namespace: str, topic: str, segment_id: int, name: str, type_: str
    ) -> dict[str, Any]:
        return await self._call(
            "PUT",
            url,
            self._path(namespace, topic, segment_id) + f"/subscriptions/{name}",
            {"type": type_, "initialPosition": "earliest"},
        )

    async def delete_subscription(
        self, url: str, namespace: str, topic: str, segment_id: int, name: str
    ) -> None:
        await self._call(
            "DELETE",
            url,
            self._path(namespace, topic, segment_id) + f"/subscriptions/{name}",
            missing_ok=True,
        )
