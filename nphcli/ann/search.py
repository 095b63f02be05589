"""Hopfield retrieval over an approximate index: candidates from FAISS, the rest exact.

The candidates' scores are recomputed exactly and the model's `CandidateRule` weighs them, so the
index can get wrong only which memories are candidates. A result is certified exact when every
unseen memory scores below the rule's cut, bounded per kind (`unseen_bound`): flat, the c-th
found score; ivf, that for probed lists and ⟨x, c_j⟩ + ‖x‖·r_j for unprobed list j
(Cauchy–Schwarz, r_j its radius); ivfpq, the centroid bound for every list; hnsw, ‖x‖·max‖ξ‖.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from nphcli.ann.index_file import AnnIndex, require_faiss
from nphcli.core.defaults import DEFAULT_CANDIDATES, DEFAULT_EF, DEFAULT_NPROBE
from nphcli.core.errors import NphError
from nphcli.engine.candidate_rule import CandidateRule
from nphcli.engine.exact_search import torch_topk
from nphcli.engine.selection import stable_top
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import Retrieval
from nphcli.models.inputs import check_output

SLACK = 1e-5  # relative to ‖x‖·max‖ξ‖: FAISS vs recomputed scores differ by rounding
GATHER_ELEMENTS = 1 << 24  # floats of gathered candidate rows per query chunk


@dataclass
class Candidates:
    """One search: per query the candidate ids (index order, −1 missing last) and exact scores."""

    ids: Tensor  # (Q, c) int64
    scores: Tensor  # (Q, c) exact ⟨x, ξ⟩, −inf where missing
    bound: Tensor  # (Q,) upper bound on every unseen memory's score


@dataclass
class IndexedModel:
    """A sparse-structured model whose candidates come from an index; reads like the model."""

    model: Any  # HopfieldModel
    index: AnnIndex
    candidates: int | None = None  # per query; None: max(the rule's minimum, DEFAULT_CANDIDATES)
    nprobe: int | None = None  # IVF kinds
    ef: int | None = None  # HNSW
    certified: Tensor | None = field(default=None, repr=False)  # (Q,) of the last retrieve
    _by_position: dict[int, bool] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_depth(self.index.kind, self.nprobe, self.ef, "this one")
        depths = (("--nprobe", self.nprobe), ("--ef", self.ef), ("--candidates", self.candidates))
        for flag, value in depths:
            if value is not None and (isinstance(value, bool) or value < 1):
                raise NphError(f"{flag} must be a whole number ≥ 1, got {value!r}")
        if self.model.steps != 1:
            raise NphError("--index retrieves one step; use --steps 1")
        self.rule(self.index.meta["M"])  # refuses models that cannot use an index

    def __getattr__(self, name: str) -> Any:
        # Parameters (beta, k, alpha, ...) are the model's.
        if name in ("model", "index") or name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.model, name)

    def rule(self, num_memories: int) -> CandidateRule:
        return candidate_rule(self.model, num_memories)

    def count(self, num_memories: int) -> int:
        """Candidates fetched per query."""
        rule = self.rule(num_memories)
        wanted = self.candidates if self.candidates is not None else DEFAULT_CANDIDATES
        return min(num_memories, max(rule.minimum, wanted))

    def check_memory(self, memory: MemoryBank) -> None:
        self.model.check_memory(memory)
        meta = self.index.meta
        if (memory.num_memories, memory.dim) != (meta["M"], meta["d"]):
            raise NphError(
                f"{self.index.path} indexes M = {meta['M']}, d = {meta['d']} but the memory has "
                f"M = {memory.num_memories}, d = {memory.dim}; rebuild the index"
            )

    def search(self, queries: Tensor, bank: MemoryBank) -> Candidates:
        """Candidates (index order), their exact scores, and the bound on unseen scores."""
        faiss = require_faiss()
        if queries.device.type != "cpu":
            raise NphError("--index searches on the CPU; use --device cpu")
        num_memories = bank.num_memories
        count = self.count(num_memories)
        faiss.omp_set_num_threads(torch.get_num_threads())
        xq = queries.detach().to(torch.float32).contiguous().numpy()
        found, ids = faiss_search(faiss, self.index, xq, count, self.nprobe, self.ef)
        ids = torch.from_numpy(ids)  # (Q, c), −1 where fewer were found
        found = torch.from_numpy(found)  # (Q, c) FAISS's (maybe approximate) scores
        missing = ids < 0
        ids = torch.sort(torch.where(missing, num_memories, ids), dim=1).values  # index order
        missing = ids >= num_memories
        ids = torch.where(missing, 0, ids)
        scores = exact_scores(queries, bank, ids)  # (Q, c)
        scores = scores.masked_fill(missing, -torch.inf)
        bound = unseen_bound(self.index, queries, found, missing.any(dim=1), self.nprobe)
        return Candidates(ids=ids, scores=scores, bound=bound)

    def retrieve(
        self,
        queries: Tensor,
        memory: MemoryBank,
        *,
        positions: Tensor | None = None,
        memory_budget: int | None = None,
    ) -> Retrieval:
        """T(x) from the candidates; records which queries are certified exact."""
        found = self.search(queries, memory)
        weights, cut = self.rule(memory.num_memories).apply(found.scores)  # (Q, c), (Q,)
        patterns = memory.weighted_sum(found.ids, weights.to(memory.dtype))  # (Q, d_v)
        check_output(patterns)
        self.certified = found.bound < cut  # (Q,)
        if positions is not None:
            self._by_position.update(zip(positions.tolist(), self.certified.tolist(), strict=True))
        support = (weights > 0).sum(dim=1)  # (Q,)
        steps = torch.ones(queries.shape[0], dtype=torch.int64)
        return Retrieval(patterns=patterns.to(queries.dtype), steps=steps, support=support)

    def certified_at(self, positions: Tensor) -> Tensor | None:
        """Whether the latest retrieval of each query position (Q,) was certified exact."""
        if not self._by_position:
            return None
        return torch.tensor([self._by_position.get(p, False) for p in positions.tolist()])

    def compare_exact(
        self,
        queries: Tensor,
        bank: MemoryBank,
        *,
        sample: int,
        seed: int,
        targets: Tensor | None = None,
    ) -> dict[str, Any]:
        """On a seeded sample of the queries: the index's recall@k against exact search, and how
        far the patterns (and their error against the targets) are from exact retrieval."""
        num_queries, num_memories = queries.shape[0], bank.num_memories
        generator = torch.Generator().manual_seed(seed)
        rows = torch.randperm(num_queries, generator=generator)[: min(sample, num_queries)]
        rows = torch.sort(rows).values  # (N,)
        x = queries[rows]  # (N, d)
        rule = self.rule(num_memories)
        k = min(rule.report_k, self.count(num_memories))
        found = self.search(x, bank)
        order = stable_top(found.scores, k)
        approx_top = found.ids.gather(1, order)  # (N, k)
        valid = torch.isfinite(found.scores.gather(1, order))  # (N, k)
        exact_top = torch_topk(x, bank, k, block_rows=max(1, GATHER_ELEMENTS // bank.dim))[1]
        hits = (approx_top.unsqueeze(2) == exact_top.unsqueeze(1)) & valid.unsqueeze(2)
        recall = hits.any(dim=1).float().mean(dim=1)  # (N,) share of exact top-k found
        approx = self.retrieve(x, bank).patterns  # (N, d_v)
        certified = self.certified
        exact = self.model.retrieve(x, bank).patterns  # (N, d_v)
        gap = torch.linalg.vector_norm(approx - exact, dim=1)  # (N,)
        out: dict[str, Any] = {
            "queries": int(rows.numel()),
            "seed": seed,
            "k": k,
            "recall_at_k": float(recall.mean()),
            "pattern_gap_mean": float(gap.mean()),
            "pattern_gap_max": float(gap.max()),
            "certified_fraction": float(certified.float().mean()),
            "sse_difference_mean": None,
        }
        if targets is not None:
            y = targets[rows].to(approx.dtype)  # (N, d_v)
            sse_approx = (approx - y).pow(2).sum(dim=1)
            sse_exact = (exact - y).pow(2).sum(dim=1)
            out["sse_difference_mean"] = float((sse_approx - sse_exact).mean())
        return out


def check_depth(kind: str, nprobe: int | None, ef: int | None, where: str) -> None:
    """Refuse a search-depth option the index kind does not have."""
    if nprobe is not None and kind not in ("ivf", "ivfpq"):
        raise NphError(f"--nprobe applies to ivf and ivfpq indexes; {where} is {kind}")
    if ef is not None and kind != "hnsw":
        raise NphError(f"--ef applies to hnsw indexes; {where} is {kind}")


def candidate_rule(model: Any, num_memories: int) -> CandidateRule:
    """The model's `CandidateRule`, or the error for a model that needs every score."""
    rule = model.candidate_rule(num_memories)
    if rule is None:
        raise NphError(
            f"--model {model.name} needs every memory's score and cannot use an index; "
            "use topk, sparse or entmax, or drop --index"
        )
    return rule


