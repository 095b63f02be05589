"""Exact retrieval over 2 and 3 local gloo processes: every model, several shard splittings
(a shard of one row, uneven shards), loaded and streamed, float32 and float64, equals the
single-process result; ties go to the lowest global index; a rank that dies or hangs stops every
rank with one error naming it, and nothing is written."""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_one_error_line, family_params, real_valued_models, write_memory
from safetensors import safe_open
from safetensors.torch import save_file

from nphcli.core.errors import NphError, NphRuntimeError
from nphcli.distributed.launch import run_workers
from nphcli.distributed.retrieve import evaluate_on_rank
from nphcli.evaluation.corruption import Corruption
from nphcli.evaluation.evaluate import evaluate
from nphcli.memory.file import load_memory
from nphcli.memory.format import tensors_sha256
from nphcli.memory.shards import read_manifest, write_shards
from nphcli.schema.settings import InputSpec, RetrieveSettings

pytestmark = pytest.mark.slow  # several processes per test

# No test here races the clock. A collective wait that should not time out gets WAIT_S, far
# beyond any wait of a busy machine; a rank that should be seen hung blocks for HUNG_S, far
# beyond the test's own wait, so a result before then can only come from the timeout firing.
WAIT_S = 600.0
HUNG_S = 3600.0

PARAMS = {
    "multihead": {"heads": 2},
    "random-feature": {"features": 24},
    "topk": {"k": 3},
    "random": {"k": 2, "seed": 1},
    "window": {"window": 1},
    "entmax": {"alpha": 1.5},
}
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def _settings(name: str, dtype: str, *, noise: float = 0.3, **extra) -> RetrieveSettings:
    params = {**family_params(name, beta=1.0), **PARAMS.get(name, {}), **extra}
    return RetrieveSettings(
        model=name, params=params, dtype=dtype, corruption=Corruption(noise=noise), queries=9
    )


def _cases() -> list[tuple[str, RetrieveSettings]]:
    cases = [(name, _settings(name, "float64")) for name in real_valued_models()]
    cases += [(name, _settings(name, "float32")) for name in ("dense", "topk", "sparse")]
    cases.append(("dense", _settings("dense", "float64", steps=3)))  # iteration across ranks
    cases.append(("sparse", _settings("sparse", "float64", steps=2)))
    cases.append(("topk", _settings("topk", "float64", noise=0.0, k=2)))  # exact ties
    return cases


def _every_case(collective, runs):
    """On each rank: every (memory, stream, settings) run; rank 0's reports come back."""
    return [
        evaluate_on_rank(collective, InputSpec(memory=str(manifest), stream=stream), settings)
        for manifest, stream, settings in runs
    ]


def _memories(folder):
    """A random memory and one whose rows repeat (each pattern on several shards: ties)."""
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(40, 6, generator=generator, dtype=torch.float64)
    random_path = folder / "random.safetensors"
    write_memory(random_path, keys, dtype=torch.float64)
    # Tied keys with distinct values, so which copy wins shows in the result. Small integers
    # make every score exact, so copies tie bitwise whatever the matrix-product blocking.
    tied_keys = torch.randint(-3, 4, (12, 6), generator=generator).to(torch.float64)
    values = torch.randn(40, 6, generator=generator, dtype=torch.float64)
    tied_path = folder / "tied.safetensors"
    write_memory(tied_path, tied_keys[torch.arange(40) % 12], values=values, dtype=torch.float64)
    return random_path, tied_path


def _shard(path, folder, sizes):
    folder.mkdir()
    return write_shards(path, folder, sizes=sizes)


ATTRACTOR_KEYS = {"attractor", "attractor_size", "at_pattern", "at_metastable", "at_global"}
ATTRACTOR_KEYS |= {"energy"}


def _check(reports, runs, memories):
    for report, (manifest, _, settings) in zip(reports, runs, strict=True):
        expected = evaluate(memories[manifest], settings)
        tolerance = TOLERANCE[settings.dtype]
        torch.testing.assert_close(report.retrieved, expected.retrieved, rtol=0, atol=tolerance)
        # Attractor diagnostics are not computed over ranks (docs/distributed.md): exactly
        # those keys are missing, and every other per-query value must equal one process's.
        missing = set(expected.per_query) - set(report.per_query)
        assert missing <= ATTRACTOR_KEYS, (settings.model, missing)
        for key, values in expected.per_query.items():
            if key in missing:
                continue
            if values.dtype == torch.int64:
                assert torch.equal(report.per_query[key], values), (settings.model, key)
            else:
                torch.testing.assert_close(
                    report.per_query[key], values, rtol=0, atol=100 * tolerance
                )


