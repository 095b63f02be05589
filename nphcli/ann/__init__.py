"""Approximate nearest-neighbour indexes (the `ann` extra, FAISS): build, verify, search."""
