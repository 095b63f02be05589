"""A memory file larger than the address space a process may use still opens: `--stream`,
`nph info`, `nph shard` and `nph index` read it in blocks.

Each command runs in a child process whose address space (RLIMIT_AS) is capped at what it uses
once torch, FAISS and the CLI are imported plus HEADROOM, less than the file's size: mapping the
whole file (what the safetensors package does) fails there with "Cannot allocate memory". The
file is sparse (a header, a few nonzero rows, then a hole), so it costs no disk and little time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DIM = 64
ROWS = 2_000_000  # 2e6 × 64 float32: 512 MB
HEADROOM = 200 << 20  # address space the command may use beyond its imports: 40% of the file

# Imports everything the commands import, caps the address space, then runs the CLI.
WRAPPER = """
import resource, runpy, sys
import importlib.util
import torch, safetensors.torch, nphcli.cli.app, nphcli.memory.open
if importlib.util.find_spec("faiss"):  # the ann extra: imported before the cap when present
    import faiss
pages = int(open("/proc/self/statm").read().split()[0])
limit = pages * resource.getpagesize() + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
if sys.argv[2] == "-c":
    exec(sys.argv[3])
else:
    sys.argv = ["nph", *sys.argv[2:]]
    runpy.run_module("nphcli", run_name="__main__")
"""


def _sparse_memory(path: Path) -> torch.Tensor:
    """An nph memory file of ROWS × DIM float32 whose first 512 rows are seeded random and the
    rest zeros (a hole); returns the nonzero rows."""
    head = torch.randn(512, DIM, generator=torch.Generator().manual_seed(0))
    meta = {"format": "nph-memory", "format_version": 1, "M": ROWS, "d": DIM, "dtype": "float32"}
    size = ROWS * DIM * 4
    header = {
        "__metadata__": {k: json.dumps(v) for k, v in meta.items()},
        "patterns": {"dtype": "F32", "shape": [ROWS, DIM], "data_offsets": [0, size]},
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as handle:
        handle.write(len(text).to_bytes(8, "little") + text + head.numpy().tobytes())
        handle.truncate(8 + len(text) + size)
    return head


def _run(*args: object, headroom: int = HEADROOM) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",  # each thread's malloc arena reserves 64 MiB of address space
    }
    command = [sys.executable, "-c", WRAPPER, str(headroom), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    _sparse_memory(path)
    assert path.stat().st_size > 2 * HEADROOM
    return path


def test_the_limit_is_real(big):
    # Mapping the file whole, as the safetensors package does, fails under the same cap.
    code = "from safetensors import safe_open; safe_open(sys.argv[-1], framework='pt')"
    result = _run("-c", code, big)
    assert result.returncode != 0


def test_stream_retrieve(big, tmp_path):
    queries = tmp_path / "q.npy"
    import numpy as np

    head = torch.randn(512, DIM, generator=torch.Generator().manual_seed(0))
    np.save(queries, head[[3, 200]].numpy())
    result = _run(
        "retrieve", "--memory", big, "--stream", "--queries-file", queries, "--model", "topk",
        "--k", "4", "--beta", "4", "--memory-budget", "16MiB", "--target-indices", "3,200",
        "--per-query", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["per_query"]["nearest"] == [3, 200]


def test_info(big):
    result = _run("info", big, "--sample", "8", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert (report["M"], report["d"]) == (ROWS, DIM)
    head = torch.randn(512, DIM, generator=torch.Generator().manual_seed(0))
    norms = head.double().norm(dim=1)
    assert report["separation"]["m"] == pytest.approx(float(norms.max()), rel=1e-6)
    assert report["norms"]["min"] == 0.0


def test_shard(big, tmp_path):
    result = _run("shard", big, "--parts", "32", "--out-dir", tmp_path / "shards", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((tmp_path / "shards" / "big.shards.json").read_text())
    assert sum(part["rows"] for part in manifest["parts"]) == ROWS
    info = _run("info", tmp_path / "shards" / "big.shards.json", "--sample", "4", "--json")
    assert info.returncode == 0, info.stderr[-2000:]
    assert json.loads(info.stdout)["M"] == ROWS


def test_index(big, tmp_path):
    pytest.importorskip("faiss")
    out = tmp_path / "big.index"
    # FAISS's growing inverted lists fragment the heap: more room, still less than the file
    # (340 MiB failed one run in two on this 488 MiB file).
    args = ["index", big, "--kind", "ivfpq", "--lists", "4", "--out", out, "--json"]
    result = _run(*args, headroom=440 << 20)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["M"] == ROWS
