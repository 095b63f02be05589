"""The README's model reference, generated from the registry so the two cannot drift apart.

`python -m nphcli.models.catalog` prints the Markdown that README.md holds between the
`<!-- models:start -->` and `<!-- models:end -->` markers; a test checks they agree.
"""

from __future__ import annotations

from nphcli.models.base import HopfieldModel
from nphcli.models.registry import ParamInfo, list_models

START = "<!-- models:start -->"
END = "<!-- models:end -->"


def _param_line(p: ParamInfo) -> str:
    return f"- `--{p.name}` ({p.type.__name__}, default `{p.default}`): {p.help}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bare | would end the Markdown table cell


def models_markdown() -> str:
    """Markdown: one table of formulas and costs, then every model's own parameters."""
    shared = {name for name in HopfieldModel.__dataclass_fields__}
    infos = list_models()
    lines = [
        "| model | retrieval rule T(x) | cost for Q queries, M memories |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{i.name}` | {_cell(i.formula)} | {_cell(i.cost)} |" for i in infos]
    lines += ["", "Parameters every model takes:", ""]
    lines += [_param_line(p) for p in infos[0].params if p.name in shared]
    for info in infos:
        own = [p for p in info.params if p.name not in shared]
        lines += ["", f"**`{info.name}`**: {info.summary}."]
        if own:
            lines += [""] + [_param_line(p) for p in own]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(START)
    print(models_markdown(), end="")
    print(END)
