"""The benchmarks' scratch directory: a killed run's data is swept, a live run's never."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench import _scratch

HOLD = """
import sys, tempfile, time
sys.path.insert(0, {repo!r})
from bench._scratch import scratch_root
with scratch_root() as root:
    (root / "data").write_bytes(b"x" * 4096)
    print(root, flush=True)
    time.sleep(600)
"""


def _start_run(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    repo = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(repo=repo)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.stdout is not None
    root = Path(proc.stdout.readline().strip())
    assert root.parent == tmp_path and (root / "data").exists()
    return proc, root


def test_a_killed_runs_directory_is_swept_and_a_live_runs_is_not(tmp_path: Path) -> None:
    killed, killed_root = _start_run(tmp_path)
    live, live_root = _start_run(tmp_path)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert killed_root.exists()  # no finally ran
        unrelated = tmp_path / "bench-run-not-a-run"
        unrelated.mkdir()  # no lock file: some other tool's, or one being created

        removed = _scratch.sweep(tmp_path)

        assert removed == [killed_root]
        assert not killed_root.exists()
        assert (live_root / "data").exists()
        assert unrelated.exists()
    finally:
        live.kill()
        live.wait(timeout=30)


def test_the_run_directory_is_the_temp_dir_inside_and_removed_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", "/somewhere/else")
    with _scratch.scratch_root() as root:
        assert Path(tempfile.mkdtemp()).parent == root
        assert os.environ["TMPDIR"] == str(root)
    assert not root.exists()
    assert tempfile.tempdir == str(tmp_path)
    assert os.environ["TMPDIR"] == "/somewhere/else"
