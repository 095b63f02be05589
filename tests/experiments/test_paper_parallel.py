"""`nph paper ... --jobs N` and `--ray ADDRESS` (nphcli.experiments.parallel): the trainings of
the paper's tables in local processes or on a Ray cluster write the same results files as one
process, and a run killed mid-way resumes without redoing finished trainings."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_mil_paper import TINY as MIL_TINY
from test_mil_paper import _bags, _csv
from test_timeseries import TINY, sine, write_csv

from nphcli.core.errors import NphError
from nphcli.experiments import mil_paper, parallel, timeseries_run

TIMINGS = ("seconds", "seconds_per_epoch")  # wall time: the only part that may differ


def _lines(path) -> list[dict]:
    """The records of a results file without their wall times."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        for key in TIMINGS:
            record.pop(key, None)
        for epoch in record.get("epochs", []) if isinstance(record.get("epochs"), list) else []:
            epoch.pop("seconds")
    return records


def _square(x: int) -> int:
    return x * x


def test_tasks_run_in_order_in_one_process_and_jobs_must_be_positive():
    tasks = [(_square, (i,)) for i in range(4)]
    assert list(parallel.run_tasks(tasks)) == [(0, 0), (1, 1), (2, 4), (3, 9)]
    with pytest.raises(NphError, match="--jobs must be ≥ 1"):
        list(parallel.run_tasks(tasks, jobs=0))


def test_jobs_start_from_a_fork_server_or_spawn_where_there_is_none(monkeypatch):
    """A fork server (the real pools of the tests below use it); Windows has none: spawn."""
    import multiprocessing

    tasks = [(_square, (1,))]
    assert parallel._context(tasks).get_start_method() == "forkserver"
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert parallel._context(tasks).get_start_method() == "spawn"


CONFIG = replace(TINY, runs=2, variants=("dense", "linear"))
MODELS = ["dense", "linear"]  # of the MIL runs
# 200 rows: 8 batches an epoch, distinct records for each variant and run. Where a training runs
# cannot change them however many batches it has (each seeds all it draws from its arguments).
ROWS = 200


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """A folder with the time series (s.csv) and MIL bags, their records in one process
    (one.jsonl, mil/runs.jsonl), and the MIL run's per-seed results: what every way of running
    them in parallel must write and return."""
    folder = tmp_path_factory.mktemp("one")
    data = write_csv(folder / "s.csv", sine(ROWS, period=100))
    timeseries_run.run_experiment(CONFIG, data, folder / "one.jsonl")
    _csv(folder, _bags(16))
    return folder, mil_paper.run(MIL_TINY, folder, folder / "mil", models=MODELS)[0]


@pytest.mark.slow  # trains 5 tiny networks: seconds on a busy machine
def test_a_killed_time_series_run_resumes_without_redoing_finished_trainings(tmp_path, monkeypatch):
    data = write_csv(tmp_path / "s.csv", sine(ROWS, period=100))
    out = tmp_path / "runs.jsonl"
    trained = []
    real = timeseries_run.train_one

    def counted(config, variant, horizon, run, *rest):
        trained.append((variant.label, run))
        return real(config, variant, horizon, run, *rest)

    monkeypatch.setattr(timeseries_run, "train_one", counted)
    whole = timeseries_run.run_experiment(CONFIG, data, out)
    assert len(trained) == 4
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:3]) + "\n")  # killed after three trainings
    trained.clear()
    again = timeseries_run.run_experiment(CONFIG, data, out, resume=True)
    assert trained == [("linear", 1)]  # only the missing one
    assert [r["test_mse"] for r in again] == [r["test_mse"] for r in whole]


@pytest.mark.slow
def test_jobs_write_the_same_time_series_records_as_one_process(one_process, tmp_path):
    folder, _ = one_process
    timeseries_run.run_experiment(CONFIG, folder / "s.csv", tmp_path / "two.jsonl", jobs=2)
    assert _lines(tmp_path / "two.jsonl") == _lines(folder / "one.jsonl")


@pytest.mark.slow
def test_jobs_write_the_same_mil_trainings_as_one_process(one_process, tmp_path):
    folder, one = one_process
    two = mil_paper.run(MIL_TINY, folder, tmp_path / "two", models=MODELS, jobs=2)
    assert one == two[0]
    key = lambda r: (r["seed"], r["model"], r["fold"])  # noqa: E731
    assert sorted(_lines(tmp_path / "two" / "runs.jsonl"), key=key) == sorted(
        _lines(folder / "mil" / "runs.jsonl"), key=key
    )


@pytest.mark.slow
def test_a_local_ray_instance_writes_the_same_records_as_one_process(one_process, tmp_path):
    ray = pytest.importorskip("ray")
    folder, one = one_process
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        timeseries_run.run_experiment(CONFIG, folder / "s.csv", tmp_path / "ray.jsonl", ray="auto")
        on_ray = mil_paper.run(MIL_TINY, folder, tmp_path / "mil", models=MODELS, ray="auto")
    finally:
        ray.shutdown()
    assert _lines(tmp_path / "ray.jsonl") == _lines(folder / "one.jsonl")
    assert on_ray[0] == one
