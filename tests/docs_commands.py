"""The shell commands a reader can paste from ``README.md``, ``docs/**/*.md`` and the other
``README.md`` files of the checkout (``manifests/examples/README.md``, ...), for
``tests/integration/test_docs_commands.py``. Pure apart from reading the files.

What counts as a command, in fenced code blocks only:

- a block tagged ``sh``, ``bash``, ``shell`` or ``zsh``: every line that is not blank and not a
  comment, a backslash continuation joined to its next line, a trailing ``# comment`` removed
  (a ``#`` that starts a word outside quotes, as the shell reads it);
- a block tagged ``console`` or not tagged: the lines that start with ``$ `` (the prompt is
  removed, the same joining and comment rule); the lines up to the next prompt are the output
  the docs show for that command. Other untagged blocks (diagrams, synopses, file layouts) hold
  no command.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SHELL_TAGS = frozenset({"sh", "bash", "shell", "zsh"})
PROMPT_TAGS = frozenset({"console", ""})
PROMPT = "$ "
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")


@dataclass(frozen=True)
class DocCommand:
    file: str
    """The Markdown file, relative to the repository root (``docs/client.md``)."""
    line: int
    """1-based line of the command's first physical line."""
    command: str
    occurrence: int = 1
    """1 for the first time this exact command appears in ``file``, 2 for the second, ..."""
    output: tuple[str, ...] = ()
    """The lines a console block shows after the command (its output, as the docs show it)."""

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment, right-stripped.

    A ``#`` starts a comment at the start of a word (after blank or at the line's start) outside
    single and double quotes and not escaped, as bash reads it: ``#0`` in ``a#0`` or a ``#``
    inside ``'...'`` stays.
    """
    quote = ""
    escaped = False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
            continue
        if quote == "'":
            if ch == "'":
                quote = ""
            continue
        if ch == "\\":
            escaped = True
            continue
        if quote == '"':
            if ch == '"':
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _join_continuations(lines: Sequence[str], start: int) -> tuple[str, int]:
    """The logical line starting at ``lines[start]`` (backslash-newline continuations joined
    with one blank) and the index of the line after it."""
    text = lines[start].rstrip()
    i = start + 1
    while text.endswith("\\") and not text.endswith("\\\\") and i < len(lines):
        following = lines[i].strip()
        if following.startswith("> "):
            following = following[2:].lstrip()
        text = text[:-1].rstrip() + " " + following
        i += 1
    return text, i


def _blocks(text: str) -> Iterable[tuple[str, int, list[str]]]:
    """Each fenced block: its tag (first word of the info string, lower case), the 1-based line
    of its first content line, and its content lines without the fence's indentation."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        tag = (opening["info"].split() or [""])[0].lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        yield tag, i + 2, body
        i = j + 1


def _shell_block(body: list[str], first: int) -> Iterable[tuple[int, str, tuple[str, ...]]]:
    i = 0
    while i < len(body):
        stripped = body[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        logical, after = _join_continuations(body, i)
        command = strip_comment(logical.strip())
        if command:
            yield first + i, command, ()
        i = after


def _prompt_block(body: list[str], first: int) -> Iterable[tuple[int, str, tuple[str, ...]]]:
    i = 0
    while i < len(body):
        if not body[i].startswith(PROMPT):
            i += 1
            continue
        logical, after = _join_continuations(body, i)
        output: list[str] = []
        while after < len(body) and not body[after].startswith(PROMPT):
            output.append(body[after])
            after += 1
        while output and not output[-1].strip():
            output.pop()
        command = strip_comment(logical[len(PROMPT) :].strip())
        if command:
            yield first + i, command, tuple(output)
        i = after


def extract(text: str, file: str) -> list[DocCommand]:
    """Every command of the Markdown ``text`` (of ``file``), in the order of the file."""
    found: list[DocCommand] = []
    seen: Counter[str] = Counter()
    for tag, first, body in _blocks(text):
        if tag in SHELL_TAGS:
            commands = _shell_block(body, first)
        elif tag in PROMPT_TAGS:
            commands = _prompt_block(body, first)
        else:
            continue
        for line, command, output in commands:
            seen[command] += 1
            found.append(DocCommand(file, line, command, seen[command], output))
    return found


def doc_files(root: Path) -> list[Path]:
    """``README.md``, every ``docs/**/*.md``, then every other ``README.md`` below ``root``
    outside hidden directories (``.venv``, ``.git``, ...), each group by path."""
    readme = root / "README.md"
    others: list[Path] = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        here = Path(directory)
        if "README.md" in files and here != root and not here.is_relative_to(root / "docs"):
            others.append(here / "README.md")
    return [
        *([readme] if readme.exists() else []),
        *sorted((root / "docs").rglob("*.md")),
        *sorted(others),
    ]


def extract_all(root: Path) -> list[DocCommand]:
    """Every documented command of the checkout at ``root``."""
    return [
        command
        for path in doc_files(root)
        for command in extract(path.read_text(encoding="utf-8"), path.relative_to(root).as_posix())
    ]


def _stable(token: str) -> bool:
    return not any(ch.isdigit() or ch == "/" for ch in token)


def expected_lead(output: Sequence[str]) -> str:
    """What the command's output must mention, from the output the docs show: the words its
    first line leads with up to the first that varies from run to run (one with a digit or a
    ``/``: counts, times, ids, paths), or that first word itself when the line starts with one;
    ``""`` when the docs show no output. Compared with whitespace collapsed, so a table header
    is matched whatever its column widths."""
    first = next((line for line in output if line.strip()), "")
    words = first.split()
    lead: list[str] = []
    for word in words:
        if not _stable(word):
            break
        lead.append(word)
    return " ".join(lead or words[:1])


def mentions(text: str, lead: str) -> bool:
    """Whether ``text`` contains ``lead`` with any run of whitespace as one blank."""
    return " ".join(lead.split()) in " ".join(text.split())
