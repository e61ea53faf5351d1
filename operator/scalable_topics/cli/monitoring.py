"""Write (or check) the ``PrometheusRule`` made from the plain Prometheus rule file:
``python -m scalable_topics.cli.monitoring RULES MANIFEST [--check]``.

The rule file (docs/dashboards/scalable-topics.rules.yaml) is the one source: people without
prometheus-operator load it with ``rule_files:``, and the manifest carries the same groups as
its ``spec`` for those with it. ``make monitoring`` runs this; the unit tests fail when the
manifest is stale.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

HEADER = (
    "# Generated from {source} by `make monitoring`; edit that file, not this one.\n"
    "# For prometheus-operator users: `kubectl apply -k manifests/monitoring`\n"
    '# (docs/operations.md, "Alerts").\n'
)


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The ``PrometheusRule`` whose ``spec`` is the rule file's content."""
    if not isinstance(rules, dict) or not isinstance(rules.get("groups"), list):
        raise ValueError("a Prometheus rule file has a top-level 'groups' list")
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "scalable-topics",
            "namespace": "scalable-topics",
            "labels": {"app.kubernetes.io/part-of": "scalable-topics"},
        },
        "spec": rules,
    }


def render(rules_path: Path, source_name: str) -> str:
    rules = yaml.safe_load(rules_path.read_text(encoding="utf-8"))
    body = yaml.safe_dump(prometheus_rule(rules), sort_keys=False, width=100)
    return HEADER.format(source=source_name) + body


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="monitoring", description="Generate the PrometheusRule from the rule file."
    )
    parser.add_argument("rules", type=Path, help="docs/dashboards/scalable-topics.rules.yaml")
    parser.add_argument("manifest", type=Path, help="manifests/monitoring/prometheusrule.yaml")
    parser.add_argument("--check", action="store_true", help="exit 1 if the manifest is stale")
    args = parser.parse_args(argv)
    text = render(args.rules, args.rules.as_posix())
    current = args.manifest.read_text(encoding="utf-8") if args.manifest.is_file() else None
    if args.check:
        if current != text:
            print(f"stale: {args.manifest} (run make monitoring)", file=sys.stderr)
            return 1
        return 0
    if current != text:
        args.manifest.parent.mkdir(parents=True, exist_ok=True)
        args.manifest.write_text(text, encoding="utf-8")
    print(f"{args.manifest}: {'unchanged' if current == text else 'written'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
