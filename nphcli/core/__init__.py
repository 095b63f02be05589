"""What every layer needs and nothing in nph sits below: the one user-error type, notices,
defaults, dtype names, device resolution, writes that never half-write a file, size checks
before allocating, and the normalisations a memory records."""
