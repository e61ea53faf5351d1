"""The ``stopic`` command (also installed as the kubectl plugin ``kubectl-stopic``).

One function per subcommand; each registers its parser in :func:`build_parser` and is
dispatched through ``args.func``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from . import local


def _topic_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from . import clients, demo, topics

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", default="default")
    common.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    topics.add_parsers(sub, common)
    clients.add_parsers(sub, common)
    for name in ("dag", "split", "merge", "produce", "consume", "bench"):
        sub.choices[name].set_defaults(func=topics.run_async)
    demo.add_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stopic", description="Scalable Topics command line")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    local.add_parser(sub)
    _topic_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with contextlib.suppress(KeyboardInterrupt):
        rc: int = args.func(args)
        return rc
    return 130


if __name__ == "__main__":
    sys.exit(main())
