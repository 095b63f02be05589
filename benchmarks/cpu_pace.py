"""The CPU at the hardware's pace (issue 49): nph against what the machine does anyway, in one run.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/cpu_pace.py [--rounds 7] [--out FILE]
        [--only topk,one-query,few-queries,entmax,crossover] [--memories 60000] [--queries 200]

Prints one JSON object (and writes it to --out). One thread for torch and for FAISS
(`faiss.omp_set_num_threads(1)`), M = 60,000 random unit-norm patterns of d = 784 (`run.synthetic`),
queries = stored patterns plus noise, β = 1, float32. Each section times its calls in
alternation, one call each per round after a warm-up call each, so that a change in the
machine's load reaches every call alike; per call the median and min over rounds, and per ratio
the median of the rounds' ratios with its spread (min and max over rounds), of wall time and of
this process's CPU time (one thread: the steadier measure when other processes share the core).
The load average before and after is recorded: on a shared machine that is what makes timings
noisy.

- topk: `topk` (k = 10) at Q = 200 by each exact-search kernel (`NPH_EXACT_SEARCH`: torch's
  running top-k over memory blocks, FAISS, and auto) against FAISS
  `IndexFlatIP.search` and `faiss.knn` plus the softmax and the weighted sum of the k rows, and
  against one (Q, M) product + `torch.topk` + sum.
- one-query: dense (with the `fast` extra's one-read kernel, and without it: torch's fused
  attention) and topk at Q = 1 against one GEMV `K x` (one read of the keys), and torch's fused
  attention called directly.
- few-queries: dense at Q = 2, 3, 4, 8 with and without the one-read kernel, against the product.
- entmax: α = 1.3 and dense at Q = 200 (the wide-support regime, as `run.py --only regimes`).
- crossover: exact top-10 search alone, torch's kernel against FAISS's, at several Q (the queries
  from which `exact_search` takes FAISS).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from _common import emit, provenance
from run import queries_for, synthetic

from nphcli.engine import attention, exact_search
from nphcli.memory.bank import TensorBank
from nphcli.models import create_model

BETA = 1.0
K = 10
SECTIONS = ("topk", "one-query", "few-queries", "entmax", "crossover")
CROSSOVER_QUERIES = (1, 2, 8, 32, 100, 128, 160, 200, 256)


def alternate(calls: dict, rounds: int) -> dict:
    """Each call once per round, in turn, after a warm-up call each: per call its seconds,
    median and min, and this process's CPU seconds (with one thread, the wall time less the
    time other processes held the core)."""
    for call in calls.values():
        call()
    seconds: dict = {name: [] for name in calls}
    cpu: dict = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            seconds[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {
        name: {
            "median_s": statistics.median(s),
            "min_s": min(s),
            "cpu_median_s": statistics.median(cpu[name]),
            "seconds": s,
            "cpu_seconds": cpu[name],
        }
        for name, s in seconds.items()
    }


def ratio(row: dict, name: str, base: str) -> dict:
    """name over base: the median of the rounds' ratios of wall time, its spread (min, max),
    the ratio of minima, and the median and spread of the rounds' ratios of CPU time."""

    def pairs(field):
        return [a / b for a, b in zip(row[name][field], row[base][field], strict=True)]

    wall, cpu = pairs("seconds"), pairs("cpu_seconds")
    return {
        "median": statistics.median(wall),
        "min": min(wall),
        "max": max(wall),
        "of_min": row[name]["min_s"] / row[base]["min_s"],
        "cpu_median": statistics.median(cpu),
        "cpu_min": min(cpu),
        "cpu_max": max(cpu),
    }


def with_search(choice: str, call):
    """`call` run under NPH_EXACT_SEARCH=choice."""

    def run():
        before = os.environ.get(exact_search.ENVIRONMENT)
        os.environ[exact_search.ENVIRONMENT] = choice
        try:
            return call()
        finally:
            if before is None:
                del os.environ[exact_search.ENVIRONMENT]
            else:
                os.environ[exact_search.ENVIRONMENT] = before

    return run


def faiss_calls(queries, keys) -> dict:
    """FAISS's flat search (an `IndexFlatIP` built once, untimed, and `faiss.knn` on the arrays)
    plus the softmax and weighted sum of the k rows: what `topk` computes. Empty without FAISS."""
    if not exact_search.faiss_available():
        return {}
    import faiss

    index = faiss.IndexFlatIP(keys.shape[1])
    index.add(keys.numpy())
    xq, xb = queries.numpy(), keys.numpy()

    def weigh(found):
        scores, ids = (torch.from_numpy(a) for a in found)  # (Q, k) each
        weights = torch.softmax(BETA * scores, dim=1)  # (Q, k)
        return (weights.unsqueeze(1) @ keys[ids]).squeeze(1)  # (Q, d)

    return {
        "faiss IndexFlatIP.search + sum": lambda: weigh(index.search(xq, K)),
        "faiss.knn + sum": lambda: weigh(faiss.knn(xq, xb, K, metric=faiss.METRIC_INNER_PRODUCT)),
    }


def mm_topk_sum(queries, keys):
    """One (Q, M) product, `torch.topk`, softmax and the weighted sum of the k rows."""
    scores, ids = torch.topk(queries @ keys.T, K, dim=1)  # (Q, k) each
    weights = torch.softmax(BETA * scores, dim=1)
    return (weights.unsqueeze(1) @ keys[ids]).squeeze(1)


