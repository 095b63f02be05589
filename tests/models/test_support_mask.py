"""A model's declared support set is the one it really retrieves over."""

from __future__ import annotations

import pytest
import torch

from nphcli.models import create_model, model_names

PARAMS = {"topk": {"k": 4}, "random": {"k": 4, "seed": 3}, "window": {"window": 2}}
# Models whose weights are not a softmax over a support set: they declare none.
NOT_STRUCTURED = {
    "sparse",
    "entmax",
    "linear",
    "random-feature",
    "multihead",
    "nearest",
    "hebbian",
    "pseudoinverse",
}


@pytest.mark.parametrize("name", [n for n in model_names() if n not in NOT_STRUCTURED])
def test_support_mask_matches_retrieval(name, device):
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(11, 6, generator=g, dtype=torch.float64).to(device)  # (M, d)
    queries = torch.randn(5, 6, generator=g, dtype=torch.float64).to(device)  # (Q, d)
    positions = torch.tensor([0, 3, 5, 9, 10], device=device)
    model = create_model(name, beta=0.7, **PARAMS.get(name, {}))
    support = model.support_mask(queries @ keys.T, positions)
    assert support is not None, f"{name} retrieves over a support set but declares none"
    scores = (0.7 * queries @ keys.T).masked_fill(~support, -torch.inf)  # (Q, M)
    expected = torch.softmax(scores, dim=1) @ keys  # (Q, d)
    got = model.retrieve(queries, keys, positions=positions).patterns
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(NOT_STRUCTURED & set(model_names())))
def test_other_models_declare_no_support_set(name):
    model = create_model(name, **PARAMS.get(name, {}))
    assert model.support_mask(torch.zeros(2, 3), torch.arange(2)) is None


def test_structured_models_are_found_by_capability_not_name():
    from nphcli.theory.checks import is_structured

    found = {name for name in model_names() if is_structured(name, PARAMS.get(name, {}))}
    assert found == {"dense", "topk", "random", "window"}
    assert not is_structured("topk", {"k": 4, "steps": 2})
