"""The command line that starts a broker as a child process on the loopback interface."""

from __future__ import annotations

import sys
from pathlib import Path


def broker_command(port: int, data_dir: str | Path, *args: str) -> list[str]:
    """``python -m segment_broker`` (this interpreter) on ``127.0.0.1:port`` with its segments
    under ``data_dir``; ``args`` are further options (``--fsync always``, …)."""
    return [
        sys.executable,
        "-m",
        "segment_broker",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *args,
    ]
