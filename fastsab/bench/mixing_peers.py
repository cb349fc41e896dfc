"""The peers of the mixing suite: other libraries' sample-level mixers, run over the suite's sources.

Each peer mixes sources by drawing the next sample at random with the probabilities given, and
stops when a source is exhausted (as fastsab's ``stop="first"``). A peer here is a function of
the sources' item counts and the probabilities, returning the source of each item its epoch
yields, in order; what it needs (datasets, cuts) is made beforehand by ``peer_mixers`` and not
timed. The peers are imported when the suite runs: a peer that does not import has no function,
and ``peer_mixers`` says why instead.

- Hugging Face ``datasets.interleave_datasets(probabilities=..., stopping_strategy="first_exhausted")``;
- torchdata ``nodes.MultiNodeWeightedSampler(stop_criteria="FIRST_DATASET_EXHAUSTED")``;
- lhotse ``CutSet.mux(stop_early=True)``;
- Mosaic Streaming ``Stream(proportion=...)``: reported as not measured, with the reason (where
  its package imports: that its streams are MDS shards, which the suite does not write).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["PEER_NAMES", "Mixer", "peer_mixers"]

#: A peer's epoch: ``mixer(probabilities)`` mixes (the part timed) and gives what reads the source of each
#: item yielded, in order (not timed).
Mixer = Callable[[Sequence[float]], Callable[[], np.ndarray]]

#: The peers, in the order of the suite's rows.
PEER_NAMES = (
    "HF datasets interleave_datasets",
    "torchdata MultiNodeWeightedSampler",
    "lhotse CutSet.mux",
    "Mosaic Streaming Stream(proportion=...)",
)


def peer_mixers(counts: Sequence[int], seed: int = 0) -> dict[str, Mixer | str]:
    """Each peer of ``PEER_NAMES`` over sources of ``counts`` items: its mixer, or why it is not measured.

    Examples:
        >>> mixers = peer_mixers([3, 2])
        >>> sorted(mixers) == sorted(PEER_NAMES)
        True
    """
    makers: list[Callable[[Sequence[int], int], Mixer | str]] = [_hf, _torchdata, _lhotse, _mosaic]
    out: dict[str, Mixer | str] = {}
    for name, make in zip(PEER_NAMES, makers):
        try:
            out[name] = make(counts, seed)
        # NOTE: not ImportError alone: a peer whose own imports fail otherwise (a compiled extension built
        # for another torch raises RuntimeError) is as absent
        except Exception as error:
            out[name] = f"not measured: {_why(error)}"
    return out


def _why(error: BaseException) -> str:
    """``error``, and the error that caused it where there is one, in a line."""
    cause = error.__cause__ or error.__context__
    text = f"{type(error).__name__}: {error}"
    return f"{text} ({type(cause).__name__}: {cause})" if cause is not None else text


def _hf(counts: Sequence[int], seed: int) -> Mixer:
    from datasets import Dataset, interleave_datasets

    parts = [Dataset.from_dict({"source": np.full(count, s, np.int64)}) for s, count in enumerate(counts)]

    def mix(probabilities: Sequence[float]) -> Callable[[], np.ndarray]:
        # NOTE: interleave_datasets draws every index at once; reading the mixed column back (a take through
        # those indices, slower than the draws) is not timed
        mixed = interleave_datasets(
            parts, probabilities=list(probabilities), seed=seed, stopping_strategy="first_exhausted"
        )
        return lambda: np.asarray(mixed.with_format("arrow")[:]["source"].to_numpy(), dtype=np.int64)

    return mix


def _torchdata(counts: Sequence[int], seed: int) -> Mixer:
    from torchdata.nodes import IterableWrapper, MultiNodeWeightedSampler

    def mix(probabilities: Sequence[float]) -> Callable[[], np.ndarray]:
        nodes = {str(s): IterableWrapper(itertools.repeat(s, count)) for s, count in enumerate(counts)}
        weights = {str(s): float(p) for s, p in enumerate(probabilities)}
        sampler = MultiNodeWeightedSampler(nodes, weights, stop_criteria="FIRST_DATASET_EXHAUSTED", seed=seed)
        sources = np.fromiter(sampler, dtype=np.int64)
        return lambda: sources

    return mix


def _lhotse(counts: Sequence[int], seed: int) -> Mixer:
    from lhotse import CutSet
    from lhotse.cut import MonoCut

    cutsets = [
        CutSet.from_cuts(MonoCut(id=f"{s}-{i}", start=0.0, duration=1.0, channel=0) for i in range(count))
        for s, count in enumerate(counts)
    ]

    def mix(probabilities: Sequence[float]) -> Callable[[], np.ndarray]:
        mixed = CutSet.mux(*cutsets, stop_early=True, weights=list(probabilities), seed=seed)
        sources = np.fromiter((int(cut.id.partition("-")[0]) for cut in mixed), dtype=np.int64)
        return lambda: sources

    return mix


def _mosaic(counts: Sequence[int], seed: int) -> str:
    # NOTE: only the import is tried. Its streams are MDS shards on disk; a run of them could not be
    # checked where this suite was written (the package did not import), so none is timed
    import streaming  # noqa: F401

    return "not measured: mosaicml-streaming imports, but this suite writes no MDS shards for its streams"
