"""The data directory lock (one control plane per directory) and ``reset``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalable_topics.localcluster.datadir import (
    HOLDER_FILE,
    LOCK_FILE,
    MARKER_FILE,
    DataDirInUse,
    DataDirLock,
    NotADataDir,
    read_holder,
    reset,
    running,
)

HOLD = """
import subprocess, sys
from scalable_topics.localcluster.datadir import DataDirLock
lock = DataDirLock(sys.argv[1])
lock.acquire()
lock.publish("http://127.0.0.1:4242")
child = subprocess.Popen(["sleep", "300"], close_fds=False)
print(child.pid, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    """Another process holding ``tmp_path/d`` (and a grandchild of it, which must not keep
    the lock alive once it dies)."""
    data = tmp_path / "d"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    try:
        yield proc, grandchild, data
    finally:
        proc.kill()
        proc.wait()
        os.kill(grandchild, signal.SIGKILL)


def test_second_lock_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path / "d")
    first.acquire()
    first.publish("http://127.0.0.1:5555")
    with pytest.raises(DataDirInUse) as refused:
        DataDirLock(tmp_path / "d").acquire()
    message = str(refused.value)
    assert f"pid {os.getpid()}" in message
    assert "http://127.0.0.1:5555" in message
    assert f"stopic local down --data-dir {tmp_path / 'd'}" in message
    assert refused.value.holder == first.holder
    assert running(tmp_path / "d") == first.holder

    first.release()
    assert not (tmp_path / "d" / HOLDER_FILE).exists()
    assert running(tmp_path / "d") is None
    again = DataDirLock(tmp_path / "d")
    again.acquire()
    assert again.previous is None, "a clean release leaves no holder record behind"
    again.release()


def test_lock_of_a_killed_process_is_taken_over(
    holder_process: tuple[subprocess.Popen[str], int, Path],
) -> None:
    proc, grandchild, data = holder_process
    held = running(data)
    assert held is not None and held.pid == proc.pid
    assert held.api_url == "http://127.0.0.1:4242"
    with pytest.raises(DataDirInUse, match=re.escape(f"pid {proc.pid}, http://127.0.0.1:4242")):
        DataDirLock(data).acquire()

    proc.send_signal(signal.SIGKILL)
    proc.wait()
    os.kill(grandchild, 0)  # still alive, and it inherited every inheritable descriptor
    assert running(data) is None
    lock = DataDirLock(data)
    lock.acquire()
    assert lock.previous is not None and lock.previous.pid == proc.pid
    current = read_holder(data)
    assert current is not None and current.pid == os.getpid() and current.api_url == ""
    lock.release()


def test_acquire_marks_the_directory(tmp_path: Path) -> None:
    lock = DataDirLock(tmp_path / "new" / "dir")
    lock.acquire()
    assert (tmp_path / "new" / "dir" / MARKER_FILE).is_file()
    lock.release()


def _populate(data: Path) -> None:
    for name in ("cluster.sqlite3", "cluster.sqlite3-wal", "token", "kubeconfig"):
        (data / name).write_text("x")
    (data / "pods" / "ns" / "p").mkdir(parents=True)
    (data / "pods" / "ns" / "p" / "c.log").write_text("log")
    (data / "volumes" / "ns" / "claim").mkdir(parents=True)
    (data / "kubelet").mkdir()


def test_reset_removes_only_what_the_control_plane_created(tmp_path: Path) -> None:
    data = tmp_path / "d"
    lock = DataDirLock(data)
    lock.acquire()
    lock.release()
    _populate(data)
    (data / "notes.txt").write_text("mine")

    result = reset(data)
    assert set(result.removed) >= {
        "cluster.sqlite3",
        "cluster.sqlite3-wal",
        "token",
        "kubeconfig",
        "pods",
        "volumes",
        "kubelet",
        MARKER_FILE,
    }
    assert result.kept == ["notes.txt"]
    assert sorted(p.name for p in data.iterdir()) == ["notes.txt"]
    assert not result.directory_removed


def test_reset_removes_an_emptied_directory_and_accepts_an_old_one(tmp_path: Path) -> None:
    data = tmp_path / "old"
    data.mkdir()
    _populate(data)  # written before the marker existed: store, token and kubeconfig
    result = reset(data)
    assert result.directory_removed and not data.exists()
    assert reset(data).removed == []


def test_reset_refuses_a_directory_that_is_not_a_data_dir(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "pods").mkdir(parents=True)
    (home / "kubeconfig").write_text("a user's own kubeconfig")
    with pytest.raises(NotADataDir, match="does not look like"):
        reset(home)
    assert (home / "pods").is_dir() and (home / "kubeconfig").exists()
    assert not (home / LOCK_FILE).exists()


def test_reset_refuses_while_the_directory_is_held(tmp_path: Path) -> None:
    data = tmp_path / "d"
    lock = DataDirLock(data)
    lock.acquire()
    lock.publish("http://127.0.0.1:7777")
    _populate(data)
    with pytest.raises(DataDirInUse, match=re.escape("http://127.0.0.1:7777")):
        reset(data)
    assert (data / "cluster.sqlite3").exists() and (data / "pods").is_dir()
    lock.release()
    reset(data)
    assert not data.exists()


def test_reset_removes_the_real_control_plane_state(tmp_path: Path) -> None:
    """The PKI, etcd's data, the logs, every kubeconfig, the kubectl link (not its target) and
    the temporary files an interrupted start leaves; a user's look-alikes stay."""
    data = tmp_path / "d"
    lock = DataDirLock(data)
    lock.acquire()
    lock.release()
    binary = tmp_path / "cache" / "kube"
    binary.parent.mkdir()
    binary.write_text("the multi-call binary")
    for directory in ("pki", "etcd/member/wal", "logs", "flexvolume", "bin", ".pki.4242.tmp"):
        (data / directory).mkdir(parents=True)
    (data / "pki" / "ca.key").write_text("key")
    (data / "logs" / "kube-apiserver.log").write_text("log")
    (data / "bin" / "kubectl").symlink_to(binary)
    for name in (
        "kubeconfig",
        "admin.kubeconfig",
        "kube-controller-manager.kubeconfig",
        "kube-scheduler.kubeconfig",
        "node-local.kubeconfig",
        "node-real-node.kubeconfig",
        ".admin.kubeconfig.tmp",
    ):
        (data / name).write_text("x")
    for mine in (".notes.tmp", "node-notes.txt", "kubeconfig.bak"):
        (data / mine).write_text("mine")

    result = reset(data)

    assert {"pki", "etcd", "logs", "flexvolume", "bin", "node-real-node.kubeconfig"} <= set(
        result.removed
    )
    assert sorted(p.name for p in data.iterdir()) == [
        ".notes.tmp",
        "kubeconfig.bak",
        "node-notes.txt",
    ]
    assert result.kept == [".notes.tmp", "kubeconfig.bak", "node-notes.txt"]
    assert binary.read_text() == "the multi-call binary"
