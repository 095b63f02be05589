"""Every example in README.md and docs/ runs, and shows the output it prints.

The convention (docs/development.md, "Documentation"): a ```sh block is run line by line; a
```python block is executed; a ```console block holds `$ command` lines, each followed by its
output; a ```pycon block is a doctest. A block preceded by `<!-- no-run: reason -->` is not run,
and ```text is not a command. Each page runs in its own temporary folder, its blocks in page
order, on a small memory made once per session. `nph` runs in-process through the CLI runner;
a line that needs a real shell (a pipe) runs in bash, which makes the page `slow`, as does a line
that draws figures (`nph plot`, `nph report`).
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = ("sh", "python", "console", "pycon")
LANGUAGES = (*RUN, "text")
NO_RUN = re.compile(r"<!-- no-run: (\S.*?) -->")
FENCE = re.compile(r"^```(\S*)\s*$")
# Commands that draw figures (seconds each): a page running one is `slow`; tests/output has the
# fast tests of both commands.
DRAWS = re.compile(r"nph (plot|report)\b")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    lang: str
    code: str
    no_run: str | None  # the reason, when marked

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.lang})"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            i += 1
        before = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marked = NO_RUN.search(before)
        code = "\n".join(lines[start + 1 : i]) + "\n"
        found.append(Block(page, start + 1, match.group(1), code, marked and marked.group(1)))
        i += 1
    return found


def _indented_code(page: Path) -> list[int]:
    """Lines that open an indented code block (4 spaces after a blank line, outside a list or a
    fence): examples this test would not see."""
    lines, fenced, found = page.read_text(encoding="utf-8").split("\n"), False, []
    for n, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("    ") or n < 2 or lines[n - 1].strip():
            continue
        paragraph = next((p for p in reversed(lines[: n - 1]) if p.strip()), "")
        if not re.match(r"\s*([-*+]|\d+\.)\s|\s{2,}", paragraph):
            found.append(n + 1)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_example_is_fenced_and_labelled(page):
    assert not _indented_code(page), f"{page.name}: indented code at lines {_indented_code(page)}"
    for block in blocks(page):
        assert block.lang in LANGUAGES, f"{block}: fence it as one of {LANGUAGES}"


def test_no_run_marks_give_a_reason_and_mark_runnable_blocks():
    for page in PAGES:
        for match in re.finditer(r"<!-- no-run(.*?)-->", page.read_text(encoding="utf-8")):
            assert NO_RUN.fullmatch(match.group(0)), f"{page.name}: {match.group(0)} has no reason"
    marked = [b for page in PAGES for b in blocks(page) if b.no_run]
    assert marked and all(b.lang in RUN for b in marked)


# --- running ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def template(tmp_path_factory) -> Path:
    """What a reader has after the quick start: a memory of 100 bundled digits, and the tour's
    own vectors."""
    import numpy as np

    from nphcli.cli import app

    folder = tmp_path_factory.mktemp("doc-template")
    with _chdir(folder), pytest.MonkeyPatch.context() as patch:
        patch.setenv("NPH_DATA", str(folder / "no-datasets"))  # the bundled sample, always
        patch.setenv("XDG_CACHE_HOME", str(folder / "no-datasets"))
        result = CliRunner().invoke(app, ["store", "mnist", "--n", "100"])
        assert result.exit_code == 0, result.stderr
        np.save("my_vectors.npy", np.random.default_rng(0).normal(size=(200, 32)))
    return folder


@contextlib.contextmanager
def _chdir(folder: Path):
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _shell_env(folder: Path) -> dict[str, str]:
    """PATH with `nph` and `python` from this checkout first, no dataset folders, one thread."""
    bin_dir = folder / ".bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nph").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m nphcli "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        NO_COLOR="1",
    )


def _commands(code: str) -> list[str]:
    """Lines of a shell block, continuation lines joined."""
    return [c for c in code.replace("\\\n", " ").split("\n") if c.strip()]


def _needs_bash(command: str) -> bool:
    return any(t in ("|", "<") for t in shlex.split(command, comments=True))


def _run_simple(words: list[str], where: str) -> str:
    """One command without shell syntax (but `> FILE` / `>> FILE`), in-process; its stdout."""
    from nphcli.cli import app

    target, mode = None, "w"
    for op, m in ((">", "w"), (">>", "a")):
        if op in words:
            i = words.index(op)
            target, mode, words = words[i + 1], m, words[:i]
    if words[0] == "nph":
        result = CliRunner().invoke(app, words[1:])
        assert result.exit_code == 0, f"{where}: {' '.join(words)}\n{result.stderr[-2000:]}"
        assert "Traceback" not in result.stderr, f"{where}: {result.stderr[-2000:]}"
        out = result.stdout
    elif words[:2] == ["python", "-c"]:
        out = _exec(words[2], where)
    elif words[:2] == ["mkdir", "-p"]:
        out = "".join(Path(name).mkdir(parents=True, exist_ok=True) or "" for name in words[2:])
    elif words[0] == "printf":
        fmt = words[1].encode().decode("unicode_escape")
        out = "".join(fmt.replace("%s", arg) for arg in words[2:])
    else:
        raise AssertionError(f"{where}: cannot run {words[0]!r} in-process; mark the block")
    if target:
        with open(target, mode, encoding="utf-8") as file:
            file.write(out)
    return out


def _exec(code: str, where: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, where, "exec"), {"__name__": "__doc_example__"})
    return printed.getvalue()


def run_line(command: str, where: str, folder: Path) -> str:
    """One line of a shell block: `a && b`, `for X in ...; do ...; done >> FILE`, or a command."""
    loop = re.fullmatch(r"for (\w+) in ([^;]+); do (.+); done(.*)", command.strip())
    if loop:
        name, values, body, tail = loop.groups()
        out = "".join(
            run_line(body.replace(f"${name}", value) + tail, where, folder)
            for value in values.split()
        )
        return out
    if _needs_bash(command):
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", command],
            cwd=folder,
            env=_shell_env(folder),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{where}: {command}\n{done.stderr[-2000:]}"
        return done.stdout
    out = ""
    for part in command.split(" && "):
        out += _run_simple(shlex.split(part, comments=True), where)
    return out


def _matches(expected: str, got: str) -> bool:
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    return checker.check_output(expected, got, flags)


def run_block(block: Block, folder: Path) -> None:
    where = str(block)
    if block.lang == "python":
        _exec(block.code, where)
    elif block.lang == "sh":
        for command in _commands(block.code):
            run_line(command, where, folder)
    elif block.lang == "console":
        for chunk in re.split(r"^\$ ", block.code, flags=re.M)[1:]:
            command, _, expected = chunk.partition("\n")
            got = run_line(command, where, folder)
            shown = f"{where}: {command}\n--- shown\n{expected}--- got\n{got}"
            assert _matches(expected, got), shown
    elif block.lang == "pycon":
        test = doctest.DocTestParser().get_doctest(block.code, {}, where, str(block.page), 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        report = io.StringIO()
        runner.run(test, out=report.write)
        assert not runner.failures, report.getvalue()


def _runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang in RUN and not b.no_run]


def _pages_to_run():
    for page in PAGES:
        runnable = _runnable(page)
        if not runnable:
            continue
        sh = [c for b in runnable if b.lang == "sh" for c in _commands(b.code)]
        shown = [
            re.findall(r"^\$ (.*)", b.code, flags=re.M) for b in runnable if b.lang == "console"
        ]
        draws = any(DRAWS.match(c) for c in [*sh, *(c for cs in shown for c in cs)])
        marks = [pytest.mark.slow] if draws or any(map(_needs_bash, sh)) else []
        yield pytest.param(page, id=page.name, marks=marks)


@pytest.mark.parametrize("page", list(_pages_to_run()))
def test_page_examples_run_as_written(page, template, tmp_path, monkeypatch):
    folder = tmp_path / "work"
    shutil.copytree(template, folder)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("NPH_DATA", str(tmp_path / "no-datasets"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-datasets"))
    for block in _runnable(page):
        run_block(block, folder)
