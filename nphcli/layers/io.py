"""Save and load a layer's weights with safetensors, with the configuration that rebuilds it.

The file holds the layer's state dict as tensors and, in the safetensors metadata, the layer's
class name and its constructor arguments as JSON, so `load_layer(path)` needs nothing else.
Files are written atomically: an interrupted save leaves any previous file as it was.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from nphcli.atomic import atomic_write
from nphcli.errors import NphError
from nphcli.layers.modules import NPH, NPHLayer, NPHPooling

_CLASSES = {cls.__name__: cls for cls in (NPH, NPHPooling, NPHLayer)}
FORMAT = "nph-layer/1"


def save_layer(layer: nn.Module, path: str | os.PathLike, *, force: bool = False) -> None:
    """Write `layer` (NPH, NPHPooling or NPHLayer) to a safetensors file at `path`."""
    name = type(layer).__name__
    if name not in _CLASSES:
        raise NphError(f"save_layer takes NPH, NPHPooling or NPHLayer, got {name}")
    tensors = {key: value.detach().contiguous().cpu() for key, value in layer.state_dict().items()}
    metadata = {"format": FORMAT, "class": name, "config": json.dumps(layer.config)}
    with atomic_write(path, force=force) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def load_layer(
    path: str | os.PathLike, *, device: torch.device | str = "cpu"
) -> NPH | NPHPooling | NPHLayer:
    """Rebuild the layer saved at `path` with its weights, on `device`."""
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path), device=str(device))
    except (OSError, SafetensorError) as error:
        raise NphError(f"cannot read layer file {path}: {error}") from None
    if metadata.get("format") != FORMAT or metadata.get("class") not in _CLASSES:
        raise NphError(f"{path} is not an nph layer file (no {FORMAT!r} metadata)")
    config = json.loads(metadata["config"])
    d_model = config.pop("d_model")
    layer = _CLASSES[metadata["class"]](d_model, **config)
    layer.load_state_dict(tensors)
    return layer.to(device)
