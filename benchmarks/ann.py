"""Benchmark retrieval over an approximate index, and exact top-k through FAISS, in one run.

    python benchmarks/ann.py [--memories 1000000] [--dim 128] [--kinds flat,ivf,ivfpq,hnsw]
                             [--nprobe 1,4,16,64] [--ef 64,256] [--skip-topk] [--out FILE]

Part 1 (issue 16's CPU target): at Q = 1000, M = 60,000, d = 784 (the data of `run.py`), the
`topk` model (k = 10) with its automatic FAISS kernel and with `NPH_EXACT_SEARCH=torch`, against
FAISS `IndexFlatIP` search + the softmax-weighted sum (index built untimed), as in `run.py`.

Part 2: M synthetic clustered unit vectors (4096 Gaussian clusters, so neighbours exist as in
real data; uniform random vectors have none and no index helps them), queries = stored patterns
plus noise. Per index kind: build time (checksum of the memory file included) and index file size;
per search setting and Q ∈ {1, 1000}: seconds per query of `nph retrieve --index`'s retrieval
(topk, k = 10: search, exact rescoring, weighted sum) against exact brute-force topk (torch and
FAISS kernels), recall@10 against exact search and the share of queries certified exact.

Prints one JSON object (and writes it to --out); timings are medians after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from nphcli.ann.index_file import build_index, open_index, write_index
from nphcli.ann.search import IndexedModel
from nphcli.engine.exact_search import faiss_topk, torch_topk
from nphcli.memory.bank import TensorBank
from nphcli.memory.file import load_memory, save_memory
from nphcli.models import create_model

BETA = 10.0
K = 10


def timed(fn, *, repeats: int = 3, budget_s: float = 20.0) -> dict:
    """Median and min seconds over repeats after one warm-up; stops early past `budget_s`."""
    fn()
    times: list[float] = []
    while len(times) < repeats and (len(times) < 1 or sum(times) < budget_s):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": len(times)}


def with_search(choice: str, fn):
    """Run fn with NPH_EXACT_SEARCH set to `choice`."""

    def run():
        old = os.environ.get("NPH_EXACT_SEARCH")
        os.environ["NPH_EXACT_SEARCH"] = choice
        try:
            return fn()
        finally:
            if old is None:
                del os.environ["NPH_EXACT_SEARCH"]
            else:
                os.environ["NPH_EXACT_SEARCH"] = old

    return run


# -- part 1 ---------------------------------------------------------------------------------------


def topk_target() -> dict:
    """topk (k = 10) vs FAISS IndexFlatIP + weighted sum at Q = 1000, M = 60,000, d = 784."""
    import faiss

    g = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.rand(60_000, 784, generator=g), dim=1)  # (M, d)
    rows = torch.randint(0, 60_000, (1000,), generator=g)
    queries = torch.nn.functional.normalize(keys[rows] + 0.02 * torch.randn(1000, 784, generator=g))
    model = create_model("topk", k=K, beta=BETA)
    index = faiss.IndexFlatIP(784)
    index.add(keys.numpy())
    faiss.omp_set_num_threads(torch.get_num_threads())

    def faiss_and_sum():
        scores, ids = index.search(queries.numpy(), K)
        weights = torch.softmax(BETA * torch.from_numpy(scores), dim=1)  # (Q, k)
        return (weights.unsqueeze(1) @ keys[torch.from_numpy(ids)]).squeeze(1)

    auto = with_search("auto", lambda: model.retrieve(queries, keys))
    torch_only = with_search("torch", lambda: model.retrieve(queries, keys))
    gap = float((auto().patterns - torch_only().patterns).abs().max())
    f_index = faiss_topk(queries, keys, K)[1]  # (Q, k)
    t_index = torch_topk(queries, TensorBank(keys), K, block_rows=8192)[1]  # (Q, k)
    as_sets = torch.sort(f_index, dim=1).values == torch.sort(t_index, dim=1).values  # (Q, k)
    same_sets = int(as_sets.all(dim=1).sum())
    out = {
        "faiss_search_and_sum": timed(faiss_and_sum, repeats=5),
        "topk_auto_faiss": timed(auto, repeats=5),
        "topk_torch": timed(torch_only, repeats=5),
        "rows_same_topk_set": same_sets,  # of 1000: the same k memories from both kernels
        "rows_same_topk_order": int((f_index == t_index).all(dim=1).sum()),
        "max_abs_pattern_difference": gap,  # rounding: the kernels sum in different orders
    }
    base = out["faiss_search_and_sum"]["median_s"]
    out["ratio_topk_faiss_vs_baseline"] = out["topk_auto_faiss"]["median_s"] / base
    out["ratio_topk_torch_vs_baseline"] = out["topk_torch"]["median_s"] / base
    return out


# -- part 2 ---------------------------------------------------------------------------------------


def clustered(num: int, dim: int, seed: int) -> torch.Tensor:
    """Unit vectors around 4096 random centres (spread 0.6 per unit of centre length)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(4096, dim, generator=g), dim=1)
    out = torch.empty(num, dim)
    for start in range(0, num, 100_000):
        rows = min(100_000, num - start)
        pick = torch.randint(0, 4096, (rows,), generator=g)
        noise = torch.randn(rows, dim, generator=g) * (0.6 / dim**0.5)
        out[start : start + rows] = torch.nn.functional.normalize(centres[pick] + noise, dim=1)
    return out


