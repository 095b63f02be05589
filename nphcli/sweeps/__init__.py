"""Sweeps: a grid of retrieval evaluations over models, memory sizes, corruptions, β and trials.

Modules, each readable on its own:

- `config`: the grid as read from a preset, a TOML file or command-line options (`SweepConfig`);
- `parsing`: the checks and conversions of config values and option text it uses;
- `grid`: settings, the (setting, trial) tasks in run order, and the seeds of a trial;
- `pool`: the patterns memories are drawn from, and the memory of one trial and size;
- `columns`: the columns of a results row, the theory columns included;
- `results`: the results file: formats, reading back, appending durably, resuming;
- `summary`: each setting's mean and standard deviation over its trials;
- `runner`: running the grid, row by row, into the results file.

Nothing is imported here, so `import nphcli.sweeps.config` stays free of torch.
"""
