"""Settings are plain dataclasses: each setting is declared once (`setting(...)`), its option is
derived from that declaration, its value checked by the class's own `__post_init__`, and the
same objects are built by the command line, batch jobs and the Python API."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

import nphcli as nph
from nphcli.core.errors import NphError
from nphcli.schema import settings as S
from nphcli.schema.fields import ANALYSIS_FIELDS, FIELDS
from nphcli.schema.option import arguments, check_settings, nested, options_of, setting

SETTINGS_CLASSES = (
    S.InputSpec,
    S.Corruption,
    S.IndexSettings,
    S.RetrieveSettings,
    S.Spread,
    S.OutputSpec,
    S.AnalysisOptions,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Inner:
    level: float = setting(0.5, "A level.", minimum=0.0, maximum=1.0, meaning="a fraction")

    def __post_init__(self) -> None:
        check_settings(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Outer:
    count: int = setting(3, "A count.", minimum=1)
    inner: _Inner = nested(_Inner, group="corruption")
    file: str | None = setting(None, "A file.", kind="path", name="source")

    def __post_init__(self) -> None:
        check_settings(self)


def test_options_are_derived_from_the_declarations_in_order():
    options = options_of(_Outer, "run")
    assert [(o.name, o.kind, o.default, o.group) for o in options] == [
        ("count", "int", 3, "run"),
        ("level", "float", 0.5, "corruption"),
        ("source", "path", None, "run"),
    ]
    assert arguments(_Outer, {"count": 2, "level": 0.1, "source": "x"}) == {"count": 2, "file": "x"}
    with pytest.raises(NphError, match=r"^count= must be a whole number ≥ 1, got 0$"):
        _Outer(count=0)
    with pytest.raises(NphError, match=r"^level= must be a fraction in \[0, 1\], got 2"):
        _Inner(level=2.0)


def test_every_settings_attribute_is_an_option_with_its_default():
    """A field added without `setting(...)` would be invisible to every surface."""
    by_name = {o.name: o for o in (*FIELDS, *ANALYSIS_FIELDS)}
    for cls in SETTINGS_CLASSES:
        options = {o.name for o in options_of(cls)}
        for f in dataclasses.fields(cls):
            if f.name == "params" or f.metadata.get("nph.nested"):
                continue
            declared = f.metadata.get("nph.option")
            assert declared is not None, (cls.__name__, f.name)  # declared with setting(...)
            name = declared["name"] or f.name
            assert name in options and name in by_name, (cls.__name__, f.name)
            if f.default is not dataclasses.MISSING:
                assert by_name[name].default == f.default, (cls.__name__, f.name)


def test_settings_classes_are_plain_and_typed():
    for cls in SETTINGS_CLASSES:
        assert cls.__new__ is object.__new__, cls  # nothing rewritten behind the reader
        signature = inspect.signature(cls)
        assert all(p.kind is p.KEYWORD_ONLY for p in signature.parameters.values())
    assert "noise: 'float' = 0.0" in str(inspect.signature(nph.Corruption))
    assert "model: 'str' = 'dense'" in str(inspect.signature(nph.RetrieveSettings))


def test_python_api_errors_name_the_argument_not_the_flag():
    with pytest.raises(NphError, match=r"^noise= must be a standard deviation ≥ 0"):
        nph.Corruption(noise=-0.1)
    with pytest.raises(NphError, match=r"^mask_mode= must be one of"):
        nph.Corruption(mask_mode="middle")
    with pytest.raises(NphError, match=r"^repeat= must be"):
        nph.RetrieveSettings(repeat=0)
    with pytest.raises(NphError, match=r"^sample= must be"):
        S.AnalysisOptions(sample=-1)
    with pytest.raises(NphError, match=r"^check_exact= must be"):
        S.IndexSettings(path="x", check_exact=-1)
    with pytest.raises(NphError, match="unknown model 'softmaxx'"):
        nph.RetrieveSettings(model="softmaxx")


def test_the_command_line_and_a_batch_job_build_equal_requests():
    from nphcli.app.request import request_from
    from nphcli.cli.field_options import field_values
    from nphcli.schema.fields import get_field

    text = {"model": "topk,dense", "k": "3", "flip": "0,0.3", "query_text": "a cat", "json": True}
    job = {"model": ["topk", "dense"], "k": 3, "flip": [0, 0.3], "query_text": "a cat"}
    from_cli = request_from(field_values(text))
    values = {key: get_field(key).from_json(value, key) for key, value in job.items()}
    from_job = request_from({**values, "json": [True]})
    assert from_cli == from_job
    assert from_cli.inputs.query_text == "a cat"
    assert [s.corruption.flip for s in from_cli.settings] == [0.0, 0.3, 0.0, 0.3]


@pytest.mark.slow
def test_a_batch_job_with_query_text_recalls_the_texts_neighbours(tmp_path, invoke):
    texts = tmp_path / "facts.txt"
    texts.write_text(
        "the cat sat on the mat\nrockets fly to the moon\nbread is baked in an oven\n",
        encoding="utf-8",
    )
    memory = tmp_path / "facts.safetensors"
    stored = invoke("store", texts, "--embed", "hash-256", "--out", memory)
    assert stored.exit_code == 0, stored.output
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        json.dumps({"memory": str(memory), "query_text": "rockets to the moon", "model": "sparse"})
        + "\n",
        encoding="utf-8",
    )
    result = invoke("batch", jobs)
    assert result.exit_code == 0, result.output
    (line,) = [json.loads(x) for x in result.stdout.splitlines() if x.strip()]
    assert line["config"]["queries"]["file"] == "--query-text"
    assert line["config"]["queries"]["Q"] == 1
    (recall,) = line["recall"]
    assert recall["nearest"]["text"] == "rockets fly to the moon"
    assert recall["recalled"][0]["text"] == "rockets fly to the moon"  # the heaviest weight


def test_the_settings_classes_import_no_torch():
    """The settings read no torch: `nph --help` and the option table stay fast."""
    import subprocess
    import sys

    code = "import nphcli.schema.fields, sys; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def _other_value(option):
    """A valid value of `option` other than its default."""
    if option.choices:
        return next(c for c in option.choices if c != option.default)
    if option.name == "device":
        return "cuda"
    return {"bool": True, "int": 2, "float": 0.25, "size": 1 << 20}[option.kind]


def _fake_report(settings):
    from types import SimpleNamespace

    corruption = dataclasses.asdict(settings.corruption)
    config = {"memory": {"file": "m", "M": 9}, "queries": {"Q": 3}, "seed": settings.seed}
    metrics = dict.fromkeys(("sse", "success", "cosine", "support"), {"mean": 0.5})
    return SimpleNamespace(
        config={**config, "corruption": corruption},
        metrics=metrics,
        timing={"retrieve_median_s": 0.001},
    )


@pytest.mark.parametrize(
    "option",
    [o for o in FIELDS if o.setting and o.group != "index" and o.name not in ("model", "seed")],
    ids=lambda o: o.name,
)
def test_every_setting_option_that_varies_is_a_column_of_the_comparison(option, capsys):
    """Derived, not listed: a corruption or run option added to its class shows here."""
    from nphcli.cli.retrieve_output import _print_comparison
    from nphcli.evaluation.settings import settings_from

    grid = [
        settings_from("dense", {}, {}),
        settings_from("dense", {}, {option.name: _other_value(option)}),
    ]
    _print_comparison(grid, [_fake_report(s) for s in grid])
    header = capsys.readouterr().out.splitlines()[2:5]
    assert any(option.name in line for line in header), header


@pytest.mark.parametrize(
    "option",
    [o for o in options_of(S.Corruption) if o.kind == "float" and o.name != "fill"],
    ids=lambda o: o.name,
)
def test_the_run_table_names_every_corruption_that_is_set(option):
    from nphcli.cli.retrieve_output import _corruption_text

    corruption = dataclasses.asdict(S.Corruption(**{option.name: 0.25, "noise_clip": True}))
    text = _corruption_text({**corruption, "mask_mode": "random"})
    assert "0.25" in text and (option.name.split("_")[0] in text or "noise" in text), text
    if option.name == "noise":
        assert "clipped to [0, 1]" in text
