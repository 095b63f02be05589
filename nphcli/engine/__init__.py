"""The blockwise kernels the models are built from: query batches × memory blocks planned within
the budget and merged exactly. Models choose what to compute; the engine chooses how, per device."""
