"""Default values users meet, in one torch-free place: the library, the CLI's help texts, sweeps
and the generated documentation all read them from here, so each has one documented value."""

# Inverse temperature β of every model that takes one, in the library and on the command line.
# Measured on the bundled MNIST digits stored in [0, 1] (mean ‖ξ‖² ≈ 88): β = 0.3 gives the
# lowest or near-lowest SSE for dense, topk, sparse and entmax clean, at --mask 0.5 and at
# --noise 0.5 (README, "Retrieving"). Scores are β⟨x, ξ⟩, so the right β scales as 1/‖ξ‖².
DEFAULT_BETA = 0.3
DEFAULT_BETA_NORM2 = 88.0  # the mean ‖ξ‖² DEFAULT_BETA was measured at
# `nph recall` on a memory of items (unit vectors: scores are cosines): sparsemax at β = 30
# recalls as well as nearest neighbour with 1-2 rows of support (docs/text.md); a memory stored
# from a table records it (`recall` in its metadata), and --model / --beta override it.
ITEM_RECALL = {"model": "sparse", "beta": 30.0}

# Working memory one `retrieve` call may use beyond its inputs and result (--memory-budget).
DEFAULT_MEMORY_BUDGET = 512 * 2**20  # bytes

# Searching an approximate index (`nph retrieve --index`): what an unset option means.
DEFAULT_CANDIDATES = 64  # candidates per query when the rule needs fewer
DEFAULT_NPROBE = 16  # IVF lists searched per query
DEFAULT_EF = 128  # HNSW search breadth
DEFAULT_CHECK_EXACT = 100  # seeded queries compared with exact retrieval


# `nph analyze --capacity` (`nphcli.theory.capacity.CapacityRequest`): Ramsauer et al.'s example,
# K = 3, d = 20, β = 1, p = 0.001, over doubling pattern counts.
CAPACITY_DIM = 20
CAPACITY_BETA = 1.0
CAPACITY_K_RADIUS = 3.0  # norm m = K·√(d − 1)
CAPACITY_P = 0.001
CAPACITY_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)
CAPACITY_TRIALS = 5
CAPACITY_STEPS = 100
CAPACITY_EPSILON = 1e-9
CAPACITY_MODELS = ("dense", "topk", "sparse")


def size_text(size: int) -> str:
    """A byte count as a help text writes it: 536870912 → 512MiB (exact units only)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)
