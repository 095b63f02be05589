"""Results files under real use: one writer at a time, and files merged by `cat`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import assert_one_error_line

from nphcli.core.errors import NphError
from nphcli.core.lock import WriterLock, lock_path
from nphcli.sweeps.results import Results, read_results

TINY = ("--model", "dense,topk", "--k", "0.5", "--trials", "2", "--beta", "0.5", "--noise", "0.3")


def sweep(invoke, pool, out, sizes, *extra):
    return invoke("sweep", "--dataset", pool, *TINY, "--sizes", sizes, "--out", out, *extra)


@pytest.mark.slow
def test_a_second_writer_is_refused_while_another_process_holds_the_file(tmp_path, pool, invoke):
    """Two real processes: one holds the results file's lock, the sweep started second (in this
    test's process) fails in one line naming the holder, and runs once the holder is gone."""
    out = tmp_path / "s.csv"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from nphcli.core.lock import WriterLock; "
            f"lock = WriterLock({str(out)!r}); print('locked', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert_one_error_line(sweep(invoke, pool, out, "5"), f"pid {holder.pid}", "being written")
        assert not out.exists()  # the refused sweep wrote nothing
    finally:
        holder.communicate("", timeout=60)  # stdin closed: the holder exits
    again = sweep(invoke, pool, out, "5")
    assert again.exit_code == 0, again.stderr
    assert len(read_results(out).rows) == 2 * 2
    assert not lock_path(out).exists()  # released and removed


def test_the_lock_is_held_for_the_whole_run_and_released_after(tmp_path, pool, invoke):
    out = tmp_path / "s.jsonl"
    with WriterLock(out):
        line = assert_one_error_line(sweep(invoke, pool, out, "5"))
        assert f"pid {os.getpid()}" in line
        with pytest.raises(NphError, match="being written"):
            Results(out)
    assert sweep(invoke, pool, out, "5").exit_code == 0
    results = Results(out, resume=True)  # a library writer holds it until finish()
    with pytest.raises(NphError, match="being written"):
        WriterLock(out)
    results.finish()
    WriterLock(out).release()


def test_cat_merged_csv_resumes_and_plots(tmp_path, pool, invoke):
    """`cat a.csv b.csv` of two grids with the same columns reads as one file: the second
    header is skipped, a run present twice counts once, --resume skips them all."""
    a, b, merged = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "ab.csv"
    assert sweep(invoke, pool, a, "5").exit_code == 0
    assert sweep(invoke, pool, b, "8").exit_code == 0
    merged.write_bytes(a.read_bytes() + b.read_bytes() + a.read_bytes())
    loaded = read_results(merged)
    assert len(loaded.rows) == 8 and loaded.duplicates == 4
    result = sweep(invoke, pool, merged, "5,8", "--resume", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["runs"] == {"total": 8, "ran": 0, "skipped": 8}
    assert all(row["trials"] == 2 for row in report["summary"])  # duplicates not counted
    pytest.importorskip("matplotlib")
    png = tmp_path / "ab.png"
    assert invoke("plot", merged, "--out", png).exit_code == 0
    assert png.stat().st_size > 1000


def test_a_foreign_header_is_assert_one_error_line(tmp_path, pool, invoke):
    """Rows of another program (here `nph retrieve --csv`'s columns) appended to a sweep's CSV:
    --resume and plot each say so in one line, naming the line."""
    a = tmp_path / "a.csv"
    assert sweep(invoke, pool, a, "5").exit_code == 0
    rows = read_results(a).rows
    foreign = ",".join(k for k in rows[0] if k not in ("setting", "label", "trial")) + "\n"
    foreign += ",".join(
        "" if v is None else str(v)
        for k, v in rows[0].items()
        if k not in ("setting", "label", "trial")
    )
    mixed = tmp_path / "mixed.csv"
    mixed.write_text(a.read_text() + foreign + "\n")
    line = assert_one_error_line(sweep(invoke, pool, mixed, "5", "--resume"))
    assert "line 6" in line and "second header" in line
    pytest.importorskip("matplotlib")
    line = assert_one_error_line(invoke("plot", mixed, "--out", tmp_path / "p.png"))
    assert "line 6" in line and "second header" in line


def test_a_retrieve_csv_is_not_resumed_as_a_sweep(tmp_path, pool, invoke):
    memory = tmp_path / "m.safetensors"
    assert invoke("store", pool, "--out", memory).exit_code == 0
    runs = tmp_path / "runs.csv"
    result = invoke("retrieve", "--memory", memory, "--model", "topk", "--k", "1,5", "--csv")
    runs.write_text(result.stdout)
    line = assert_one_error_line(sweep(invoke, pool, runs, "5", "--resume"))
    assert "not runs of nph sweep" in line


def test_jsonl_rows_of_another_sweep_further_down_are_refused(tmp_path, pool, invoke):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert sweep(invoke, pool, a, "5").exit_code == 0
    assert sweep(invoke, pool, b, "8", "--seed", "4").exit_code == 0
    with open(a, "ab") as handle:
        handle.write(b.read_bytes())
    line = assert_one_error_line(sweep(invoke, pool, a, "5,8", "--resume"))
    assert "another sweep" in line and "sweep_seed" in line
