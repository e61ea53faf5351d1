"""Argument parsing: one-line usage errors and the value checks every subcommand shares.

Every value is checked here, before anything connects anywhere: a mistake is one line on
stderr and exit code 2 (``docs/client.md``, "Exit codes").
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

from .errors import EXIT_USAGE


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (no usage block): ``<prog>: error:
    <what> (see '<prog> --help')``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        sys.exit(status)


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def hash_point(text: str) -> int:
    """A point of the 16-bit hash ring as 1 to 4 hex digits (``4000``, ``0x4000``)."""
    digits = text.lower().removeprefix("0x")
    if not 1 <= len(digits) <= 4 or any(c not in "0123456789abcdef" for c in digits):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a hash point: give 1 to 4 hex digits, 0000 to ffff"
        )
    return int(digits, 16)
