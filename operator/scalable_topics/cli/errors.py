"""The CLI's failures and their exit codes (the table in ``docs/client.md``, "Exit codes").

A command raises one of these with a message that names what was wrong and what to do;
``main`` prints it as one line on stderr (``stopic: <message>``) and exits with its code.
Exceptions of the libraries underneath are mapped by ``main.describe_error``.
"""

from __future__ import annotations

import contextlib
import os
import sys

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130
"""128 + SIGINT, as shells report a command ended by Ctrl-C."""
EXIT_TERMINATED = 143
"""128 + SIGTERM."""


class CliError(Exception):
    """A failure worth one clear line on stderr and a non-zero exit (1: the operation failed)."""

    exit_code = EXIT_ERROR


class UsageError(CliError):
    """The command line (or the kubeconfig it names) is wrong; nothing was sent anywhere."""

    exit_code = EXIT_USAGE


class NotFoundError(CliError):
    """A topic, subscription or segment that does not exist."""

    exit_code = EXIT_NOT_FOUND


class UnreachableError(CliError):
    """The Kubernetes API, the operator or a broker could not be reached in time."""

    exit_code = EXIT_UNREACHABLE


class Interrupted(CliError):
    """Ctrl-C (SIGINT) or SIGTERM ended the command."""

    def __init__(self, exit_code: int) -> None:
        super().__init__("interrupted")
        self.exit_code = exit_code


def stdout_gone() -> None:
    """The reader of stdout went away (``| head``): stop quietly, and keep the interpreter's
    final flush from failing too."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
