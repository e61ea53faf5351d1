"""Server processes for benchmarks: install, pin, start, wait, measure CPU, stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
SERVER_CORE = 0
CLIENT_CORE = 1


def can_pin() -> bool:
    """Server and client get a core each only when the machine has at least two."""
    try:
        return len(os.sched_getaffinity(0)) >= 2 and {SERVER_CORE, CLIENT_CORE} <= set(
            os.sched_getaffinity(0)
        )
    except AttributeError:
        return False


def pin_self(core: int) -> None:
    if can_pin():
        os.sched_setaffinity(0, {core})


def pin_process(pid: int, core: int) -> None:
    """Every thread of a running process onto ``core`` (threads it starts later inherit it from
    theirs); a no-op where the machine cannot pin."""
    if not can_pin():
        return
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), {core})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_debian_package(binary: str, package: str) -> str:
    """Path of `binary`; installs the Debian `package` with apt-get when it is missing.

    The benchmark runs as root on the project's machines; elsewhere the install fails with a
    clear message and the benchmark for that peer is skipped by the caller.
    """
    found = shutil.which(binary) or (
        f"/usr/sbin/{binary}" if os.path.exists(f"/usr/sbin/{binary}") else None
    )
    if found:
        return found
    print(
        f"[bench] {binary} not found: installing the Debian package {package} (apt-get install -y)",
        flush=True,
    )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", package]
    if os.geteuid() != 0:
        raise RuntimeError(f"{binary} is missing and installing {package} needs root")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        subprocess.run(
            ["apt-get", "update"], env=env, capture_output=True, timeout=600, check=False
        )
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    found = shutil.which(binary) or (
        f"/usr/sbin/{binary}" if os.path.exists(f"/usr/sbin/{binary}") else None
    )
    if r.returncode != 0 or not found:
        raise RuntimeError(f"apt-get install {package} failed: {r.stderr[-2000:]}")
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all threads included (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def runqueue_seconds(pid: int) -> float:
    """Time the process's live threads have spent runnable but waiting for a CPU
    (/proc/<pid>/task/*/schedstat, second field; 0 where schedstats are missing). On a shared
    machine a process can be CPU-bound at well under 100 % of a core: this is the rest."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (FileNotFoundError, IndexError, ValueError):
            continue
    return total / 1e9


def cpu_by_role(roles: Mapping[str, str]) -> dict[str, float]:
    """CPU seconds (user + system) of the live processes, summed by role: the first role whose
    text occurs in the process's command line (processes of no role are left out). Two calls
    make a delta of where the machine's cores went, as long as the processes of each role live
    through both."""
    totals: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            seconds = cpu_seconds(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        role = next((name for name, text in roles.items() if text in cmdline), None)
        if role is not None:
            totals[role] = totals.get(role, 0.0) + seconds
    return totals


def memory_kb(pid: int, field: str = "VmRSS") -> int:
    """A /proc/<pid>/status memory line in KiB: ``VmRSS`` (resident now), ``VmHWM`` (its peak)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise ValueError(f"no {field} in /proc/{pid}/status")


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    workdir: Path
    log_path: Path
    port: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def runqueue(self) -> float:
        return runqueue_seconds(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)


def start_server(
    name: str,
    argv: Sequence[str],
    workdir: Path,
    port: int,
    ready: Callable[[], bool],
    *,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
) -> Server:
    """Start `argv` pinned to the server core, logging to `workdir/<name>.log`; wait for `ready`.

    `ready` is polled until it returns True or the deadline passes (then the process is stopped
    and the log tail is raised).
    """
    cmd = list(argv)
    taskset = shutil.which("taskset")
    if can_pin() and taskset:
        cmd = [taskset, "-c", str(SERVER_CORE), *cmd]
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )
    server = Server(name, proc, workdir, log_path, port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(OSError):
            if ready():
                return server
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"{name} not ready after {timeout:.0f} s:\n{server.log_tail()}")


def tcp_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True


def python() -> str:
    return sys.executable
