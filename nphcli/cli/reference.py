"""docs/cli.md, the command reference, generated from the click tree typer builds for `nph`: every
command, option, type and help text is the one `--help` prints, independent of the terminal.
`python -m nphcli.cli.reference --write` regenerates it and the model reference
(`nphcli.schema.catalog`); `tests/docs/test_docs.py` fails while any is stale. Typer may carry its
own copy of click, so objects are told apart by their attributes, not by click's classes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer.main

from nphcli.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"
_HEADER = """\
# Command reference

Every `nph` command and option, generated from the commands' own help
(`python -m nphcli.cli.reference --write`; a test fails when this page is stale).
`nph COMMAND --help` prints the same.
"""


def _cell(text: str) -> str:
    """One Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _flags(param) -> str:
    return ", ".join(f"`{name}`" for name in [*param.opts, *param.secondary_opts])


def _option_row(param, ctx) -> str:
    """`--flag` | type | help, from the very line `--help` prints (help text with its default)."""
    record = param.get_help_record(ctx)
    names, text = record if record else ("", "")
    kind = "flag" if getattr(param, "is_flag", False) else names.rsplit(" ", 1)[-1]
    # Typer versions name a repeatable option's type <list[Path]>, <Path> or <path>: one spelling
    # here (<path>), so the page does not change with the installed version.
    if kind.startswith("<"):
        kind = re.sub(r"^<list\[(.+)\]>$", r"<\1>", kind).lower()
    return f"| {_flags(param)} | {_cell(kind)} | {_cell(text)} |"


def _command(name: str, command, parent) -> list[str]:
    ctx = command.context_class(command, info_name=name, parent=parent)
    path = ctx.command_path
    lines = [f"## `{path}`", ""]
    if command.help:
        lines += [command.help.strip(), ""]
    params = [p for p in command.get_params(ctx) if not p.hidden]
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name == "option"]
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines += ["```text", f"{path} {usage}".rstrip(), "```", ""]
    if arguments:
        lines += ["| argument | help |", "| --- | --- |"]
        for arg in arguments:
            record = arg.get_help_record(ctx)
            text = record[1] if record else ""
            usage_name = " ".join(arg.get_usage_pieces(ctx))
            lines.append(f"| `{usage_name}` | {_cell(text)} |")
        lines.append("")
    if options:
        lines += ["| option | type | help |", "| --- | --- | --- |"]
        lines += [_option_row(opt, ctx) for opt in options]
        lines.append("")
    return lines


def reference_markdown() -> str:
    """The whole page: the root command's options, then every command in name order."""
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="nph")
    lines = [_HEADER, *_command("nph", root, None)[2:]]  # the root's help without a heading
    commands = _walk(root, ctx)
    lines += ["| command | what it does |", "| --- | --- |"]
    for path, command, _ in commands:
        short = command.get_short_help_str(limit=200)
        anchor = path.replace(" ", "-")
        lines.append(f"| [`{path}`](#{anchor}) | {_cell(short)} |")
    lines.append("")
    for path, command, parent in commands:
        lines += _command(path.rsplit(" ", 1)[-1], command, parent)
    return "\n".join(lines).rstrip("\n") + "\n"


def _walk(group, ctx) -> list:
    """(path, command, parent context) of every command under `group` in name order, a group
    (`nph paper`) followed by its own commands (`nph paper mil`)."""
    found = []
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        found.append((f"{ctx.command_path} {name}", command, ctx))
        if hasattr(command, "list_commands"):
            inner = command.context_class(command, info_name=name, parent=ctx)
            found += _walk(command, inner)
    return found


def main(argv: list[str]) -> int:
    text = reference_markdown()
    if argv == ["--write"]:
        import nphcli.models  # noqa: F401  (serves the live registry's cards)
        from nphcli.schema.catalog import write_generated

        PAGE.write_text(text, encoding="utf-8")
        for path in [PAGE, *write_generated()]:
            print(f"wrote {path}", file=sys.stderr)
    elif not argv:
        sys.stdout.write(text)
    else:
        print("usage: python -m nphcli.cli.reference [--write]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
