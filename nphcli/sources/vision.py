"""torchvision's datasets, imported so that a torchvision built for another torch gives one
error line (what `nph doctor` then explains) instead of a traceback from deep inside it."""

from __future__ import annotations

from nphcli.core.errors import NphError


def import_torchvision():
    """`torchvision.datasets`, or one NphError saying it does not load and where to look."""
    try:
        import torchvision.datasets
    except Exception as error:  # ImportError, RuntimeError (missing operators), OSError (libs)
        raise NphError(
            f"torchvision does not load ({first_line(error)}); it must be the build made for "
            "the installed torch: run `nph doctor` to see both versions"
        ) from None
    return torchvision.datasets


def first_line(error: BaseException) -> str:
    """An exception's first line (its type when it has no message): enough for one error line."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
