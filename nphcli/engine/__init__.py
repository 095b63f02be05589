"""The blockwise kernels every model is built from: a retrieval over memories too large for one
score matrix runs in query batches × memory blocks planned within the working-memory budget, and
merges the blocks exactly (softmax accumulators, top-k selection, sparse thresholds), on the CPU
or a GPU. Models choose what to compute; the engine chooses how, per device."""
