"""Recalling stored items from a text (`nph recall`, `nph serve`'s `recall` tool, `nph.recall`).

For a query x (embedded as the memory's rows were) the rule weighs every stored row,
w = rule(β·K·x); each row with w > 0 is listed with its id, text, weight and score ⟨x, ξ_j⟩. A
rule that forms no weights lists the k highest scores. Defaults: the memory's `recall` record,
else sparsemax at β = 30 (`core.defaults.ITEM_RECALL`): a peaked answer that shows competition.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from nphcli.core.defaults import ITEM_RECALL
from nphcli.core.errors import NphError
from nphcli.evaluation.recall import recall as weighed
from nphcli.memory.bank import MemoryBank
from nphcli.memory.items import Items, open_items
from nphcli.memory.open import open_memory
from nphcli.memory.provenance import provenance
from nphcli.models import create_model
from nphcli.models.base import forms_weights
from nphcli.sources.embedders import Embedder, check_same_embedder, resolve_embedder
from nphcli.version import __version__

DEFAULT_K = 5  # items listed per recall


@dataclass(frozen=True)
class Recalled:
    """One recall: what was asked, how, and the items recalled."""

    query: str | None  # the text (None: a vector was given)
    model: str
    params: dict[str, Any]  # β and the model's other parameters, as used
    support: int | None  # rows with weight > 0 (None: the rule forms no weights)
    items: list[dict[str, Any]]  # {id, text, weight, score, row}, heaviest first
    memory: dict[str, Any] = field(default_factory=dict)  # what it came from: sha256, path, M

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "nph_version": __version__}


class Recaller:
    """A memory, its items and its embedder, loaded once, recalling any number of queries."""

    def __init__(self, memory: MemoryBank, items: Items | None, name: str = "the memory"):
        self.memory, self.items, self.name = memory, items, name
        self._embedder: Embedder | None = None

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = True) -> Recaller:
        """Open the memory file at `path` (one that grew with `nph add` too); `verify`: check
        its segments' checksums (`open_memory`)."""
        memory = open_memory(path, verify=verify)
        return cls(memory, open_items(path, memory.meta), str(path))

    def defaults(self) -> dict[str, Any]:
        """The model and parameters a recall uses unless told otherwise."""
        recorded = self.memory.meta.get("recall")
        return dict(recorded) if isinstance(recorded, dict) else dict(ITEM_RECALL)

    def embed(self, text: str) -> torch.Tensor:
        """(1, d) the text embedded as the memory's rows were; the embedder loads once."""
        record = self.memory.meta.get("embedder")
        if not record:
            raise NphError(
                f"{self.name} holds vectors stored without an embedder: give the query as a "
                "vector, or store texts (`nph store texts.txt --embed MODEL`)"
            )
        if self._embedder is None:
            embedder = resolve_embedder(record["name"])
            check_same_embedder(record, embedder, self.name)
            self._embedder = embedder
        return self._embedder.embed([text])

    def recall(
        self,
        query: str | list[float],
        *,
        k: int = DEFAULT_K,
        model: str | None = None,
        beta: float | None = None,
        params: dict[str, Any] | None = None,
    ) -> Recalled:
        """The items `query` (a text, or a vector of d numbers) recalls: at most `k`, by
        `model` with inverse temperature `beta` and the model's other `params` (e.g. topk's
        {"k": 3}); each None: the memory's defaults (`defaults`)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise NphError(f"k must be a whole number ≥ 1, got {k!r}")
        x, text = self._query(query)  # (1, d)
        chosen = self.defaults()
        if model is not None and model != chosen.get("model"):
            chosen = {"model": model}  # another model: its own defaults
        given = {**(params or {}), **({} if beta is None else {"beta": beta})}
        chosen.update({key: value for key, value in given.items() if value is not None})
        name = chosen.pop("model")
        rule = create_model(name, **chosen)
        memory = self.memory
        query = x[0].float()  # (d,) float32 products: the stored rows' own precision
        scores = torch.cat(
            [(keys.float() @ query).double() for _, keys in memory.key_blocks(1 << 16)]
        )  # (M,) ⟨x, ξ_j⟩
        if forms_weights(rule) and not rule.baseline and rule.steps == 1:
            valid = torch.ones(1, scores.shape[0], dtype=torch.bool)  # (1, M)
            weights = rule.weights(rule.beta * scores[None, None, None], valid, torch.zeros(1))
            weights = weights[0, 0, 0]  # (M,) the rule's own weights, w = rule(β·K·x)
            kept = torch.nonzero(weights > 0).flatten()
            order = kept[weights[kept].argsort(descending=True, stable=True)][:k]
            found = [(int(r), float(weights[r])) for r in order]
            support = int(kept.numel())
        else:  # iterated, or no weights of its own: the retrieval's weights, else top scores
            out = rule.retrieve(x.to(memory.dtype), memory).patterns  # (1, d_v)
            (entry,) = weighed(rule, memory, x, out, top=k)
            support = entry["support"]
            if entry["recalled"] is None:
                top = scores.topk(min(k, scores.numel())).indices  # (k,)
                found = [(int(row), None) for row in top]
            else:
                found = [(r["row"], r["weight"]) for r in entry["recalled"]]
        rows = [row for row, _ in found]
        named = self.items.get(rows) if self.items is not None else None
        listed = []
        for i, (row, weight) in enumerate(found):
            item = {"id": row, "text": None} if named is None else named[i]
            scored = {"weight": weight, "score": float(scores[row]), "row": row}
            listed.append({"id": item["id"], "text": item.get("text"), **scored})
        beta_used = {"beta": rule.beta} if hasattr(rule, "beta") else {}  # baselines take none
        used = beta_used | {key: getattr(rule, key) for key in chosen if key != "beta"}
        origin = provenance(memory)
        source = {"sha256": origin["sha256"], "path": origin["path"], "M": memory.num_memories}
        return Recalled(text, name, used, support, listed, source)

    def _query(self, query: str | list[float]) -> tuple[torch.Tensor, str | None]:
        if isinstance(query, str):
            if not query.strip():
                raise NphError("the query is empty; give a text to recall from")
            return self.embed(query).double(), query
        try:
            x = torch.as_tensor(query, dtype=torch.float64).reshape(1, -1)  # (1, d)
        except (TypeError, ValueError, RuntimeError):
            raise NphError("a query is a text or a list of numbers") from None
        if x.shape[1] != self.memory.dim or not torch.isfinite(x).all():
            raise NphError(f"a query vector needs {self.memory.dim} finite numbers")
        if (self.memory.meta.get("embedder") or {}).get("normalize") == "l2":
            x = x / x.norm().clamp_min(1e-300)  # as the stored rows were
        return x, None


def recall(
    memory: str | os.PathLike | MemoryBank,
    query: str | list[float],
    *,
    k: int = DEFAULT_K,
    model: str | None = None,
    beta: float | None = None,
    params: dict[str, Any] | None = None,
) -> Recalled:
    """The items of `memory` (a memory file's path, or an open bank) that `query` (a text, or
    a vector) recalls, heaviest first (`Recaller.recall`). Open a `Recaller` once to recall
    many queries: the memory and its embedder then load once."""
    if isinstance(memory, MemoryBank):
        recaller = Recaller(memory, open_items(memory.path, memory.meta) if memory.path else None)
    else:
        recaller = Recaller.open(memory)
    return recaller.recall(query, k=k, model=model, beta=beta, params=params)
