"""The README's Python example, checked by mypy --strict."""

import nphcli as nph

settings = nph.RetrieveSettings(
    model="topk", params={"k": 10}, corruption=nph.Corruption(noise=0.5)
)
memory = nph.open_memory("memory.safetensors")
report = nph.evaluate(memory, settings)
sse = report.metrics["sse"]
out = nph.retrieve(memory.patterns[:5], memory, model="topk", k=10)
model = nph.create_model("dense", beta=0.5)

from nphcli.layers import NPH  # noqa: E402

layer = NPH(16, heads=2, dropout=0.1, rule=nph.create_model("dense", beta=0.5))
