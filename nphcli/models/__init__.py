"""The Hopfield model family. Importing this package registers every model.

Add a model: write one module with a `@register_model` class and import it below.
"""

from typing import Any

from torch import Tensor

from nphcli.memory.bank import MemoryBank
from nphcli.models import (
    classical,  # noqa: F401  (registers the models)
    dense,  # noqa: F401  (registers the model)
    entmax,  # noqa: F401  (registers the model)
    linear,  # noqa: F401  (registers the model)
    multihead,  # noqa: F401  (registers the model)
    nearest,  # noqa: F401  (registers the model)
    random_feature,  # noqa: F401  (registers the model)
    random_mask,  # noqa: F401  (registers the model)
    sparse,  # noqa: F401  (registers the model)
    topk,  # noqa: F401  (registers the model)
    window,  # noqa: F401  (registers the model)
)
from nphcli.models.base import HopfieldModel, Retrieval, Retriever, Update
from nphcli.models.registry import (
    ModelInfo,
    create_model,
    get_model_info,
    layer_model_names,
    list_models,
    model_names,
)
from nphcli.schema.catalog import ModelCard, serve_live_cards


def _live_cards() -> list[ModelCard]:
    """The registry as the torch-free catalog describes models (`nph models`, option help)."""
    return [ModelCard(i.name, i.summary, i.formula, i.cost, i.params) for i in list_models()]


serve_live_cards(_live_cards)


def retrieve(
    queries: Tensor,
    memory: Tensor | MemoryBank,
    values: Tensor | None = None,
    *,
    model: str = "dense",
    memory_budget: int | None = None,
    **params: Any,
) -> Retrieval:
    """The bare retrieval rule T applied to `queries`: no corruption, no metrics.

    Args:
        queries: (Q, d) tensor.
        memory: keys (M, d), or a `MemoryBank` such as `open_memory`'s `Memory`.
        values: (M, d_v) values for hetero-association (default: the keys).
        model: a registered model's name (`nph models`).
        memory_budget: bytes of working memory (default 512 MiB); changes speed, not results.
        **params: the model's parameters, e.g. k=10, beta=0.5.

    Returns:
        `Retrieval`: patterns (Q, d_v), steps (Q,), support (Q,) or None.

    Example:
        >>> out = nph.retrieve(memory.patterns[:5], memory, model="topk", k=10)
        >>> out.patterns.shape  # (5, d)

    Use `create_model` to keep a rule and apply it many times.
    """
    rule = create_model(model, **params)
    return rule.retrieve(queries, memory, values, memory_budget=memory_budget)


__all__ = [
    "HopfieldModel",
    "Retriever",
    "ModelInfo",
    "Retrieval",
    "Update",
    "create_model",
    "get_model_info",
    "layer_model_names",
    "list_models",
    "model_names",
    "retrieve",
]
