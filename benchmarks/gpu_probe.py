"""One GPU measurement of issue 22's fast paths, sized for a single call of about 3 minutes.

    python benchmarks/gpu_probe.py [--device cuda] [--small] [--out probe.json] [--time-s 200]
                                   [--issue 22|36]

For Q = 1, 1024 and 16384 queries, M = 10⁶ unit-norm memories, d = 784, β = 10, float32 and
bfloat16, it times nph's dense, topk (k = 10), sparse, entmax, random (k = 10) and multihead
(H = 4) against the plain-torch baselines of `large.py` on the same inputs in the same run (the
two GEMMs per block, X·Kᵀ in one product, X·K_bᵀ + torch.topk(10) + weighted sum). Every time
is the median of a few synchronised calls after a warm-up (`first_s`, the warm-up's own time;
`first_dense_call_s`, the process's first dense call per dtype, which compiles the Triton
softmax step). It also records each model's peak allocation beyond its inputs
(torch.cuda.max_memory_allocated) against `--memory-budget`, each model's relative error against
float64 on 64 queries, the plan (query batch, memory block) nph chose, whether cuBLAS float32
output was used, and any Triton kernel that fell back to eager torch. Cases projected past 10 s
from the previous Q are skipped, and everything stops at --time-s.

`--issue 36` adds entmax at α = 1.25 (the fused kernel's Newton route), random with k = 0.2·M (its
whole-batch mask), the device's copy bandwidth with the time to read the memories once at it
(`read_once`, the Q = 1 yardstick), the first product alone (`gemm1`) and the two products with
float32 scores (`gemm2_f32`), and issue 36's targets instead of issue 22's.

Prints one JSON object (also written to --out) and a Markdown table. `--small` (M = 20,000,
d = 64) runs the same code on a CPU in seconds; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import device_name, device_or_exit, emit, provenance, sync, unit_inputs  # noqa: E402  (the benchmarks' sibling modules)
from large import BETA, BLOCK, copy_bandwidth, gemm2, mm_topk  # noqa: E402
from large import MODELS as LARGE_MODELS  # noqa: E402

from nphcli.core.defaults import DEFAULT_MEMORY_BUDGET  # noqa: E402
from nphcli.engine import attention, blocks, precision  # noqa: E402
from nphcli.engine.precision import HALF_DTYPES  # noqa: E402
from nphcli.memory.bank import TensorBank  # noqa: E402
from nphcli.models import create_model  # noqa: E402

# The models issue 22 names: `large.py`'s, less the feature models.
MODELS = {
    name: params
    for name, params in LARGE_MODELS.items()
    if name not in ("linear", "random-feature")
}
# Issue 36 (`--issue 36`) adds the routes built since: the fused entmax kernel's other-α
# (Newton) route and random's whole-batch mask, beside the above.
MODELS_36 = {**MODELS, "entmax a=1.25": {"alpha": 1.25}, "random k=0.2": {"k": 0.2}}
ERROR_QUERIES = 64
SKIP_PROJECTED_S = 10.0
# Issue 22's targets: (label, numerator, denominator, bound, dtypes, queries it applies to).
TARGETS = [
    ("dense/gemm2", "dense", "gemm2", 1.1, ("float32",), (1024, 16384)),
    ("dense/gemm2", "dense", "gemm2", 2.0, ("bfloat16",), (1024, 16384)),
    ("topk/mm_topk10", "topk", "mm_topk10", 1.2, ("float32", "bfloat16"), (1024, 16384)),
    ("sparse/dense", "sparse", "dense", 1.5, ("float32", "bfloat16"), (1024, 16384)),
    ("entmax/dense", "entmax", "dense", 1.5, ("float32", "bfloat16"), (1024, 16384)),
    ("dense/xkt", "dense", "xkt", 2.0, ("float32", "bfloat16"), (1,)),
    ("topk/xkt", "topk", "xkt", 2.0, ("float32", "bfloat16"), (1,)),
    ("sparse/xkt", "sparse", "xkt", 2.0, ("float32", "bfloat16"), (1,)),
    ("multihead/dense", "multihead", "dense", 1.3, ("float32", "bfloat16"), (1024, 16384)),
    ("random/topk", "random", "topk", 2.0, ("float32", "bfloat16"), (1, 1024, 16384)),
]

# Issue 36's targets. `read_once` is the time to read the memories once at the device's copy
# bandwidth (measured in the same run); `gemm1` the first product alone, `gemm2_f32` the two
# products with float32 scores (what nph's half route keeps), both diagnostics of item 1.
TARGETS_36 = [
    ("dense/gemm2", "dense", "gemm2", 1.5, ("bfloat16",), (1024, 16384)),
    ("dense/gemm2", "dense", "gemm2", 1.1, ("float32",), (1024, 16384)),
    ("dense/read_once", "dense", "read_once", 1.5, ("float32", "bfloat16"), (1,)),
    ("topk/read_once", "topk", "read_once", 1.5, ("float32", "bfloat16"), (1,)),
    ("sparse/read_once", "sparse", "read_once", 1.5, ("float32", "bfloat16"), (1,)),
    ("entmax/dense", "entmax", "dense", 1.5, ("bfloat16",), (1024, 16384)),
    ("entmax a=1.25/dense", "entmax a=1.25", "dense", 1.5, ("bfloat16",), (1024, 16384)),
    ("random k=0.2/dense", "random k=0.2", "dense", 1.5, ("bfloat16",), (1024, 16384)),
    ("sparse/dense", "sparse", "dense", 1.5, ("bfloat16",), (16384,)),
    ("topk/mm_topk10", "topk", "mm_topk10", 1.2, ("bfloat16",), (16384,)),
]
RATIOS_36 = {"dense/gemm1": ("dense", "gemm1"), "gemm2_f32/gemm2": ("gemm2_f32", "gemm2")}


def timed(fn, device: torch.device, *, repeats: int = 3, budget_s: float = 3.0) -> dict:
    """{'s': median seconds, 'first_s': the warm-up call, 'reps'}; a warm-up over 2 s is
    followed by one timed call only."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - start
    times: list[float] = []
    wanted = 1 if first > 2.0 else repeats
    while len(times) < wanted and (len(times) < 1 or sum(times) < budget_s):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return {"s": statistics.median(times), "first_s": first, "reps": len(times)}


