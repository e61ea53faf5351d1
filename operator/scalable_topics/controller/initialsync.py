"""When a replica's cache holds what the API server held as it started.

kopf fills the cache from its watches, and says nothing of when their first listing is over: its
ready flag is up before the watches start. A replica that answered then would tell a client
that an existing topic is not found (a fatal answer to a DAG watch), and a leader that
reconciled then would act on part of the cluster. So the replica lists the kinds it watches
once, and is ready when every object of that listing has come through its watches (or is gone:
an object deleted before a watch listed it never comes, so a listing again drops those). The
listing is never put in the cache, where it could overwrite a newer watch event or bring back
an object the watch has since deleted.
"""

from __future__ import annotations

import asyncio


class InitialSync:
    """``done`` is set once every uid :meth:`expect` named was :meth:`saw`-ed by a watch or is
    no longer listed (:meth:`relisted`)."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self._seen: set[str] = set()
        """Uids the watches delivered before the listing was known."""
        self._pending: set[str] | None = None

    @property
    def pending(self) -> int:
        """Listed objects the watches have not delivered yet (0 before the first listing)."""
        return len(self._pending or ())

    @property
    def listed(self) -> bool:
        """A first listing was given (:meth:`expect` or :meth:`relisted`)."""
        return self._pending is not None

    def saw(self, uid: str) -> None:
        """A watch delivered the object ``uid`` (put or deleted)."""
        if self.done.is_set():
            return
        if self._pending is None:
            self._seen.add(uid)
            return
        self._pending.discard(uid)
        self._check()

    def expect(self, listed: set[str]) -> None:
        """The uids of a first listing."""
        self._pending = listed - self._seen
        self._seen = set()
        self._check()

    def relisted(self, listed: set[str]) -> None:
        """The uids of a later listing: a pending object no longer listed was deleted before
        any watch saw it, and none ever will."""
        if self._pending is None:
            self.expect(listed)
            return
        self._pending &= listed
        self._check()

    def _check(self) -> None:
        if not self._pending:
            self._pending = set()
            self.done.set()
