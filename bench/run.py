"""Run the benchmarks and write `bench/reports/latest.{md,json}`.

Registry: every module `bench/<name>.py` whose name does not start with `_` (and is not `run`
or `report`) and that defines `run(report: Report, quick: bool)` — a coroutine function or a
plain function — is a benchmark. It adds a section with `report.section(name, title)` and
fills it. Adding a benchmark is adding a module; nothing here changes.

    python -m bench.run [--quick] [--only NAME ...] [--out DIR]

A benchmark that raises is recorded as an error in its section, the others still run, and the
exit status is 1. A failed target does not change the exit status: the report carries it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import pkgutil
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import bench
from bench._scratch import scratch_root
from bench.report import Report

_NOT_BENCHMARKS = {"run", "report", "quick_broker"}
REPORTS_DIR = Path(__file__).resolve().parent / "reports"


def discover() -> list[str]:
    """Names of the candidate benchmark modules, in alphabetical order."""
    return sorted(
        m.name
        for m in pkgutil.iter_modules(bench.__path__)
        if not m.name.startswith("_") and m.name not in _NOT_BENCHMARKS and not m.ispkg
    )


def load(name: str) -> Callable[..., Any] | None:
    module = importlib.import_module(f"bench.{name}")
    fn = getattr(module, "run", None)
    return fn if callable(fn) else None


def run_one(name: str, fn: Callable[..., Any], report: Report, quick: bool) -> bool:
    print(f"[bench] {name}: starting", flush=True)
    t0 = time.monotonic()
    before = len(report.sections)
    ok = True
    try:
        if inspect.iscoroutinefunction(fn):
            asyncio.run(fn(report, quick))
        else:
            fn(report, quick)
    except Exception:
        ok = False
        section = report.sections[-1] if len(report.sections) > before else None
        if section is None:
            section = report.section(name, name)
        section.error = traceback.format_exc()
        print(section.error, file=sys.stderr, flush=True)
    elapsed = time.monotonic() - t0
    for s in report.sections[before:]:
        s.seconds = elapsed
    print(f"[bench] {name}: {'done' if ok else 'FAILED'} in {elapsed:.1f} s", flush=True)
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short smoke run (< 60 s)")
    p.add_argument("--only", action="append", metavar="NAME", help="run only these benchmarks")
    p.add_argument("--out", type=Path, default=REPORTS_DIR, help="report directory")
    args = p.parse_args(argv)

    names = discover()
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            p.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(names)}")
        names = [n for n in names if n in args.only]

    command = shlex.join(["python", "-m", "bench.run", *(argv or sys.argv[1:])])
    report = Report(quick=args.quick, command=command, out_dir=args.out)
    ok = True
    with scratch_root():
        for name in names:
            fn = load(name)
            if fn is None:
                continue
            ok = run_one(name, fn, report, args.quick) and ok
    md, js = report.write(args.out)
    print(f"[bench] report: {md} and {js}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
