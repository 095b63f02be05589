"""Sweeps: a grid of retrieval evaluations over models and their parameters, memory sizes,
corruptions and trials.

Modules, each readable on its own:

- `config`: the grid as read from a preset, a TOML file or command-line options (`SweepConfig`);
- `grid`: settings, the (setting, trial) tasks in run order, and the seeds of a trial;
- `pool`: the patterns memories are drawn from, and the memory of one trial and size;
- `columns`: the columns of a results row, the theory columns included;
- `results`: the results file: formats, reading back, appending durably, resuming;
- `summary`: each setting's mean and standard deviation over its trials;
- `runner`: running the grid, row by row, into the results file;
- `session`: a whole `nph sweep`: its outputs checked, the grid run, summarised and plotted.

Nothing is imported here, so `import nphcli.sweeps.config` stays free of torch.
"""
