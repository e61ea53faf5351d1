"""Write (or check) the generated CRDs: ``python -m scalable_topics.cli.crdgen crds [--check]``.

``make crds`` runs it; the unit tests fail when ``crds/`` differs from what the models generate.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from scalable_topics.core.crds import crd_files


def stale_files(directory: Path) -> list[str]:
    """Names of the generated files that are missing from ``directory`` or differ."""
    stale = []
    for name, text in crd_files().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def write(directory: Path) -> list[str]:
    """Write every CRD file whose content changed; returns the names written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in stale_files(directory):
        (directory / name).write_text(crd_files()[name], encoding="utf-8")
        written.append(name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="crdgen", description="Generate the CRDs from scalable_topics.core.resources."
    )
    parser.add_argument("directory", type=Path, help="output directory, e.g. crds")
    parser.add_argument(
        "--check", action="store_true", help="only report stale files; exit 1 if any"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.directory)
        for name in stale:
            print(f"stale: {args.directory / name} (run make crds)", file=sys.stderr)
        return 1 if stale else 0
    written = write(args.directory)
    for name in sorted(crd_files()):
        print(f"{args.directory / name}: {'written' if name in written else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
