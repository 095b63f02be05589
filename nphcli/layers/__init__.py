"""NPH deep-learning layers: the retrieval rules as `torch.nn.Module`s (see docs/layers.md).

`NPH` (queries and stored patterns), `NPHPooling` (learnable prototype queries pool a set) and
`NPHLayer` (learnable stored patterns) take the retrieval rule by its registry name and
parameters, e.g. `NPH(256, model="topk", k=0.2, heads=4)`. Padded keys get weight exactly 0.
"""

from nphcli.layers.association import associate
from nphcli.layers.io import load_layer, save_layer
from nphcli.layers.modules import NPH, NPHLayer, NPHPooling

__all__ = ["NPH", "NPHLayer", "NPHPooling", "associate", "load_layer", "save_layer"]
