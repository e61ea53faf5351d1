"""The ``stopic`` command (also installed as the kubectl plugin ``kubectl-stopic``).

One function per subcommand; each registers its parser in :func:`build_parser` and is
dispatched through ``args.func``. The topic commands (``dag``, ``split``, ``merge``,
``produce``, ``consume``, ``bench``) run through :func:`run_command`: Ctrl-C or SIGTERM cancels
them (they close what they opened, within bounds) and a watchdog ends the process if that takes
more than :data:`SIGNAL_GRACE` seconds. Every failure goes through :func:`describe_error`, the
one table of exit codes and messages (``docs/client.md``, "Exit codes"): one line on stderr,
the traceback only with ``--verbose``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import cast

from . import local
from .args import Parser, positive_float
from .errors import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    Interrupted,
    stdout_gone,
)

SIGNAL_GRACE = 1.6
"""Seconds a command gets to stop after Ctrl-C or SIGTERM before the process exits anyway."""


def _hard_exit(code: int) -> None:
    os.write(2, f"stopic: did not stop within {SIGNAL_GRACE:g}s; exiting\n".encode())
    os._exit(code)


async def _supervised(args: argparse.Namespace, watchdogs: list[threading.Timer]) -> int:
    """Run ``args.afunc``; the first SIGINT/SIGTERM cancels it, a second one (or the watchdog,
    :data:`SIGNAL_GRACE` seconds later, which ``watchdogs`` receives) ends the process at
    once."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if received:
            _hard_exit(128 + received[0])
        received.append(signum)
        task.cancel()
        watchdog = threading.Timer(SIGNAL_GRACE, _hard_exit, args=(128 + signum,))
        watchdog.daemon = True
        watchdog.start()
        watchdogs.append(watchdog)

    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        rc = int(await args.afunc(args))
    except asyncio.CancelledError:
        if not received:
            raise
        raise Interrupted(128 + received[0]) from None
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    if received:
        raise Interrupted(128 + received[0])
    return rc


def run_command(args: argparse.Namespace) -> int:
    watchdogs: list[threading.Timer] = []
    try:
        return asyncio.run(_supervised(args, watchdogs))
    finally:
        for watchdog in watchdogs:  # the loop is closed: nothing of the command is left
            watchdog.cancel()


def describe_error(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one line for a failure (the table in ``docs/client.md``)."""
    import aiohttp

    from ..kubeapi import KubeconfigError
    from .clients import sdk_error

    if isinstance(exc, CliError):
        return exc.exit_code, str(exc)
    if isinstance(exc, KubeconfigError):
        return EXIT_USAGE, str(exc)
    mapped = sdk_error(exc, "the topic")
    if mapped is not None:
        return mapped.exit_code, str(mapped)
    if isinstance(exc, aiohttp.ClientConnectionError | ConnectionError):
        return EXIT_UNREACHABLE, f"connection failed: {exc}"
    if isinstance(exc, TimeoutError):
        return EXIT_UNREACHABLE, "timed out waiting for the cluster (--verbose shows where)"
    detail = " ".join(str(exc).split())
    return EXIT_ERROR, (
        f"unexpected {type(exc).__name__}{': ' + detail if detail else ''} "
        "(--verbose shows the traceback)"
    )


def _topic_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from . import clients, demo, demo_cluster, drain, topics
    from .kube import API_TIMEOUT

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n", "--namespace", default="default", help="the topic's namespace (default: default)"
    )
    common.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG, else the in-cluster config, else "
        "~/.kube/config)",
    )
    common.add_argument(
        "--request-timeout",
        type=positive_float,
        default=API_TIMEOUT,
        metavar="SECONDS",
        help="how long one Kubernetes API request may take (default: %(default)g)",
    )
    common.add_argument(
        "-v",
        "--verbose",
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="debug logging, and the traceback of a failure",
    )
    topics.add_parsers(sub, common)
    clients.add_parsers(sub, common)
    drain.add_parsers(sub, common)
    for name in (
        "dag",
        "split",
        "merge",
        "move",
        "drain",
        "uncordon",
        "produce",
        "consume",
        "bench",
    ):
        sub.choices[name].set_defaults(func=run_command)
    demo.add_parser(sub, existing_cluster=demo_cluster.existing_cluster_demo)
    demo_cluster.add_load_parser(sub)


def build_parser(local_only: bool = False) -> argparse.ArgumentParser:
    """The whole command line; ``local_only`` registers just ``stopic local`` (which then starts
    without importing the SDK and the Kubernetes client, so a refused second ``local up`` is
    quick)."""
    parser = Parser(prog="stopic", description="Scalable Topics command line")
    parser.add_argument(
        "-v",
        "--verbose",
        "--debug",
        action="store_true",
        help="debug logging, and the traceback of a failure",
    )
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True),
    )
    local.add_parser(sub)
    if not local_only:
        _topic_commands(sub)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the top level has only flags before it)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A subcommand's cross-option rules (``check`` default): a usage error before anything
    connects."""
    check = getattr(args, "check", None)
    problem = check(args) if check is not None else None
    if problem:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                action.choices[args.command].error(problem)
        parser.error(problem)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(local_only=_command_of(argv) == "local")
    try:
        args = parser.parse_args(argv)
        _check(parser, args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    topic_command = getattr(args, "func", None) is run_command
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if topic_command else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        rc: int = args.func(args)
        return rc
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Interrupted as exc:
        return exc.exit_code
    except BrokenPipeError:
        stdout_gone()  # `stopic dag --watch | head`: the reader has what it wanted
        return 0
    except Exception as exc:
        code, line = describe_error(exc)
        if args.verbose:
            traceback.print_exc()
        print(f"stopic: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
