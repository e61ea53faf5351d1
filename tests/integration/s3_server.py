"""A real S3 server for tests: MinIO, built from its Go module (the Go module proxy) once into
``~/.cache/scalable-topics/minio/<version>/minio``, run on 127.0.0.1 with a data directory of
the test's. ``MINIO_VERSION`` pins it here and nowhere else."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
"""The module proxy's latest at the time of writing (MinIO tags releases as RELEASE.<date>,
which Go sees as pseudo-versions)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "scalable-topics" / "minio" / MINIO_VERSION


def minio_binary() -> Path:
    """The MinIO server binary, built with ``go install`` when missing (~10 min on 2 cores)."""
    target = cache_dir()
    binary = target / "minio"
    if binary.exists():
        return binary
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        raise RuntimeError("go not found: MinIO is built from its Go module (install Go 1.24+)")
    target.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(target), "CGO_ENABLED": "0"}
    subprocess.run(
        [
            "nice",
            "-n",
            "19",
            go,
            "install",
            "-trimpath",
            "-ldflags",
            "-s -w",
            f"{MINIO_MODULE}@{MINIO_VERSION}",
        ],
        env=env,
        check=True,
        timeout=3600,
    )
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a Secret would give the brokers and the recommender."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
        }


@contextmanager
def minio_server(data_dir: Path, *, within: float = 60.0) -> Iterator[S3Server]:
    port, console = _free_port(), _free_port()
    user, password = "stopic-" + secrets.token_hex(4), secrets.token_hex(16)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(data_dir),
        "MINIO_ROOT_USER": user,
        "MINIO_ROOT_PASSWORD": password,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
        "MINIO_CALLHOME_ENABLE": "off",
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    log = (data_dir / "minio.log").open("wb")
    proc = subprocess.Popen(
        [
            str(minio_binary()),
            "server",
            str(data_dir / "data"),
            "--address",
            f"127.0.0.1:{port}",
            "--console-address",
            f"127.0.0.1:{console}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + within
        while True:
            if proc.poll() is not None:
                tail = (data_dir / "minio.log").read_text()[-2000:]
                raise RuntimeError(f"minio exited {proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{endpoint}/minio/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("minio not ready in time")
            time.sleep(0.2)
        yield S3Server(endpoint, user, password)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
