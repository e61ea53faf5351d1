"""Garbage collector, namespace controller and CRD cleanup, driven by store events.

- Owner references: a dependent whose owners are all gone is deleted (in the background, or in
  the foreground when its owner went that way); references to vanished owners are dropped from
  dependents that still have a live owner.
- ``foregroundDeletion``: the owner's dependents are deleted, and the finalizer is removed once
  no dependent with ``blockOwnerDeletion: true`` is left.
- ``orphan``: the owner's references are removed from its dependents, then the finalizer.
- A terminating namespace has its content deleted and goes once it is empty; a terminating CRD
  has its custom resources deleted, then loses ``customresourcecleanup.apiextensions.k8s.io``.

Work items are queued from a synchronous store listener and processed by one task, so the
collector never races the request handlers (everything runs on the event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from typing import Any

from .errors import ApiError
from .objects import CRD_CLEANUP_FINALIZER, CRD_KEY, FOREGROUND, NS_KEY, ORPHAN, Api
from .store import DELETED, Event

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Loc = tuple[str, str, str]


def _loc(key: str, obj: JSON) -> Loc:
    meta = obj["metadata"]
    return key, meta.get("namespace") or "", meta["name"]


class GarbageCollector:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.store = api.store
        self._dependents: dict[str, set[Loc]] = {}
        self._owners_of: dict[Loc, tuple[str, ...]] = {}
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._pending: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None
        for key, obj in self.store.iter_all():
            self._track(key, obj)
        self.store.add_listener(self._on_event)

    def start(self) -> None:
        for key, obj in self.store.iter_all():
            self._schedule_for(key, obj)
            for uid in self._owners_of.get(_loc(key, obj), ()):
                if self.store.by_uid(uid) is None:
                    self._enqueue("owner-gone", uid)
        self._task = asyncio.create_task(self._run(), name="localcluster-gc")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def idle(self) -> None:
        """Wait until every queued item has been processed (tests use it)."""
        await self._queue.join()

    # -- bookkeeping ------------------------------------------------------------------------

    def _track(self, key: str, obj: JSON) -> None:
        loc = _loc(key, obj)
        old = self._owners_of.pop(loc, ())
        for uid in old:
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(loc)
                if not deps:
                    del self._dependents[uid]
        refs = tuple(r["uid"] for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid"))
        if refs:
            self._owners_of[loc] = refs
            for uid in refs:
                self._dependents.setdefault(uid, set()).add(loc)

    def _untrack(self, key: str, obj: JSON) -> None:
        loc = _loc(key, obj)
        for uid in self._owners_of.pop(loc, ()):
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(loc)
                if not deps:
                    del self._dependents[uid]

    def _enqueue(self, kind: str, ident: str) -> None:
        item = (kind, ident)
        if item not in self._pending:
            self._pending.add(item)
            self._queue.put_nowait(item)

    def _on_event(self, event: Event) -> None:
        obj = event.obj
        meta = obj["metadata"]
        if event.type == DELETED:
            self._untrack(event.key, obj)
            uid = meta.get("uid")
            if uid and uid in self._dependents:
                self._enqueue("owner-gone", uid)
            for ref in meta.get("ownerReferences") or []:
                owner = self.store.by_uid(ref.get("uid", ""))
                if owner is not None and owner[1]["metadata"].get("deletionTimestamp"):
                    self._enqueue("foreground", ref["uid"])
            ns = meta.get("namespace")
            if ns:
                nsobj = self.store.get(NS_KEY, "", ns)
                if nsobj is not None and nsobj["metadata"].get("deletionTimestamp"):
                    self._enqueue("namespace", ns)
            for crd in self.store.list(CRD_KEY):
                if crd["metadata"].get("deletionTimestamp") and self._crd_key(crd) == event.key:
                    self._enqueue("crd", crd["metadata"]["name"])
            return
        self._track(event.key, obj)
        self._schedule_for(event.key, obj)
        if event.type == "ADDED":
            for uid in self._owners_of.get(_loc(event.key, obj), ()):
                if self.store.by_uid(uid) is None:
                    self._enqueue("owner-gone", uid)

    def _schedule_for(self, key: str, obj: JSON) -> None:
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        finalizers = meta.get("finalizers") or []
        if FOREGROUND in finalizers:
            self._enqueue("foreground", meta["uid"])
        if ORPHAN in finalizers:
            self._enqueue("orphan", meta["uid"])
        if key == NS_KEY:
            self._enqueue("namespace", meta["name"])
        if key == CRD_KEY:
            self._enqueue("crd", meta["name"])

    @staticmethod
    def _crd_key(crd: JSON) -> str:
        spec = crd.get("spec") or {}
        return f"{spec.get('group')}/{(spec.get('names') or {}).get('plural')}"

    # -- processing -------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            self._pending.discard(item)
            try:
                kind, ident = item
                if kind == "owner-gone":
                    self._owner_gone(ident)
                elif kind == "foreground":
                    self._foreground(ident)
                elif kind == "orphan":
                    self._orphan(ident)
                elif kind == "namespace":
                    self._namespace(ident)
                elif kind == "crd":
                    self._crd(ident)
            except Exception:
                log.exception("garbage collection of %s failed", item)
            finally:
                self._queue.task_done()
            await asyncio.sleep(0)

    def _rt(self, key: str) -> Any:
        return self.api.registry.by_key(key)

    def _delete(self, loc: Loc, policy: str) -> None:
        rt = self._rt(loc[0])
        if rt is None:
            return
        with contextlib.suppress(ApiError):
            self.api.delete(rt, loc[1], loc[2], {"propagationPolicy": policy})

    def _owner_gone(self, owner_uid: str) -> None:
        for loc in list(self._dependents.get(owner_uid, ())):
            obj = self.store.get(*loc)
            if obj is None:
                continue
            refs = obj["metadata"].get("ownerReferences") or []
            alive = [r for r in refs if self.store.by_uid(r.get("uid", "")) is not None]
            if alive:
                if len(alive) != len(refs):
                    self._set_owner_refs(loc, obj, alive)
                continue
            if obj["metadata"].get("deletionTimestamp"):
                continue
            self._delete(loc, "Background")

    def _set_owner_refs(self, loc: Loc, obj: JSON, refs: list[JSON]) -> None:
        rt = self._rt(loc[0])
        if rt is None:
            return
        new = copy.deepcopy(obj)
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        with contextlib.suppress(ApiError):
            self.api.update(rt, loc[1], loc[2], new, subresource=None, require_rv=False)

    def _owner(self, uid: str, finalizer: str) -> tuple[str, JSON] | None:
        """The owner ``uid`` while it is being deleted and ``finalizer`` still holds it."""
        found = self.store.by_uid(uid)
        if found is None:
            return None
        meta = found[1]["metadata"]
        if not meta.get("deletionTimestamp") or finalizer not in (meta.get("finalizers") or []):
            return None
        return found

    def _release(self, key: str, owner: JSON, finalizer: str) -> None:
        """Drop ``finalizer`` from the owner as it is stored now."""
        current = self.store.get(*_loc(key, owner))
        if current is not None:
            self._remove_finalizer(key, current, finalizer)

    def _remove_finalizer(self, key: str, obj: JSON, finalizer: str) -> None:
        rt = self._rt(key)
        if rt is None:
            return
        new = copy.deepcopy(obj)
        new["metadata"]["finalizers"] = [
            f for f in new["metadata"].get("finalizers") or [] if f != finalizer
        ]
        meta = obj["metadata"]
        with contextlib.suppress(ApiError):
            self.api.update(rt, meta.get("namespace", ""), meta["name"], new, require_rv=False)

    def _foreground(self, owner_uid: str) -> None:
        found = self._owner(owner_uid, FOREGROUND)
        if found is None:
            return
        key, owner = found
        for loc in list(self._dependents.get(owner_uid, ())):
            dep = self.store.get(*loc)
            if dep is not None and not dep["metadata"].get("deletionTimestamp"):
                self._delete(loc, "Foreground")
        if not any(
            self._blocks(loc, owner_uid) for loc in list(self._dependents.get(owner_uid, ()))
        ):
            self._release(key, owner, FOREGROUND)

    def _blocks(self, loc: Loc, owner_uid: str) -> bool:
        """Whether a dependent still exists and holds its owner with ``blockOwnerDeletion``."""
        dep = self.store.get(*loc)
        return dep is not None and any(
            r.get("uid") == owner_uid and r.get("blockOwnerDeletion")
            for r in dep["metadata"].get("ownerReferences") or []
        )

    def _orphan(self, owner_uid: str) -> None:
        found = self._owner(owner_uid, ORPHAN)
        if found is None:
            return
        key, owner = found
        for loc in list(self._dependents.get(owner_uid, ())):
            dep = self.store.get(*loc)
            if dep is None:
                continue
            refs = [
                r for r in dep["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid
            ]
            self._set_owner_refs(loc, dep, refs)
        self._release(key, owner, ORPHAN)

    def _namespace(self, name: str) -> None:
        ns = self.store.get(NS_KEY, "", name)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        for key in self.store.resource_keys():
            if key == NS_KEY:
                continue
            for obj in self.store.list(key, name):
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete(_loc(key, obj), "Background")
        if self.store.count_in_namespace(name) == 0:
            rt = self._rt(NS_KEY)
            new = copy.deepcopy(ns)
            new.setdefault("spec", {})["finalizers"] = []
            with contextlib.suppress(ApiError):
                self.api.update(rt, "", name, new, subresource="finalize", require_rv=False)

    def _crd(self, name: str) -> None:
        crd = self.store.get(CRD_KEY, "", name)
        if crd is None or not crd["metadata"].get("deletionTimestamp"):
            return
        key = self._crd_key(crd)
        remaining = self.store.list(key)
        for obj in remaining:
            if not obj["metadata"].get("deletionTimestamp"):
                self._delete(_loc(key, obj), "Background")
        if not self.store.list(key):
            self._remove_finalizer(CRD_KEY, crd, CRD_CLEANUP_FINALIZER)