def topk_section(keys, num_queries: int, rounds: int) -> dict:
    queries = queries_for(keys, num_queries, seed=1)
    model = create_model("topk", beta=BETA, k=K)
    calls = {
        f"nph topk ({choice})": with_search(choice, lambda: model.retrieve(queries, keys))
        for choice in ("torch", "auto")
    }
    if exact_search.faiss_available():
        calls["nph topk (faiss)"] = with_search("faiss", lambda: model.retrieve(queries, keys))
    calls.update(faiss_calls(queries, keys))
    calls["mm + topk + sum"] = lambda: mm_topk_sum(queries, keys)
    row = alternate(calls, rounds)
    base = "faiss IndexFlatIP.search + sum" if "faiss.knn + sum" in row else "mm + topk + sum"
    row["ratios"] = {f"{name} / {base}": ratio(row, name, base) for name in calls if name != base}
    return {f"Q={num_queries},M={keys.shape[0]},k={K}": row}


def without_decode(call):
    """`call` with the CPU's one-read kernel (`engine/cpu_decode.py`) switched off: dense then
    runs torch's fused attention, as it does without the `fast` extra."""

    def run():
        state = attention._DECODE["cpu_decode"]
        state["failed"] = "switched off by the benchmark"
        try:
            return call()
        finally:
            state["failed"] = None

    return run


def one_query_section(keys, rounds: int) -> dict:
    x = queries_for(keys, 1, seed=1)  # (1, d)
    dense = create_model("dense", beta=BETA)
    topk = create_model("topk", beta=BETA, k=K)
    calls = {
        "GEMV K x": lambda: torch.mv(keys, x[0]),
        "nph dense": lambda: dense.retrieve(x, keys),
        "fused attention (SDPA) alone": lambda: torch.nn.functional.scaled_dot_product_attention(
            x[None, None], keys[None, None], keys[None, None], scale=BETA
        ),
        "nph dense without numba": without_decode(lambda: dense.retrieve(x, keys)),
        "nph topk (torch)": with_search("torch", lambda: topk.retrieve(x, keys)),
        "nph topk (auto)": with_search("auto", lambda: topk.retrieve(x, keys)),
    }
    row = alternate(calls, rounds)
    row["ratios"] = {f"{n} / GEMV K x": ratio(row, n, "GEMV K x") for n in calls if n != "GEMV K x"}
    return {f"Q=1,M={keys.shape[0]}": row}


def few_queries_section(keys, rounds: int) -> dict:
    """Dense at Q = 2, 3, 4, 8 with and without the one-read kernel (which takes Q ≤ 3), against
    the (Q, M) product alone."""
    dense = create_model("dense", beta=BETA)
    out = {}
    for num_queries in (2, 3, 4, 8):
        x = queries_for(keys, num_queries, seed=1)
        calls = {
            "product x Kᵀ": lambda x=x: x @ keys.T,
            "nph dense": lambda x=x: dense.retrieve(x, keys),
            "nph dense without numba": without_decode(lambda x=x: dense.retrieve(x, keys)),
        }
        row = alternate(calls, rounds)
        row["ratios"] = {
            f"{n} / {base}": ratio(row, n, base)
            for n, base in (
                ("nph dense", "nph dense without numba"),
                ("nph dense", "product x Kᵀ"),
                ("nph dense without numba", "product x Kᵀ"),
            )
        }
        out[f"Q={num_queries},M={keys.shape[0]}"] = row
    return out


def entmax_section(keys, num_queries: int, rounds: int) -> dict:
    queries = queries_for(keys, num_queries, seed=1)
    dense = create_model("dense", beta=BETA)
    entmax = create_model("entmax", beta=BETA, alpha=1.3)
    calls = {
        "dense": lambda: dense.retrieve(queries, keys),
        "entmax α=1.3": lambda: entmax.retrieve(queries, keys),
    }
    row = alternate(calls, rounds)
    row["ratios"] = {"entmax α=1.3 / dense": ratio(row, "entmax α=1.3", "dense")}
    return {f"unit-norm β=1,Q={num_queries},M={keys.shape[0]}": row}


def crossover_section(keys, rounds: int) -> dict:
    out = {}
    bank = TensorBank(keys)
    for num_queries in CROSSOVER_QUERIES:
        queries = queries_for(keys, num_queries, seed=1)
        calls = {
            choice: with_search(
                choice, lambda q=queries: exact_search.exact_topk(q, bank, K, block_rows=10**9)
            )
            for choice in ("torch", "faiss")
        }
        row = alternate(calls, rounds)
        row["ratios"] = {"faiss / torch": ratio(row, "faiss", "torch")}
        out[f"Q={num_queries}"] = row
        faster = row["ratios"]["faiss / torch"]
        print(f"  crossover Q={num_queries}: faiss / torch {faster['median']:.2f}", file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--memories", type=int, default=60_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    parser.add_argument("--out")
    args = parser.parse_args()
    sections = args.only.split(",")
    torch.set_num_threads(1)
    if exact_search.faiss_available():
        import faiss

        faiss.omp_set_num_threads(1)
    keys = synthetic(args.memories, 0, torch.device("cpu"))
    result = {
        **provenance(),
        "faiss": exact_search.faiss_available(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "load_average_before": os.getloadavg(),
        "rounds": args.rounds,
        "beta": BETA,
    }
    runs = {
        "topk": lambda: topk_section(keys, args.queries, args.rounds),
        "one-query": lambda: one_query_section(keys, args.rounds),
        "few-queries": lambda: few_queries_section(keys, args.rounds),
        "entmax": lambda: entmax_section(keys, args.queries, args.rounds),
        "crossover": lambda: crossover_section(keys, args.rounds),
    }
    for name in sections:
        print(f"{name}…", file=sys.stderr)
        result[name] = runs[name]()
    result["load_average_after"] = os.getloadavg()
    emit(result, args.out)


if __name__ == "__main__":
    main()
