"""Metrics against hand-computed values and an independent full-matrix nearest search."""

from __future__ import annotations

import math

import pytest
import torch

from nphcli.evaluation import metrics


def test_sse_mse_cosine_by_hand():
    y = torch.tensor([[1.0, 2.0, 2.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    t = torch.tensor([[1.0, 0.0, 0.0], [3.0, 4.0, 0.0], [-2.0, 0.0, 0.0]])
    assert metrics.sse(y, t).tolist() == [8.0, 25.0, 9.0]  # 0+4+4, 9+16, 9
    out = metrics.per_query(y, t, targets=t)
    assert out["mse"].tolist() == pytest.approx([8 / 3, 25 / 3, 3.0])
    # ⟨y, t⟩ / (‖y‖‖t‖): 1 / (3·1); zero vector → 0 by definition; opposite → −1
    assert metrics.cosine(y, t).tolist() == pytest.approx([1 / 3, 0.0, -1.0])


def test_cosine_of_zero_vectors_is_zero_not_nan():
    zeros = torch.zeros(2, 4)
    assert metrics.cosine(zeros, zeros).tolist() == [0.0, 0.0]


def test_nearest_by_hand_with_ties_to_the_lowest_index():
    stored = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    points = torch.tensor([[1.9, 0.1], [1.0, 1.0], [0.0, 0.0], [2.0, 0.0]])
    index, distance = metrics.nearest(points, stored, block_elements=1)
    # (1, 1) is √2 from rows 0, 1, 2 and 3: lowest index 0. (2, 0) is rows 1 and 3: 1.
    assert index.tolist() == [1, 0, 0, 1]
    assert distance.tolist() == pytest.approx([math.sqrt(0.02), math.sqrt(2), 0.0, 0.0])


@pytest.mark.parametrize("block_elements", [1, 7, 64, 1 << 24])
def test_blocked_nearest_equals_a_full_matrix_search(block_elements):
    g = torch.Generator().manual_seed(0)
    stored = torch.randn(37, 5, generator=g, dtype=torch.float64)
    stored[20] = stored[3]  # a duplicate: ties go to 3
    points = torch.cat([torch.randn(23, 5, generator=g, dtype=torch.float64), stored[[3, 20, 36]]])
    index, distance = metrics.nearest(points, stored, block_elements=block_elements)
    full = (points[:, None, :] - stored[None, :, :]).norm(dim=2)  # (Q, M), no expansion
    assert torch.equal(index, full.argmin(dim=1))  # argmin returns the first minimum
    assert torch.allclose(distance, full.min(dim=1).values)
    assert index[-3:].tolist() == [3, 3, 36]


def test_success_is_nearest_equals_target():
    stored = torch.eye(3)
    retrieved = torch.tensor([[0.9, 0.1, 0.0], [0.9, 0.1, 0.0], [0.0, 0.2, 0.7]])
    out = metrics.per_query(retrieved, stored, targets=stored, target_indices=torch.arange(3))
    assert out["success"].tolist() == [1.0, 0.0, 1.0]
    assert out["nearest"].tolist() == [0, 0, 2]
    # without indices the target's index is the stored row nearest to the target
    again = metrics.per_query(retrieved, stored, targets=stored)
    assert torch.equal(again["success"], out["success"])


def test_without_targets_only_what_can_be_known():
    stored = torch.eye(3)
    out = metrics.per_query(torch.eye(3), stored, steps=torch.ones(3), support=torch.full((3,), 2))
    assert set(out) == {"nearest", "nearest_distance", "steps", "support"}


def test_half_precision_inputs_are_measured_in_float32():
    g = torch.Generator().manual_seed(1)
    stored = torch.randn(10, 8, generator=g)
    retrieved = torch.randn(4, 8, generator=g).to(torch.bfloat16)
    targets = stored[:4]
    out = metrics.per_query(retrieved, stored.to(torch.bfloat16), targets=targets)
    assert out["sse"].dtype == torch.float32
    expected = ((retrieved.float() - targets) ** 2).sum(dim=1)
    assert torch.equal(out["sse"], expected)


def test_summarize_by_hand():
    stats = metrics.summarize(torch.tensor([1.0, 2.0, 3.0, 10.0]))
    assert stats["mean"] == 4.0
    assert stats["std"] == pytest.approx(math.sqrt((9 + 4 + 1 + 36) / 4))  # population std
    assert stats["median"] == 2.5
    assert metrics.summarize(torch.tensor([5.0])) == {"mean": 5.0, "std": 0.0, "median": 5.0}
    assert metrics.summarize(torch.tensor([3.0, 1.0, 2.0]))["median"] == 2.0


def test_success_counts_identical_stored_rows_as_the_target():
    """Hetero-association with one-hot label values: every class's row repeats, so a retrieval
    of the right class is a success whichever of the equal rows is the target."""
    labels = torch.tensor([0, 1, 0, 2, 1, 0])
    values = torch.nn.functional.one_hot(labels, 3).float()  # (6, 3), rows repeat per class
    retrieved = values[[3, 4, 5, 1]] + 0.01  # classes 2, 1, 0, 1
    targets = values[[3, 4, 5, 2]]  # the last retrieval has the wrong class
    out = metrics.per_query(
        retrieved, values, targets=targets, target_indices=torch.tensor([3, 4, 5, 2])
    )
    assert out["nearest"].tolist() == [3, 1, 0, 1]  # ties resolve to the lowest index
    assert out["success"].tolist() == [1.0, 1.0, 1.0, 0.0]


def test_memory_with_one_hot_label_values_reports_label_accuracy(tmp_path):
    """The end-to-end case: keys are patterns, values the one-hot labels; dense retrieval
    with a large β returns each query's own class."""
    from nphcli.evaluation.evaluate import evaluate
    from nphcli.memory.bank import Memory
    from nphcli.schema.settings import RetrieveSettings

    gen = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(40, 16, generator=gen), dim=1)
    labels = torch.arange(40) % 4
    values = torch.nn.functional.one_hot(labels, 4).float()
    memory = Memory(keys, values=values, labels=labels)
    report = evaluate(memory, RetrieveSettings(params={"beta": 50.0}))
    assert report.metrics["success"]["mean"] == 1.0