def timed_with_peak(fn, device: torch.device) -> dict:
    """`timed(fn)` plus, on CUDA, the bytes allocated at the peak of those calls beyond what was
    allocated before them (each call's result is dropped before the next)."""
    if device.type != "cuda":
        return {**timed(fn, device), "peak_bytes": None}
    sync(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    entry = timed(fn, device)
    entry["peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
    return entry


def float32_out_works(device: torch.device) -> bool | str:
    """Whether torch.mm(bf16, bf16, out_dtype=float32) runs here (nph's half scores use it)."""
    if device.type != "cuda":
        return "cuda only"
    a = torch.ones(8, 8, device=device, dtype=torch.bfloat16)
    try:
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError) as error:
        return f"{type(error).__name__}: {error}"[:160]


def probe(device: torch.device, *, small: bool, time_s: float, issue: int = 22) -> dict:
    began = time.perf_counter()
    models = MODELS_36 if issue == 36 else MODELS
    memories, dim = (20_000, 64) if small else (1_000_000, 784)
    queries_list = [1, 64, 256] if small else [1, 1024, 16384]
    block = 4096 if small else BLOCK
    keys, all_queries = unit_inputs(memories, dim, max(queries_list), device)  # (M, d), (Q_max, d)
    out: dict = {
        **provenance(),
        "device": device_name(device),
        "memories": memories,
        "dim": dim,
        "beta": BETA,
        "memory_budget": DEFAULT_MEMORY_BUDGET,
        "issue": issue,
        "float32_out": float32_out_works(device),
        "first_dense_call_s": _first_calls(all_queries[:1024], keys, device),
        "errors_vs_float64": _errors(all_queries[:ERROR_QUERIES], keys, models),
        "cases": [],
    }
    if issue == 36:
        out["copy_bandwidth_gbps"] = copy_bandwidth(device, 2**24 if small else 2**30) / 1e9
    last: dict[tuple[str, str], tuple[int, float]] = {}  # (model, dtype) -> (Q, seconds)
    for num_queries, dtype in _cases(queries_list, issue):
        name = str(dtype).removeprefix("torch.")
        x, k = all_queries[:num_queries].to(dtype), keys.to(dtype)
        case: dict = {"Q": num_queries, "dtype": name, "s": {}, "notes": {}}
        out["cases"].append(case)
        if time.perf_counter() - began > time_s:
            case["notes"]["all"] = f"skipped: past --time-s {time_s:.0f}"
            continue
        _baselines(case, x, k, block, device)
        if issue == 36:
            _baselines_36(case, x, k, block, device, out["copy_bandwidth_gbps"])
        for model_name, params in models.items():
            projected = _projected(last.get((model_name, name)), num_queries)
            if projected > SKIP_PROJECTED_S or time.perf_counter() - began > time_s:
                case["notes"][model_name] = f"skipped: projected {projected:.0f} s or time out"
                continue
            model = create_model(model_name.split()[0], beta=BETA, **params)
            plan = model.plan(num_queries, TensorBank(k), _planned_budget(dtype))
            case["notes"][model_name] = f"plan {plan.query_rows}x{plan.memory_rows}"
            try:
                entry = timed_with_peak(partial(model.retrieve, x, k), device)
            except (RuntimeError, MemoryError) as error:  # out of memory: report, go on
                case["notes"][model_name] += f"; {type(error).__name__}: {error}"[:200]
                continue
            case["s"][model_name] = entry
            last[(model_name, name)] = (num_queries, entry["s"])
        case["ratios"] = _ratios(case["s"], TARGETS_36 if issue == 36 else TARGETS)
    out["fused_step"] = {
        "failed": blocks._KERNEL["failed"],
        "decode_failed": attention._DECODE["triton_kernels"]["failed"],
        "selection_failed": blocks._SELECT["failed"],
    }
    out["float32_out_fell_back"] = precision._FLOAT32_OUT["failed"]
    out["total_s"] = time.perf_counter() - began
    out["targets"] = _targets(out["cases"], TARGETS_36 if issue == 36 else TARGETS)
    return out


def _cases(queries_list: list[int], issue: int) -> list[tuple[int, torch.dtype]]:
    """(Q, dtype) in the order they run: by Q, float32 first; for issue 36 its targets' cases
    first (the bfloat16 ones, the largest Q before the middle one), so that `--time-s` cuts the
    float32 ones at Q > 1, which only must not regress."""
    cases = [(q, dtype) for q in queries_list for dtype in (torch.float32, torch.bfloat16)]
    if issue == 36:
        one, *rest = queries_list
        first = [(one, torch.float32), (one, torch.bfloat16)]
        first += [(q, torch.bfloat16) for q in reversed(rest)]
        cases = first + [(q, torch.float32) for q in rest]
    return cases


def _planned_budget(dtype: torch.dtype) -> int:
    """The budget `retrieve` hands the planner (half inputs: half of it)."""
    return DEFAULT_MEMORY_BUDGET // 2 if dtype in HALF_DTYPES else DEFAULT_MEMORY_BUDGET


def _baselines(case: dict, x, k, block: int, device: torch.device) -> None:
    times = case["s"]
    times["gemm2"] = timed(partial(gemm2, x, k, block), device)
    times["mm_topk10"] = timed(partial(mm_topk, x, k, block), device)
    if x.shape[0] * k.shape[0] <= 2**31:  # one (Q, M) product: the floor for one query
        times["xkt"] = timed(partial(torch.matmul, x, k.T), device)


def _baselines_36(case: dict, x, k, block: int, device: torch.device, gbps: float) -> None:
    """Issue 36's yardsticks: the memories read once at the copy bandwidth (Q = 1), the first
    product alone and the two products with float32 scores (half inputs; Q > 1)."""
    times = case["s"]
    seconds = k.numel() * k.element_size() / (gbps * 1e9)
    times["read_once"] = {"s": seconds, "first_s": 0.0, "reps": 0}
    if x.shape[0] == 1:
        return
    times["gemm1"] = timed(partial(_gemm1, x, k, block), device)
    if x.dtype in HALF_DTYPES and device.type == "cuda":
        times["gemm2_f32"] = timed(partial(_gemm2_float32_scores, x, k, block), device)


def _gemm1(x: torch.Tensor, keys: torch.Tensor, block: int) -> None:
    """X·K_bᵀ per block alone, in the inputs' dtype: the first product of dense."""
    for start in range(0, keys.shape[0], block):
        x @ keys[start : start + block].T


def _gemm2_float32_scores(x: torch.Tensor, keys: torch.Tensor, block: int) -> torch.Tensor:
    """`gemm2` with each block's scores in float32 (cuBLAS's accumulator) rounded to the inputs'
    dtype for the second product: the score traffic of nph's half route."""
    out = x.new_zeros(x.shape[0], keys.shape[1])  # (Q, d)
    for start in range(0, keys.shape[0], block):
        kb = keys[start : start + block]  # (B, d)
        out += torch.mm(x, kb.T, out_dtype=torch.float32).to(x.dtype) @ kb
    return out


def _projected(previous: tuple[int, float] | None, num_queries: int) -> float:
    """Seconds this Q would take if time grew linearly in Q from the previous case."""
    if previous is None:
        return 0.0
    queries, seconds = previous
    return seconds * num_queries / queries if seconds > 0.5 else 0.0


def _first_calls(queries: torch.Tensor, keys: torch.Tensor, device: torch.device) -> dict:
    """Seconds of this process's first dense retrieval per dtype: what one `nph retrieve` pays
    to compile the Triton softmax step (on CUDA, for blocks of `blocks.KERNEL_MIN_CELLS` scores
    or more; cached on disk for later processes)."""
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, k = queries.to(dtype), keys.to(dtype)
        sync(device)
        start = time.perf_counter()
        create_model("dense", beta=BETA).retrieve(x, k)
        sync(device)
        seconds[str(dtype).removeprefix("torch.")] = time.perf_counter() - start
    return seconds


def _errors(queries: torch.Tensor, keys: torch.Tensor, models: dict) -> dict:
    """‖out − ref‖ / ‖ref‖ per model and dtype, ref the same model in float64 on these queries."""
    errors: dict = {}
    keys64 = keys.double()
    for model_name, params in models.items():
        model = create_model(model_name.split()[0], beta=BETA, **params)
        reference = model.retrieve(queries.double(), keys64).patterns
        for dtype in (torch.float32, torch.bfloat16):
            got = model.retrieve(queries.to(dtype), keys.to(dtype)).patterns.double()
            key = f"{model_name} {str(dtype).removeprefix('torch.')}"
            errors[key] = float((got - reference).norm() / reference.norm())
    del keys64
    return errors


def _ratios(times: dict, targets: list) -> dict:
    pairs = {label: (a, b) for label, a, b, *_ in targets}  # the targets' ratios, and a few more
    pairs["multihead/gemm2"] = ("multihead", "gemm2")
    pairs.update(RATIOS_36)
    return {
        label: times[a]["s"] / times[b]["s"]
        for label, (a, b) in pairs.items()
        if a in times and b in times
    }


def _targets(cases: list[dict], targets: list) -> list[dict]:
    found = []
    for label, _, _, bound, dtypes, queries in targets:
        for case in cases:
            if case["dtype"] in dtypes and case["Q"] in queries and label in case.get("ratios", {}):
                ratio = case["ratios"][label]
                found.append(
                    {
                        "target": f"{label} ≤ {bound} (Q={case['Q']} {case['dtype']})",
                        "ratio": round(ratio, 3),
                        "met": ratio <= bound,
                    }
                )
    return found


def markdown(result: dict) -> str:
    """The timings in milliseconds, one row per case, and the targets."""
    models = MODELS_36 if result.get("issue") == 36 else MODELS
    columns = ["read_once", "xkt", "gemm1", "gemm2", "gemm2_f32", "mm_topk10", *models]
    columns = [c for c in columns if any(c in case["s"] for case in result["cases"])]
    lines = [
        f"{result['device']}, torch {result['torch']}, M = {result['memories']}, "
        f"d = {result['dim']}, β = {result['beta']}; median ms (peak MiB beyond inputs)",
        "",
        "| case | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for case in result["cases"]:
        cells = []
        for column in columns:
            entry = case["s"].get(column)
            if entry is None:
                cells.append("–")
                continue
            cell = f"{entry['s'] * 1e3:.2f}"
            if entry.get("peak_bytes") is not None:
                cell += f" ({entry['peak_bytes'] / 2**20:.0f})"
            cells.append(cell)
        lines.append(f"| Q={case['Q']} {case['dtype']} | " + " | ".join(cells) + " |")
    lines += ["", "| target | ratio | met |", "|---|---:|---|"]
    lines += [f"| {t['target']} | {t['ratio']} | {t['met']} |" for t in result["targets"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes: a dry run on a CPU")
    parser.add_argument("--out", type=Path, help="also write the JSON object here")
    parser.add_argument("--time-s", type=float, default=200.0, help="stop starting cases after")
    parser.add_argument(
        "--issue", type=int, choices=[22, 36], default=22, help="whose models and targets"
    )
    args = parser.parse_args()
    device = device_or_exit(args.device)
    result = probe(device, small=args.small, time_s=args.time_s, issue=args.issue)
    emit(result, args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
