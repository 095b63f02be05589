"""Benchmark nph's retrieval engine against the hardware's own limits, in one run.

    python benchmarks/run.py [--quick] [--device cpu|cuda] [--out FILE] [--markdown FILE]
                             [--stream-gb 6] [--machine NAME] [--threads N]
                             [--only regimes [--alphas 1.1,1.3,1.5,1.7,2] [--queries 200,1000]
                              [--rounds 5] [--no-package]]

Prints one JSON object on stdout (and to --out) and a short table on stderr. Everything a target
compares is measured in the same run: per model, the time of `retrieve` for Q ∈ {1, 100, 1000}
queries × M ∈ {1,000; 10,000; 60,000} memories, d = 784, float32 (median and min over repeats,
after a warm-up, synchronising CUDA); the baselines (the two GEMMs X·Kᵀ and P·V alone, the naive
full-matrix path of the paper's code, FAISS IndexFlatIP exact search + the weighted sum, the copy
bandwidth); peak resident memory for Q = M = 60,000 and for streaming a memory file of about 6 GB
(each in a fresh subprocess); and the start-up time of `nph --help` and of a small
`nph retrieve`. The targets are those of issue 6. On CUDA (or with `--large on|dry-run`) it
adds the M = 10⁶ float32/bfloat16 cases of `large.py` (issue 12).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import device_or_exit, emit, provenance, sync
from large import large_cases

from nphcli.engine import summary_cache
from nphcli.memory.streamed import StreamedBank
from nphcli.models import create_model

DIM = 784
BETA = 10.0  # unit-norm patterns: scores β·cos in [0, β]; sparse supports of a few memories
QUERIES = [1, 100, 1000]
MEMORIES = [1_000, 10_000, 60_000]
# Per model: the parameters benchmarked (topk's k = 10 is the target's; others are defaults).
MODELS = {
    "dense": {},
    "multihead": {"heads": 4},
    "linear": {},
    "random-feature": {},
    "topk": {"k": 10},
    "random": {"k": 10},
    "random k=0.2": {"k": 0.2},
    "window": {},
    "sparse": {},
    "entmax": {},
}
FASHION = Path("/usr/share/datasets/fashion-mnist")
NPH = Path(sys.executable).with_name("nph")


# -- timing ---------------------------------------------------------------------------------------


def timed(fn, device: torch.device, *, budget_s: float, max_repeats: int = 7) -> dict:
    """Median and min seconds of fn() over repeats, after one warm-up call. Repeats stop once
    they have used `budget_s` (at least three), so slow cases do not dominate the run."""
    sync(device)
    fn()
    sync(device)
    times: list[float] = []
    while len(times) < max_repeats and (len(times) < 3 or sum(times) < budget_s):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": len(times)}


def synthetic(num: int, seed: int, device: torch.device) -> torch.Tensor:
    """Image-like patterns: uniform in [0, 1), scaled to unit length (num, d)."""
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.rand(num, DIM, generator=generator)
    return torch.nn.functional.normalize(patterns, dim=1).to(device)


def queries_for(keys: torch.Tensor, num: int, seed: int) -> torch.Tensor:
    """Stored patterns plus Gaussian noise (σ = 0.02 per entry), renormalised: (num, d)."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, keys.shape[0], (num,), generator=generator)
    noise = 0.02 * torch.randn(num, DIM, generator=generator).to(keys.device)
    return torch.nn.functional.normalize(keys[rows] + noise, dim=1)


# -- baselines ------------------------------------------------------------------------------------


