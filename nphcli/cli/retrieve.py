"""`nph retrieve`: corrupt stored patterns (or read your own queries), retrieve, measure, report.

Every option is generated from the retrieval fields (`nphcli.schema.fields`) and the model
catalog; `nphcli.app.request` builds and runs the request. Parsing and rendering only.
"""

from __future__ import annotations

from typing import Any

from nphcli.cli.app import app
from nphcli.cli.field_options import field_values, with_fields
from nphcli.cli.retrieve_output import print_many, print_report


@app.command("retrieve")
@with_fields()
def retrieve_command(*, given: dict[str, Any]) -> None:
    """Retrieve corrupted stored patterns (or your own queries) and report error and timing.

    By default every stored pattern is a query; --mask and --noise corrupt it (mask first, then
    noise) and the uncorrupted pattern is the target. Any setting option takes a comma list:
    every combination is evaluated on the memory read once. Metrics and timings are defined in
    docs/retrieving.md.
    """
    from nphcli.app.request import request_from, run_request, save_outputs

    request = request_from(field_values(given))
    outcome = run_request(request)
    if not outcome.reports:  # a torchrun rank other than 0
        return
    save_outputs(request, outcome)
    if len(outcome.reports) > 1:
        print_many(request.settings, outcome.reports, request.output)
        return
    print_report(outcome.reports[0], request.output, outcome.trace)
