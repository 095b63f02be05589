"""Start-up cost of the `nph` command: many settings in one call against one, and static commands.

    python benchmarks/startup.py [--repeats 5] [--settings 10] [--out FILE]

Prints one JSON object on stdout (and to --out). Everything is timed from outside, as a script
sees it: the wall time of whole `python -m nphcli ...` processes (this checkout's `nphcli`),
importing torch included. In the same run and in turn (A B C A B C ...), so that a drifting
machine load hits each alike:

- `single`: `nph retrieve --model topk --k 1 --json` on 100 bundled MNIST digits;
- `many`: the same call with `--k 1,2,...,N` (N settings, default 10);
- `models`: `nph models` (static text: must not import torch);
- `python`, `import typer`: the interpreter alone and with the CLI framework, as floors.

Targets (issue 11): many / single ≤ 1.5 (the ratio is taken pair by pair, then the median);
`nph models` ≤ 0.3 s. The loop a script would otherwise run costs about N × single. Children
run with OMP_NUM_THREADS=1. Wall and CPU (user + system) seconds are both recorded, and the load
average before and after, because a shared machine inflates wall time far more than CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.5
TARGET_MODELS_S = 0.3


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _run(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one process running `argv`; it must succeed. CPU is user +
    system time of the finished child, which a busy machine inflates much less than wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _summary(times: list[float]) -> dict[str, float]:
    return {"min_s": min(times), "median_s": statistics.median(times), "max_s": max(times)}


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each command")
    parser.add_argument("--settings", type=int, default=10, help="settings in the `many` call")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    load_before = _loadavg()
    with tempfile.TemporaryDirectory(prefix="nph-startup-") as folder:
        cwd = Path(folder)
        nph = [sys.executable, "-m", "nphcli"]
        _run([*nph, "store", "mnist", "--n", "100"], cwd)
        ks = ",".join(str(k) for k in range(1, args.settings + 1))
        commands = {
            "single": [*nph, "retrieve", "--model", "topk", "--k", "1", "--json"],
            "many": [*nph, "retrieve", "--model", "topk", "--k", ks, "--json"],
            "models": [*nph, "models"],
            # floors for `nph models`: the interpreter alone, and the CLI framework's import
            "python": [sys.executable, "-c", "pass"],
            "import typer": [sys.executable, "-c", "import typer"],
        }
        for command in commands.values():  # warm-up: page cache, .pyc files
            _run(command, cwd)
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, command in commands.items():
                wall, used = _run(command, cwd)
                times[name].append(wall)
                cpu[name].append(used)
    ratios = [m / s for m, s in zip(times["many"], times["single"], strict=True)]
    ratio = statistics.median(ratios)
    models_s = min(times["models"])
    result = {
        "benchmark": "startup",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "settings": args.settings,
        "load_average_before": load_before,
        "load_average_after": _loadavg(),
        "commands": {name: " ".join(command[1:]) for name, command in commands.items()},
        "wall": {name: _summary(values) for name, values in times.items()},
        "cpu": {name: _summary(values) for name, values in cpu.items()},
        "many_over_single": {
            "median_of_pairs": ratio,
            "min_over_min": min(times["many"]) / min(times["single"]),
            "loop_estimate_s": args.settings * statistics.median(times["single"]),
        },
        "targets": {
            f"many / single <= {TARGET_RATIO}": {"value": ratio, "met": ratio <= TARGET_RATIO},
            f"nph models <= {TARGET_MODELS_S} s (min wall)": {
                "value": models_s,
                "met": models_s <= TARGET_MODELS_S,
            },
            f"nph models <= {TARGET_MODELS_S} s (min CPU)": {
                "value": min(cpu["models"]),
                "met": min(cpu["models"]) <= TARGET_MODELS_S,
            },
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
