"""Request plumbing shared by the broker's admin routes (:mod:`.admin`, :mod:`.transfer`) and
its WebSocket handshakes (:mod:`.connection`): the JSON error shape, the segment a path names,
request bodies, and how an admin route's failure maps to an HTTP status.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from scalable_topics.core import wire

from .storage.segment import SegmentCorruptedError
from .store import ConflictError, HostedSegment, NotFoundError, SegmentStore

log = logging.getLogger(__name__)

_ERROR_STATUS = {
    "BadRequest": 400,
    "Unauthorized": 401,
    "NotFound": 404,
    "SegmentNotFound": 404,
    "SubscriptionNotFound": 404,
    "Conflict": 409,
    "SegmentCorrupted": 409,
    "StorageError": 500,
    "NotReady": 503,
}


def json_error(code: str, message: str, status: int | None = None) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status or _ERROR_STATUS.get(code, 400)
    )


def segment_key(request: web.Request) -> tuple[str, str, int]:
    """``(namespace, topic, segment id)`` of a path; a malformed id is a ``WireError``
    (400 on admin routes, close 4000 on WebSockets)."""
    info = request.match_info
    return info["namespace"], info["topic"], wire.parse_id(info["segment_id"])


def hosted_segment(store: SegmentStore, request: web.Request) -> HostedSegment:
    return store.get(*segment_key(request))


async def read_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    return wire.parse_json_object(await request.read(), "request body")


async def run_admin(
    request: web.Request, action: Callable[[], Awaitable[web.Response]]
) -> web.Response:
    """``action``'s response, or the JSON error its failure maps to."""
    try:
        return await action()
    except NotFoundError as exc:
        return json_error("SegmentNotFound", str(exc))
    except ConflictError as exc:
        return json_error("Conflict", str(exc))
    except SegmentCorruptedError as exc:
        return json_error("SegmentCorrupted", str(exc))
    except (ValueError, KeyError, TypeError) as exc:
        return json_error(
            "BadRequest", str(exc) if not isinstance(exc, KeyError) else f"missing field {exc}"
        )
    except OSError as exc:
        # A full disk (507), a read-only or broken volume: said to the caller and logged,
        # the broker keeps serving every other segment.
        log.error("%s %s failed on storage: %s", request.method, request.path, exc)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        return json_error("StorageError", f"{exc}", 507 if full else 500)
