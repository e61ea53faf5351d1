"""Process supervision for the local kubelet.

Each container runs as a child process in its own session (so its own process group): killing a
container signals the whole group, which takes down any grandchildren the way a container runtime
takes down a cgroup. Output (stdout and stderr interleaved) is appended to the container's log
file, which the API server serves for ``kubectl logs``.

:class:`ManagedProcess` is one run of a process. :class:`SupervisedContainer` runs a process
repeatedly according to a Kubernetes ``restartPolicy`` with the kubelet's crash-loop back-off and
keeps the state that becomes a ``containerStatuses`` entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def rfc3339(ts: float | None = None) -> str:
    """Kubernetes timestamp (second precision, UTC, ``Z`` suffix)."""
    moment = datetime.fromtimestamp(time.time() if ts is None else ts, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ProcessSpec:
    """What to execute: a resolved argv, the complete environment, a working directory."""

    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    cwd: Path | None = None


def _group_alive(pgid: int) -> bool:
    """Whether a member of process group ``pgid`` still runs.

    Zombies do not count: a killed container's orphaned children are reaped by init, which
    in some sandboxes does so only every second or two, and waiting for that made stopping
    a pod (and Ctrl-C of ``stopic local up``) take seconds after its processes were dead.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return True  # no procfs: a zombie cannot be told from a live process
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_prctl = _load_prctl()


def _die_with(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to SIGKILL the container's process when the process
    that started it dies, however it dies (Linux; elsewhere ``None``).

    Containers run in sessions of their own, so nothing else ends them when the control plane
    is killed (``kill -9``, a crash): they kept their ports and volumes, and the next start on
    the data directory crash-looped its pods against them. Only the container's main process
    is covered: a child of its own that outlives it is not.
    """
    prctl = _prctl
    if prctl is None:
        return None

    def request() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(128 + signal.SIGKILL)

    return request


class ManagedProcess:
    """One run of a process in its own process group, output appended to a log file."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self._proc: asyncio.subprocess.Process | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    async def start(self) -> None:
        """Start the process; raises ``OSError`` when it cannot be executed."""
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(self.spec.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=dict(self.spec.env),
                cwd=None if self.spec.cwd is None else str(self.spec.cwd),
                start_new_session=True,
                preexec_fn=_die_with(os.getpid()),
            )
        finally:
            os.close(out)
        self.started_at = time.time()

    async def wait(self) -> int:
        """Wait for the leader to exit, then reap what is left of its process group."""
        if self._proc is None:
            raise RuntimeError("process not started")
        code = await self._proc.wait()
        if self.finished_at is None:
            self.finished_at = time.time()
            self.returncode = code
        # The container "dies" with its main process: stray group members go too.
        _signal_group(self._proc.pid, signal.SIGKILL)
        return code

    async def terminate(self, grace: float) -> int | None:
        """SIGTERM the group, wait up to ``grace`` seconds, then SIGKILL it.

        Returns only when the leader has exited and no member of its group is left.
        """
        proc = self._proc
        if proc is None:
            return None
        pgid = proc.pid
        if proc.returncode is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=max(grace, 0.0))
            except TimeoutError:
                _signal_group(pgid, signal.SIGKILL)
        code = await self.wait()
        deadline = time.monotonic() + 5.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            _signal_group(pgid, signal.SIGKILL)
            await asyncio.sleep(0.02)
        return code


class RestartPolicy(enum.Enum):
    ALWAYS = "Always"
    ON_FAILURE = "OnFailure"
    NEVER = "Never"

    @classmethod
    def parse(cls, value: str | None) -> RestartPolicy:
        return cls(value) if value else cls.ALWAYS

    def should_restart(self, exit_code: int) -> bool:
        if self is RestartPolicy.ALWAYS:
            return True
        if self is RestartPolicy.ON_FAILURE:
            return exit_code != 0
        return False


@dataclass(frozen=True)
class BackOff:
    """The kubelet's crash-loop back-off.

    As in the kubelet (``doBackOff`` with ``flowcontrol.Backoff``), the first restart after a crash
    is immediate; each further one waits ``base`` seconds doubling up to ``cap``. A container that
    ran for at least ``reset_after`` seconds starts over.
    """

    base: float = 10.0
    cap: float = 300.0
    reset_after: float = 600.0

    def delay(self, consecutive_restarts: int) -> float:
        if consecutive_restarts <= 0:
            return 0.0
        return float(min(self.cap, self.base * (2 ** (consecutive_restarts - 1))))