@pytest.mark.slow
def test_three_ranks_equal_one_process(tmp_path):
    random_path, tied_path = _memories(tmp_path)
    one_row = _shard(random_path, tmp_path / "one-row", [1, 25, 14])
    uneven = _shard(random_path, tmp_path / "uneven", [7, 3, 19, 1, 10])
    tied = _shard(tied_path, tmp_path / "tied", [13, 13, 14])
    memories = {one_row: load_memory(random_path), uneven: load_memory(random_path)}
    memories[tied] = load_memory(tied_path)
    runs = [(one_row, False, settings) for _, settings in _cases()]
    runs += [(uneven, True, settings) for _, settings in _cases()[:9]]
    runs += [(tied, False, settings) for name, settings in _cases() if name == "topk"]
    reports = run_workers(3, functools.partial(_every_case, runs=runs), timeout=WAIT_S)
    _check(reports, runs, memories)
    assert reports[0].config["distributed"]["ranks"] == 3


def test_two_ranks_equal_one_process(tmp_path):
    random_path, tied_path = _memories(tmp_path)
    one_row = _shard(random_path, tmp_path / "one-row", [1, 25, 14])
    tied = _shard(tied_path, tmp_path / "tied", [5, 35])
    memories = {one_row: load_memory(random_path), tied: load_memory(tied_path)}
    runs = [(one_row, True, settings) for _, settings in _cases()]
    runs += [(tied, False, _settings("topk", "float64", noise=0.0, k=2))]
    reports = run_workers(2, functools.partial(_every_case, runs=runs), timeout=WAIT_S)
    _check(reports, runs, memories)


def _die_or_hang(collective, how):
    collective.all_sum(torch.ones(3))  # every rank is up: what follows is the fault alone
    if collective.rank == 1:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(HUNG_S)  # certainly hung: ended by the parent, never by waking up
    collective.all_sum(torch.ones(3))
    return "finished"


def test_a_killed_rank_stops_every_rank():
    """The death is seen by its exit code, not by the others' collective timing out: with a
    timeout of WAIT_S, the error comes long before it."""
    start = time.monotonic()
    with pytest.raises(NphRuntimeError, match="worker rank 1 died \\(signal SIGKILL\\)"):
        run_workers(2, functools.partial(_die_or_hang, how="kill"), timeout=WAIT_S)
    assert time.monotonic() - start < WAIT_S / 2


@pytest.mark.slow
def test_a_hung_rank_is_named_after_the_timeout():
    """Rank 1 blocks for HUNG_S after the first collective, so only the others' timeout can end
    the call before then; how long the machine takes to get there does not matter. The timeout
    also bounds the ranks' meeting, but they are forked from one server that imported everything
    (milliseconds apart), so 3 s is ample; each rank's first collective has passed before."""
    start = time.monotonic()
    with pytest.raises(NphRuntimeError, match="worker rank 1 stopped answering"):
        run_workers(3, functools.partial(_die_or_hang, how="hang"), timeout=3)
    assert time.monotonic() - start < HUNG_S / 2


def test_cli_workers_equal_one_process_and_a_failing_rank_writes_nothing(tmp_path, invoke):
    random_path, _ = _memories(tmp_path)
    manifest = _shard(random_path, tmp_path / "set", [20, 20])
    args = ["--model", "sparse", "--beta", "1", "--noise", "0.3", "--queries", "7", "--json"]
    args += ["--dtype", "float64", "--per-query"]
    single = invoke("retrieve", "--memory", random_path, *args)
    out = tmp_path / "out.safetensors"
    spread = invoke("retrieve", "--memory", manifest, "--workers", "2", "--out", out, *args)
    assert single.exit_code == 0 and spread.exit_code == 0, spread.output
    got, want = json.loads(spread.stdout)["per_query"], json.loads(single.stdout)["per_query"]
    assert got["nearest"] == want["nearest"] and got["support"] == want["support"]
    with safe_open(str(out), framework="pt") as handle:
        assert torch.equal(handle.get_tensor("nearest"), torch.tensor(want["nearest"]))

    # Shard 1 gets a NaN row, found only by rank 1 while streaming: every rank stops.
    part = read_manifest(manifest).parts[1].path
    with safe_open(str(part), framework="pt") as handle:
        meta, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}
    tensors["patterns"][3, 0] = torch.nan
    save_file(tensors, str(part), metadata=meta)
    listing = json.loads(manifest.read_text())  # record the NaN's checksum: it passes the open
    listing["parts"][1]["sha256"] = tensors_sha256(part)
    manifest.write_text(json.dumps(listing))
    broken_out = tmp_path / "broken.safetensors"
    failed = invoke(
        "retrieve", "--memory", manifest, "--workers", "2", "--stream", "--out", broken_out, *args
    )
    assert failed.exit_code != 0
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1  # under --json, the one error line is a JSON object
    error = json.loads(lines[0])["error"] if "--json" in args else lines[0]
    assert error.startswith(("Error: rank 1:", "rank 1:")) and "NaN" in error
    assert not broken_out.exists()


