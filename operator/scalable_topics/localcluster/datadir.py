"""One control plane per data directory, and a reset that removes only what it created.

A local control plane takes an exclusive ``flock(2)`` on ``D/localcluster.lock`` before it
writes anything else in ``D`` (store, token, kubeconfig, kubelet state) and keeps that file
open until it has stopped. The kernel drops the lock when the holder exits, however it exits
(``SIGKILL`` included), so a lock left by a dead process is free: the next start simply takes
it. There is no PID file to go stale and no PID to check against a reused number.

Next to the lock, ``D/localcluster.json`` names the holder (PID, API URL, start time) so a
refused start or ``stopic local down`` can say who holds it. It is informative only: whether a
control plane runs is decided by the lock, never by that file.

``D/.stopic-localcluster`` marks a directory as one a control plane has used: :func:`reset`
refuses a directory without it (or without the files of a data directory written before the
marker existed), so a mistyped ``--data-dir`` cannot make it delete a user's files, and even on
a marked directory it removes only the entries in :data:`STATE_ENTRIES`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = "localcluster.lock"
HOLDER_FILE = "localcluster.json"
MARKER_FILE = ".stopic-localcluster"
MARKER_TEXT = (
    "This directory holds the state of a stopic local control plane "
    "(`stopic local reset --data-dir DIR` removes it).\n"
)

EXIT_IN_USE = 75
"""Exit status of a command refused because another control plane holds the directory
(``EX_TEMPFAIL`` of sysexits.h: retry once the other one has stopped)."""

STATE_ENTRIES = (
    "cluster.sqlite3",
    "cluster.sqlite3-wal",
    "cluster.sqlite3-shm",
    "cluster.sqlite3-journal",
    "token",
    "kubeconfig",
    "kubeconfig.tmp",
    "localcluster.pid",
    HOLDER_FILE,
    "kubelet",
    "pods",
    "volumes",
    # The real control plane (controlplane.py, cluster.py): certificates and keys, etcd's data,
    # the components' logs and kubeconfigs, the kubectl link.
    "pki",
    "etcd",
    "logs",
    "flexvolume",
    "bin",
    "admin.kubeconfig",
    "kube-controller-manager.kubeconfig",
    "kube-scheduler.kubeconfig",
)
"""Everything a control plane and its kubelet create in the data directory (besides the marker
and the lock file, removed last). ``localcluster.pid`` is what versions before the lock wrote."""

STATE_PATTERNS = (
    "node-*.kubeconfig",
    ".pki.*.tmp",
    ".*kubeconfig*.tmp",
    ".localcluster.json.*.tmp",
)
"""Names made per node (a kubelet's kubeconfig) and temporary files left by an interrupted
write (a half-made PKI, a kubeconfig), also removed by :func:`reset`."""

_LEGACY_EVIDENCE = ("cluster.sqlite3", "token", "kubeconfig")


@dataclass(frozen=True)
class Holder:
    """Who holds a data directory, as its ``localcluster.json`` says."""

    pid: int
    api_url: str = ""
    started_at: float = 0.0

    def describe(self) -> str:
        api = self.api_url or "API not serving yet"
        return f"pid {self.pid}, {api}"


class DataDirInUse(RuntimeError):
    """Another live process holds the data directory's lock."""

    def __init__(self, data_dir: Path, holder: Holder | None) -> None:
        self.data_dir = data_dir
        self.holder = holder
        who = f" ({holder.describe()})" if holder is not None else ""
        super().__init__(
            f"{data_dir} is in use by a running local control plane{who}; stop it first "
            f"(Ctrl-C in its terminal, or `stopic local down --data-dir {data_dir}`)"
        )


class NotADataDir(RuntimeError):
    """The directory shows no sign of having been a control plane's data directory."""


def read_holder(data_dir: Path) -> Holder | None:
    """The last holder recorded in ``localcluster.json`` (alive or not), if readable."""
    try:
        raw = json.loads((data_dir / HOLDER_FILE).read_text())
        return Holder(
            pid=int(raw["pid"]),
            api_url=str(raw.get("apiUrl") or ""),
            started_at=float(raw.get("startedAt") or 0.0),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_json_atomically(path: Path, content: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(content) + "\n")
    tmp.replace(path)


class DataDirLock:
    """The exclusive lock on a data directory, held from :meth:`acquire` to :meth:`release`.

    The descriptor is close-on-exec (Python's default), so processes the kubelet starts never
    inherit it and cannot keep the lock alive after the control plane is gone.
    """

    def __init__(self, data_dir: Path | str) -> None:
        self.data_dir = Path(data_dir)
        self._fd: int | None = None
        self.holder: Holder | None = None
        self.previous: Holder | None = None
        """The holder recorded by the last process that held the lock (a dead one, if it did
        not stop cleanly), read when this one took it over."""

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise :class:`DataDirInUse` at once (never waits); then mark the
        directory and record this process as the holder."""
        if self._fd is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirInUse(self.data_dir, read_holder(self.data_dir)) from None
            raise
        self._fd = fd
        try:
            self.previous = read_holder(self.data_dir)
            marker = self.data_dir / MARKER_FILE
            if not marker.exists():
                marker.write_text(MARKER_TEXT)
            self.holder = Holder(pid=os.getpid(), started_at=time.time())
            self._write_holder()
        except BaseException:
            self.release()
            raise

    def publish(self, api_url: str) -> None:
        """Record the API URL once the server listens (for the message a second start gets)."""
        if self.holder is None:
            raise RuntimeError("the data directory lock is not held")
        self.holder = Holder(self.holder.pid, api_url, self.holder.started_at)
        self._write_holder()

    def _write_holder(self) -> None:
        assert self.holder is not None
        _write_json_atomically(
            self.data_dir / HOLDER_FILE,
            {
                "pid": self.holder.pid,
                "apiUrl": self.holder.api_url,
                "startedAt": self.holder.started_at,
            },
        )

    def release(self) -> None:
        """Remove the holder record (if it is still ours) and drop the lock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if read_holder(self.data_dir) == self.holder:
                with contextlib.suppress(FileNotFoundError):
                    (self.data_dir / HOLDER_FILE).unlink()
        finally:
            self.holder = None
            os.close(fd)


def running(data_dir: Path | str) -> Holder | None:
    """The holder of ``data_dir`` if a live process holds its lock now, else ``None``.

    Probing takes the lock for an instant when it is free, so a control plane starting at that
    very moment can be refused once; it is never the other way round (a held lock always
    answers "running").
    """
    path = Path(data_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return read_holder(Path(data_dir)) or Holder(pid=0)
    finally:
        os.close(fd)
    return None


def looks_like_data_dir(data_dir: Path) -> bool:
    """Marked by a control plane, or holding the store, token and kubeconfig that every
    version wrote before the marker existed."""
    if (data_dir / MARKER_FILE).is_file():
        return True
    return all((data_dir / name).is_file() for name in _LEGACY_EVIDENCE)


@dataclass(frozen=True)
class ResetResult:
    removed: list[str]
    kept: list[str]
    """Entries the control plane did not create; left where they are."""
    directory_removed: bool


def reset(data_dir: Path | str) -> ResetResult:
    """Remove a stopped control plane's state from ``data_dir``.

    Raises :class:`DataDirInUse` while a control plane holds the directory (holding the lock
    itself meanwhile, so none can start half-way through), and :class:`NotADataDir` for a
    directory that was never one (nothing is removed then). Only :data:`STATE_ENTRIES`, what
    matches :data:`STATE_PATTERNS`, the holder record, the marker and the lock file are
    removed; the directory itself only if that leaves it empty.
    """
    path = Path(data_dir)
    if not path.exists():
        return ResetResult([], [], False)
    if not path.is_dir():
        raise NotADataDir(f"{path} is not a directory")
    if not looks_like_data_dir(path):
        raise NotADataDir(
            f"{path} does not look like a stopic local data directory (no {MARKER_FILE}); "
            "nothing removed"
        )
    lock = DataDirLock(path)
    lock.acquire()
    removed: list[str] = []
    try:
        for name in STATE_ENTRIES:
            entry = path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            elif entry.exists() or entry.is_symlink():
                entry.unlink()
            else:
                continue
            removed.append(name)
        for pattern in STATE_PATTERNS:
            for entry in sorted(path.glob(pattern)):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed.append(entry.name)
        (path / MARKER_FILE).unlink(missing_ok=True)
        removed.append(MARKER_FILE)
        # Last, while still holding it: a start racing with the reset either was refused
        # above or finds the directory already emptied.
        (path / LOCK_FILE).unlink(missing_ok=True)
    finally:
        lock.release()
    kept = sorted(p.name for p in path.iterdir())
    directory_removed = False
    if not kept:
        with contextlib.suppress(OSError):
            path.rmdir()
            directory_removed = True
    return ResetResult(removed, kept, directory_removed)