def naive(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The paper's code path: full (Q, M) scores, softmax, one matrix product."""
    return torch.softmax(BETA * queries @ keys.T, dim=-1) @ keys


def baselines(queries, keys, device, budget_s) -> dict:
    scores = queries @ keys.T  # (Q, M)
    weights = torch.softmax(BETA * scores, dim=-1)  # (Q, M)
    out = {
        "gemm_scores": timed(lambda: queries @ keys.T, device, budget_s=budget_s),
        "gemm_values": timed(lambda: weights @ keys, device, budget_s=budget_s),
        "naive": timed(lambda: naive(queries, keys), device, budget_s=budget_s),
    }
    out["two_gemms_s"] = out["gemm_scores"]["median_s"] + out["gemm_values"]["median_s"]
    faiss = faiss_topk(queries, keys, k=10, budget_s=budget_s) if device.type == "cpu" else None
    if faiss is not None:
        out["faiss_topk10"] = faiss
    return out


def faiss_topk(queries, keys, *, k: int, budget_s: float) -> dict | None:
    """FAISS IndexFlatIP exact search for k neighbours plus the softmax-weighted sum of their
    rows: what the topk model computes. Building the index (a copy of the keys) is not timed."""
    try:
        import faiss
    except ImportError:
        return None
    faiss.omp_set_num_threads(torch.get_num_threads())
    index = faiss.IndexFlatIP(keys.shape[1])
    index.add(keys.numpy())
    query_array = queries.numpy()

    def search_and_sum():
        scores, ids = index.search(query_array, k)
        weights = torch.softmax(BETA * torch.from_numpy(scores), dim=1)  # (Q, k)
        rows = keys[torch.from_numpy(ids)]  # (Q, k, d)
        return (weights.unsqueeze(1) @ rows).squeeze(1)

    return timed(search_and_sum, torch.device("cpu"), budget_s=budget_s)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a 1 GiB tensor copy: the memory-bandwidth yardstick for Q = 1."""
    source = torch.ones(2**28, device=device)  # 1 GiB of float32
    target = torch.empty_like(source)
    timing = timed(lambda: target.copy_(source), device, budget_s=1.0)
    return source.numel() * 4 / timing["min_s"]


# -- the grid -------------------------------------------------------------------------------------


def grid(device: torch.device, queries_list, memories_list, budget_s: float) -> dict:
    keys_all = synthetic(max(memories_list), seed=0, device=device)
    results: dict = {"models": {}, "baselines": {}}
    for num_memories in memories_list:
        keys = keys_all[:num_memories].contiguous()
        for num_queries in queries_list:
            queries = queries_for(keys, num_queries, seed=1)
            key = f"Q={num_queries},M={num_memories}"
            results["baselines"][key] = baselines(queries, keys, device, budget_s)
            for label, params in MODELS.items():
                model = create_model(label.split()[0], beta=BETA, **params)
                timing = timed(
                    lambda m=model, x=queries, k=keys: cold_retrieve(m, x, k),
                    device,
                    budget_s=budget_s,
                )
                results["models"].setdefault(label, {})[key] = timing
                print(f"  {label:14s} {key:18s} {timing['median_s']:.4f} s", file=sys.stderr)
    return results


# -- support regimes (issue 25) -------------------------------------------------------------------

# (label, β) for the same random unit-norm patterns (`synthetic`): wide supports at β = 1 (nearly
# half the memories in an α-entmax support), narrow ones at β = 10. `regimes` adds real MNIST
# digits in [0, 1] at nph's default β.
REGIMES = [("unit-norm β=1", 1.0), ("random β=10", 10.0)]
REGIME_QUERIES = [200, 1000]
REGIME_ALPHAS = [1.1, 1.3, 1.5, 1.7, 2.0]  # issue 36: entmax ≤ 1.5× dense at every α in (1, 2]
REGIME_ROUNDS = 5
MNIST = Path(__file__).resolve().parents[1] / "sample_data" / "MNIST" / "raw"


def regimes(
    device: torch.device,
    num_memories: int,
    queries_list,
    budget_s: float,
    *,
    alphas=tuple(REGIME_ALPHAS),
    rounds: int = REGIME_ROUNDS,
    package: bool = True,
) -> dict:
    """Per regime and Q: dense, α-entmax at each of `alphas`, random (k = 0.2·M) and the entmax
    package's `entmax15` and `entmax_bisect` (scores, map, weighted sum; when installed and
    `package`), with the ratios the issues' targets name, all timed in this run. nph's models
    are timed in alternation, one call each per round, `rounds` rounds after a warm-up, so that
    a change in the machine's load reaches every model alike: each ratio to dense is the
    median of the rounds' ratios (`_ratios`: also of the minima and of CPU time). The package,
    much slower, is timed after them (`timed`)."""
    from nphcli.core.defaults import DEFAULT_BETA

    cases = [(label, synthetic(num_memories, 0, device), beta) for label, beta in REGIMES]
    digits = idx_images(MNIST / "train-images-idx3-ubyte.gz")
    if digits is not None:  # the 5,000 bundled digits, M = 5,000
        cases.append((f"MNIST β={DEFAULT_BETA}", digits.to(device), DEFAULT_BETA))
    maps = _entmax_package() if package else {}
    out: dict = {}
    for label, keys, beta in cases:
        for num_queries in queries_list:
            queries = queries_for(keys, num_queries, seed=1)
            if label.startswith("MNIST"):
                queries = queries.clamp(0, 1) * keys.norm(dim=1).mean()  # image-like norms
            models = {"dense": create_model("dense", beta=beta)}
            for alpha in alphas:
                models[_entmax_name(alpha)] = create_model("entmax", beta=beta, alpha=alpha)
            models["random"] = create_model("random", beta=beta, k=0.2)
            row = _alternating(models, queries, keys, device, rounds)
            for name, fn in maps.items():
                row[f"package {name}"] = timed(
                    lambda f=fn, x=queries, k=keys, b=beta: f(b * x @ k.T) @ k,
                    device,
                    budget_s=budget_s,
                    max_repeats=3,
                )
            ratios = _ratios(row, list(models)[1:])
            row["ratios"], row["ratios_of_min"], row["ratios_of_cpu"] = ratios
            if "package entmax15" in row and _entmax_name(1.5) in row:
                row["ratios"]["entmax/package entmax15"] = (
                    row[_entmax_name(1.5)]["median_s"] / row["package entmax15"]["median_s"]
                )
            key = f"{label},Q={num_queries},M={keys.shape[0]}"
            out[key] = row
            ratios = ", ".join(f"{k} {v:.2f}" for k, v in row["ratios"].items())
            print(f"  {key}: {ratios}", file=sys.stderr)
    return out


def _entmax_name(alpha: float) -> str:
    """The regimes' name of entmax at α; α = 1.5 keeps the plain "entmax" of earlier files."""
    return "entmax" if alpha == 1.5 else f"entmax α={alpha:g}"


