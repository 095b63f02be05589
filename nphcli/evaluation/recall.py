"""What a retrieval recalled, in the memory's own terms: for each query, the stored rows that
carry its weight (for rules that form weights over the memories) and the stored row nearest to
what it returned; with the memory's items (`nphcli.memory.items`), their ids and texts (in a
hetero-associative memory, the nearest row is named by its value's item: the answer recalled).

The weights are those of the last update: w = rule(β·K·x) for the state x it was applied to
(the query itself in one-step retrieval; after s − 1 updates for s steps), over every stored
row, so the listed weights are exactly the ones the retrieval summed. Rules that never form
weights (linear, random features, multihead's per-head slices, the baselines) list none; every
rule gets the nearest stored row to its output, by cosine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from nphcli.memory.bank import MemoryBank
from nphcli.memory.items import Items
from nphcli.models.base import Retriever, forms_weights

TOP = 5  # recalled rows listed per query, by weight
SCORE_CELLS = 1 << 24  # scores held at once: (queries in a pass) × M, float64 (128 MiB)
LIMIT = 100  # queries a retrieval lists what they recalled for (a table to read, not a dump)
PASS_LIMIT = 20  # ... and passes over the memory that may take: every pass reads all of it


def applies(queries: int, memories: int) -> bool:
    """Whether a retrieval of `queries` lists what each recalled: a table to read (at most
    `LIMIT` queries) that costs at most `PASS_LIMIT` reads of the memory."""
    return queries <= LIMIT and -(-queries // _chunk(memories)) <= PASS_LIMIT


def _chunk(memories: int) -> int:
    return max(1, SCORE_CELLS // max(memories, 1))


def recall(
    model: Retriever,
    memory: MemoryBank,
    queries: Tensor,  # (Q, d) the queries retrieved (after corruption)
    retrieved: Tensor,  # (Q, d_v) what the retrieval returned
    *,
    items: Items | None = None,
    top: int = TOP,
) -> list[dict[str, Any]]:
    """One object per query: `recalled` (up to `top` rows with weight > 0, heaviest first, each
    {row, weight[, id, text]}; None for rules without weights), `support` (rows with weight >
    0) and `nearest` ({row, cosine[, id, text]}: the stored value nearest to the output)."""
    memory = memory.to(device=torch.device("cpu"))  # blocks are widened to float64 one by one
    queries, retrieved = queries.cpu().double(), retrieved.cpu().double()
    states = _last_states(model, memory, queries)  # (Q, d)
    found = []
    chunk = _chunk(memory.num_memories)
    weighs = forms_weights(model) and not model.baseline  # a baseline has no weights' form
    for start in range(0, queries.shape[0], chunk):
        rows = slice(start, start + chunk)
        nearest_row, cosine = _nearest(memory, retrieved[rows])
        if weighs:
            weights = _weights(model, memory, states[rows], start)  # (q, M)
        for i in range(nearest_row.shape[0]):
            entry: dict[str, Any] = {
                "nearest": {"row": int(nearest_row[i]), "cosine": float(cosine[i])}
            }
            if weighs:
                kept = torch.nonzero(weights[i] > 0).flatten()
                order = kept[weights[i, kept].argsort(descending=True, stable=True)][:top]
                entry["support"] = int(kept.numel())
                entry["recalled"] = [{"row": int(r), "weight": float(weights[i, r])} for r in order]
            else:
                entry["support"], entry["recalled"] = None, None
            found.append(entry)
    if items is not None:
        _name(found, items)
    return found


def _last_states(model: Retriever, memory: MemoryBank, queries: Tensor) -> Tensor:
    """The states the last update was applied to: x after s − 1 updates (the queries if s = 1)."""
    if model.steps <= 1:
        return queries
    earlier = dataclasses.replace(model, steps=model.steps - 1)
    return earlier.retrieve(queries, memory.to(dtype=torch.float64)).patterns.double()


def _weights(model: Retriever, memory: MemoryBank, states: Tensor, first: int) -> Tensor:
    """The rule's weights (q, M) over every stored row, for the queries at positions first…"""
    scores = torch.cat(
        [model.beta * states @ keys.double().T for _, keys in memory.key_blocks(65536)], dim=1
    )  # (q, M)
    valid = torch.ones(1, scores.shape[1], dtype=torch.bool)  # (1, M)
    positions = torch.arange(first, first + states.shape[0])  # (q,)
    return model.weights(scores[None, None], valid, positions)[0, 0]  # (q, M)


def _nearest(memory: MemoryBank, outputs: Tensor) -> tuple[Tensor, Tensor]:
    """The stored row whose value has the largest cosine with each output, and that cosine."""
    unit = outputs / outputs.norm(dim=1, keepdim=True).clamp_min(1e-300)  # (q, d_v)
    best = torch.full((outputs.shape[0],), -2.0, dtype=torch.float64)
    where = torch.zeros(outputs.shape[0], dtype=torch.int64)
    for start, _, values in memory.blocks(65536):
        values = values.double()  # (B, d_v)
        norms = values.norm(dim=1).clamp_min(1e-300)  # (B,)
        cosines = (unit @ values.T) / norms  # (q, B)
        value, index = cosines.max(dim=1)
        better = value > best
        best = torch.where(better, value, best)
        where = torch.where(better, index + start, where)
    return where, best


def _name(found: list[dict[str, Any]], items: Items) -> None:
    rows = sorted(
        {e["nearest"]["row"] for e in found}
        | {r["row"] for e in found for r in (e["recalled"] or [])}
    )
    named = {item["row"]: item for item in items.get(rows)}
    for entry in found:
        for target in entry["recalled"] or []:  # a row's key item, and its value's if hetero
            item = named[target["row"]]
            target.update({key: item[key] for key in ("id", "text", "value") if key in item})
        nearest = entry["nearest"]  # an output is a value: a hetero memory's value item
        item = named[nearest["row"]]
        item = item.get("value", item)
        nearest.update({key: item[key] for key in ("id", "text") if key in item})
