"""The paper's §4 theory, checked on real memories and queries.

- `separation`: m, R and Δ_μ of a memory (blockwise, exact or sampled);
- `checks`: well-separation, Theorem 4.1 and Corollary 4.1 checked per query of a run;
- `bounds`: the bounds that do hold, and their tightness;
- `readings`: the two readings of well-separation (R over all pairs, R over the support);
- `energy`: iteration traces of each model's energy (the formulas are in `nphcli.engine.energy`);
  `convergence`: fixed-point checks.
"""
