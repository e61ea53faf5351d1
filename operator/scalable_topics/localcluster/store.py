"""The object store: an in-memory index, written through to SQLite, with a watch history.

Objects are plain JSON dicts and are treated as immutable once stored: every write stores a new
dict, so readers (lists, watch events, the history) can share them without copying.

The single global ``resourceVersion`` counter is bumped on every write (deletes included), as
etcd's revision is. The last ``history_size`` events are kept in memory so that a watch can
resume from any recent resourceVersion; an older one gets ``410 Gone``. History is not
persisted: after a restart only watches from the current resourceVersion can resume.

SQLite runs in WAL mode with ``synchronous=NORMAL`` and one commit per write: durable across a
crash of the process (not of the machine), at a few tens of microseconds per write.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import sqlite3
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSON = dict[str, Any]

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    key: str
    namespace: str
    obj: JSON
    old: JSON | None


class TooOld(Exception):
    """The requested resourceVersion is older than the kept history."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


class Subscription:
    """A live feed of events for one store key, delivered into an unbounded queue."""

    def __init__(self, store: Store, key: str, namespace: str | None) -> None:
        self._store = store
        self.key = key
        self.namespace = namespace
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()

    def offer(self, event: Event) -> None:
        if self.namespace is None or event.namespace == self.namespace:
            self.queue.put_nowait(event)

    def close(self) -> None:
        self._store.unsubscribe(self)
        self.queue.put_nowait(None)


def _ns_name(obj: JSON) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


