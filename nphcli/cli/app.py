"""The `nph` application object, its single error path, and small helpers shared by commands.

Commands live in sibling modules (store.py, retrieve.py, ...) and only parse options, call the
library, and render. Library modules (and so torch) are imported inside command functions, so
`nph --help` does not pay for them.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

try:  # recent typer vendors click; older releases depend on the click package
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

from nphcli import __version__
from nphcli.errors import NphError


class _StderrHandler(logging.Handler):
    """Write library notices to whatever sys.stderr is now (test runners swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"note: {record.getMessage()}", file=sys.stderr)


# Set by the root option --debug for the current invocation only (reset in NphGroup.main, so
# in-process runners such as the tests' do not carry it over to the next command).
_debug_flag = False


def _debug() -> bool:
    """--debug, or NPH_DEBUG set to anything but empty or 0."""
    return _debug_flag or os.environ.get("NPH_DEBUG", "") not in ("", "0")


class _Interrupted(NphError):
    """Ctrl-C (SIGINT) while a command ran."""

    exit_code = 130


class NphGroup(TyperGroup):
    """Turns user errors (ours and click's) into one `Error: ...` line and an exit code.

    Exit codes: 0 success, 2 usage or input error, 1 other failure, 130 interrupted.
    With --debug (or NPH_DEBUG=1) a user error also prints its traceback first; the error line
    and the exit code stay the same.
    """

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # typer would turn it into a silent exit 130
            raise _Interrupted("interrupted") from None

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        global _debug_flag
        _debug_flag = False
        _setup_notices()
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except NphError as error:
            if _debug():
                traceback.print_exc(file=sys.stderr)
            code = _fail(str(error), error.exit_code)
        except ClickException as error:
            code = _fail(error.format_message(), error.exit_code)
        except (typer.Abort, KeyboardInterrupt):
            code = _fail("interrupted", 130)
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


def _fail(message: str, code: int) -> int:
    one_line = " ".join(message.split())
    print(f"Error: {one_line}", file=sys.stderr)
    return code


def _setup_notices() -> None:
    logger = logging.getLogger("nph")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False


app = typer.Typer(
    cls=NphGroup,
    name="nph",
    help=(
        "Associative-memory retrieval with the Nonparametric Modern Hopfield model family.\n\n"
        "Store patterns in a memory file with `nph store`, then retrieve them from corrupted "
        "queries with `nph retrieve`."
    ),
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"nph {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Also show the traceback of user errors (as NPH_DEBUG=1 does)."
    ),
) -> None:
    """Associative-memory retrieval with the Nonparametric Modern Hopfield model family."""
    global _debug_flag
    _debug_flag = debug


def main() -> None:
    """Console-script entry point."""
    app()
