"""One retrieval run, measured: a setting (model, parameters, corruption, run options) applied to
a memory and its queries, from choosing and corrupting the queries to the metrics and the report
that names what it came from. Orchestrating many runs or commands is `nphcli.app`'s work."""
