"""multihead with padded heads against its blockwise route and dense, alternating in one run.

    python benchmarks/heads_padding.py [--device cuda] [--small] [--rounds 5] [--out heads.json]

M = 10⁶ unit-norm memories, d = 784, H = 4 (heads of 196, not a multiple of 8), β = 10,
Q = 1024 and 16384, bfloat16 and float32. Each round calls every variant once, in turn, so slow
drifts of the machine reach all of them alike; each time is the median over the rounds, after
one warm-up call each:

- `padded`: nph's multihead with its heads padded to `attention.aligned_head_width` (200) where
  the fused kernel runs (`attention.fused_heads`; on CUDA for flash or cuDNN attention, so
  bfloat16 only; float32 stays blockwise). The padded copy is made inside each timed call.
- `blockwise`: nph's multihead with the fused kernel turned off: what ran at H = 4 on CUDA before.
- `sdpa_196`: torch's scaled_dot_product_attention on the unpadded heads of 196, left to torch.
- `dense`: nph's dense, the baseline of issue 22's target multihead ≤ 1.3× dense.

nph's variants are planned under one `--memory-budget` (default 4 GiB, which holds the padded
copy of the memories: 1.6 GB in bfloat16 at M = 10⁶); `route` says what each one ran. Also
recorded: each variant's peak allocation beyond its inputs (CUDA), and the relative error of
both multihead routes against float64 on 64 queries. Prints one JSON object (also written to
--out) and a Markdown table. `--small` (M = 20,000) runs the same code on a CPU, the padded
route forced there (`attention.PAD_HEAD_DEVICES`), as a dry run: its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import device_name, device_or_exit, emit, provenance, sync, unit_inputs  # noqa: E402  (the benchmarks' sibling modules)

from nphcli.engine import attention  # noqa: E402
from nphcli.engine.precision import HALF_DTYPES  # noqa: E402
from nphcli.memory.bank import TensorBank  # noqa: E402
from nphcli.models import create_model  # noqa: E402

BETA = 10.0
HEADS = 4
DIM = 784
ERROR_QUERIES = 64
VARIANTS = ("padded", "blockwise", "sdpa_196", "dense")


def model_of(variant: str) -> tuple[str, dict]:
    """The nph model (name, parameters) a variant runs."""
    return ("dense", {}) if variant == "dense" else ("multihead", {"heads": HEADS})


@contextlib.contextmanager
def route(variant: str, device: torch.device):
    """The attention route a variant takes: padding where the fused kernel runs on this device
    (CUDA's rule; forced on a CPU for the dry run), or no fused kernel at all."""
    saved = attention.PAD_HEAD_DEVICES, attention.fused_attention_chosen
    if variant == "padded":
        attention.PAD_HEAD_DEVICES = (device.type,)
    elif variant == "blockwise":
        attention.fused_attention_chosen = lambda bank, heads, **how: False
    try:
        yield
    finally:
        attention.PAD_HEAD_DEVICES, attention.fused_attention_chosen = saved


def call(variant: str, x: torch.Tensor, k: torch.Tensor, budget: int, device: torch.device):
    """One retrieval by `variant`: (Q, d) patterns."""
    if variant == "sdpa_196":
        heads = x.reshape(x.shape[0], HEADS, -1).transpose(0, 1)[None]  # (1, H, Q, d/H)
        keys = k.reshape(k.shape[0], HEADS, -1).transpose(0, 1)[None]  # (1, H, M, d/H)
        out = F.scaled_dot_product_attention(heads, keys, keys, scale=BETA)[0]  # (H, Q, d/H)
        return out.transpose(0, 1).reshape(x.shape[0], -1)
    name, params = model_of(variant)
    with route(variant, device):
        return create_model(name, beta=BETA, **params).retrieve(x, k, memory_budget=budget)


def describe_route(variant: str, num_queries: int, k: torch.Tensor, budget: int, device) -> str:
    """What nph's variant runs for this case: the fused kernel (padded or not), or blockwise."""
    if variant == "sdpa_196":
        return "torch sdpa, heads of 196"
    name, params = model_of(variant)
    heads = params.get("heads", 1)
    bank = TensorBank(k)
    planned = budget // 2 if k.dtype in HALF_DTYPES else budget  # as `retrieve` plans
    with route(variant, device):
        plan = create_model(name, beta=BETA, **params).plan(num_queries, bank, planned)
        fused = attention.fused_heads(bank, heads, plan.memory_rows)
    if fused is None:
        return f"blockwise, blocks of {plan.memory_rows}"
    return f"fused, heads of {fused[0].shape[-1]}, queries in batches of {plan.query_rows}"


def measure(case: dict, x, k, budget: int, device: torch.device, rounds: int) -> None:
    """Alternating calls: `rounds` rounds of every variant after one warm-up call each."""
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    peaks: dict[str, int] = {}
    for variant in VARIANTS:
        try:
            call(variant, x, k, budget, device)
        except (RuntimeError, MemoryError) as error:  # out of memory: report, go on
            case["notes"][variant] = f"{type(error).__name__}: {error}"[:200]
            del times[variant]
    sync(device)
    for _ in range(rounds):
        for variant in times:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
            start = time.perf_counter()
            call(variant, x, k, budget, device)
            sync(device)
            times[variant].append(time.perf_counter() - start)
            if device.type == "cuda":
                peak = torch.cuda.max_memory_allocated(device) - before
                peaks[variant] = max(peaks.get(variant, 0), peak)
    case["ms"] = {variant: statistics.median(t) * 1e3 for variant, t in times.items()}
    case["peak_bytes"] = peaks or None
    ms = case["ms"]
    pairs = [("padded", "blockwise"), ("padded", "dense"), ("blockwise", "dense")]
    pairs.append(("sdpa_196", "dense"))
    case["ratios"] = {f"{a}/{b}": ms[a] / ms[b] for a, b in pairs if a in ms and b in ms}


def errors(queries: torch.Tensor, keys: torch.Tensor, budget: int, device) -> dict:
    """‖out − ref‖ / ‖ref‖ of both multihead routes per dtype, ref multihead in float64."""
    reference = call("blockwise", queries.double(), keys.double(), budget, device).patterns
    found = {}
    for dtype in (torch.bfloat16, torch.float32):
        for variant in ("padded", "blockwise"):
            got = call(variant, queries.to(dtype), keys.to(dtype), budget, device).patterns
            key = f"{variant} {str(dtype).removeprefix('torch.')}"
            found[key] = float((got.double() - reference).norm() / reference.norm())
    return found


def run(device: torch.device, *, small: bool, rounds: int, budget: int, time_s: float) -> dict:
    began = time.perf_counter()
    memories = 20_000 if small else 1_000_000
    queries_list = [64, 256] if small else [1024, 16384]
    keys, all_queries = unit_inputs(memories, DIM, max(queries_list), device)  # (M, d), (Q_max, d)
    out: dict = {
        **provenance(),
        "device": device_name(device),
        "memories": memories,
        "dim": DIM,
        "heads": HEADS,
        "beta": BETA,
        "memory_budget": budget,
        "rounds": rounds,
        "errors_vs_float64": errors(all_queries[:ERROR_QUERIES], keys, budget, device),
        "cases": [],
    }
    for num_queries in queries_list:
        for dtype in (torch.bfloat16, torch.float32):
            x, k = all_queries[:num_queries].to(dtype), keys.to(dtype)
            name = str(dtype).removeprefix("torch.")
            case: dict = {"Q": num_queries, "dtype": name, "notes": {}}
            out["cases"].append(case)
            if time.perf_counter() - began > time_s:
                case["notes"]["all"] = f"skipped: past --time-s {time_s:.0f}"
                continue
            case["route"] = {
                variant: describe_route(variant, num_queries, k, budget, device)
                for variant in VARIANTS
            }
            measure(case, x, k, budget, device, rounds)
    out["total_s"] = time.perf_counter() - began
    return out


def markdown(result: dict) -> str:
    """Median milliseconds per case (peak MiB beyond the inputs), and the ratios."""
    lines = [
        f"{result['device']}, torch {result['torch']}, M = {result['memories']}, "
        f"d = {result['dim']}, H = {result['heads']}, β = {result['beta']}, budget "
        f"{result['memory_budget'] / 2**30:.1f} GiB; median ms over {result['rounds']} rounds",
        "",
        "| case | " + " | ".join(VARIANTS) + " | padded/blockwise | padded/dense |",
        "|---|" + "---:|" * (len(VARIANTS) + 2),
    ]
    for case in result["cases"]:
        cells = []
        for variant in VARIANTS:
            ms = case.get("ms", {}).get(variant)
            cell = "–" if ms is None else f"{ms:.2f}"
            peak = (case.get("peak_bytes") or {}).get(variant)
            cells.append(cell if peak is None else f"{cell} ({peak / 2**20:.0f})")
        ratios = case.get("ratios", {})
        cells += [f"{ratios[r]:.2f}" if r in ratios else "–" for r in ("padded/blockwise",)]
        cells += [f"{ratios[r]:.2f}" if r in ratios else "–" for r in ("padded/dense",)]
        lines.append(f"| Q={case['Q']} {case['dtype']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny sizes: a dry run on a CPU")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per case")
    parser.add_argument("--memory-budget", type=int, default=4 * 2**30, help="bytes, for nph")
    parser.add_argument("--out", type=Path, help="also write the JSON object here")
    parser.add_argument("--time-s", type=float, default=240.0, help="stop starting cases after")
    args = parser.parse_args()
    device = device_or_exit(args.device)
    result = run(
        device, small=args.small, rounds=args.rounds, budget=args.memory_budget, time_s=args.time_s
    )
    emit(result, args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
