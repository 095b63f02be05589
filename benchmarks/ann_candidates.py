"""How many candidates `nph retrieve --index` needs: the share of queries certified exact
against --candidates, for topk (k = 10), sparse and entmax (docs/ann.md, "Choosing
--candidates").

    python benchmarks/ann_candidates.py MEMORY.safetensors [--queries 500]

MEMORY: e.g. `nph store mnist` (offline: the 5,000 bundled digits); flat and ivf indexes of it
are built in a temporary folder. Queries are stored patterns drawn with seed 0, bottom half
hidden (0). Prints one JSON object: per model, the exact support's quantiles and, per index
setting and candidate count, the certified fraction.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from _common import half_masked_queries

from nphcli.ann.index_file import build_index, open_index, write_index
from nphcli.ann.search import IndexedModel
from nphcli.memory.bank import TensorBank
from nphcli.memory.file import load_memory
from nphcli.models import create_model

MODELS = {"topk k=10": ("topk", {"k": 10}), "sparse": ("sparse", {}), "entmax": ("entmax", {})}
CANDIDATES = (16, 32, 64, 128, 256, 512, 1024)
SETTINGS = (("flat", None), ("ivf", 16), ("ivf", 0))  # (kind, nprobe); 0: every list


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("memory")
    parser.add_argument("--queries", type=int, default=500)
    args = parser.parse_args()
    keys = load_memory(args.memory).patterns.to(torch.float32)  # (M, d)
    queries = half_masked_queries(keys, args.queries)  # (Q, d)
    bank = TensorBank(keys)
    out: dict = {"memory": args.memory, "queries": args.queries, "models": {}}
    with tempfile.TemporaryDirectory() as folder:
        indexes = {}
        for kind in {kind for kind, _ in SETTINGS}:
            path = Path(folder) / f"memory.{kind}.index"
            write_index(
                path, *build_index(load_memory(args.memory), args.memory, kind=kind, seed=0)
            )
            indexes[kind] = open_index(path, args.memory)
        for label, (name, params) in MODELS.items():
            model = create_model(name, **params)
            support = model.retrieve(queries, keys).support.double()  # (Q,) exact
            record = {
                "support": {f"p{q}": float(support.quantile(q / 100)) for q in (50, 90, 99, 100)},
                "certified": {},
            }
            for kind, nprobe in SETTINGS:
                row = {}
                nprobe = nprobe or (indexes[kind].meta["params"]["lists"] if nprobe == 0 else None)
                for count in CANDIDATES:
                    indexed = IndexedModel(model, indexes[kind], candidates=count, nprobe=nprobe)
                    indexed.retrieve(queries, bank)
                    row[count] = float(indexed.certified.float().mean())
                record["certified"][f"{kind} nprobe={nprobe}" if nprobe else kind] = row
            out["models"][label] = record
            print(label, json.dumps(record))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
