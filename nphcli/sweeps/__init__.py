"""Sweeps: a grid of retrieval evaluations over models and their parameters, memory sizes,
corruptions and trials (docs/architecture.md lists the modules). Nothing is imported here, so
`import nphcli.sweeps.config` stays free of torch."""