class Store:
    def __init__(self, path: Path | None, history_size: int = 50_000) -> None:
        self._objects: dict[str, dict[str, dict[str, JSON]]] = {}
        self._uids: dict[str, tuple[str, str, str]] = {}
        self._history: deque[Event] = deque(maxlen=history_size)
        self._subs: dict[str, set[Subscription]] = {}
        self._listeners: builtins.list[Callable[[Event], None]] = []
        self.rv = 0
        self._oldest_rv = 0
        self._db: sqlite3.Connection | None = None
        if path is not None:
            self._open(path)

    # -- persistence -------------------------------------------------------------------------

    def _open(self, path: Path) -> None:
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS objects (key TEXT NOT NULL, namespace TEXT NOT NULL,"
            " name TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (key, namespace, name))"
        )
        db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        row = db.execute("SELECT value FROM meta WHERE name = 'rv'").fetchone()
        self.rv = int(row[0]) if row else 0
        for key, _ns, _name, body in db.execute("SELECT key, namespace, name, body FROM objects"):
            self._index(key, json.loads(body))
        self._oldest_rv = self.rv
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _persist(self, key: str, obj: JSON | None, ns: str, name: str) -> None:
        if self._db is None:
            return
        db = self._db
        db.execute("BEGIN")
        try:
            if obj is None:
                db.execute(
                    "DELETE FROM objects WHERE key = ? AND namespace = ? AND name = ?",
                    (key, ns, name),
                )
            else:
                db.execute(
                    "INSERT OR REPLACE INTO objects (key, namespace, name, body) VALUES (?,?,?,?)",
                    (key, ns, name, json.dumps(obj, separators=(",", ":"))),
                )
            db.execute(
                "INSERT OR REPLACE INTO meta (name, value) VALUES ('rv', ?)", (str(self.rv),)
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # -- reads -------------------------------------------------------------------------------

    def _index(self, key: str, obj: JSON) -> None:
        ns, name = _ns_name(obj)
        self._objects.setdefault(key, {}).setdefault(ns, {})[name] = obj
        uid = obj["metadata"].get("uid")
        if uid:
            self._uids[uid] = (key, ns, name)

    def get(self, key: str, namespace: str, name: str) -> JSON | None:
        return self._objects.get(key, {}).get(namespace, {}).get(name)

    def by_uid(self, uid: str) -> tuple[str, JSON] | None:
        loc = self._uids.get(uid)
        if loc is None:
            return None
        obj = self.get(*loc)
        return (loc[0], obj) if obj is not None else None

    def list(self, key: str, namespace: str | None = None) -> builtins.list[JSON]:
        by_ns = self._objects.get(key, {})
        if namespace is not None:
            return list(by_ns.get(namespace, {}).values())
        return [o for objs in by_ns.values() for o in objs.values()]

    def resource_keys(self) -> builtins.list[str]:
        return list(self._objects)

    def namespaces_of(self, key: str) -> builtins.list[str]:
        return [ns for ns, objs in self._objects.get(key, {}).items() if objs]

    def iter_all(self) -> Iterator[tuple[str, JSON]]:
        for key, by_ns in list(self._objects.items()):
            for objs in list(by_ns.values()):
                for obj in list(objs.values()):
                    yield key, obj

    def count_in_namespace(self, namespace: str) -> int:
        return sum(len(by_ns.get(namespace, {})) for by_ns in self._objects.values())

    # -- writes ------------------------------------------------------------------------------

    def next_rv(self) -> int:
        """The resourceVersion the next write will get (callers stamp it into the object)."""
        return self.rv + 1

    def put(self, key: str, obj: JSON, *, created: bool) -> Event:
        """Store ``obj`` whose ``metadata.resourceVersion`` must already be ``next_rv()``."""
        rv = self.next_rv()
        if obj["metadata"].get("resourceVersion") != str(rv):
            raise ValueError("object must carry the next resourceVersion")
        ns, name = _ns_name(obj)
        old = self.get(key, ns, name)
        self.rv = rv
        self._persist(key, obj, ns, name)
        self._index(key, obj)
        return self._emit(Event(rv, ADDED if created else MODIFIED, key, ns, obj, old))

    def remove(self, key: str, obj: JSON) -> Event:
        """Remove the object; ``obj`` is its final state, stamped with ``next_rv()``."""
        rv = self.next_rv()
        ns, name = _ns_name(obj)
        old = self._objects.get(key, {}).get(ns, {}).pop(name, None)
        self._uids.pop(obj["metadata"].get("uid", ""), None)
        self.rv = rv
        self._persist(key, None, ns, name)
        return self._emit(Event(rv, DELETED, key, ns, obj, old))

    def _emit(self, event: Event) -> Event:
        if len(self._history) == self._history.maxlen:
            self._oldest_rv = self._history[0].rv
        self._history.append(event)
        for sub in list(self._subs.get(event.key, ())):
            sub.offer(event)
        for listener in self._listeners:
            listener(event)
        return event

    # -- watching ----------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        """Synchronous callback for every event (the garbage collector uses it)."""
        self._listeners.append(listener)

    def subscribe(
        self, key: str, namespace: str | None, since: int | None
    ) -> tuple[Subscription, builtins.list[Event]]:
        """Register a live feed and return the history strictly after ``since``.

        Both happen without yielding to the event loop, so no event falls between them.
        """
        backlog: builtins.list[Event] = []
        if since is not None and since < self.rv:
            if since < self._oldest_rv:
                raise TooOld(since, self._oldest_rv + 1)
            backlog = [
                e
                for e in self._events_after(since)
                if e.key == key and (namespace is None or e.namespace == namespace)
            ]
        sub = Subscription(self, key, namespace)
        self._subs.setdefault(key, set()).add(sub)
        return sub, backlog

    def _events_after(self, since: int) -> builtins.list[Event]:
        hist = self._history
        lo, hi = 0, len(hist)
        while lo < hi:
            mid = (lo + hi) // 2
            if hist[mid].rv <= since:
                lo = mid + 1
            else:
                hi = mid
        return [hist[i] for i in range(lo, len(hist))]

    def watcher_count(self, key: str) -> int:
        """Open watches on one store key (tests await a client's watch this way)."""
        return len(self._subs.get(key, ()))

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.key)
        if subs is not None:
            subs.discard(sub)

    def close_subscriptions(self) -> None:
        for subs in list(self._subs.values()):
            for sub in list(subs):
                sub.close()