def search_depth(
    index: AnnIndex, count: int, nprobe: int | None, ef: int | None
) -> dict[str, int | None]:
    """The nprobe (≤ the lists) and efSearch (≥ count) a search of `count` candidates uses,
    None where the kind has none."""
    if index.kind in ("ivf", "ivfpq"):
        lists = require_faiss().extract_index_ivf(index.faiss_index).nlist
        return {"nprobe": min(nprobe or DEFAULT_NPROBE, lists), "ef": None}
    if index.kind == "hnsw":
        return {"nprobe": None, "ef": max(ef or DEFAULT_EF, count)}
    return {"nprobe": None, "ef": None}


def faiss_search(faiss, index: AnnIndex, xq, count: int, nprobe: int | None, ef: int | None):
    """FAISS search with the run's nprobe / efSearch (`search_depth`): scores and ids, (Q, c)."""
    depth, params = search_depth(index, count, nprobe, ef), None
    if depth["nprobe"] is not None:
        params = faiss.SearchParametersIVF(nprobe=depth["nprobe"])
    elif depth["ef"] is not None:
        params = faiss.SearchParametersHNSW(efSearch=depth["ef"])
    return index.faiss_index.search(xq, count, params=params)


def exact_scores(queries: Tensor, bank: MemoryBank, ids: Tensor) -> Tensor:
    """⟨x_q, ξ_ids[q, j]⟩ (Q, c) from the stored patterns, in chunks of gathered rows."""
    count = ids.shape[1]
    chunk = max(1, GATHER_ELEMENTS // max(1, count * bank.dim))
    parts = []
    for start in range(0, queries.shape[0], chunk):
        keys, _ = bank.gather(ids[start : start + chunk])  # (C, c, d)
        x = queries[start : start + chunk].to(keys.dtype)  # (C, d)
        parts.append(torch.einsum("qcd,qd->qc", keys, x))  # (C, c)
    return torch.cat(parts).to(queries.dtype)


def unseen_bound(
    index: AnnIndex, queries: Tensor, found: Tensor, short: Tensor, nprobe: int | None
) -> Tensor:
    """An upper bound (Q,) on every unseen memory's score; `found` (Q, c) FAISS's scores,
    `short` (Q,) rows with missing ids."""
    x = queries.detach().to(torch.float32)  # (Q, d)
    norm = torch.linalg.vector_norm(x, dim=1)  # (Q,)
    everything = norm * index.max_norm  # (Q,) Cauchy–Schwarz
    slack = SLACK * everything
    count = found.shape[1]
    if index.meta["M"] <= count:
        return torch.full_like(norm, -torch.inf)
    last = torch.where(short, -torch.inf, found[:, -1])  # (Q,) c-th score of a full row
    if index.kind == "flat":
        return last + slack
    if index.kind == "hnsw":
        return everything + slack
    lists = index.centroids.shape[0]
    per_list = x @ index.centroids.T + norm.unsqueeze(1) * index.radii  # (Q, nlist)
    if index.kind == "ivfpq":
        return torch.minimum(per_list.amax(dim=1), everything) + slack
    probe = min(nprobe or DEFAULT_NPROBE, lists)
    _, probed = index.faiss_index.quantizer.search(x.contiguous().numpy(), probe)  # (Q, p)
    probed = torch.from_numpy(probed)
    unprobed = per_list.scatter(1, probed.clamp(min=0), -torch.inf)  # (Q, nlist)
    return torch.maximum(last, unprobed.amax(dim=1)) + slack
