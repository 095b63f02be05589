"""Many settings per process: `nph retrieve` comma lists (their product, on a memory read once),
`nph batch` (JSON Lines jobs), and static commands that never import torch.

The reference for every multi-setting result is the same setting run on its own: apart from
timings, a setting's object, CSV row or metrics must be identical to a single-setting call's.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_one_error_line, write_memory

from nphcli.app.batch import MemoryCache, run_jobs
from nphcli.app.request import evaluate_settings
from nphcli.core.errors import NphError
from nphcli.evaluation.inputs import read_inputs
from nphcli.evaluation.report import TIMINGS
from nphcli.evaluation.settings import expand_settings
from nphcli.schema.fields import get_field
from nphcli.schema.settings import InputSpec, RetrieveSettings

TIMING_COLUMNS = set(TIMINGS)  # differ between runs; everything else must not


def _untimed(obj: dict) -> dict:
    return {key: value for key, value in obj.items() if key != "timing"}


def _json_lines(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


# -- the product, in the library ------------------------------------------------------------


def test_product_order_and_each_model_gets_only_its_parameters():
    base = RetrieveSettings(seed=4, queries=5)
    grid = expand_settings(
        {
            "model": ["dense", "topk"],
            "k": [1.0, 5.0],
            "beta": [0.1],
            "mask": [0.0, 0.5],
            "seed": [4],
            "queries": [5],
        }
    )
    got = [(s.model, s.params, s.corruption.mask, s.corruption.noise) for s in grid]
    assert got == [
        ("dense", {"beta": 0.1}, 0.0, 0.0),
        ("dense", {"beta": 0.1}, 0.5, 0.0),
        ("topk", {"k": 1.0, "beta": 0.1}, 0.0, 0.0),
        ("topk", {"k": 1.0, "beta": 0.1}, 0.5, 0.0),
        ("topk", {"k": 5.0, "beta": 0.1}, 0.0, 0.0),
        ("topk", {"k": 5.0, "beta": 0.1}, 0.5, 0.0),
    ]
    assert all(s.seed == 4 and s.queries == 5 for s in grid)
    single = expand_settings({"model": ["dense"], "seed": [4], "queries": [5]})
    assert single == [base]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"model": ["dense", "sparse"], "k": [3.0]}, ["--k", "topk"]),
        ({"model": ["hopscotch"]}, ["hopscotch"]),
        ({"model": []}, ["--model"]),
        ({"model": ["topk"], "k": "x"}, ["--k"]),
        ({"model": ["window"], "window": 2.5}, ["--window", "whole"]),
        ({"model": ["dense"], "mask": [1.5]}, ["--mask"]),
        ({"model": ["dense"], "noise": []}, ["--noise"]),
        ({"model": ["dense"], "seed": -1}, ["--seed"]),
        ({"model": ["dense"], "memory_budget": "64Q"}, ["--memory-budget"]),
    ],
)
def test_product_refuses_bad_settings(kwargs, words):
    """Values as a JSON job or a sweep file gives them, checked by their field."""
    with pytest.raises(NphError) as error:
        values = {
            key: get_field(key).from_json(v, get_field(key).flag) for key, v in kwargs.items()
        }
        expand_settings(values)
    for word in words:
        assert word in str(error.value)


def test_every_setting_sees_the_same_queries_and_matches_its_own_run(memory_file):
    grid = expand_settings(
        {"model": ["dense", "sparse"], "noise": [0.3, 0.3, 0.6], "queries": [12], "seed": [7]}
    )
    inputs = read_inputs(InputSpec(memory=str(memory_file)))
    reports = evaluate_settings(inputs, grid)
    assert len(reports) == 6
    rows = [r.per_query["query_row"] for r in reports]
    assert all(torch.equal(rows[0], row) for row in rows)
    # same seed and corruption → the same corrupted queries, whichever model
    assert torch.equal(reports[0].queries, reports[1].queries)
    assert torch.equal(reports[0].queries, reports[3].queries)
    assert not torch.equal(reports[0].queries, reports[2].queries)  # σ differs
    for settings, report in zip(grid, reports, strict=True):
        alone = evaluate_settings(read_inputs(InputSpec(memory=str(memory_file))), [settings])[0]
        assert torch.equal(alone.retrieved, report.retrieved)
        assert alone.metrics == report.metrics
        assert alone.config == report.config
    # the memory was read once: its time is the first report's
    assert reports[0].timing["load_s"] > 0
    assert all(r.timing["load_s"] == 0 for r in reports[1:])


# -- the command line -----------------------------------------------------------------------


def test_json_lines_and_csv_rows_equal_single_calls(invoke, memory_file):
    common = ["retrieve", "--memory", memory_file, "--queries", "8"]
    many = _json_lines(
        invoke(*common, "--model", "dense,topk", "--k", "3", "--noise", "0,0.4", "--json")
    )
    singles = [
        ["--model", "dense", "--noise", "0"],
        ["--model", "dense", "--noise", "0.4"],
        ["--model", "topk", "--k", "3", "--noise", "0"],
        ["--model", "topk", "--k", "3", "--noise", "0.4"],
    ]
    assert len(many) == len(singles)
    for obj, args in zip(many, singles, strict=True):
        (alone,) = _json_lines(invoke(*common, *args, "--json"))
        assert _untimed(obj) == _untimed(alone)
        assert set(obj["timing"]) == set(alone["timing"])

    result = invoke(*common, "--model", "topk", "--k", "1,2,5", "--csv")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("model,") == 1  # one header
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [row["k"] for row in rows] == ["1", "2", "5"]  # counts as ints
    alone = invoke(*common, "--model", "topk", "--k", "2", "--csv").stdout
    (reference,) = csv.DictReader(io.StringIO(alone))
    assert {k: v for k, v in rows[1].items() if k not in TIMING_COLUMNS} == {
        k: v for k, v in reference.items() if k not in TIMING_COLUMNS
    }
    no_header = invoke(*common, "--model", "topk", "--k", "1,2,5", "--csv", "--no-header")
    lines = no_header.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("topk,") for line in lines)


def test_per_query_csv_rows_say_their_setting(invoke, memory_file):
    args = ["--memory", memory_file, "--model", "dense,topk", "--k", "2", "--queries", "3"]
    result = invoke("retrieve", *args, "--per-query", "--csv")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["setting"], r["model"], r["query"]) for r in rows] == [
        ("0", "dense", "0"),
        ("0", "dense", "1"),
        ("0", "dense", "2"),
        ("1", "topk", "0"),
        ("1", "topk", "1"),
        ("1", "topk", "2"),
    ]
    alone = invoke(
        "retrieve",
        *args[:2],
        "--model",
        "topk",
        "--k",
        "2",
        "--queries",
        "3",
        "--per-query",
        "--csv",
    )
    reference = list(csv.DictReader(io.StringIO(alone.stdout)))
    assert [{k: v for k, v in r.items() if k not in ("setting", "model")} for r in rows[3:]] == (
        reference
    )


def test_table_has_one_row_per_setting(invoke, memory_file):
    result = invoke(
        "retrieve", "--memory", memory_file, "--model", "dense,sparse", "--beta", "0.1,0.5"
    )
    assert result.exit_code == 0, result.stderr
    assert "4 settings" in result.stdout
    lines = [line for line in result.stdout.splitlines() if "dense" in line or "sparse" in line]
    assert len(lines) == 4
    assert sum("beta=0.1" in line for line in lines) == 2


def test_one_setting_prints_todays_output(invoke, memory_file):
    result = invoke("retrieve", "--memory", memory_file, "--model", "topk", "--k", "3")
    assert result.exit_code == 0, result.stderr
    for title in ("Run", "Metrics (per query)", "Timing (seconds)"):
        assert title in result.stdout
    assert len(_json_lines(invoke("retrieve", "--memory", memory_file, "--json"))) == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--model", "dense,sparse", "--k", "2"], ["--k"]),
        (["--k", "2,3", "--model", "topk", "--out", "r.safetensors"], ["--out", "give 2"]),
        (["--model", "dense,topk", "--per-query"], ["--per-query", "--json"]),
        (["--noise", "0.1,x"], ["--noise"]),
        (["--mask", "0.1,2"], ["--mask"]),
        (["--model", "dense,,topk"], ["model"]),
    ],
)
def test_bad_lists_are_one_error_line_and_write_nothing(
    invoke, memory_file, tmp_path, monkeypatch, args, words
):
    monkeypatch.chdir(tmp_path)
    assert_one_error_line(invoke("retrieve", "--memory", memory_file, *args), *words)
    assert list(tmp_path.iterdir()) == []


# -- nph batch ------------------------------------------------------------------------------


def test_batch_results_errors_and_exit_status(invoke, memory_file, tmp_path):
    jobs = [
        {"memory": str(memory_file), "model": "topk", "k": 3, "noise": 0.4, "queries": 8},
        "not json",
        {"memory": str(memory_file), "model": "dense", "k": 3},
        {"memory": str(memory_file), "beta": "high"},
        {"memory": str(tmp_path / "absent.safetensors")},
        {"memory": str(memory_file), "colour": "red"},
        {"memory": str(memory_file), "model": "sparse", "seed": 2, "per_query": True},
    ]
    text = "\n".join(job if isinstance(job, str) else json.dumps(job) for job in jobs) + "\n\n"
    path = tmp_path / "jobs.jsonl"
    path.write_text(text)
    result = invoke("batch", path)
    assert result.exit_code == 1
    assert "Traceback" not in result.stderr
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(out) == len(jobs)
    errors = {obj["job"]: obj["error"] for obj in out if "error" in obj}
    assert sorted(errors) == [2, 3, 4, 5, 6]
    assert "--k" in errors[3] and "beta" in errors[4] and "absent" in errors[5]
    assert "colour" in errors[6]
    common = ["retrieve", "--memory", memory_file]
    (reference,) = _json_lines(
        invoke(*common, "--model", "topk", "--k", "3", "--noise", "0.4", "--queries", "8", "--json")
    )
    assert _untimed(out[0]) == _untimed(reference)
    (reference,) = _json_lines(
        invoke(*common, "--model", "sparse", "--seed", "2", "--per-query", "--json")
    )
    assert _untimed(out[6]) == _untimed(reference)

    good = json.dumps({"memory": str(memory_file), "model": "dense"})
    result = invoke("batch", "-", input=good + "\n" + good + "\n")
    assert result.exit_code == 0, result.stderr
    first, second = _json_lines(result)
    assert _untimed(first) == _untimed(second)
    assert first["timing"]["load_s"] > 0 and second["timing"]["load_s"] == 0  # cached


def test_memory_cache_reads_a_replaced_file_again(tmp_path):
    path = tmp_path / "m.safetensors"
    write_memory(path, torch.ones(3, 4))
    cache = MemoryCache()
    first, load_s = cache.get(str(path), stream=False)
    again, cached_s = cache.get(str(path), stream=False)
    assert again is first and load_s > 0 and cached_s == 0
    write_memory(path, torch.zeros(5, 4), force=True)
    replaced, _ = cache.get(str(path), stream=False)
    assert replaced.num_memories == 5
    results = list(run_jobs([json.dumps({"memory": str(path), "queries": 2})], cache))
    assert results[0]["config"]["memory"]["M"] == 5


def test_static_commands_do_not_import_torch():
    code = (
        "import sys\n"
        "from nphcli.cli import app\n"
        "for args in (['models'], ['models', '--json'], ['--help'], ['--version'],"
        " ['retrieve', '--help'], ['batch', '--help']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code in (0, None), (args, exit.code)\n"
        "    assert 'torch' not in sys.modules, args\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_batch_takes_every_retrieve_option_or_says_why_not(invoke, memory_file):
    """A past bug: `nph batch` refused noise_clip, tf32 and every --index option as unknown
    keys. Now each is a key (checked as retrieve checks it) or refused with its reason."""
    memory = str(memory_file)
    jobs = [
        {"memory": memory, "noise": 0.0, "noise_clip": True, "tf32": True, "queries": 4},
        {"memory": memory, "model": "topk", "k": 3, "candidates": 8},  # an index option
        {"memory": memory, "out": "x.safetensors"},
        {"memory": memory, "noise": [0.0, 0.5], "queries": 4},  # a list: two settings
    ]
    text = "\n".join(json.dumps(job) for job in jobs) + "\n"
    result = invoke("batch", "-", input=text)
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(out) == 5 and result.exit_code == 1
    first = out[0]["config"]
    assert first["corruption"]["noise_clip"] is True and first["tf32"] is True
    assert "--index" in out[1]["error"]  # understood, and refused only for lack of an index
    assert "'out'" in out[2]["error"] and "JSON" in out[2]["error"]  # refused with the reason
    assert [o["config"]["corruption"]["noise"] for o in out[3:]] == [0.0, 0.5]
