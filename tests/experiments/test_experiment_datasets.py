"""Loaders for user-downloaded MIL and time-series files, on small synthetic files."""

from __future__ import annotations

import pytest
import torch

from nphcli.core.errors import NphError
from nphcli.experiments.datasets import load_mil_csv, load_mil_mat, pad_bags
from nphcli.layers import NPHPooling
from nphcli.models import create_model


def _ucsb_file(tmp_path):
    # label, bag id, 3 features; bag "b7" positive, "a1" negative, bag ids not sorted
    lines = [
        "1,b7,0.1,0.2,0.3",
        "0,a1,1.0,1.1,1.2",
        "1,b7,0.4,0.5,0.6",
        "0,a1,2.0,2.1,2.2",
        "1,b7,0.7,0.8,0.9",
    ]
    path = tmp_path / "ucsb_breast_cancer.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_mil_csv_groups_instances_into_bags(tmp_path):
    data = load_mil_csv(_ucsb_file(tmp_path))
    assert [tuple(b.shape) for b in data.bags] == [(3, 3), (2, 3)]
    assert data.labels.tolist() == [1.0, 0.0]
    torch.testing.assert_close(data.bags[1][1], torch.tensor([2.0, 2.1, 2.2]))


def test_padded_bags_pool_like_each_bag_alone(tmp_path):
    data = load_mil_csv(_ucsb_file(tmp_path))
    stacked, mask = pad_bags(data.bags)
    assert stacked.shape == (2, 3, 3) and mask.tolist() == [[False] * 3, [False, False, True]]
    torch.manual_seed(0)
    pool = NPHPooling(3, prototypes=2, rule=create_model("sparse"), heads=1)
    pooled = pool(stacked, key_padding_mask=mask)  # (2, 2, 3)
    torch.testing.assert_close(pooled[1], pool(data.bags[1][None])[0])


def test_mil_csv_rejects_malformed_rows(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("1,a,0.5\n0,b\n")
    with pytest.raises(NphError):
        load_mil_csv(path)
    with pytest.raises(NphError, match="cannot read"):
        load_mil_csv(tmp_path / "missing.csv")


def test_mil_mat_layout(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    sparse = pytest.importorskip("scipy.sparse")
    features = sparse.csr_matrix([[0, 1.0], [2.0, 0], [0, 3.0], [4.0, 0]])
    path = tmp_path / "fox_100x100_matlab.mat"
    scipy_io.savemat(
        path,
        {
            "features": features,
            "bag_ids": [[1, 1, 2, 2]],
            "labels": sparse.csr_matrix([[-1, 1, -1, -1]]),
        },
    )
    data = load_mil_mat(path)
    assert data.labels.tolist() == [1.0, 0.0]
    torch.testing.assert_close(data.bags[1], torch.tensor([[0, 3.0], [4.0, 0]]))
