"""The benchmark report: figures, tables, targets and notes, written as Markdown and JSON.

Benchmark modules receive a `Report` and add one `Section` each. The JSON keeps every figure
with its unit and labels (for trend tracking across runs); the Markdown is for people.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Cell = str | int | float | None


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Cell]]


@dataclass
class Target:
    name: str
    passed: bool
    measured: str
    required: str


@dataclass
class Section:
    name: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def figure(self, name: str, value: float, unit: str, **labels: str) -> None:
        self.figures.append(Figure(name, float(value), unit, labels))

    def table(self, title: str, columns: list[str], rows: list[list[Cell]]) -> None:
        self.tables.append(Table(title, columns, rows))

    def target(self, name: str, passed: bool, measured: str, required: str) -> None:
        self.targets.append(Target(name, passed, measured, required))

    def note(self, text: str) -> None:
        self.notes.append(text)


def _machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpuModel": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadAverageAtStart": list(os.getloadavg()),
    }


class Report:
    def __init__(self, *, quick: bool, command: str, out_dir: Path | None = None) -> None:
        self.quick = quick
        self.command = command
        self.out_dir = out_dir
        """Where the report goes; benchmarks may put side files (profiles) there."""
        self.started_at = time.time()
        self.finished_at: float | None = None
        self.machine = _machine()
        self.sections: list[Section] = []

    def section(self, name: str, title: str) -> Section:
        s = Section(name, title)
        self.sections.append(s)
        return s

    def to_json(self) -> dict[str, Any]:
        return {
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "quick": self.quick,
            "command": self.command,
            "machine": self.machine,
            "sections": [asdict(s) for s in self.sections],
        }

    def to_markdown(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_at))
        m = self.machine
        mode = "quick (smoke run, not for conclusions)" if self.quick else "full"
        out = [
            "# Benchmark report",
            "",
            f"- started: {started}; mode: {mode}",
            f"- command: `{self.command}`",
            f"- machine: {m['cpus']} CPUs ({m['cpuModel']}), kernel {m['kernel']}, "
            f"Python {m['python']}, load average at start "
            + "/".join(f"{x:.2f}" for x in m["loadAverageAtStart"]),
            "",
        ]
        targets = [(s, t) for s in self.sections for t in s.targets]
        if targets:
            out += ["## Targets", "", "| benchmark | target | result | measured | required |"]
            out.append("|---|---|---|---|---|")
            for sec, tgt in targets:
                verdict = "PASS" if tgt.passed else "FAIL"
                out.append(
                    f"| {sec.name} | {tgt.name} | **{verdict}** | {tgt.measured} | {tgt.required} |"
                )
            out.append("")
        for s in self.sections:
            out += [f"## {s.title}", "", f"_{s.seconds:.0f} s_", ""]
            if s.error:
                out += ["**Error:**", "", "```", s.error.rstrip(), "```", ""]
            for t in s.tables:
                out += [f"### {t.title}", "", "| " + " | ".join(t.columns) + " |"]
                out.append("|" + "---|" * len(t.columns))
                for row in t.rows:
                    out.append("| " + " | ".join(_cell(c) for c in row) + " |")
                out.append("")
            if s.notes:
                out += ["### Notes", ""]
                out += [f"- {n}" for n in s.notes]
                out.append("")
        return "\n".join(out)

    def write(self, directory: Path) -> tuple[Path, Path]:
        self.finished_at = self.finished_at or time.time()
        directory.mkdir(parents=True, exist_ok=True)
        md = directory / "latest.md"
        js = directory / "latest.json"
        md.write_text(self.to_markdown(), encoding="utf-8")
        js.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        return md, js


def _cell(c: Cell) -> str:
    if c is None:
        return "-"
    if isinstance(c, float):
        if c == 0:
            return "0"
        if abs(c) >= 100:
            return f"{c:,.0f}"
        if abs(c) >= 10:
            return f"{c:.1f}"
        return f"{c:.2f}"
    if isinstance(c, int):
        return f"{c:,}"
    return c