WORKER_MODELS = [["dense"], ["topk", "--k", "3"], ["sparse"]]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("device", "model"),
    [("cpu", WORKER_MODELS[0])] + [("cuda", model) for model in WORKER_MODELS],
    ids=["cpu-dense", "cuda-dense", "cuda-topk", "cuda-sparse"],
)
def test_cuda_workers_equal_one_process(tmp_path, invoke, model, device):
    """`--workers 2 --device cuda`: NCCL with a GPU per rank, or with one GPU both ranks on
    cuda:0 over gloo (exchanges staged through host memory); either way one process's result.
    The same on the CPU (gloo) checks the test itself where no GPU is: one model is enough
    there, as CPU workers are compared with one process for every model above."""
    from nphcli.distributed.group import choose_backend

    if device == "cuda" and not os.environ.get("NPH_TEST_DEVICE", "").startswith("cuda"):
        # (as the GPU tests: elsewhere conftest runs Triton in its interpreter, which the
        # workers would inherit)
        pytest.skip("runs under NPH_TEST_DEVICE=cuda")
    random_path, _ = _memories(tmp_path)
    manifest = _shard(random_path, tmp_path / "set", [17, 23])
    args = ["--model", *model, "--beta", "1", "--noise", "0.3", "--queries", "7"]
    args += ["--json", "--per-query", "--dtype", "float64", "--device", device]
    single = invoke("retrieve", "--memory", random_path, *args)
    spread = invoke("retrieve", "--memory", manifest, "--workers", "2", *args)
    assert single.exit_code == 0 and spread.exit_code == 0, spread.output
    got, want = json.loads(spread.stdout), json.loads(single.stdout)
    backend = "nccl" if device == "cuda" and torch.cuda.device_count() > 1 else "gloo"
    assert got["config"]["distributed"]["backend"] == choose_backend(device, 2) == backend
    assert got["per_query"]["nearest"] == want["per_query"]["nearest"]
    torch.testing.assert_close(
        torch.tensor(got["per_query"]["sse"]),
        torch.tensor(want["per_query"]["sse"]),
        atol=1e-9,
        rtol=0,
    )


def test_workers_refuse_a_plain_file_and_too_few_shards(tmp_path, invoke):
    random_path, _ = _memories(tmp_path)
    manifest = _shard(random_path, tmp_path / "set", [20, 20])
    plain = invoke("retrieve", "--memory", random_path, "--workers", "2")
    assert_one_error_line(plain, "nph shard")
    few = invoke("retrieve", "--memory", manifest, "--workers", "3")
    assert_one_error_line(few, "2 shards but 3 ranks")
    with pytest.raises(NphError, match="--workers"):
        run_workers(0, print)


@pytest.mark.slow
def test_torchrun_standalone_equals_one_process(tmp_path, invoke):
    """Two ranks under torchrun (a real launch, which must exit 0) print one process's answer,
    here the same command run in-process."""
    import shutil
    import subprocess
    import sys

    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if not Path(torchrun).exists():
        pytest.skip("torchrun is not installed")
    random_path, _ = _memories(tmp_path)
    manifest = _shard(random_path, tmp_path / "set", [13, 27])
    args = ["--model", "topk", "--k", "3", "--beta", "1", "--noise", "0.3", "--queries", "7"]
    args += ["--dtype", "float64", "--per-query", "--json"]
    command = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "nphcli", "retrieve"]
    spread = subprocess.run(
        [*command, "--memory", str(manifest), *args], capture_output=True, text=True, check=True
    )
    single = invoke("retrieve", "--memory", random_path, *args)
    assert single.exit_code == 0, single.stderr
    got, want = json.loads(spread.stdout), json.loads(single.stdout)  # rank 0 alone printed
    assert got["per_query"]["nearest"] == want["per_query"]["nearest"]
    assert got["config"]["distributed"]["ranks"] == 2
    torch.testing.assert_close(
        torch.tensor(got["per_query"]["sse"]),
        torch.tensor(want["per_query"]["sse"]),
        atol=1e-12,
        rtol=0,
    )


def test_a_torchrun_rank_leaves_the_group_in_order_before_it_exits(tmp_path, invoke, monkeypatch):
    """Ranks leave the process group in order before exiting: a barrier, then
    `destroy_process_group`, which stops the group's threads. Without that a rank sometimes
    aborted at exit ("terminate called without an active exception") after the output was
    written, in about one run in three. Checked on torchrun's own path (`nph retrieve` sees
    torchrun's environment and joins the group already set up, here of one rank in this process)
    every time, rather than by chance over many launches; a real torchrun run must exit 0 in
    test_torchrun_standalone_equals_one_process."""
    import torch.distributed as dist

    random_path, _ = _memories(tmp_path)
    manifest = _shard(random_path, tmp_path / "set", [13, 27])
    calls = []
    for name in ("barrier", "destroy_process_group"):
        real = getattr(dist, name)
        monkeypatch.setattr(
            dist, name, lambda *a, _f=real, _n=name, **k: calls.append(_n) or _f(*a, **k)
        )
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun's mark; the group itself has one rank
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1
    )
    try:
        result = invoke("retrieve", "--memory", manifest, "--model", "topk", "--k", "3", "--json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["config"]["distributed"]["ranks"] == 1
        assert calls == ["barrier", "destroy_process_group"]
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
