"""Prometheus and promtool for the tests, from Debian's ``prometheus`` package.

Installed on first use with the benchmarks' mechanism (``apt-get install`` as root,
bench/_procs.py); where that is impossible the test is skipped saying why, never passed.
"""

from __future__ import annotations

import pytest

from bench._procs import ensure_debian_package

PACKAGE = "prometheus"


def prometheus_binary(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``; skips the calling test when it cannot be had."""
    try:
        return ensure_debian_package(name, PACKAGE)
    except (RuntimeError, OSError) as exc:
        pytest.skip(
            f"{name} is missing and the Debian package {PACKAGE} could not be installed: {exc}"
        )
