"""`nph batch`: run JSON Lines retrieval jobs in one process, printing JSON Lines results.

Parsing and rendering only; `nphcli.app.batch` does the work.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from nphcli.cli.app import app
from nphcli.cli.options import Threads
from nphcli.cli.render import print_json
from nphcli.core.errors import NphError
from nphcli.schema.fields import fields


@app.command("batch")
def batch_command(
    jobs: Annotated[
        str,
        typer.Argument(
            help="JSON Lines file of jobs, one JSON object per line, or - for stdin. Keys: the "
            "options of `nph retrieve` with _ for - and model parameters by name (k, beta, "
            "...); a list is several values, one result line each. Not taken here: "
            f"{', '.join(f.name for f in fields() if 'batch' in f.refused)}.",
        ),
    ],
    threads: Threads = None,
) -> None:
    """Run many `nph retrieve` settings in one process: one JSON result per job line.

    Each setting's line of output is the object `nph retrieve --json` prints for it, or
    {"job": LINE, "error": MESSAGE} when it cannot run; the other jobs still run. The two memory
    files used last are kept between jobs (group jobs by memory to read each once). Exit status
    1 when any job failed.
    """
    from nphcli.app.batch import run_jobs
    from nphcli.app.threads import use_threads

    use_threads(threads)
    if jobs == "-":
        lines = sys.stdin
    else:
        try:
            lines = open(jobs, encoding="utf-8")  # noqa: SIM115  (closed below)
        except OSError as error:
            raise NphError(f"cannot read jobs file {jobs}: {error.strerror}") from None
    failed = 0
    try:
        for result in run_jobs(lines):
            failed += "config" not in result  # an error object
            print_json(result)
            sys.stdout.flush()
    except UnicodeDecodeError:
        raise NphError(f"jobs file {jobs} is not UTF-8 text") from None
    finally:
        if lines is not sys.stdin:
            lines.close()
    if failed:
        print(f"{failed} job(s) failed; see their error objects on stdout", file=sys.stderr)
        raise typer.Exit(1)