def _alternating(models: dict, queries, keys, device, rounds: int) -> dict:
    """`retrieve` of each model once per round, in turn, after one warm-up call each: per
    model its times, median, min and repeats."""
    for model in models.values():
        model.retrieve(queries, keys)
    sync(device)
    times: dict = {name: [] for name in models}
    cpu: dict = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            model.retrieve(queries, keys)
            sync(device)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {
        name: {
            "median_s": statistics.median(seconds),
            "min_s": min(seconds),
            "repeats": len(seconds),
            "seconds": seconds,
            "cpu_seconds": cpu[name],
        }
        for name, seconds in times.items()
    }


def _ratios(row: dict, names: list[str]) -> tuple[dict, dict, dict]:
    """Each model's time over dense's: the median over rounds of the round's ratio, the ratio
    of the minima, and the median of the rounds' ratios of this process's CPU time (on a
    machine shared with other work, wall time counts the time others held the core; with
    several threads CPU time also counts threads waiting for each other)."""
    dense = row["dense"]
    paired, of_min, of_cpu = {}, {}, {}
    for name in names:
        pairs = [a / b for a, b in zip(row[name]["seconds"], dense["seconds"], strict=True)]
        paired[f"{name}/dense"] = statistics.median(pairs)
        of_min[f"{name}/dense"] = row[name]["min_s"] / dense["min_s"]
        pairs = [a / b for a, b in zip(row[name]["cpu_seconds"], dense["cpu_seconds"], strict=True)]
        of_cpu[f"{name}/dense"] = statistics.median(pairs)
    return paired, of_min, of_cpu


def _entmax_package() -> dict:
    """The entmax package's maps on rows (the `bench` extra), or nothing when not installed."""
    try:
        import entmax
    except ImportError:
        return {}
    return {
        "entmax15": lambda s: entmax.entmax15(s, dim=-1),
        "entmax_bisect": lambda s: entmax.entmax_bisect(s, alpha=1.5, dim=-1),
    }


# -- peak memory (subprocesses) -------------------------------------------------------------------


def fashion_mnist() -> torch.Tensor | None:
    """Fashion-MNIST's 60,000 training images as (60000, 784) floats in [0, 1], if installed."""
    if not FASHION.exists():
        return None
    for name in ("train-images-idx3-ubyte.gz", "train-images-idx3-ubyte"):
        path = next(FASHION.rglob(name), None)
        if path is not None:
            return idx_images(path)
    return None


