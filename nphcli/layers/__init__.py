"""NPH deep-learning layers: the retrieval rules as `torch.nn.Module`s (see docs/layers.md), e.g.
`NPH(256, rule=create_model("topk", k=0.2), heads=4)`; their shared keywords are `LayerConfig`'s.
"""

from nphcli.layers.association import associate
from nphcli.layers.config import LayerConfig, Norms, hopfield_layers_options
from nphcli.layers.io import load_layer, save_layer
from nphcli.layers.modules import NPH, NPHLayer, NPHPooling

__all__ = [
    "NPH",
    "LayerConfig",
    "NPHLayer",
    "NPHPooling",
    "Norms",
    "associate",
    "hopfield_layers_options",
    "load_layer",
    "save_layer",
]
