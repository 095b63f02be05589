""" "Did you mean" for a name the user mistyped: a model, a source, a batch or sweep key."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# A rule's name in the literature → the model that computes it, where spelling alone would
# point elsewhere (difflib sends `softmax` to entmax; the softmax rule is dense).
RULE_NAMES = {"softmax": "dense", "sparsemax": "sparse"}


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice `word` most likely meant: the same name in another case (`Dense`), else the
    model computing the rule it names (RULE_NAMES: `softmax` → dense), else the nearest by
    difflib's ratio (at least 0.6: `tpok` → topk, `sparce` → sparse, `mnsit` → mnist, `nosie`
    → noise), else None."""
    choices = [str(choice) for choice in choices]
    lowered = {choice.lower(): choice for choice in choices}
    key = str(word).strip().lower()
    if key in lowered:
        return lowered[key]
    if RULE_NAMES.get(key) in lowered:
        return lowered[RULE_NAMES[key]]
    found = difflib.get_close_matches(key, list(lowered), n=1, cutoff=0.6)
    return lowered[found[0]] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'topk'?)' for the closest choice, or '' when none is close."""
    found = closest(word, choices)
    if found is None or found == word:
        return ""
    rule = str(word).strip().lower()
    if RULE_NAMES.get(rule) == found.lower():
        return f" (did you mean {found!r}? it computes the {rule} rule)"
    return f" (did you mean {found!r}?)"
