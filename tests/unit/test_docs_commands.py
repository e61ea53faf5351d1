"""What ``tests/docs_commands.py`` reads as a documented command (the commands
``tests/integration/test_docs_commands.py`` runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_commands import (
    DocCommand,
    doc_files,
    expected_lead,
    extract,
    mentions,
    strip_comment,
)

DOC = """# Title

```sh
make run    # the demo
# a comment line

export PATH="$PWD/.venv/bin:$PATH"
kubectl annotate stopic orders --overwrite \\
  x='{"id": "a#1"}'   # trailing
```

```yaml
kind: Ignored   # not a shell block
```

```
plain text, no prompt: not a command
```

```console
$ stopic produce orders --count 5     # comment
sent 5 message(s) in 0.07s
$ printf 'a\\tb # not a comment\\n' | stopic produce orders --stdin
$ make run
```

   ```bash
   indented --in a list
   ```
"""


def test_extract_reads_shell_blocks_and_prompt_lines_in_order() -> None:
    found = extract(DOC, "docs/x.md")
    assert [(c.line, c.command, c.occurrence) for c in found] == [
        (4, "make run", 1),
        (7, 'export PATH="$PWD/.venv/bin:$PATH"', 1),
        (8, 'kubectl annotate stopic orders --overwrite x=\'{"id": "a#1"}\'', 1),
        (21, "stopic produce orders --count 5", 1),
        (23, "printf 'a\\tb # not a comment\\n' | stopic produce orders --stdin", 1),
        (24, "make run", 2),
        (28, "indented --in a list", 1),
    ]
    assert {c.file for c in found} == {"docs/x.md"}
    assert found[3].output == ("sent 5 message(s) in 0.07s",)
    assert found[4].output == () and found[0].output == ()


def test_prompt_lines_continue_with_a_backslash() -> None:
    text = "```console\n$ kubectl get \\\n>   pods\nNAME\n```\n"
    assert extract(text, "f.md") == [DocCommand("f.md", 2, "kubectl get pods", 1, ("NAME",))]


def test_an_unclosed_block_still_yields_its_commands() -> None:
    assert [c.command for c in extract("```sh\nls -l\n", "f.md")] == ["ls -l"]


@pytest.mark.parametrize(
    ("line", "stripped"),
    [
        ("ls   # list", "ls"),
        ("echo a#b", "echo a#b"),
        ("echo '# kept' # gone", "echo '# kept'"),
        ('echo "# kept \\" # still kept" # gone', 'echo "# kept \\" # still kept"'),
        ("echo \\# kept", "echo \\# kept"),
        ("# all comment", ""),
    ],
)
def test_strip_comment_follows_the_shell(line: str, stripped: str) -> None:
    assert strip_comment(line) == stripped


@pytest.mark.parametrize(
    ("output", "lead"),
    [
        (("NAME     ACTIVE   EPOCH", "orders   3        1"), "NAME ACTIVE EPOCH"),
        (("sent 5 message(s) in 0.07s",), "sent"),
        (("key-0\tmessage-0",), "key-0"),
        (("default/orders: Ready=True (Reconciled)",), "default/orders:"),
        (('{"segment": 0, "position": 0}',), '{"segment":'),
        (("", "  Succeeded: split"), "Succeeded: split"),
        ((), ""),
    ],
)
def test_expected_lead_stops_at_the_first_word_that_varies(
    output: tuple[str, ...], lead: str
) -> None:
    assert expected_lead(output) == lead


def test_mentions_ignores_column_widths() -> None:
    assert mentions("NAME   ACTIVE\tEPOCH  READY\n", "NAME ACTIVE EPOCH")
    assert not mentions("NAME ACTIVE READY", "NAME ACTIVE EPOCH")


def test_doc_files_are_the_readme_the_docs_and_other_readmes(tmp_path: Path) -> None:
    for name in (
        "README.md",
        "docs/z.md",
        "docs/dev/a.md",
        "docs/README.md",
        "manifests/examples/README.md",
        "bench/README.md",
        "bench/notes.md",
        ".venv/lib/pkg/README.md",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    assert [p.relative_to(tmp_path).as_posix() for p in doc_files(tmp_path)] == [
        "README.md",
        "docs/README.md",
        "docs/dev/a.md",
        "docs/z.md",
        "bench/README.md",
        "manifests/examples/README.md",
    ]
