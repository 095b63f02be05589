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


def score_overflow(dtype: object) -> NphError:
    """The error for finite inputs whose scores β⟨x, ξ⟩ overflow the dtype models accumulate in
    (e.g. entries near 1e19 in float32): a result would be NaN or infinite, never an answer."""
    name = str(dtype).removeprefix("torch.")
    return NphError(
        f"the scores β⟨x, ξ⟩ of these inputs overflow {name}; rescale the patterns "
        "(nph store --normalize l2 or zscore), lower --beta, or use float64"
    )
