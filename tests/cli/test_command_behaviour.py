"""Small behaviours of commands: `nph shard` makes its --out-dir, a working-memory budget below one
query × one memory says what it uses, retrieve's image-size hint names no option retrieve lacks,
the sweep table shows k=10 (its key keeps k=10.0), and the docs' sweeps do not share a file."""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_memory
from PIL import Image

from nphcli.engine import planning
from nphcli.memory.bank import TensorBank
from nphcli.models import create_model
from nphcli.sweeps.results import read_results

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def memory(tmp_path):
    generator = torch.Generator().manual_seed(0)
    path = tmp_path / "memory.safetensors"
    write_memory(path, torch.rand(20, 12, generator=generator))
    return path


def test_shard_creates_a_missing_out_dir(invoke, memory, tmp_path):
    folder = tmp_path / "shards" / "set"
    result = invoke("shard", memory, "--parts", "2", "--out-dir", folder, "--json")
    assert result.exit_code == 0, result.output
    assert (folder / "memory.shards.json").is_file()
    assert len(list(folder.glob("memory.part-*-of-2.*.safetensors"))) == 2


def test_shard_out_dir_that_is_a_file_is_refused(invoke, memory, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = invoke("shard", memory, "--out-dir", blocker)
    assert result.exit_code == 2
    assert "is a file, not a folder" in result.stderr


@pytest.mark.parametrize("budget", [1, 100])
def test_budget_below_one_query_and_one_memory_gives_a_notice(caplog, budget):
    planning._notice_once.cache_clear()
    bank = TensorBank(torch.zeros(50, 12))
    row_bytes, cell_bytes = create_model("dense").working_set(bank)
    with caplog.at_level(logging.WARNING, logger="nph"):
        plan = planning.plan_blocks(10, bank, budget, row_bytes=row_bytes, cell_bytes=cell_bytes)
    assert plan == planning.Plan(query_rows=1, memory_rows=1)
    assert "too small for one query against one memory; using about" in caplog.text


def test_a_budget_that_fits_gives_no_notice(caplog):
    planning._notice_once.cache_clear()
    bank = TensorBank(torch.zeros(50, 12))
    row_bytes, cell_bytes = create_model("dense").working_set(bank)
    with caplog.at_level(logging.WARNING, logger="nph"):
        planning.plan_blocks(10, bank, 2**20, row_bytes=row_bytes, cell_bytes=cell_bytes)
    assert "too small" not in caplog.text


def test_retrieve_with_budget_one_says_so_on_stderr(invoke, memory):
    planning._notice_once.cache_clear()
    plain = invoke("retrieve", "--memory", memory, "--json", "--beta", "1")
    tiny = invoke("retrieve", "--memory", memory, "--json", "--beta", "1", "--memory-budget", "1")
    assert tiny.exit_code == 0, tiny.output
    assert "a working-memory budget of 1 B is too small for one" in " ".join(tiny.stderr.split())
    assert "too small" not in plain.stderr


def test_queries_folder_of_mixed_sizes_suggests_no_retrieve_option(invoke, memory, tmp_path):
    folder = tmp_path / "pics"
    folder.mkdir()
    Image.new("L", (4, 3), 10).save(folder / "a.png")
    Image.new("L", (3, 4), 10).save(folder / "b.png")
    result = invoke("retrieve", "--memory", memory, "--queries-file", folder)
    assert result.exit_code == 2
    line = " ".join(result.stderr.split())
    assert "differ in size" in line
    assert "pass --size" not in line and "nph store --size WxH" in line


def test_sweep_table_shows_whole_k_and_keeps_the_key(invoke, tmp_path):
    pool = tmp_path / "pool.npy"
    np.save(pool, np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32))
    out = tmp_path / "r.jsonl"
    args = ("--dataset", pool, "--model", "topk", "--k", "10", "--sizes", "20", "--out", out)
    result = invoke("sweep", *args, "--beta", "0.5", terminal_width=200)
    assert result.exit_code == 0, result.output
    assert re.search(r"topk k=10\b(?!\.)", result.stdout)
    assert "k=10.0" not in result.stdout
    (row,) = read_results(out).rows
    assert row["label"] == "topk k=10.0" and row["setting"].startswith("topk k=10.0 |")


@pytest.mark.parametrize("page", ["README.md", "docs/sweeps.md", "docs/plots.md"])
def test_docs_sweeps_write_distinct_results_files(page):
    """A page's sweeps that neither resume nor replace write different --out files, so the second
    does not stop on the first's results."""
    text = (ROOT / page).read_text(encoding="utf-8").replace("\\\n", " ")
    outs = []
    for line in text.splitlines():
        if not line.lstrip().startswith("nph sweep"):
            continue
        words = shlex.split(line.split("#")[0])
        if {"--resume", "--force", "--print-config"} & set(words):
            continue
        outs.append(words[words.index("--out") + 1] if "--out" in words else "sweep.jsonl")
    assert len(outs) == len(set(outs)), outs


def test_every_help_fits_80_columns(invoke):
    """`nph store --help` had lines of 97-145 characters (its list of sources is
    written as is, so it is wrapped beforehand)."""
    import typer

    from nphcli.cli import app

    commands = list(typer.main.get_command(app).commands)
    for name in ["", *commands]:
        result = invoke(*([name] if name else []), "--help", terminal_width=80)
        assert result.exit_code == 0, (name, result.stderr)
        longest = max(result.stdout.splitlines(), key=len)
        assert len(longest) <= 80, (name, longest)
