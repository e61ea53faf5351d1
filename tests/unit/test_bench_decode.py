"""``bench/decode.py``: both decoders read every message of the entry, and the section holds one
figure per decoder and payload (the figures themselves are the benchmark's, not asserted)."""

from __future__ import annotations

from bench import decode
from bench.report import Report


def test_each_decoder_reads_the_whole_entry() -> None:
    for size, count in decode.CASES:
        item = decode._entry(size, count)
        for name, fn in decode.DECODERS.items():
            messages = fn(item)
            assert len(messages) == count, name
            assert [len(m.value) for m in messages] == [size] * count  # type: ignore[attr-defined]


def test_the_report_has_a_rate_per_decoder_and_payload() -> None:
    report = Report(quick=True, command="test")
    decode.run(report, quick=True)
    (section,) = report.sections
    figures = {(f.labels["decoder"], f.labels["payload"]): f.value for f in section.figures}
    assert set(figures) == {(n, str(s)) for s, _ in decode.CASES for n in decode.DECODERS}
    assert all(v > 0 for v in figures.values())
