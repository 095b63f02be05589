"""nph: associative-memory retrieval with the Nonparametric Modern Hopfield model family.

Importing the package is cheap (no torch): the CLI imports library modules only when a command
needs them, so `nph --help` stays fast in shell loops.
"""

__version__ = "0.1.0"
