"""The Argo CD health check (docs/gitops) run by a real Lua interpreter on its own test data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

lupa = pytest.importorskip("lupa")

CHECK = Path(__file__).resolve().parents[2] / "docs/gitops/argocd/scalabletopics.io/ScalableTopic"


def _to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({k: _to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value


def health(obj: dict[str, Any]) -> dict[str, str]:
    runtime = lupa.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = _to_lua(runtime, obj)
    result = runtime.execute((CHECK / "health.lua").read_text())
    return {"status": str(result["status"]), "message": str(result["message"])}


CASES = yaml.safe_load((CHECK / "health_test.yaml").read_text())["tests"]


@pytest.mark.parametrize("case", CASES, ids=[c["inputPath"] for c in CASES])
def test_health_check_matches_its_expectations(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((CHECK / case["inputPath"]).read_text())
    assert health(obj) == case["healthStatus"]


def test_terminating_topic_is_progressing() -> None:
    obj = yaml.safe_load((CHECK / "testdata/ready.yaml").read_text())
    obj["metadata"]["deletionTimestamp"] = "2026-11-22T05:00:00Z"
    assert health(obj)["status"] == "Progressing"
