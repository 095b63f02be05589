"""`nph doctor`: what nph runs on, and whether the parts fit together.

The first thing to break on a fresh install is the torch/torchvision pair (a torchvision built
for another torch fails deep inside with `operator torchvision::nms does not exist`); the checks
name that. Every check returns plain values for the CLI to render.
"""

from __future__ import annotations

import importlib
import platform
import sys
from typing import Any

from nphcli.sources.vision import first_line as _first_line


def diagnose() -> dict[str, Any]:
    """Every check, by name: {"ok": bool, ...details}. `ok` is False only for a problem that
    stops nph or a part of it (optional parts that are absent are ok, with `version` None)."""
    report: dict[str, Any] = {
        "python": {
            "ok": sys.version_info >= (3, 10),
            "version": platform.python_version(),
            "executable": sys.executable,
        }
    }
    report["torch"] = _torch()
    report["torchvision"] = _torchvision(report["torch"].get("version"))
    report["cuda"] = _cuda()
    for name, module in (("faiss", "faiss"), ("matplotlib", "matplotlib")):
        report[name] = _optional(module)
    report["sample_data"] = _sample_data()
    return report


def _torch() -> dict[str, Any]:
    try:
        import torch
    except Exception as error:
        return {"ok": False, "version": None, "error": _first_line(error)}
    return {
        "ok": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "threads": torch.get_num_threads(),
    }


def _torchvision(torch_version: str | None) -> dict[str, Any]:
    """Loads, and runs a tiny `nms` (the compiled operator a mismatched build lacks)."""
    try:
        import torch
        import torchvision
        from torchvision.ops import nms

        boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])  # (2, 4)
        kept = nms(boxes, torch.tensor([1.0, 0.5]), 0.5).tolist()
    except Exception as error:
        return {
            "ok": False,
            "version": _version("torchvision"),
            "error": _first_line(error),
            "hint": f"install the torchvision built for torch {torch_version}, e.g. "
            "pip install --force-reinstall torch torchvision (from the same index)",
        }
    if kept != [0]:
        return {"ok": False, "version": torchvision.__version__, "error": f"nms gave {kept}"}
    return {"ok": True, "version": torchvision.__version__}


# What a CUDA build of torch costs on a machine that cannot use it, and the CPU build instead.
CUDA_BUILD_SIZE = "about 5.5 GB of CUDA libraries on Linux"
CPU_WHEEL = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"


def _cuda() -> dict[str, Any]:
    """The CUDA devices torch sees, and a note where torch is a CUDA build but sees none: its
    CUDA libraries are dead weight there, and the CPU build does the same work."""
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        devices = [torch.cuda.get_device_name(i) for i in range(count)]
        build = torch.version.cuda
    except Exception as error:
        return {"ok": True, "devices": [], "error": _first_line(error)}
    if build is None or devices:
        return {"ok": True, "devices": devices}
    note = (
        f"torch is a CUDA {build} build ({CUDA_BUILD_SIZE}) and no GPU is visible; "
        f"the CPU build does the same here: {CPU_WHEEL}"
    )
    return {"ok": True, "devices": devices, "note": note}


def _optional(module: str) -> dict[str, Any]:
    try:
        loaded = importlib.import_module(module)
    except Exception as error:
        return {"ok": True, "version": None, "error": _first_line(error)}
    return {"ok": True, "version": getattr(loaded, "__version__", "unknown")}


def _sample_data() -> dict[str, Any]:
    from nphcli.sources import sample

    try:
        folder = sample.sample_data_dir()
    except Exception as error:
        return {"ok": False, "path": None, "error": _first_line(error)}
    names = [*(f"MNIST/raw/{f}.gz" for f in sample.MNIST_FILES), sample.CIFAR10_FILE]
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        return {"ok": False, "path": str(folder), "error": f"missing: {', '.join(missing)}"}
    return {"ok": True, "path": str(folder)}


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
