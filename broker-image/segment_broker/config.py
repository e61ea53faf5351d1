"""Typed broker settings from the command line and ``SEGMENT_BROKER_*`` environment variables
(command line wins)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Literal

FsyncMode = Literal["always", "interval"]


@dataclass(frozen=True)
class BrokerConfig:
    data_dir: str
    host: str = "127.0.0.1"
    port: int = 8080
    fsync: FsyncMode = "always"
    fsync_interval_ms: int = 50
    roll_bytes: int = 256 * 1024 * 1024
    cache_bytes: int = 256 * 1024 * 1024
    page_cache_bytes: int = 64 * 1024 * 1024
    cursor_flush_ms: int = 100
    max_inflight_bytes: int = 8 * 1024 * 1024
    max_frame_bytes: int = 32 * 1024 * 1024
    fence_wait_s: float = 5.0
    handoff_wait_s: float = 0.0
    admin_token_file: str | None = None
    auth: str = "none"
    auth_audience: str = "scalabletopics.io"
    admin_identities: str = ""
    auth_ttl_s: float = 10.0
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    load_history_dir: str | None = None
    load_interval_s: float = 10.0
    load_reporter: str = "none"
    kubeconfig: str | None = None
    uvloop: bool = True
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if self.fsync not in ("always", "interval"):
            raise ValueError("fsync must be 'always' or 'interval'")
        for name in (
            "fsync_interval_ms",
            "roll_bytes",
            "cache_bytes",
            "cursor_flush_ms",
            "max_inflight_bytes",
            "max_frame_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.page_cache_bytes < 0:
            raise ValueError("page_cache_bytes must not be negative")
        if self.fence_wait_s < 0:
            raise ValueError("fence_wait_s must not be negative")
        if self.handoff_wait_s < 0:
            raise ValueError("handoff_wait_s must not be negative")
        if self.auth not in ("none", "kubernetes"):
            raise ValueError("auth must be 'none' or 'kubernetes'")
        if self.auth_ttl_s < 0:
            raise ValueError("auth_ttl_s must not be negative")
        if self.auth == "kubernetes" and self.admin_token_file:
            raise ValueError(
                "--admin-token-file and --auth kubernetes both read the Authorization header "
                "of admin requests: use one (docs/security.md)"
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("--tls-cert-file and --tls-key-file go together: set both or neither")
        if self.load_reporter not in ("none", "kubernetes"):
            raise ValueError("load_reporter must be 'none' or 'kubernetes'")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be within 0..65535")


_HELP = {
    "data_dir": "directory holding the segment logs (required)",
    "host": "listen address",
    "port": "listen port",
    "fsync": "'always': ack after fdatasync (group commit, default); "
    "'interval': ack after write, fdatasync every --fsync-interval-ms (weaker)",
    "fsync_interval_ms": "fsync period in 'interval' mode",
    "roll_bytes": "log file size at which a new file is started",
    "cache_bytes": "memory for recent entries (tailing consumers read them without disk "
    "reads), shared evenly by the hosted segments (at least 1 MiB each)",
    "page_cache_bytes": "synced bytes at the end of each log file left in the OS page cache: "
    "older ones are dropped from it after their sync (posix_fadvise DONTNEED), so the broker's "
    "writes reuse the memory they freed instead of filling the machine's; readers further "
    "behind read from the disk. 0: leave everything to the kernel",
    "cursor_flush_ms": "how often changed cursors are persisted",
    "max_inflight_bytes": "per producer connection: unacknowledged bytes before reading pauses",
    "max_frame_bytes": "largest WebSocket frame accepted",
    "fence_wait_s": "how long a produce handshake on a fenced segment (a split/merge child "
    "whose parents are being sealed) waits for its activation before it is refused with "
    "SegmentNotWritable",
    "handoff_wait_s": "on SIGTERM, keep serving up to this long while the operator moves this "
    "broker's segments to the others (it drains a terminating broker pod), then stop; 0: stop "
    "at once (keep it below terminationGracePeriodSeconds)",
    "admin_token_file": "file with the bearer token required on /admin routes",
    "auth": "'kubernetes': clients present a ServiceAccount token checked with TokenReview and "
    "SubjectAccessReview (verbs produce/consume on scalabletopics), the admin API only for "
    "--admin-identities; 'none' (default): anyone who reaches the port may do anything "
    "(development only, insecure; docs/security.md)",
    "auth_audience": "audience client tokens must be issued for",
    "admin_identities": "comma-separated usernames allowed on /admin (e.g. "
    "system:serviceaccount:scalable-topics:scalable-topics-operator)",
    "auth_ttl_s": "seconds a token review or access decision is cached",
    "tls_cert_file": "PEM certificate (chain) of the listener: with --tls-key-file the broker "
    "serves HTTPS/WSS only, read at start (a renewed certificate needs a restart; "
    "docs/security.md); unset (default): plain HTTP",
    "tls_key_file": "PEM private key of --tls-cert-file",
    "load_history_dir": "where the load history (JSON lines) is written: a directory or "
    "s3://bucket/prefix (credentials from the AWS variables); none when unset",
    "load_interval_s": "load sampling interval",
    "load_reporter": "'kubernetes': patch Segment.status.load when a rate moves by more than "
    "25 %%, and Segment.status.corruption when a segment is quarantined or truncated "
    "(in-cluster config, else --kubeconfig); 'none' (default)",
    "kubeconfig": "kubeconfig for --load-reporter kubernetes outside a cluster",
    "uvloop": "use uvloop when installed",
    "log_level": "logging level",
}


def parse_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> BrokerConfig:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="segment-broker", description="Scalable Topics broker")
    for f in fields(BrokerConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "uvloop":
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=_HELP[f.name]
            )
            continue
        kind: type = {
            "port": int,
            "fsync_interval_ms": int,
            "roll_bytes": int,
            "cache_bytes": int,
            "page_cache_bytes": int,
            "cursor_flush_ms": int,
            "max_inflight_bytes": int,
            "max_frame_bytes": int,
            "load_interval_s": float,
            "fence_wait_s": float,
            "handoff_wait_s": float,
            "auth_ttl_s": float,
        }.get(f.name, str)
        kwargs: dict[str, object] = {"type": kind, "default": None, "help": _HELP[f.name]}
        if f.name == "fsync":
            kwargs["choices"] = ["always", "interval"]
        if f.name in ("load_reporter", "auth"):
            kwargs["choices"] = ["none", "kubernetes"]
        parser.add_argument(flag, **kwargs)  # type: ignore[arg-type]
    ns = parser.parse_args(argv)
    values: dict[str, object] = {}
    for f in fields(BrokerConfig):
        cli = getattr(ns, f.name)
        raw = env.get("SEGMENT_BROKER_" + f.name.upper())
        if cli is not None:
            values[f.name] = cli
        elif raw is not None and raw != "":
            values[f.name] = _coerce(f.name, raw)
    if "data_dir" not in values:
        parser.error("--data-dir (or SEGMENT_BROKER_DATA_DIR) is required")
    try:
        return BrokerConfig(**values)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
        raise


def _coerce(name: str, raw: str) -> object:
    if name == "uvloop":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if name in ("load_interval_s", "fence_wait_s", "handoff_wait_s", "auth_ttl_s"):
        return float(raw)
    if name in (
        "port",
        "fsync_interval_ms",
        "roll_bytes",
        "cache_bytes",
        "page_cache_bytes",
        "cursor_flush_ms",
        "max_inflight_bytes",
        "max_frame_bytes",
    ):
        return int(raw)
    return raw
