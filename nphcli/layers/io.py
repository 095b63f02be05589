"""Save and load a layer's weights with safetensors, with the configuration that rebuilds it.

The metadata holds the class name, its `LayerConfig` and its own arguments as JSON; written
atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError
from nphcli.layers.config import LayerConfig
from nphcli.layers.modules import NPH, NPHLayer, NPHPooling

_CLASSES = {cls.__name__: cls for cls in (NPH, NPHPooling, NPHLayer)}
FORMAT = "nph-layer/3"
# Version 2's configs are version 3's with its new fields at their defaults; version 1 kept the
# model's name, β and parameters flat among the layer's keywords.
FORMAT_V2 = "nph-layer/2"
FORMAT_V1 = "nph-layer/1"


def save_layer(layer: nn.Module, path: str | os.PathLike, *, force: bool = False) -> None:
    """Write `layer` (NPH, NPHPooling or NPHLayer) to a safetensors file at `path`."""
    name = type(layer).__name__
    if name not in _CLASSES:
        raise NphError(f"save_layer takes NPH, NPHPooling or NPHLayer, got {name}")
    tensors = {key: value.detach().contiguous().cpu() for key, value in layer.state_dict().items()}
    metadata = {
        "format": FORMAT,
        "class": name,
        "config": json.dumps(layer.config.to_json()),
        "arguments": json.dumps(layer.arguments()),
    }
    with atomic_write(path, force=force) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def load_layer(
    path: str | os.PathLike, *, device: torch.device | str = "cpu"
) -> NPH | NPHPooling | NPHLayer:
    """Rebuild the layer saved at `path` with its weights, on `device`."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path), device=str(device))
    except (OSError, SafetensorError) as error:
        raise NphError(f"cannot read layer file {path}: {error}") from None
    fmt = metadata.get("format")
    if fmt not in (FORMAT, FORMAT_V2, FORMAT_V1) or metadata.get("class") not in _CLASSES:
        raise NphError(f"{path} is not an nph layer file (no {FORMAT!r} metadata)")
    if fmt == FORMAT_V1:
        config, arguments = _from_v1(json.loads(metadata["config"]))
    else:
        config = LayerConfig.from_json(json.loads(metadata["config"]))
        arguments = json.loads(metadata["arguments"])
    options = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    layer = _CLASSES[metadata["class"]](options.pop("d_model"), **arguments, **options)
    layer.load_state_dict(tensors)
    return layer.to(device)


def _from_v1(flat: dict) -> tuple[LayerConfig, dict]:
    """A version-1 config ("multihead" then meant `multihead` with heads = 1)."""
    arguments = {key: flat.pop(key) for key in ("prototypes", "memories") if key in flat}
    known = {f.name for f in dataclasses.fields(LayerConfig)}
    rule = {key: flat.pop(key) for key in list(flat) if key not in known}  # model, beta, params
    rule["name"] = rule.pop("model")
    return LayerConfig.from_json({**flat, "rule": rule}), arguments
