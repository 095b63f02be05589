"""benchmarks/results/ holds what the docs cite: its INDEX.md lists every file once, with the
machine and commit it came from, and the page that cites it, which does cite it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _rows() -> list[list[str]]:
    text = (RESULTS / "INDEX.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_every_result_file_is_listed_once():
    listed = [row[0].strip("`") for row in _rows()]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    present = sorted(
        p.relative_to(RESULTS).as_posix()
        for p in RESULTS.rglob("*")
        if p.is_file() and p.name != "INDEX.md"
    )
    assert sorted(listed) == present


def test_every_row_names_its_machine_commit_and_a_citing_page():
    for file, what, machine, commit, page, cited_as in _rows():
        assert what and machine, file
        assert re.fullmatch(r"(added )?[0-9a-f]{7}", commit), (file, commit)
        text = (ROOT / page).read_text(encoding="utf-8")
        assert cited_as.strip("`").split("` / `")[0] in text, (file, page, cited_as)
