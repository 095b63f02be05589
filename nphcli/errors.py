"""The one exception family for user errors.

Library code raises these with a message that says what is wrong and what to do; the CLI turns
them into a single `Error: ...` line on stderr. Anything else is a bug and keeps its traceback.
"""


class NphError(Exception):
    """A user-facing error: bad input, bad option, unusable file. Exit code 2."""

    exit_code = 2


class NphRuntimeError(NphError):
    """A failure that is not the input's fault (e.g. the disk filled up). Exit code 1."""

    exit_code = 1