def idx_images(path: Path) -> torch.Tensor | None:
    """The images of an IDX file (gzip-compressed or not) as (n, 784) floats in [0, 1]."""
    if not path.exists():
        return None
    import gzip

    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    count = struct.unpack(">I", raw[4:8])[0]
    pixels = torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8)
    return pixels.reshape(count, DIM).float() / 255


def child_rss(model_name: str, params: dict) -> dict:
    """Run in a fresh process: Q = M = 60,000 retrieval, report peak RSS."""
    images = fashion_mnist()
    source = "fashion-mnist" if images is not None else "synthetic"
    keys = images if images is not None else synthetic(60_000, seed=0, device=torch.device("cpu"))
    keys = torch.nn.functional.normalize(keys, dim=1)
    queries = queries_for(keys, 60_000, seed=1)
    before = _reset_peak_rss()
    start = time.perf_counter()
    create_model(model_name, beta=BETA, **params).retrieve(queries, keys)
    return {
        "data": source,
        "seconds": time.perf_counter() - start,
        "memory_bytes": keys.numel() * 4,
        "rss_at_start_bytes": before,
        "peak_rss_bytes": _peak_rss(),
    }


def child_stream(path: str, num_queries: int, model_name: str) -> dict:
    """Run in a fresh process: retrieve from a memory file streamed from disk."""
    bank = StreamedBank(path)
    queries = synthetic(num_queries, seed=2, device=torch.device("cpu"))
    params = MODELS.get(model_name, {})
    before = _reset_peak_rss()
    start = time.perf_counter()
    create_model(model_name, beta=BETA, **params).retrieve(queries, bank)
    return {
        "seconds": time.perf_counter() - start,
        "file_bytes": os.path.getsize(path),
        "M": bank.num_memories,
        "Q": num_queries,
        "rss_at_start_bytes": before,
        "peak_rss_bytes": _peak_rss(),
    }


def _peak_rss(field: str = "VmHWM") -> int:
    """This process's peak resident set (VmHWM; VmRSS: the current one). Not getrusage's
    ru_maxrss: on Linux that is inherited from the parent across fork and exec, so a child would
    report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak_rss() -> int:
    """Reset the peak to the current resident set (Linux ≥ 4.0), so that the peak read later is
    that of the retrieval alone, not of preparing its data; returns the current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5\n")
    except OSError:
        pass
    return _peak_rss("VmRSS")


def in_subprocess(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout)


