"""The `nph` application object, its single error path, and small helpers shared by commands.

Commands live in sibling modules (store.py, retrieve.py, ...) and only parse options, call the
library, and render. Library modules (and so torch) are imported inside command functions, so
`nph --help` does not pay for them.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

try:  # recent typer vendors click; older releases depend on the click package
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException, NoArgsIsHelpError

from nphcli.cli.render import plain_streams
from nphcli.core.errors import NphError
from nphcli.version import __version__


class _StderrHandler(logging.Handler):
    """Write library notices to whatever sys.stderr is now (test runners swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"note: {record.getMessage()}", file=sys.stderr)


# Set by --debug, --quiet and --json (anywhere) for the current invocation only: NphGroup.main
# resets them, so in-process runners do not carry them over to the next command.
_debug_flag = False
_quiet_flag = False
_json_errors = False

BROKEN_PIPE_EXIT = 141  # stdout closed early (`nph ... | head`): 128 + SIGPIPE, as a shell says


def _debug() -> bool:
    """--debug, or NPH_DEBUG set to anything but empty or 0."""
    return _debug_flag or os.environ.get("NPH_DEBUG", "") not in ("", "0")


def quiet() -> bool:
    """--quiet: no notices, progress or `wrote FILE` lines on stderr; errors still print."""
    return _quiet_flag


class _BrokenPipe(Exception):
    """stdout was closed by its reader; raised past click, which would exit 1 instead."""


class _Interrupted(NphError):
    """Ctrl-C (SIGINT) while a command ran."""

    exit_code = 130


class NphGroup(TyperGroup):
    """Turns user errors (ours and click's) into one `Error: ...` line and an exit code: 0
    success, 2 usage or input error, 1 other failure (a full disk, out of memory), 130
    interrupted, 141 stdout closed early. --debug (or NPH_DEBUG=1) prints the traceback first;
    with --json the error is a JSON object on stderr instead of the `Error:` line."""

    def invoke(self, ctx: Any) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
            return result
        except KeyboardInterrupt:  # typer would turn it into a silent exit 130
            raise _Interrupted("interrupted") from None
        except BrokenPipeError:
            raise _BrokenPipe() from None

    def _flags(self, argv: list[str]) -> set[str]:
        """The options the command `argv` runs takes (advice names only those)."""
        command: Any = self
        for word in (w for w in argv if not w.startswith("-")):
            if not hasattr(command, "get_command"):
                break
            command = command.get_command(None, word) or command  # type: ignore[arg-type]
        return {flag for param in command.params for flag in getattr(param, "opts", [])}

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        global _debug_flag, _quiet_flag, _json_errors
        argv = args[0] if args else kwargs.get("args")
        argv = sys.argv[1:] if argv is None else list(argv)
        _debug_flag, _quiet_flag = False, False
        _json_errors = "--json" in argv
        plain_streams()
        logger = logging.getLogger("nph")
        if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
            logger.addHandler(_StderrHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except NoArgsIsHelpError as error:  # bare `nph`: the usual help, not an error line
            print(error.ctx.get_help())
            code = 0
        except NphError as error:
            if _debug():
                traceback.print_exc(file=sys.stderr)
            code = _fail(str(error), error.exit_code)
        except ClickException as error:  # (typer words a wrong choice "..., Value error, ...")
            code = _fail(error.format_message().replace(": Value error, ", ": "), error.exit_code)
        except (typer.Abort, KeyboardInterrupt):
            code = _fail("interrupted", 130)
        except _BrokenPipe:
            try:  # point stdout at /dev/null so the interpreter's final flush cannot fail again
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):  # not a real file (in-process runners)
                pass
            code = BROKEN_PIPE_EXIT
        except Exception as error:
            message = _resource_message(error, self._flags(argv))
            if message is None:  # a bug: keep its traceback
                raise
            if _debug():
                traceback.print_exc(file=sys.stderr)
            code = _fail(message, 1)
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


def _fail(message: str, code: int) -> int:
    line = " ".join(message.split())
    _write_line(
        json.dumps({"error": line, "exit_code": code}) if _json_errors else f"Error: {line}"
    )
    return code


def _write_line(text: str) -> None:
    """`text` and its newline to stderr in one write(2): ranks of torchrun (or --workers) that
    share one stderr then never mix their lines (a pipe keeps writes of ≤ 4 KiB whole)."""
    data = (text + "\n").encode("utf-8", errors="replace")
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # captured (tests, embedding): no descriptor
        sys.stderr.write(text + "\n")
        return
    sys.stderr.flush()
    while data:
        data = data[os.write(fd, data) :]


_REDUCE = {  # what to lower when memory runs out, by the option that lowers it
    "--n": "fewer patterns (--n)",
    "--dim": "fewer values per pattern (--dim)",
    "--queries": "fewer queries (--queries)",
    "--batch-size": "smaller query batches (--batch-size)",
    "--memory-budget": "a smaller --memory-budget",
    "--stream": "--stream",
}


def _resource_message(error: BaseException, flags: set[str] = frozenset()) -> str | None:
    """The one-line message for a failure of the machine rather than of nph or its input: out
    of memory (CPU or CUDA), with advice naming only options of the command (`flags`), or no
    space left on the disk. None for anything else."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        name = f" writing {error.filename}" if error.filename else ""
        return f"no space left on the device{name}; free some space or write elsewhere"
    torch = sys.modules.get("torch")  # only loaded modules can have raised it
    cuda = getattr(torch, "cuda", None)
    torch_oom = getattr(torch, "OutOfMemoryError", None) or getattr(cuda, "OutOfMemoryError", None)
    text = str(error)
    said = any(s in text for s in ("can't allocate memory", "out of memory"))
    if isinstance(error, (MemoryError, *([torch_oom] if torch_oom else []))) or (
        said and isinstance(error, RuntimeError)
    ):
        first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
        reduce = [advice for flag, advice in _REDUCE.items() if flag in flags]
        if not reduce:
            return f"out of memory ({first[:200]}); free memory or use a machine with more"
        return f"out of memory ({first[:200]}); reduce the work: {', '.join(reduce)}"
    return None


app = typer.Typer(
    cls=NphGroup,
    name="nph",
    help=(
        "Associative-memory retrieval with the Nonparametric Modern Hopfield model family.\n\n"
        "Store patterns in a memory file with `nph store`, then retrieve them from corrupted "
        "queries with `nph retrieve`."
    ),
    add_completion=True,
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
    quiet_: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="Print no notices, progress or `wrote FILE` lines on stderr (errors still print).",
    ),
) -> None:
    """Associative-memory retrieval with the Nonparametric Modern Hopfield model family."""
    global _debug_flag, _quiet_flag
    _debug_flag = debug
    _quiet_flag = quiet_
    if quiet_:
        logging.getLogger("nph").setLevel(logging.ERROR)


def main() -> None:
    """Console-script entry point."""
    app()
