"""How TLS settings choose the schemes the DAG advertises (docs/security.md, "TLS")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scalable_topics.controller.__main__ import parse_args
from scalable_topics.controller.app import ControllerSettings
from scalable_topics.controller.cache import pod_broker
from scalable_topics.credentials import CredentialsError, client_ssl_context, server_ssl_context
from segment_broker.config import parse_config


def _pod(subdomain: str | None = "segment-broker") -> dict[str, Any]:
    spec = {"hostname": "segment-broker-0"}
    if subdomain:
        spec["subdomain"] = subdomain
    return {
        "metadata": {"name": "segment-broker-0", "namespace": "st"},
        "spec": spec,
        "status": {"podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_broker_urls_are_http_by_ip_unless_tls() -> None:
    plain = pod_broker(_pod(), 8080)
    assert plain is not None and plain.url == "http://10.0.0.7:8080"
    secure = pod_broker(_pod(), 8080, "https")
    assert (
        secure is not None and secure.url == "https://segment-broker-0.segment-broker.st.svc:8080"
    )
    bare = pod_broker(_pod(subdomain=None), 8080, "https")
    assert bare is not None and bare.url == "https://10.0.0.7:8080"


def test_operator_schemes_follow_the_flags() -> None:
    off = parse_args(["--host", "10.1.1.1"])
    assert off.advertised_url() == "http://10.1.1.1:8080" and off.broker_scheme == "http"
    on = parse_args(
        ["--host", "10.1.1.1", "--tls-cert-file", "c", "--tls-key-file", "k", "--tls-ca-file", "a"]
    )
    assert on.advertised_url() == "https://10.1.1.1:8080" and on.broker_scheme == "https"
    named = parse_args(
        ["--host", "10.1.1.1", "--namespace", "st", "--url", "https://{pod_dns}:8080"]
    )
    assert named.advertised_url() == "https://10-1-1-1.st.pod:8080"
    with pytest.raises(SystemExit):
        parse_args(["--tls-cert-file", "c"])
    with pytest.raises(ValueError, match="go together"):
        ControllerSettings(tls_key_file="k")


def test_broker_needs_cert_and_key_together(tmp_path: Path) -> None:
    config = parse_config(
        ["--data-dir", str(tmp_path)],
        {"SEGMENT_BROKER_TLS_CERT_FILE": "c", "SEGMENT_BROKER_TLS_KEY_FILE": "k"},
    )
    assert (config.tls_cert_file, config.tls_key_file) == ("c", "k")
    with pytest.raises(SystemExit):
        parse_config(["--data-dir", str(tmp_path), "--tls-cert-file", "c"], {})


def test_missing_files_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(CredentialsError, match=r"nope\.pem"):
        client_ssl_context(missing)
    monkeypatch.setenv("SCALABLE_TOPICS_CA_FILE", missing)
    with pytest.raises(CredentialsError, match="CA file"):
        client_ssl_context()
    monkeypatch.delenv("SCALABLE_TOPICS_CA_FILE")
    assert client_ssl_context() is None
    with pytest.raises(CredentialsError, match="TLS certificate"):
        server_ssl_context(missing, missing)
