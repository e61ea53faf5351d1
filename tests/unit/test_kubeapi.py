"""The one kubeconfig loader (``scalable_topics.kubeapi``) says which file is wrong and how, for
every edge that uses it: the CLI, the demo and the brokers' load reporter."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalable_topics.kubeapi import KubeconfigError, configuration


async def test_a_kubeconfig_that_is_missing_or_not_valid_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "missing.kubeconfig"
    broken = tmp_path / "broken.kubeconfig"
    broken.write_text("clusters: [\n")
    not_one = tmp_path / "list.kubeconfig"
    not_one.write_text("- a\n- b\n")
    for path, says in (
        (missing, f"kubeconfig {missing}: no such file; pass --kubeconfig or set KUBECONFIG"),
        (broken, f"kubeconfig {broken} is not valid YAML (line 2, column 1)"),
        (not_one, f"kubeconfig {not_one} is not a kubeconfig"),
    ):
        with pytest.raises(KubeconfigError) as raised:
            await configuration(str(path))
        assert str(raised.value).startswith(says), raised.value


async def test_without_a_cluster_or_a_kubeconfig_it_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeconfigError, match=r"no kubeconfig: not running in a cluster and "):
        await configuration(None)
    named = tmp_path / "elsewhere.kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(named))
    with pytest.raises(KubeconfigError, match=f"and {named} does not exist"):
        await configuration(None)
