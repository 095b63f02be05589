"""The application layer: what one command does from its parsed settings, orchestrating the
layers below it (one `nph retrieve` request in this process or over ranks, `nph batch` jobs,
settings evaluated on inputs read once, the thread policy, `nph store`, `nph doctor`)."""
