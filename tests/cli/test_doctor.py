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


def test_a_cuda_torch_without_a_gpu_is_flagged_with_the_cpu_build(invoke, monkeypatch):
    """The 5.5 GB CUDA build of torch on a machine with no GPU went unnoticed. It
    still runs nph (exit 0), so it is a NOTE with the CPU wheel's install command."""
    import torch

    from nphcli.app.doctor import CPU_WHEEL

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = invoke("doctor", "--json")
    assert result.exit_code in (0, 1), result.stderr  # (1 only for an unrelated problem)
    cuda = json.loads(result.stdout)["cuda"]
    assert cuda["ok"] and "5.5 GB" in cuda["note"] and CPU_WHEEL in cuda["note"]
    table = invoke("doctor", env={"COLUMNS": "200"})
    assert "NOTE" in table.stdout and "whl/cpu" in table.stdout
    monkeypatch.setattr(torch.version, "cuda", None)  # the CPU build: nothing to say
    assert "note" not in json.loads(invoke("doctor", "--json").stdout)["cuda"]
