"""nph doctor, and one error line (pointing to it) when torchvision does not load."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import assert_one_error_line


def test_doctor_json_reports_every_part(invoke):
    result = invoke("doctor", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert list(report) == [
        "python", "torch", "torchvision", "cuda", "faiss", "matplotlib", "sample_data"
    ]  # fmt: skip
    assert all(check["ok"] for check in report.values())
    import torch

    assert report["torch"]["version"] == torch.__version__
    assert report["torch"]["threads"] == torch.get_num_threads()
    assert report["cuda"]["devices"] == [
        torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
    ]
    table = invoke("doctor")
    assert table.exit_code == 0 and "torchvision" in table.stdout


@pytest.fixture
def broken_torchvision(tmp_path, monkeypatch):
    """A torchvision that fails on import as one built for another torch does."""
    package = tmp_path / "fake" / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n"
    )
    for name in [name for name in sys.modules if name.split(".")[0] == "torchvision"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))


def test_a_broken_torchvision_is_one_error_line_pointing_to_doctor(
    invoke, tmp_path, broken_torchvision
):
    for dataset in ("mnist", "cifar10"):
        result = invoke("store", dataset, "--n", "5", "--out", tmp_path / f"{dataset}.safetensors")
        line = assert_one_error_line(result, "torchvision::nms", "nph doctor")
        assert line.startswith("Error: torchvision does not load"), line
    doctor = invoke("doctor", "--json")
    assert doctor.exit_code == 1
    report = json.loads(doctor.stdout)
    assert report["torchvision"]["ok"] is False
    assert "torchvision::nms" in report["torchvision"]["error"]
    assert "hint" in report["torchvision"]
