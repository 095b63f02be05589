"""Experiments from the paper that train networks built from `nphcli.layers` (see docs)."""
