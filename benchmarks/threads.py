"""Benchmark torch's CPU threads for nph's commands, quiet and beside a competing process.

    python benchmarks/threads.py [--memories 60000] [--batch 1000] [--trials 5]
                                 [--threads 1,2] [--skip-sweep] [--out FILE]

Cases, each timed with 1 thread and with one per core (`--threads`), first with the machine as
it is ("quiet") and then beside a competing process that spins on one core ("busy"):
- `retrieve 1 query` and `retrieve Q queries`: dense retrieval over a random memory of
  `--memories` rows (d = 784, float32, written by `nph store random`), the median of 5 timed
  retrievals after a warm-up (`retrieve_median_s` of `nph retrieve --json`), in this process;
- `sweep`: `nph sweep --preset paper-mask --dataset mnist --trials T` in a subprocess, its
  `wall_s`, with `--threads N` and with no option at all (nph's default).
Ratios are within this run: seconds with N threads over seconds with 1. Prints one JSON object
(also written to --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from nphcli.app.request import request_from, run_request
from nphcli.core.devices import use_threads

BUSY = "while True: pass"


@contextmanager
def competing(busy: bool):
    """A process spinning on one core while inside (when `busy`)."""
    if not busy:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.5)  # let it reach the scheduler
        yield
    finally:
        spinner.kill()
        spinner.wait()


def retrieve_seconds(memory: Path, queries: int, threads: int) -> float:
    """Median seconds of one dense retrieval of `queries` stored patterns (5 timed calls)."""
    use_threads(threads)
    values = {"memory": [str(memory)], "queries": [queries], "repeat": [5], "threads": [threads]}
    (report,) = run_request(request_from(values)).reports
    return report.to_json()["timing"]["retrieve_median_s"]


def sweep_seconds(trials: int, threads: int | None, folder: Path) -> float:
    """`wall_s` of the paper-mask preset over `trials` trials (threads None: nph's default)."""
    out = folder / f"sweep-{threads}-{time.monotonic_ns()}.jsonl"
    command = [sys.executable, "-m", "nphcli", "sweep", "--preset", "paper-mask"]
    command += ["--dataset", "mnist", "--trials", str(trials), "--out", str(out), "--json"]
    if threads is not None:
        command += ["--threads", str(threads)]
    env = {k: v for k, v in os.environ.items() if k not in ("NPH_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)["wall_s"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=60000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--threads", default=f"1,{os.cpu_count() or 1}")
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.threads.split(",")]
    result: dict = {
        "machine": {
            "platform": platform.platform(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
        },
        "memories": args.memories,
        "batch": args.batch,
        "trials": args.trials,
        "load_average": {},
        "cases": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        memory = folder / "memory.safetensors"
        subprocess.run(
            [sys.executable, "-m", "nphcli", "store", "random", "--n", str(args.memories)]
            + ["--dim", "784", "--out", str(memory)],
            check=True,
            capture_output=True,
        )
        for load in ("quiet", "busy"):
            with competing(load == "busy"):
                cases = {}
                for queries in (1, args.batch):
                    name = f"retrieve {queries} quer{'y' if queries == 1 else 'ies'}"
                    cases[name] = {n: retrieve_seconds(memory, queries, n) for n in counts}
                if not args.skip_sweep:
                    sweep = {n: sweep_seconds(args.trials, n, folder) for n in counts}
                    sweep["default"] = sweep_seconds(args.trials, None, folder)
                    cases[f"sweep paper-mask, {args.trials} trials"] = sweep
                result["load_average"][load] = os.getloadavg()
            for name, seconds in cases.items():
                one = seconds[counts[0]]
                ratios = {f"{n}/{counts[0]}": s / one for n, s in seconds.items() if n != counts[0]}
                case = {"seconds": {str(n): s for n, s in seconds.items()}, "ratio": ratios}
                result["cases"][f"{name}, {load}"] = case
                print(f"{name}, {load}: {json.dumps(case)}", file=sys.stderr, flush=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
