"""Recall of real short texts from corrupted copies: every model against the nearest-neighbour
baseline, on sentence embeddings and on hashed bags of words.

Corpus: the English jokes of the `pyjokes` package (PyPI, BSD-3-Clause), de-duplicated: 283
short real texts, offline once the package is installed (`pip install pyjokes`). Each text is
corrupted, with a seed, by one of: word dropout (each word removed with probability p), word
swaps (each adjacent pair swapped with probability p), typos (each word edited with probability
p: a letter deleted, doubled or replaced). The corrupted text is embedded with the memory's
embedder and retrieved; recall@1 is the fraction of queries whose output is nearest (cosine) to
the original text's row, the same test for every model and for the baseline (`nearest`: the
stored row with the largest cosine to the query). Support: memories with non-zero weight.

    python benchmarks/text_recall.py --out benchmarks/results/text-recall-ci-2core.json
    python benchmarks/text_recall.py --small      # a dry run: hash embedder, 60 texts
    python benchmarks/text_recall.py --from-json RESULT.json --plot docs/img/text-recall.png
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, provenance  # noqa: E402

from nphcli.memory.bank import TensorBank  # noqa: E402
from nphcli.models import create_model  # noqa: E402
from nphcli.sources.embedders import resolve_embedder  # noqa: E402

CORRUPTIONS = ("dropout", "swap", "typo")
RATES = (0.1, 0.3, 0.5)
BETAS = (10.0, 30.0, 100.0)
MODELS = {  # name → parameters (k and window in rows; multihead's 4 heads of 96 or 128 dims)
    "dense": {},
    "sparse": {},
    "entmax": {"alpha": 1.5},
    "topk": {"k": 5},
    "random": {"k": 0.5},
    "window": {"window": 5},
    "linear": {},
    "random-feature": {"features": 256},
    "multihead": {"heads": 4},
}


def corpus(limit: int | None) -> list[str]:
    import pyjokes.jokes_en as jokes

    texts = sorted({joke for group in jokes.jokes_en.values() for joke in group})
    return texts[:limit] if limit else texts


def corrupt(text: str, kind: str, rate: float, rng: random.Random) -> str:
    words = text.split()
    if kind == "dropout":
        kept = [w for w in words if rng.random() >= rate]
        words = kept or words[:1]
    elif kind == "swap":
        i = 0
        while i < len(words) - 1:
            if rng.random() < rate:
                words[i], words[i + 1] = words[i + 1], words[i]
                i += 1
            i += 1
    else:
        words = [_typo(w, rng) if rng.random() < rate else w for w in words]
    return " ".join(words)


def _typo(word: str, rng: random.Random) -> str:
    if len(word) < 2:
        return word
    i = rng.randrange(len(word))
    edit = rng.choice(("delete", "double", "replace"))
    if edit == "delete":
        return word[:i] + word[i + 1 :]
    if edit == "double":
        return word[: i + 1] + word[i:]
    return word[:i] + rng.choice("abcdefghijklmnopqrstuvwxyz") + word[i + 1 :]


def measure(keys: torch.Tensor, queries: torch.Tensor) -> dict[str, dict]:
    """recall@1 and mean support of every model at every β, and of the nearest baseline."""
    unit_keys = keys / keys.norm(dim=1, keepdim=True)
    truth = torch.arange(queries.shape[0])

    def recall_at_1(outputs: torch.Tensor) -> float:
        nearest = (outputs @ unit_keys.T / outputs.norm(dim=1, keepdim=True)).argmax(dim=1)
        return float((nearest == truth).double().mean())

    found = {"nearest": {"recall_at_1": recall_at_1(queries), "support": 1.0}}
    bank = TensorBank(keys, keys)
    for name, params in MODELS.items():
        for beta in BETAS:
            rule = create_model(name, beta=beta, **params)
            result = rule.retrieve(queries, bank)
            support = None if result.support is None else float(result.support.double().mean())
            found[f"{name} β={beta:g}"] = {
                "recall_at_1": recall_at_1(result.patterns),
                "support": support,
            }
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="60 texts, hash-512 only")
    parser.add_argument("--embedders", default="all-MiniLM-L6-v2,hash-512")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path, help="also draw recall@1 against the rate (PNG)")
    parser.add_argument("--from-json", type=Path, help="draw --plot from an earlier --out")
    args = parser.parse_args(argv)
    if args.from_json:
        draw(json.loads(args.from_json.read_text()), args.plot)
        return 0
    texts = corpus(60 if args.small else None)
    names = ["hash-512"] if args.small else args.embedders.split(",")
    result = {
        "benchmark": "text_recall",
        **provenance(),
        "corpus": {"package": "pyjokes (BSD-3-Clause), jokes_en", "texts": len(texts)},
        "rates": RATES,
        "betas": BETAS,
        "models": MODELS,
        "embedders": {},
    }
    for name in names:
        started = time.perf_counter()
        embedder = resolve_embedder(name)
        keys = embedder.embed(texts)  # (M, dim)
        cells = {}
        for kind in CORRUPTIONS:
            for rate in RATES:
                rng = random.Random(f"{args.seed}-{kind}-{rate}")
                corrupted = [corrupt(text, kind, rate, rng) for text in texts]
                cells[f"{kind} {rate:g}"] = measure(keys, embedder.embed(corrupted))
        result["embedders"][name] = {
            "dim": embedder.dim,
            "seconds": time.perf_counter() - started,
            "cells": cells,
        }
    emit(result, args.out)
    if args.plot:
        draw(result, args.plot)
    return 0


def draw(result: dict, path: Path, beta: float = 30.0) -> None:
    """recall@1 against the corruption rate, one panel per embedder and corruption, one line per
    model at `beta` (and the nearest baseline)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    embedders = list(result["embedders"])
    figure, axes = plt.subplots(
        len(embedders), len(CORRUPTIONS), figsize=(12, 3.6 * len(embedders)), squeeze=False
    )
    for row, name in enumerate(embedders):
        cells = result["embedders"][name]["cells"]
        models = ["nearest", *(f"{m} β={beta:g}" for m in MODELS)]
        for col, kind in enumerate(CORRUPTIONS):
            ax = axes[row][col]
            for i, model in enumerate(models):
                values = [cells[f"{kind} {rate:g}"][model]["recall_at_1"] for rate in RATES]
                style = {"color": "black", "linewidth": 2.5} if model == "nearest" else {}
                ax.plot(RATES, values, marker="os^vD<>px"[i % 9], label=model, **style)
            ax.set_title(f"{name}: {kind}", fontsize=10)
            ax.set_xlabel("corruption rate p")
            ax.set_ylim(-0.02, 1.02)
            if col == 0:
                ax.set_ylabel("recall@1")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    figure.suptitle(
        f"{result['corpus']['texts']} real short texts (pyjokes), every model at β = {beta:g} "
        "against nearest neighbour"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
