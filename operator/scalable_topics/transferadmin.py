"""The brokers' ownership-transfer routes (docs/protocol.md, "Ownership transfer") as calls on
:class:`~scalable_topics.brokeradmin.SegmentAdmin`, and the copy relay the leader runs: it reads
the source's log in chunks and appends them to the destination at the same positions, then
merges the source's cursors and seal. The leader relays the bytes so that brokers never need a
credential for each other; both calls carry the operator's own token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from .brokeradmin import ADMIN_PREFIX, AdminError, SegmentAdmin

CHUNK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class CopyReport:
    """One copy pass: how far the destination got and what it cost."""

    last_position: int
    source_last_position: int
    entries: int
    bytes: int
    seconds: float
    digest: str
    source_digest: str

    @property
    def complete(self) -> bool:
        return self.digest == self.source_digest


class TransferAdmin:
    """The transfer routes of one segment on one broker."""

    def __init__(self, admin: SegmentAdmin, namespace: str, topic: str, segment_id: int) -> None:
        self.admin = admin
        self.path = f"/{namespace}/{topic}/{segment_id}/transfer"

    async def _json(
        self, method: str, step: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return await self.admin._call(method, f"{self.path}/{step}", body)

    async def snapshot(self) -> dict[str, Any] | None:
        """The segment's transfer snapshot, or None when the broker does not host it."""
        return await self.admin._call_or_missing("POST", f"{self.path}/snapshot")

    async def fence(self) -> dict[str, Any]:
        return await self._json("POST", "fence")

    async def unfence(self) -> dict[str, Any]:
        return await self._json("POST", "unfence")

    async def incoming(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        return await self._json("PUT", "incoming", snapshot)

    async def state(self, cursors: dict[str, Any], seal: dict[str, Any] | None) -> dict[str, Any]:
        return await self._json("PUT", "state", {"cursors": cursors, "seal": seal})

    async def own(self) -> dict[str, Any]:
        return await self._json("POST", "own")

    async def release(self, broker_url: str, *, redirect: bool = True) -> dict[str, Any] | None:
        """Close the source's clients with ``broker_url`` (``redirect=False``: a plain close,
        for comparison) and delete its copy; None when it was deleted already."""
        return await self.admin._call_or_missing(
            "POST", f"{self.path}/release", {"brokerUrl": broker_url, "redirect": redirect}
        )

    async def _binary(
        self, method: str, step: str, data: bytes | None = None, **query: int
    ) -> tuple[bytes, dict[str, str]]:
        admin = self.admin
        url = admin.url + ADMIN_PREFIX + f"{self.path}/{step}"
        try:
            async with admin._session.request(
                method,
                url,
                params={k: str(v) for k, v in query.items()},
                data=data,
                headers={**admin._headers, "Content-Type": "application/octet-stream"},
                timeout=admin._timeout,
            ) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    try:
                        err = json.loads(body).get("error", {})
                    except ValueError:
                        err = {
                            "code": "BadResponse",
                            "message": body[:200].decode(errors="replace"),
                        }
                    raise AdminError(
                        admin.url, resp.status, str(err.get("code")), str(err.get("message"))
                    )
                return body, dict(resp.headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AdminError(admin.url, 0, "Unreachable", f"{method} {step}: {exc!r}") from None

    async def read(self, position: int, max_bytes: int = CHUNK_BYTES) -> bytes:
        body, _ = await self._binary(
            "POST", "read", None, **{"from": position, "maxBytes": max_bytes}
        )
        return body

    async def append(self, records: bytes) -> dict[str, Any]:
        body, _ = await self._binary("POST", "append", records)
        data: dict[str, Any] = json.loads(body)
        return data


async def copy(source: TransferAdmin, destination: TransferAdmin) -> CopyReport:
    """Copy what the destination lacks, up to the source's last acknowledged position as it is
    when the pass starts, then merge cursors and (when sealed) the seal. Idempotent: a repeated
    pass copies only the rest. Raises :class:`AdminError` when either broker fails."""
    started = time.monotonic()
    src = await source.snapshot()
    if src is None:
        raise AdminError(source.admin.url, 404, "SegmentNotFound", "the source has no copy")
    dst = await destination.snapshot()
    if dst is None:
        dst = await destination.incoming(src)
    target = int(src["lastPosition"])
    position = int(dst["lastPosition"]) + 1
    if position < int(src["firstPosition"]):
        raise AdminError(
            destination.admin.url,
            409,
            "Conflict",
            f"the destination ends at {position - 1}, the source starts at {src['firstPosition']}",
        )
    entries = 0
    nbytes = 0
    while position <= target:
        records = await source.read(position)
        if not records:
            break
        result = await destination.append(records)
        copied = int(result["lastPosition"]) + 1 - position
        if copied <= 0:
            break
        entries += copied
        nbytes += len(records)
        position = int(result["lastPosition"]) + 1
    seal = src["seal"] if src["seal"] is not None and src["lastPosition"] < position else None
    dst = await destination.state(src["cursors"], seal)
    return CopyReport(
        last_position=int(dst["lastPosition"]),
        source_last_position=target,
        entries=entries,
        bytes=nbytes,
        seconds=time.monotonic() - started,
        digest=str(dst["digest"]),
        source_digest=str(src["digest"]),
    )
