"""The controller's side of the brokers: which broker pods are ready, where a segment goes, and
the admin clients of DESIGN §6 (``scalable_topics.brokeradmin``; ``docs/protocol.md`` has the
shapes)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..brokeradmin import AdminError, SegmentAdmin
from ..credentials import TokenFile, client_session, tls_connector

log = logging.getLogger(__name__)

BROKER_LABEL_SELECTOR = "app.kubernetes.io/name=segment-broker"


def broker_unavailable(message: str, code: str = "BrokerUnavailable") -> AdminError:
    """The controller's own finding that a broker cannot serve a call (no broker recorded for a
    segment, its pod away), in the same error type as the brokers' answers."""
    return AdminError("", 0, code, message)


@dataclass(frozen=True)
class BrokerPod:
    name: str
    url: str
    ready: bool
    cordoned: bool = False
    """Annotated for a drain: never chosen for a new segment or a move."""
    namespace: str = ""
    uid: str = ""

    def event_target(self) -> dict[str, Any]:
        """The pod as the object of an Event."""
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }


def choose_broker(
    brokers: Iterable[BrokerPod], load: Mapping[str, int], *, beside: str | None = None
) -> BrokerPod | None:
    """The ready broker hosting the fewest active segments (ties by name, for stable tests);
    never a cordoned (draining) one.

    ``beside``: the broker of a split's parent, which a child of that split goes to when that
    keeps the brokers within one segment of each other, as least-loaded placement does: its
    count less the parent (which the split seals) is at most the least loaded broker's. Its
    broker then opens the child as the seal completes, without the controller's round trip
    (docs/operator.md, "Broker placement"); Pulsar's bundle split keeps the new bundles on
    their broker the same way."""
    ready = [b for b in brokers if b.ready and not b.cordoned]
    if not ready:
        return None
    least = min(ready, key=lambda b: (load.get(b.name, 0), b.name))
    home = next((b for b in ready if b.name == beside), None)
    if home is not None and load.get(home.name, 0) - 1 <= load.get(least.name, 0):
        return home
    return least


class BrokerAdmin:
    """Admin clients of the broker pods (``scalable_topics.brokeradmin``), sharing one HTTP
    session and the bearer token."""

    def __init__(
        self,
        *,
        token: str | None = None,
        token_file: str | None = None,
        timeout: float = 10.0,
        ca_file: str | None = None,
    ) -> None:
        self._token = token
        self._ca_file = ca_file
        self._token_file = TokenFile(token_file) if token_file else None
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._clients: dict[str, SegmentAdmin] = {}

    def at(self, url: str) -> SegmentAdmin:
        if self._session is None or self._session.closed:
            self._session = (
                client_session(self._token_file, ca_file=self._ca_file)
                if self._token_file is not None
                else aiohttp.ClientSession(connector=tls_connector(self._ca_file))
            )
            self._clients.clear()
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = SegmentAdmin(
                url, token=self._token, session=self._session, timeout=self._timeout
            )
        return client

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