def write_big_memory(path: Path, target_bytes: int) -> int:
    """Write an nph memory file of about `target_bytes` of float32 patterns, 64 MiB at a time,
    without ever holding it in RAM: the safetensors header, then the rows. Returns M."""
    rows_per_chunk = 2**26 // (DIM * 4)
    num_memories = target_bytes // (DIM * 4) // rows_per_chunk * rows_per_chunk
    meta = {
        "format": "nph-memory",
        "format_version": 1,
        "M": num_memories,
        "d": DIM,
        "dtype": "float32",
        "source": "benchmark",
    }
    header = {
        "patterns": {
            "dtype": "F32",
            "shape": [num_memories, DIM],
            "data_offsets": [0, num_memories * DIM * 4],
        },
        "__metadata__": {key: json.dumps(value) for key, value in meta.items()},
    }
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned
    generator = torch.Generator().manual_seed(3)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for _ in range(num_memories // rows_per_chunk):
            chunk = torch.rand(rows_per_chunk, DIM, generator=generator)
            handle.write(torch.nn.functional.normalize(chunk, dim=1).numpy().tobytes())
    return num_memories


def drop_page_cache() -> bool:
    """Ask the kernel to drop clean page-cache pages (root only), so streaming reads the disk."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def background_load(seconds: float = 3.0) -> float | None:
    """Share of all CPU time that other processes used while this one slept: on a shared machine
    the timings are only as steady as this is low."""

    def busy_and_total():
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    try:
        busy0, total0 = busy_and_total()
        time.sleep(seconds)
        busy1, total1 = busy_and_total()
    except (OSError, ValueError, IndexError):
        return None
    return (busy1 - busy0) / max(1, total1 - total0)


# -- start-up -------------------------------------------------------------------------------------


def startup(budget_s: float) -> dict:
    out: dict = {}
    if not NPH.exists():
        return {"error": f"{NPH} not found"}

    def run(*args):
        subprocess.run([str(NPH), *args], capture_output=True, check=True)

    out["nph --help"] = timed(lambda: run("--help"), torch.device("cpu"), budget_s=budget_s)
    has_retrieve = subprocess.run([str(NPH), "retrieve", "--help"], capture_output=True)
    if has_retrieve.returncode != 0:
        out["nph retrieve"] = {"error": "no retrieve command"}
        return out
    from nphcli.memory.file import save_memory

    with tempfile.TemporaryDirectory() as folder:
        memory = Path(folder) / "small.safetensors"
        save_memory(memory, synthetic(1000, seed=4, device=torch.device("cpu")))
        args = ("retrieve", "--memory", str(memory), "--queries", "10", "--json")
        out["nph retrieve (M=1000, Q=10)"] = timed(
            lambda: run(*args), torch.device("cpu"), budget_s=budget_s
        )
    return out


# -- targets --------------------------------------------------------------------------------------


def targets(results: dict, bandwidth: float) -> list[dict]:
    models, base = results["grid"]["models"], results["grid"]["baselines"]
    big = "Q=1000,M=60000"
    rows = []

    def add(name, value, limit, note):
        rows.append({"target": name, "value": value, "limit": limit, "met": value <= limit, **note})

    if big in base:
        dense = models["dense"][big]["median_s"]
        add("dense / two GEMMs (Q=1000, M=60k)", dense / base[big]["two_gemms_s"], 1.0, {})
        add("sparse / dense (Q=1000, M=60k)", models["sparse"][big]["median_s"] / dense, 1.5, {})
        if "faiss_topk10" in base[big]:
            faiss = base[big]["faiss_topk10"]["median_s"]
            add(
                "topk(k=10) / FAISS+sum (Q=1000, M=60k)",
                models["topk"][big]["median_s"] / faiss,
                1.0,
                {},
            )
    for key, row in results.get("regimes", {}).items():
        if not key.startswith("MNIST"):
            for name, ratio in row["ratios"].items():
                if name.startswith("entmax") and name.endswith("/dense"):
                    add(f"{name} ({key})", ratio, 1.5, {})
            add(f"random k=0.2 / dense ({key})", row["ratios"]["random/dense"], 1.0, {})
    for name in ("linear", "random-feature"):
        scaling = results.get("scaling", {}).get(name)
        if scaling:
            add(f"{name} t(M=60k)/t(M=6k) (Q=1000)", scaling["ratio"], 11.0, {})
    single = "Q=1,M=60000"
    if single in base:
        bound = 60_000 * DIM * 4 / bandwidth
        for name in ("dense", "topk", "sparse"):
            ratio = models[name][single]["median_s"] / bound
            add(f"{name} Q=1 / bandwidth bound (M=60k)", ratio, 1.3, {"bound_s": bound})
    for name, rss in results.get("rss", {}).items():
        if "peak_rss_bytes" in rss:
            limit = rss["memory_bytes"] + 2**30
            add(f"peak RSS {name} Q=M=60k (GB)", rss["peak_rss_bytes"] / 1e9, limit / 1e9, {})
            growth = (rss["peak_rss_bytes"] - rss["rss_at_start_bytes"]) / 1e9
            add("  its growth during retrieval (GB)", growth, 2**30 / 1e9, {})
    stream = results.get("stream", {})
    for name, run in stream.get("runs", {}).items():
        if "peak_rss_bytes" in run:
            add(f"peak RSS streaming {name} (GB)", run["peak_rss_bytes"] / 1e9, 1.5, {})
    help_timing = results.get("startup", {}).get("nph --help")
    if help_timing:
        add("nph --help (s)", help_timing["median_s"], 0.3, {})
    return rows


def scaling(device, budget_s) -> dict:
    """t(M = 60,000) / t(M = 6,000) at Q = 1000 for the models that should be linear in M."""
    keys = synthetic(60_000, seed=0, device=device)
    queries = queries_for(keys, 1000, seed=1)
    out = {}
    for name in ("linear", "random-feature"):
        model = create_model(name, beta=BETA)
        small = timed(
            lambda m=model: cold_retrieve(m, queries, keys[:6000]), device, budget_s=budget_s
        )
        large = timed(lambda m=model: cold_retrieve(m, queries, keys), device, budget_s=budget_s)
        out[name] = {"t_6k": small, "t_60k": large, "ratio": large["median_s"] / small["median_s"]}
    return out


# -- report ---------------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    grid_results = results["grid"]
    keys = list(next(iter(grid_results["models"].values())))
    lines = [
        f"# Benchmark: {results['machine']}",
        "",
        f"{results['environment']['cpu']}, {results['environment']['threads']} threads, torch "
        f"{results['environment']['torch']}, device {results['device']}; float32, d = {DIM}, "
        f"β = {BETA}. Median seconds of `retrieve` (min in the JSON).",
        "",
        "| model | " + " | ".join(k.replace(",", " ") for k in keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for name, row in grid_results["models"].items():
        lines.append(f"| {name} | " + " | ".join(_s(row[k]["median_s"]) for k in keys) + " |")
    base = grid_results["baselines"]
    for label, pick in (
        ("X·Kᵀ alone", lambda b: b["gemm_scores"]["median_s"]),
        ("P·V alone", lambda b: b["gemm_values"]["median_s"]),
        ("naive (paper)", lambda b: b["naive"]["median_s"]),
        ("FAISS k=10 + sum", lambda b: b.get("faiss_topk10", {}).get("median_s")),
    ):
        lines.append(f"| *{label}* | " + " | ".join(_s(pick(base[k])) for k in keys) + " |")
    lines += ["", "| target | measured | limit | met |", "|---|---:|---:|:---:|"]
    for row in results["targets"]:
        met = "yes" if row["met"] else "**no**"
        lines.append(f"| {row['target']} | {row['value']:.3f} | {row['limit']:.3f} | {met} |")
    lines += ["", f"Copy bandwidth: {results['copy_bandwidth_gbps']:.1f} GB/s."]
    loads = [results.get(f"background_cpu_busy_{when}") for when in ("before", "after")]
    if None not in loads:
        lines.append(
            "CPU used by other processes while this one slept: "
            f"{loads[0]:.0%} before the run, {loads[1]:.0%} after."
        )
    for name, rss in results.get("rss", {}).items():
        if "peak_rss_bytes" in rss:
            lines.append(
                f"Peak RSS, {name}, Q = M = 60,000 ({rss['data']}): "
                f"{rss['peak_rss_bytes'] / 1e9:.2f} GB ({rss['rss_at_start_bytes'] / 1e9:.2f} "
                f"GB resident when retrieval starts: torch, memories, queries; memory "
                f"{rss['memory_bytes'] / 1e9:.2f} GB), "
                f"{rss['seconds']:.1f} s."
            )
    stream = results.get("stream", {})
    for name, run in stream.get("runs", {}).items():
        if "peak_rss_bytes" in run:
            lines.append(
                f"Streaming {name}: {run['file_bytes'] / 1e9:.2f} GB file (M = {run['M']:,}, "
                f"Q = {run['Q']}, page cache dropped: {stream['cold']}): "
                f"{run['seconds']:.1f} s, peak RSS {run['peak_rss_bytes'] / 1e9:.2f} GB "
                f"({run['rss_at_start_bytes'] / 1e9:.2f} GB resident when retrieval starts)."
            )
    for name, timing in results.get("startup", {}).items():
        if "median_s" in timing:
            lines.append(f"`{name}`: {timing['median_s']:.3f} s (min {timing['min_s']:.3f} s).")
    return "\n".join(lines) + "\n"


def cold_retrieve(model, queries, keys):
    """One `retrieve` as a first call on this memory: the feature models' summaries are kept
    between calls (`summary_cache`), which would otherwise turn repeats into readouts alone."""
    summary_cache.clear()
    return model.retrieve(queries, keys)


def _s(value) -> str:
    return "–" if value is None else f"{value:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Q ≤ 100, M ≤ 10,000; no RSS runs")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", help="write the JSON here too")
    parser.add_argument("--markdown", help="write the markdown summary here")
    parser.add_argument("--stream-gb", type=float, default=6.0, help="0 skips the streaming run")
    parser.add_argument("--machine", default=f"{platform.node()}-{platform.machine()}")
    parser.add_argument(
        "--large",
        choices=["auto", "on", "off", "dry-run"],
        default="auto",
        help="M = 10⁶ cases (large.py): auto = on for CUDA; dry-run = tiny sizes, any device",
    )
    parser.add_argument(
        "--only", choices=["regimes"], help="run this section alone (JSON on stdout, no targets)"
    )
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--alphas",
        default=",".join(map(str, REGIME_ALPHAS)),
        help="regimes: the α of entmax, comma-separated",
    )
    parser.add_argument("--queries", help="regimes: Q, comma-separated (default 200,1000)")
    parser.add_argument("--rounds", type=int, default=REGIME_ROUNDS, help="regimes: rounds")
    parser.add_argument(
        "--no-package", action="store_true", help="regimes: leave out the entmax package"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        kind, *rest = args.child
        out = child_rss(rest[0], json.loads(rest[1])) if kind == "rss" else None
        if kind == "stream":
            out = child_stream(rest[0], int(rest[1]), rest[2])
        print(json.dumps(out))
        return

    device = device_or_exit(args.device)
    budget_s = 1.0 if args.quick else 3.0
    queries_list = QUERIES[:2] if args.quick else QUERIES
    memories_list = MEMORIES[:2] if args.quick else MEMORIES
    regime_queries = queries_list[1:2] if args.quick else REGIME_QUERIES
    if args.queries:
        regime_queries = [int(q) for q in args.queries.split(",")]
    regime_options = {
        "alphas": [float(a) for a in args.alphas.split(",")],
        "rounds": args.rounds,
        "package": not args.no_package,
    }
    if args.only == "regimes":
        results = {**provenance(args.machine), "device": str(device)}
        results["regimes"] = regimes(
            device, memories_list[-1], regime_queries, budget_s, **regime_options
        )
        print(json.dumps(results, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        return
    results: dict = {
        **provenance(args.machine),
        "device": str(device),
        "environment": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "params": {"beta": BETA, "dim": DIM, "models": MODELS},
    }
    results["background_cpu_busy_before"] = background_load()
    print("copy bandwidth…", file=sys.stderr)
    bandwidth = copy_bandwidth(device)
    results["copy_bandwidth_gbps"] = bandwidth / 1e9
    print("grid…", file=sys.stderr)
    results["grid"] = grid(device, queries_list, memories_list, budget_s)
    print("support regimes…", file=sys.stderr)
    results["regimes"] = regimes(
        device, memories_list[-1], regime_queries, budget_s, **regime_options
    )
    if not args.quick:
        print("scaling…", file=sys.stderr)
        results["scaling"] = scaling(device, budget_s)
        if device.type == "cpu":
            print("peak RSS at Q = M = 60,000…", file=sys.stderr)
            results["rss"] = {
                name: in_subprocess("rss", name, json.dumps(MODELS[name]))
                for name in ("dense", "topk", "sparse", "linear")
            }
    if args.stream_gb > 0 and not args.quick and device.type == "cpu":
        print(f"streaming a {args.stream_gb} GB file…", file=sys.stderr)
        folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="nph-bench-"))
        try:
            path = folder / "big.safetensors"
            write_big_memory(path, int(args.stream_gb * 1e9))
            cold = drop_page_cache()
            runs = {"dense Q=100": in_subprocess("stream", str(path), "100", "dense")}
            drop_page_cache()
            runs["topk Q=100"] = in_subprocess("stream", str(path), "100", "topk")
            results["stream"] = {"cold": cold, "runs": runs}
        finally:
            shutil.rmtree(folder)
    if args.large == "on" or (args.large == "auto" and device.type == "cuda"):
        print("large cases (M = 10⁶)…", file=sys.stderr)
        results["large"] = large_cases(device, budget_s=budget_s)
    elif args.large == "dry-run":
        print("large cases, dry run (tiny sizes)…", file=sys.stderr)
        results["large"] = large_cases(device, dry_run=True, budget_s=0.2)
    print("start-up…", file=sys.stderr)
    results["startup"] = startup(budget_s)
    results["background_cpu_busy_after"] = background_load()
    results["targets"] = targets(results, bandwidth)
    emit(results, args.out)
    summary = markdown(results)
    print(summary, file=sys.stderr)
    if args.markdown:
        Path(args.markdown).write_text(summary)


if __name__ == "__main__":
    main()
