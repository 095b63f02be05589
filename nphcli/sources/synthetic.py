"""Seeded synthetic patterns for capacity experiments: `nph store random`."""

from __future__ import annotations

from nphcli.core.errors import NphError
from nphcli.core.resources import check_allocation
from nphcli.sources.base import VECTOR, Loaded, SourceOptions, register_source

DEFAULT_N = 1000
DEFAULT_DIM = 64
DISTRIBUTIONS = {
    "gaussian": "independent N(0, 1) entries",
    "binary": "independent ±1 entries, each sign with probability 1/2",
}


@register_source(
    "random",
    summary=(
        f"seeded synthetic patterns: --n (default {DEFAULT_N}) rows of --dim (default "
        f"{DEFAULT_DIM}) values, Gaussian N(0,1) or binary ±1 (--distribution)"
    ),
    options=("dim", "distribution"),
)
def load_random(spec: str, options: SourceOptions) -> Loaded:
    """M patterns ξ_μ ∈ R^d with i.i.d. entries, drawn from a generator seeded with `seed`."""
    import torch

    n = DEFAULT_N if options.n is None else options.n
    dim = DEFAULT_DIM if options.dim is None else options.dim
    distribution = options.distribution or "gaussian"
    for flag, value in (("--n", n), ("--dim", dim)):
        if value <= 0:
            raise NphError(f"{flag} must be at least 1, got {value}")
    if distribution not in DISTRIBUTIONS:
        raise NphError(
            f"--distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}"
        )
    # Integer bits take 8 bytes per entry before the float32 copy: check the larger need.
    entry_bytes = 4 if distribution == "gaussian" else 12
    check_allocation((n, dim), entry_bytes, what="these patterns", reduce="lower --n or --dim")
    generator = torch.Generator().manual_seed(options.seed)
    if distribution == "gaussian":
        patterns = torch.randn(n, dim, generator=generator)  # (M, d)
    else:
        bits = torch.randint(0, 2, (n, dim), generator=generator)  # (M, d) in {0, 1}
        patterns = bits.to(torch.float32).mul_(2).sub_(1)  # (M, d) in {-1, +1}
    meta = {
        "source": spec,
        "kind": VECTOR,
        "origin": f"generated: {DISTRIBUTIONS[distribution]}",
        "distribution": distribution,
        "fallback": False,
        "available": n,
        "selection": {"method": "generated", "n": n, "seed": options.seed},
        "seed": options.seed,
    }
    return Loaded(patterns, None, meta)
