"""Process supervision of the local kubelet: output capture, restart policy, back-off, kill tree."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from scalable_topics.localcluster.processes import (
    BackOff,
    ContainerConfigError,
    ManagedProcess,
    ProcessSpec,
    RestartPolicy,
    SupervisedContainer,
    exit_code_of,
)


async def wait_until(predicate: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.02)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def py(code: str, log: Path, cwd: Path | None = None) -> ProcessSpec:
    return ProcessSpec([sys.executable, "-c", code], dict(os.environ), log, cwd)


def container(
    spec: ProcessSpec, policy: RestartPolicy, base: float = 0.05, events: list[str] | None = None
) -> SupervisedContainer:
    async def prepare() -> ProcessSpec:
        return spec

    sc: SupervisedContainer

    def changed() -> None:
        if events is not None:
            events.append(f"{sc.state.kind}:{sc.state.reason}:{sc.restart_count}")

    sc = SupervisedContainer("c", prepare, policy, BackOff(base=base, cap=base * 4), changed)
    return sc


async def test_output_is_appended_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "c.log"
    for word in ("first", "second"):
        proc = ManagedProcess(
            py(f"import sys; print({word!r}); print('err', file=sys.stderr)", log)
        )
        await proc.start()
        assert await proc.wait() == 0
    assert log.read_text().split() == ["first", "err", "second", "err"]


async def test_exit_codes_follow_container_runtime_convention() -> None:
    assert exit_code_of(3) == 3
    assert exit_code_of(-signal.SIGKILL) == 137
    assert exit_code_of(-signal.SIGTERM) == 143


def test_backoff_is_immediate_then_doubles_to_the_cap() -> None:
    b = BackOff(base=10, cap=300)
    assert [b.delay(n) for n in range(8)] == [0, 10, 20, 40, 80, 160, 300, 300]


async def test_always_restarts_with_crash_loop_backoff(tmp_path: Path) -> None:
    events: list[str] = []
    starts = tmp_path / "starts"
    sc = container(
        py(
            f"import time; open({str(starts)!r}, 'a').write(f'{{time.time()}}\\n'); "
            "raise SystemExit(2)",
            tmp_path / "c.log",
        ),
        RestartPolicy.ALWAYS,
        events=events,
    )
    sc.start()
    try:
        await wait_until(lambda: starts.exists() and len(starts.read_text().split()) >= 4)
    finally:
        await sc.stop(1.0)
    stamps = [float(x) for x in starts.read_text().split()]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    # 1st restart immediate, then 0.05 s, 0.1 s, …: later gaps are at least the back-off.
    assert gaps[1] >= 0.05 and gaps[2] >= 0.1
    assert any(e.startswith("waiting:CrashLoopBackOff") for e in events)
    assert sc.last_state is not None and sc.last_state.exit_code == 2


async def test_on_failure_stops_after_success(tmp_path: Path) -> None:
    marker = tmp_path / "ran-once"
    code = (
        f"import os, sys; p = {str(marker)!r}; first = not os.path.exists(p); "
        "open(p, 'a').close(); sys.exit(1 if first else 0)"
    )
    sc = container(py(code, tmp_path / "c.log"), RestartPolicy.ON_FAILURE)
    sc.start()
    state = await asyncio.wait_for(sc.wait_finished(), 20)
    assert state.kind == "terminated" and state.exit_code == 0 and state.reason == "Completed"
    assert sc.restart_count == 1 and sc.finished


async def test_never_does_not_restart(tmp_path: Path) -> None:
    sc = container(py("raise SystemExit(5)", tmp_path / "c.log"), RestartPolicy.NEVER)
    sc.start()
    state = await asyncio.wait_for(sc.wait_finished(), 20)
    assert (state.exit_code, state.reason, sc.restart_count) == (5, "Error", 0)


async def test_sigkill_from_outside_is_detected_and_restarted(tmp_path: Path) -> None:
    sc = container(py("import time; time.sleep(600)", tmp_path / "c.log"), RestartPolicy.ALWAYS)
    sc.start()
    try:
        await wait_until(lambda: sc.running and sc.pid is not None)
        first_pid = sc.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        await wait_until(lambda: sc.running and sc.pid not in (None, first_pid))
        assert sc.restart_count == 1
        assert sc.last_state is not None
        assert (sc.last_state.exit_code, sc.last_state.signal) == (137, 9)
    finally:
        await sc.stop(1.0)
    assert not pid_alive(first_pid)


async def test_terminate_kills_the_whole_process_group(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(child_pid_file)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(600)\n"
    )
    proc = ManagedProcess(py(code, tmp_path / "c.log"))
    await proc.start()
    await wait_until(lambda: child_pid_file.exists() and child_pid_file.read_text() != "")
    child = int(child_pid_file.read_text())
    assert proc.pid is not None and pid_alive(child)
    await proc.terminate(2.0)
    assert not pid_alive(proc.pid)
    await wait_until(lambda: not pid_alive(child), 5)


async def test_sigterm_ignoring_process_is_killed_after_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(600)\n"
    )
    proc = ManagedProcess(py(code, tmp_path / "c.log"))
    await proc.start()
    await wait_until(ready.exists)
    began = time.monotonic()
    code_ = await proc.terminate(0.3)
    assert code_ == -signal.SIGKILL
    assert time.monotonic() - began >= 0.3


async def test_unstartable_command_reports_start_error(tmp_path: Path) -> None:
    spec = ProcessSpec([str(tmp_path / "missing-binary")], dict(os.environ), tmp_path / "c.log")
    sc = container(spec, RestartPolicy.NEVER)
    sc.start()
    state = await asyncio.wait_for(sc.wait_finished(), 20)
    assert state.reason == "StartError" and state.exit_code == 128


async def test_config_error_waits_and_retries(tmp_path: Path) -> None:
    attempts: list[int] = []
    spec = py("pass", tmp_path / "c.log")

    async def prepare() -> ProcessSpec:
        attempts.append(1)
        if len(attempts) < 2:
            err = ContainerConfigError('configmap "x" not found')
            err.retry_after = 0.05
            raise err
        return spec

    states: list[str | None] = []
    sc = SupervisedContainer("c", prepare, RestartPolicy.NEVER, BackOff(base=0.05))
    sc.on_change = lambda: states.append(sc.state.reason)
    sc.start()
    state = await asyncio.wait_for(sc.wait_finished(), 20)
    assert state.exit_code == 0
    assert states[0] == "CreateContainerConfigError"


@pytest.mark.parametrize("policy", list(RestartPolicy))
async def test_stop_leaves_nothing_behind(tmp_path: Path, policy: RestartPolicy) -> None:
    sc = container(py("import time; time.sleep(600)", tmp_path / "c.log"), policy)
    sc.start()
    await wait_until(lambda: sc.pid is not None)
    pid = sc.pid
    assert pid is not None
    await sc.stop(1.0)
    assert not pid_alive(pid)
    assert sc.state.kind == "terminated"


def test_a_group_of_zombies_is_not_alive() -> None:
    """Dead but unreaped (init may reap a container's orphans late) is dead: stopping a pod
    does not wait for the reaping."""
    import subprocess

    from scalable_topics.localcluster.processes import _group_alive

    leader = subprocess.Popen(["true"], start_new_session=True)  # not waited for: a zombie

    def zombie() -> bool:
        with open(f"/proc/{leader.pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"

    try:
        deadline = time.monotonic() + 20
        while not zombie():
            assert time.monotonic() < deadline, "the process did not exit"
            time.sleep(0.01)
        os.killpg(leader.pid, 0)  # the kernel still lists the group
        assert not _group_alive(leader.pid)
    finally:
        leader.wait()
    live = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert _group_alive(live.pid)
    finally:
        live.kill()
        live.wait()


def test_a_container_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """``kill -9`` of the control plane must not leave its containers running: they run in
    sessions of their own, so only the parent-death signal ends them."""
    import subprocess

    starter = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from scalable_topics.localcluster.processes import ManagedProcess, ProcessSpec\n"
        "async def main():\n"
        "    p = ManagedProcess(ProcessSpec(['sleep', '300'], {}, Path(sys.argv[1])))\n"
        "    await p.start()\n"
        "    print(p.pid, flush=True)\n"
        "    await asyncio.sleep(300)\n"
        "asyncio.run(main())\n"
    )
    kubelet = subprocess.Popen(
        [sys.executable, "-c", starter, str(tmp_path / "c.log")], stdout=subprocess.PIPE, text=True
    )
    assert kubelet.stdout is not None
    container = int(kubelet.stdout.readline())
    try:
        assert pid_alive(container)
        kubelet.kill()
        kubelet.wait()
        deadline = time.monotonic() + 10
        while pid_alive(container):
            assert time.monotonic() < deadline, "the container outlived its kubelet"
            time.sleep(0.01)
    finally:
        kubelet.kill()
        kubelet.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(container, signal.SIGKILL)
