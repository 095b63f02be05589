"""The large cases of `run.py` (issue 12): M = 10⁶ memories, d = 784, float32 and bfloat16, Q = 1,
1024 and 16384, each model against plain-torch baselines on the same inputs in the same run.

Baselines, with memories in blocks of 65,536 rows as a careful user would write them:
- `gemm2`: X·K_bᵀ then S_b·K_b per block (the two matrix products dense cannot avoid);
- `mm_topk10`: X·K_bᵀ and torch.topk(10) per block, merged, then softmax of the 10 and their sum;
- `xkt`: X·Kᵀ in one product (the GEMV floor of a single query), where Q·M ≤ 2³¹.
Ratios reported: dense / gemm2, topk / mm_topk10, sparse and entmax / dense, multihead / dense,
random / topk, and for Q = 1 dense, topk, sparse / xkt. On CUDA each model's peak allocation
beyond its inputs is recorded (torch.cuda.max_memory_allocated). `dry_run` shrinks every size so
the code path can be checked on a CPU; its numbers mean nothing.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch
from _common import sync

from nphcli.engine import summary_cache
from nphcli.models import create_model

DIM, BETA, BLOCK = 784, 10.0, 65_536
MODELS = {
    "dense": {},
    "topk": {"k": 10},
    "sparse": {},
    "entmax": {},
    "multihead": {"heads": 4},
    "random": {"k": 10},
    "linear": {},
    "random-feature": {},
}


def _time(fn, device: torch.device, budget_s: float, repeats: int = 5) -> float:
    """Median seconds of fn() after one warm-up, synchronising the device around each call."""
    sync(device)
    fn()
    sync(device)
    times: list[float] = []
    while len(times) < repeats and (len(times) < 2 or sum(times) < budget_s):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm2(x: torch.Tensor, keys: torch.Tensor, block: int) -> torch.Tensor:
    """X·K_bᵀ then S_b·K_b per block, summed: the two GEMMs alone, no softmax."""
    out = x.new_zeros(x.shape[0], keys.shape[1])  # (Q, d)
    for start in range(0, keys.shape[0], block):
        kb = keys[start : start + block]  # (B, d)
        out += (x @ kb.T) @ kb
    return out


def mm_topk(x: torch.Tensor, keys: torch.Tensor, block: int, k: int = 10) -> torch.Tensor:
    """Per block X·K_bᵀ and torch.topk(k), merged; softmax of the k and their weighted sum."""
    best_v = best_i = None
    for start in range(0, keys.shape[0], block):
        v, i = torch.topk(x @ keys[start : start + block].T, k, dim=1)  # (Q, k)
        i = i + start
        if best_v is not None:
            v, j = torch.topk(torch.cat([best_v, v], dim=1), k, dim=1)
            i = torch.cat([best_i, i], dim=1).gather(1, j)
        best_v, best_i = v, i
    weights = torch.softmax(BETA * best_v.float(), dim=1).to(x.dtype)  # (Q, k)
    return torch.einsum("qk,qkd->qd", weights, keys[best_i])


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Device-to-device copy bandwidth in bytes per second (read + write counted)."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = _time(lambda: target.copy_(source), device, budget_s=1.0)
    return 2 * nbytes / seconds


def large_cases(device: torch.device, *, dry_run: bool = False, budget_s: float = 3.0) -> dict:
    """Timings (seconds) and ratios of the large cases; see the module docstring."""
    memories = 20_000 if dry_run else 1_000_000
    queries_list = [1, 64] if dry_run else [1, 1024, 16384]
    block = 4096 if dry_run else BLOCK
    generator = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(memories, DIM, generator=generator), dim=1)
    keys = keys.to(device)
    out: dict = {
        "memories": memories,
        "dim": DIM,
        "beta": BETA,
        "block": block,
        "dry_run": dry_run,
        "copy_bandwidth_gbps": copy_bandwidth(device, 2**24 if dry_run else 2**30) / 1e9,
        "cases": [],
    }
    for num_queries in queries_list:
        rows = torch.randint(0, memories, (num_queries,), generator=generator).to(device)
        noise = 0.05 * torch.randn(num_queries, DIM, generator=generator).to(device)
        queries = keys[rows] + noise
        for dtype in (torch.float32, torch.bfloat16):
            x, k = queries.to(dtype), keys.to(dtype)
            case: dict = {"Q": num_queries, "dtype": str(dtype).removeprefix("torch."), "s": {}}
            times = case["s"]
            times["gemm2"] = _time(partial(gemm2, x, k, block), device, budget_s)
            times["mm_topk10"] = _time(partial(mm_topk, x, k, block), device, budget_s)
            if num_queries * memories <= 2**31:
                times["xkt"] = _time(partial(torch.matmul, x, k.T), device, budget_s)
            for name, params in MODELS.items():
                model = create_model(name, beta=BETA, **params)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                    before = torch.cuda.memory_allocated(device)
                try:
                    times[name] = _time(partial(_cold, model, x, k), device, budget_s)
                except (RuntimeError, MemoryError) as error:  # out of memory: report, go on
                    case.setdefault("errors", {})[name] = f"{type(error).__name__}: {error}"[:200]
                    continue
                if device.type == "cuda":
                    peak = torch.cuda.max_memory_allocated(device) - before
                    case.setdefault("peak_gib_beyond_inputs", {})[name] = peak / 2**30
            case["ratios"] = _ratios(times)
            out["cases"].append(case)
    return out


def _cold(model, x: torch.Tensor, k: torch.Tensor):
    """One retrieve with nothing kept from earlier calls (the kernel models' summaries)."""
    summary_cache.clear()
    return model.retrieve(x, k)


def _ratios(times: dict) -> dict:
    pairs = {
        "dense/gemm2": ("dense", "gemm2"),
        "topk/mm_topk10": ("topk", "mm_topk10"),
        "sparse/dense": ("sparse", "dense"),
        "entmax/dense": ("entmax", "dense"),
        "multihead/dense": ("multihead", "dense"),
        "random/topk": ("random", "topk"),
        "dense/xkt": ("dense", "xkt"),
        "topk/xkt": ("topk", "xkt"),
        "sparse/xkt": ("sparse", "xkt"),
    }
    return {
        label: times[a] / times[b] for label, (a, b) in pairs.items() if a in times and b in times
    }