def exit_code_of(returncode: int) -> int:
    """Container exit code: a process killed by signal N reports 128 + N, like a runtime does."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class ContainerState:
    """One of Kubernetes' container states (``waiting``, ``running``, ``terminated``)."""

    kind: str
    reason: str | None = None
    message: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None

    def to_api(self) -> dict[str, Any]:
        if self.kind == "running":
            return {"running": {"startedAt": rfc3339(self.started_at)}}
        if self.kind == "terminated":
            body: dict[str, Any] = {
                "exitCode": self.exit_code,
                "reason": self.reason,
                "startedAt": rfc3339(self.started_at) if self.started_at else None,
                "finishedAt": rfc3339(self.finished_at),
            }
            if self.signal is not None:
                body["signal"] = self.signal
            if self.message:
                body["message"] = self.message
            return {"terminated": body}
        waiting: dict[str, Any] = {"reason": self.reason or "ContainerCreating"}
        if self.message:
            waiting["message"] = self.message
        return {"waiting": waiting}


SpecFactory = Callable[[], Awaitable[ProcessSpec]]


@dataclass
class SupervisedContainer:
    """Runs a container's process per its restart policy, tracking Kubernetes container state.

    ``prepare`` is awaited before every start, so the caller can re-materialise files or fail
    with :class:`ContainerConfigError` (shown as ``waiting`` with that reason and retried).
    ``on_change`` is called (synchronously) after every state change.
    """

    name: str
    prepare: SpecFactory
    policy: RestartPolicy
    backoff: BackOff
    on_change: Callable[[], None] = lambda: None
    restart_count: int = 0
    state: ContainerState = field(default_factory=lambda: ContainerState("waiting"))
    last_state: ContainerState | None = None
    _process: ManagedProcess | None = field(default=None, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _stopping: bool = field(default=False, repr=False)
    _consecutive: int = field(default=0, repr=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _ever_started: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self.state.kind == "running"

    @property
    def finished(self) -> bool:
        """Terminated and, per the restart policy, never to run again."""
        return self._task is not None and self._task.done() and self.state.kind == "terminated"

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"container:{self.name}")

    async def wait_finished(self) -> ContainerState:
        if self._task is None:
            raise RuntimeError("container not started")
        await asyncio.shield(self._task)
        return self.state

    def _set(self, state: ContainerState) -> None:
        self.state = state
        try:
            self.on_change()
        except Exception:
            log.exception("container %s: on_change failed", self.name)

    async def _run(self) -> None:
        while not self._stopping:
            try:
                spec = await self.prepare()
            except ContainerConfigError as exc:
                self._set(ContainerState("waiting", reason=exc.reason, message=str(exc)))
                await self._pause(exc.retry_after)
                continue
            process = ManagedProcess(spec)
            try:
                await process.start()
            except OSError as exc:
                now = time.time()
                self._record_exit(
                    ContainerState(
                        "terminated",
                        reason="StartError",
                        message=f"failed to start {spec.argv[0]!r}: {exc}",
                        started_at=now,
                        finished_at=now,
                        exit_code=128,
                    )
                )
                if not await self._maybe_restart(128, ran_for=0.0):
                    return
                continue
            self._process = process
            self._ever_started = True
            if self._stopping:
                await process.terminate(0.0)
            started = process.started_at or time.time()
            self._set(ContainerState("running", started_at=started))
            returncode = await process.wait()
            self._process = None
            code = exit_code_of(returncode)
            finished = process.finished_at or time.time()
            self._record_exit(
                ContainerState(
                    "terminated",
                    reason="Completed" if code == 0 else "Error",
                    started_at=started,
                    finished_at=finished,
                    exit_code=code,
                    signal=-returncode if returncode < 0 else None,
                )
            )
            if self._stopping or not await self._maybe_restart(code, ran_for=finished - started):
                return

    def _record_exit(self, terminated: ContainerState) -> None:
        self._set(terminated)

    async def _maybe_restart(self, code: int, ran_for: float) -> bool:
        if self._stopping or not self.policy.should_restart(code):
            return False
        if ran_for >= self.backoff.reset_after:
            self._consecutive = 0
        delay = self.backoff.delay(self._consecutive)
        self._consecutive += 1
        terminated = self.state
        if delay > 0:
            self.last_state = terminated
            self._set(
                ContainerState(
                    "waiting",
                    reason="CrashLoopBackOff",
                    message=f"back-off {delay:g}s restarting failed container={self.name}",
                )
            )
            await self._pause(delay)
            if self._stopping:
                return False
        self.last_state = terminated
        self.restart_count += 1
        return True

    async def _pause(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    async def kill_for_restart(self, grace: float) -> None:
        """Kill the running process (e.g. failed liveness probe); the policy decides what next."""
        process = self._process
        if process is not None:
            await process.terminate(grace)

    async def stop(self, grace: float) -> None:
        """Stop for good: no more restarts, kill the process tree, wait until it is gone."""
        self._stopping = True
        self._wake.set()
        process = self._process
        if process is not None:
            await process.terminate(grace)
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=max(grace, 0.0) + 10.0)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        # A start that raced with stop() may have spawned a process after the check above.
        process = self._process
        if process is not None:
            await process.terminate(0.0)


class ContainerConfigError(Exception):
    """The container cannot be started yet (missing ConfigMap key, unknown command, …)."""

    def __init__(self, message: str, reason: str = "CreateContainerConfigError") -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = 2.0