def large(args) -> dict:
    keys = clustered(args.memories, args.dim, seed=0)  # (M, d)
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, args.memories, (max(args.queries),), generator=g)
    noise = torch.randn(rows.numel(), args.dim, generator=g) * (0.3 / args.dim**0.5)
    all_queries = torch.nn.functional.normalize(keys[rows] + noise, dim=1)  # (Q, d)
    folder = Path(tempfile.mkdtemp(prefix="nph-ann-bench-"))
    path = folder / "memory.safetensors"
    save_memory(path, keys)
    memory = load_memory(path)
    bank = TensorBank(memory.keys)
    model = create_model("topk", k=K, beta=BETA)
    out: dict = {"M": args.memories, "d": args.dim, "exact": {}, "indexes": {}}
    truth = faiss_topk(all_queries, memory.keys, K)[1]  # (Q, k) exact top-10
    for num in args.queries:
        x = all_queries[:num]
        entry = {"faiss": timed(with_search("faiss", lambda x=x: model.retrieve(x, bank)))}
        entry["torch"] = timed(with_search("torch", lambda x=x: model.retrieve(x, bank)))
        for name in ("faiss", "torch"):
            entry[name]["s_per_query"] = entry[name]["median_s"] / num
        out["exact"][f"Q={num}"] = entry
        print(f"exact Q={num}: {json.dumps(entry)}", file=sys.stderr)
    for kind in args.kinds:
        start = time.perf_counter()
        faiss_index, meta, extra = build_index(memory, path, kind=kind, seed=0)
        build_s = time.perf_counter() - start
        index_path = folder / f"memory.{kind}.index"
        write_index(index_path, faiss_index, meta, extra, force=True)
        del faiss_index
        index = open_index(index_path, path)
        record = {"build_s": build_s, "bytes": index_path.stat().st_size, "params": meta["params"]}
        print(f"{kind} build: {json.dumps(record)}", file=sys.stderr)
        settings = {"ivf": "nprobe", "ivfpq": "nprobe", "hnsw": "ef"}.get(kind)
        values = {"nprobe": args.nprobe, "ef": args.ef}.get(settings, [None])
        record["search"] = {}
        for value in values:
            indexed = IndexedModel(model, index, **({settings: value} if settings else {}))
            label = f"{settings}={value}" if settings else "default"
            result = {}
            for num in args.queries:
                x = all_queries[:num]
                timing = timed(lambda x=x, m=indexed: m.retrieve(x, bank))
                found = indexed.search(x, bank)
                order = torch.sort(found.scores, dim=1, descending=True, stable=True).indices
                top = found.ids.gather(1, order[:, :K])  # (Q, k)
                hits = (top.unsqueeze(2) == truth[:num].unsqueeze(1)).any(dim=1)  # (Q, k)
                exact_s = out["exact"][f"Q={num}"]
                result[f"Q={num}"] = {
                    **timing,
                    "s_per_query": timing["median_s"] / num,
                    "recall_at_10": float(hits.float().mean()),
                    "certified_fraction": float(indexed.certified.float().mean()),
                    "speedup_vs_exact_torch": exact_s["torch"]["median_s"] / timing["median_s"],
                    "speedup_vs_exact_faiss": exact_s["faiss"]["median_s"] / timing["median_s"],
                }
            record["search"][label] = result
            print(f"{kind} {label}: {json.dumps(result)}", file=sys.stderr)
        out["indexes"][kind] = record
        if args.out:  # partial results survive an interrupted run
            args.out.write_text(json.dumps({"large": out}, indent=1) + "\n")
        index_path.unlink()
    path.unlink()
    folder.rmdir()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", default="1,1000")
    parser.add_argument("--kinds", default="flat,ivf,ivfpq,hnsw")
    parser.add_argument("--nprobe", default="1,4,16,64")
    parser.add_argument("--ef", default="64,256")
    parser.add_argument("--skip-topk", action="store_true", help="skip part 1")
    parser.add_argument("--skip-large", action="store_true", help="skip part 2")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.queries = [int(v) for v in args.queries.split(",")]
    args.kinds = [v for v in args.kinds.split(",") if v]
    args.nprobe = [int(v) for v in args.nprobe.split(",")]
    args.ef = [int(v) for v in args.ef.split(",")]
    result = {"threads": torch.get_num_threads(), "faiss": __import__("faiss").__version__}
    if not args.skip_topk:
        result["topk_target"] = topk_target()
        print(json.dumps(result["topk_target"]), file=sys.stderr)
    if not args.skip_large:
        result["large"] = large(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
