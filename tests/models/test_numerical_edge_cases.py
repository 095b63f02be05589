"""Numerical edge cases an independent reference found: entmax near α = 1 at every
memory budget, NaN and infinity named as such, zero queries, batch per_query with lists."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_error_line, write_memory

import nphcli
from nphcli.core.errors import NphError
from nphcli.engine.functional import entmax_bisect


def _patterns(seed=0, m=60, d=400):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(m, d, generator=g, dtype=torch.float64) - 0.2  # scores up to ~200


@pytest.mark.parametrize("budget", [None, 256 * 1024, 4096])
def test_entmax_near_alpha_one_at_any_budget(mnist, budget):
    from nphcli.memory.file import load_memory

    x = load_memory(mnist).patterns.double()  # (100, 784) pixels in [0, 1]: scores up to ~300
    beta, alpha = 3.0, 1.0001
    scores = beta * x @ x.T  # (Q, M) float64
    assert float(scores.max()) > 100  # weights e^{s − t} past float32 unless shifted
    want = entmax_bisect(scores, alpha) @ x  # the sort-free bisection, float64
    got = nphcli.retrieve(
        x.float(), x.float(), model="entmax", alpha=alpha, beta=beta, memory_budget=budget
    )
    assert torch.isfinite(got.patterns).all()
    assert torch.allclose(got.patterns.double(), want, atol=1e-4, rtol=1e-4)


def test_entmax_near_alpha_one_streamed_and_in_the_cli(tmp_path, invoke):
    path = tmp_path / "m.safetensors"  # the reported case: 200 digits in [0, 1], β = 3
    assert (
        invoke("store", "mnist", "--n", "200", "--normalize", "minmax", "--out", path).exit_code
        == 0
    )
    sse = []
    for extra in ([], ["--stream"], ["--memory-budget", "256K"]):
        result = invoke(
            "retrieve", "--memory", path, "--model", "entmax", "--alpha", "1.0001",
            "--beta", "3", "--json", *extra,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        sse.append(json.loads(result.stdout)["metrics"]["sse"]["mean"])
    assert sse[1] == pytest.approx(sse[0], rel=1e-5) and sse[2] == pytest.approx(sse[0], rel=1e-5)


@pytest.mark.parametrize("bad, word", [(float("nan"), "NaN"), (float("inf"), "infinite")])
@pytest.mark.parametrize("where", ["queries", "memories"])
def test_nan_and_infinity_are_named(bad, word, where):
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    q = x.clone()
    target = q if where == "queries" else x
    target[2, 1] = bad
    with pytest.raises(NphError, match=f"{where} row 2 holds .*{word}") as error:
        nphcli.retrieve(q, x)
    assert "overflow" not in str(error.value)


@pytest.mark.parametrize("model", ["dense", "sparse", "topk", "entmax"])
def test_zero_queries_give_an_empty_answer(model):
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    params = {"k": 2} if model == "topk" else {}
    got = nphcli.retrieve(torch.empty(0, 3), x, model=model, **params)
    assert got.patterns.shape == (0, 3) and got.steps.shape == (0,)
    values = torch.randn(5, 7)
    assert nphcli.retrieve(torch.empty(0, 3), x, values, model=model, **params).patterns.shape == (
        0,
        7,
    )


def test_batch_per_query_with_a_list_of_values(tmp_path, invoke):
    path = tmp_path / "m.safetensors"
    write_memory(path, _patterns(m=8, d=4).float())
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"memory": str(path), "beta": [1, 2], "per_query": True}) + "\n")
    result = invoke("batch", jobs)
    assert result.exit_code == 0, result.output
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o["config"]["params"]["beta"] for o in objects] == [1.0, 2.0]
    assert all(len(o["per_query"]["success"]) == 8 for o in objects)
    assert "error" not in result.stdout


def test_bad_input_still_one_line(tmp_path, invoke):
    result = invoke("retrieve", "--memory", tmp_path / "missing.safetensors")
    assert_one_error_line(result, "missing.safetensors")


def test_huge_finite_results_are_not_an_overflow():
    """The result check sums each tensor first; finite values whose sum overflows float32 are
    then checked one by one and pass, and a NaN or infinity is still caught."""
    from nphcli.models.inputs import check_output

    huge = torch.full((4, 3), 3e38)  # every value finite, their sum is not
    check_output(huge, (("queries", huge.clone()),))
    x = torch.full((6, 3), 3e38)
    got = nphcli.retrieve(x[:2], x, model="dense", beta=1e-80)
    assert torch.isfinite(got.patterns).all()
    for bad in (float("nan"), float("inf"), -float("inf")):
        broken = huge.clone()
        broken[1, 2] = bad
        with pytest.raises(NphError):
            check_output(broken, (("queries", huge),))
