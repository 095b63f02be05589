"""Notices for the user (fallbacks, assumptions) that are not results.

The library reports through the standard `logging` logger "nph" and never prints; the CLI sends
these records to stderr so that stdout carries results only.
"""

import logging

logger = logging.getLogger("nph")


def notice(message: str) -> None:
    """Tell the user something they should know (e.g. which data was used instead)."""
    logger.warning(message)
