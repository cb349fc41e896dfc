"""Differential tests against the peers whose APIs fastsab mirrors (bionemo-size-aware-batching, toma)."""
