"""A field carries its meaning and its destination (`Field.holder`): a new field of each holder
kind is followed from command-line text to the object holding it, into the computation and
into the report's recorded config, and fails here if any step drops it. The holders
(`RetrieveSettings`, `Corruption`, `IndexSettings`, `InputSpec`, `OutputSpec`,
`AnalysisRequest`) take their defaults and checks from the fields; a model parameter named like
a run field is refused when the model registers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nphcli.core.errors import NphError

# Run in a fresh process: the new fields must exist before anything builds its holder class.
SCRIPT = r"""
import dataclasses, json, sys

import nphcli.schema.fields as fields
from nphcli.schema.fields import Field

new = {
    "corruption": Field("fill2", "float", 0.0, "A second fill.", group="corruption"),
    "run": Field("probe", "int", 0, "A run knob.", group="run", minimum=0),
    "index": Field("probe_index", "int", None, "An index knob.", group="index"),
    "output": Field("probe_out", "bool", False, "An output switch.", group="output"),
}
fields.FIELDS = (*fields.FIELDS, *new.values())
fields._BY_NAME.update({f.name: f for f in new.values()})
fields.ANALYSIS_FIELDS = (
    *fields.ANALYSIS_FIELDS, Field("probe_k", "int", 3, "An analysis knob.", group="analysis")
)

import nphcli.evaluation.evaluate as evaluate_module
from nphcli.app.request import request_from
from nphcli.cli.field_options import field_values
from nphcli.evaluation.settings import expand_settings
from nphcli.memory import open_memory
from nphcli.theory.analysis import AnalysisRequest

memory_path = sys.argv[1]
seen = {}
real_corrupt = evaluate_module.corrupt


def spy(clean, corruption, **kw):
    seen["corrupt"] = corruption.fill2
    return real_corrupt(clean, corruption, **kw)


evaluate_module.corrupt = spy
text = {"fill2": "0.1,0.2", "probe": "7", "probe_out": True, "memory": memory_path}
request = request_from(field_values(text))
first, second = request.settings
out = {
    "distinct": first != second,
    "fill2": [s.corruption.fill2 for s in request.settings],
    "probe": first.probe,
    "probe_out": request.output.probe_out,
}
report = evaluate_module.evaluate(open_memory(memory_path), second)
out["computed"] = seen["corrupt"]
out["config_fill2"] = report.config["corruption"]["fill2"]
out["config_probe"] = report.config["probe"]
index = expand_settings(field_values({"index": "x.index", "probe_index": "5"}))[0].index
out["index"] = index.probe_index
try:
    expand_settings(field_values({"probe_index": "5"}))
    out["index_alone"] = "accepted"
except Exception as error:
    out["index_alone"] = str(error)
out["analysis"] = [AnalysisRequest().probe_k, AnalysisRequest(probe_k=4).probe_k]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_new_field_of_each_holder_reaches_its_holder_the_computation_and_the_report(
    invoke, tmp_path
):
    pool = tmp_path / "pool.npy"
    np.save(pool, np.random.default_rng(0).normal(size=(12, 6)).astype(np.float32))
    memory = tmp_path / "m.safetensors"
    assert invoke("store", pool, "--out", memory).exit_code == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(memory)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["distinct"]  # two values, two different settings
    assert seen["fill2"] == [0.1, 0.2]
    assert seen["computed"] == 0.2  # the corruption the computation received holds it
    assert seen["config_fill2"] == 0.2  # and the report records it
    assert seen["probe"] == 7 and seen["config_probe"] == 7
    assert seen["probe_out"] is True
    assert seen["index"] == 5
    assert "--probe-index" in seen["index_alone"] and "--index" in seen["index_alone"]
    assert seen["analysis"] == [3, 4]


def test_holders_take_defaults_ranges_and_choices_from_the_fields():
    from nphcli.ann.settings import IndexSettings
    from nphcli.app.request import OutputSpec, RetrieveRequest
    from nphcli.evaluation.corruption import MASK_MODES, Corruption
    from nphcli.evaluation.inputs import InputSpec
    from nphcli.evaluation.settings import RetrieveSettings
    from nphcli.schema.fields import holder_fields
    from nphcli.schema.holders import check_complete
    from nphcli.theory.analysis import AnalysisRequest

    holders = {
        "run": RetrieveSettings,
        "corruption": Corruption,
        "index": IndexSettings,
        "input": InputSpec,
        "output": OutputSpec,
        "request": RetrieveRequest,
        "analysis": AnalysisRequest,
    }
    for holder, cls in holders.items():
        check_complete(cls)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for f in holder_fields(holder):
            assert defaults[f.key] == f.default, (cls.__name__, f.name)
    assert (
        MASK_MODES == next(f for f in holder_fields("corruption") if f.name == "mask_mode").choices
    )
    with pytest.raises(NphError, match=r"--mask must be a fraction in \[0, 1\]"):
        Corruption(mask=1.5)
    with pytest.raises(NphError, match="--noise must be a standard deviation ≥ 0"):
        Corruption(noise=-0.1)
    with pytest.raises(NphError, match="--mask-mode"):
        Corruption(mask_mode="middle")
    with pytest.raises(NphError, match="--check-exact"):
        IndexSettings(path="x", check_exact=-1)
    with pytest.raises(NphError, match="--sample"):
        AnalysisRequest(sample=-1)
    with pytest.raises(NphError, match="--repeat"):
        RetrieveSettings(repeat=0)


def test_a_holder_with_its_own_default_is_refused():
    from nphcli.schema.holders import holds

    with pytest.raises(TypeError, match="take the default from the field"):

        @dataclasses.dataclass(frozen=True)
        @holds("corruption")
        class Drifted:
            mask: float = 0.5


def test_a_model_parameter_named_like_a_run_field_is_refused():
    from nphcli.models.base import HopfieldModel, param
    from nphcli.models.registry import _MODELS, register_model

    with pytest.raises(ValueError, match="named like run options"):

        @register_model("clash-test", summary="s", formula="f", cost="c")
        @dataclasses.dataclass
        class Clash(HopfieldModel):
            noise: float = param(0.0, "a clash with --noise")

    assert "clash-test" not in _MODELS
