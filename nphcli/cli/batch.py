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
from nphcli.schema.fields import fields


@app.command("batch")
def batch_command(
    jobs: Annotated[
        str,
        typer.Argument(
            help="JSON Lines file of jobs, one JSON object per line, or - for stdin. Keys: the "
            "options of `nph retrieve` with _ for - and model parameters by name (k, beta, "
            "...); a list is several values, one result line each. Not taken here: "
            f"{', '.join(f.name for f in fields() if 'batch' in f.refused)}."
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
    from nphcli.app.batch import MAX_JOB_BYTES, run_jobs
    from nphcli.app.threads import use_threads
    from nphcli.core.bounded import read_lines

    use_threads(threads)
    source = sys.stdin.buffer if jobs == "-" else jobs
    # A line is one job: one longer than a job may be (an endless input) stops the batch.
    numbered = read_lines(source, what="jobs file", max_line=MAX_JOB_BYTES, limit=1 << 62)
    failed = 0
    for result in run_jobs(line for _, line in numbered):
        failed += "config" not in result  # an error object
        print_json(result)
        sys.stdout.flush()
    if failed:
        print(f"{failed} job(s) failed; see their error objects on stdout", file=sys.stderr)
        raise typer.Exit(1)
