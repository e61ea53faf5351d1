"""Broker settings from the command line and SEGMENT_BROKER_* environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from segment_broker.config import BrokerConfig, parse_config
from segment_broker.server import Broker


def test_cli_wins_over_environment_and_defaults_apply() -> None:
    env = {"SEGMENT_BROKER_PORT": "9000", "SEGMENT_BROKER_FSYNC": "interval"}
    cfg = parse_config(["--data-dir", "/d", "--port", "8081"], env)
    assert (cfg.port, cfg.fsync, cfg.data_dir) == (8081, "interval", "/d")
    assert cfg.fsync_interval_ms == BrokerConfig(data_dir="x").fsync_interval_ms
    assert parse_config([], {"SEGMENT_BROKER_DATA_DIR": "/e", "SEGMENT_BROKER_UVLOOP": "no"}) == (
        BrokerConfig(data_dir="/e", uvloop=False)
    )
    cfg = parse_config(["--data-dir", "/d", "--admin-token-file", "/t", "--no-uvloop"], {})
    assert cfg.admin_token_file == "/t" and cfg.uvloop is False
    env = {
        "SEGMENT_BROKER_AUTH": "kubernetes",
        "SEGMENT_BROKER_AUTH_TTL_S": "2.5",
        "SEGMENT_BROKER_ADMIN_IDENTITIES": "system:serviceaccount:st:op",
    }
    cfg = parse_config(["--data-dir", "/d"], env)
    assert (cfg.auth, cfg.auth_ttl_s, cfg.admin_identities) == (
        "kubernetes",
        2.5,
        "system:serviceaccount:st:op",
    )
    assert cfg.auth_audience == "scalabletopics.io"
    assert parse_config(["--data-dir", "/d"], {}).auth == "none"
    assert parse_config(["--data-dir", "/d"], {}).page_cache_bytes == 64 * 1024 * 1024
    env = {"SEGMENT_BROKER_PAGE_CACHE_BYTES": "0"}
    assert parse_config(["--data-dir", "/d"], env).page_cache_bytes == 0
    cfg = parse_config(["--data-dir", "/d", "--page-cache-bytes", "1048576"], env)
    assert cfg.page_cache_bytes == 1048576


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--data-dir", "/d", "--fsync", "sometimes"],
        ["--data-dir", "/d", "--roll-bytes", "0"],
        ["--data-dir", "/d", "--port", "70000"],
        ["--data-dir", "/d", "--auth", "ldap"],
        ["--data-dir", "/d", "--auth", "kubernetes", "--admin-token-file", "/t"],
        ["--data-dir", "/d", "--auth-ttl-s", "-1"],
        ["--data-dir", "/d", "--page-cache-bytes", "-1"],
    ],
)
def test_invalid_settings_are_rejected(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(argv, {})


def test_the_broker_hands_its_storage_settings_to_the_store(tmp_path: Path) -> None:
    cfg = parse_config(["--data-dir", str(tmp_path), "--page-cache-bytes", "4096"], {})
    assert Broker(cfg).store.settings.page_cache_bytes == 4096
