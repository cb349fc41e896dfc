"""What an epoch yielded: ``EpochStats``, a loader's ``stats``."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastsab.plan.figures import FILL, FILLER, PADDED, REAL
from fastsab.plan.plans import PlanChunk

__all__ = ["EpochStats"]

#: Gives the figures of a chunk's batches that came without them (or ``None``: the plan has none).
Measure = Callable[[np.ndarray, np.ndarray], np.ndarray | None]


@dataclass
class EpochStats:
    """What the last epoch yielded.

    The counts and figures are of the batches this loader yielded in the epoch iterated last:
    under ``torch.distributed``, this rank's share; in an epoch resumed from a state, the
    batches yielded since the resume (the reports of skipped, dropped and repeated items
    excepted, which are the whole epoch's). A batch taken back to be retried with a lowered
    limit (``fastsab.adaptive.run``) is not counted; the batches planned in its place are.

    Attributes:
        epoch: The epoch number.
        num_batches: Batches yielded so far: the loader's steps. A batch split within its step
            (``fastsab.adaptive.run`` under ranks, or a batch that costs nothing) counts once.
        num_items: Items in those batches.
        num_skipped: Oversize items skipped (size-aware loaders).
        skipped: Their dataset indices.
        num_dropped: Items left out: the last partial batch with ``drop_last=True``, or the
            surplus batches with ``even_batches="drop"`` under ``torch.distributed``.
        dropped: Their dataset indices.
        limit_changes: ``(batches yielded before, old limit, new limit)`` for every time
            the batch size or cap was lowered during the epoch (out-of-memory adaptation).
        num_splits: Batches split because their step ran out of memory
            (``fastsab.adaptive.run``): once per split, a part split again counting once more.
        num_padded: Steps filled by repeating batches so that every rank runs the same
            number of steps (``even_batches="pad"`` under ``torch.distributed``), over all ranks.
        padded: The indices this rank yields a second time in the epoch: its share of those
            repeated batches. A resumed epoch reports, like ``skipped`` and ``dropped``, the
            whole epoch's: all repeats of the ranks it runs on, also those run before the save.
        spread_before, spread_after: Mean per-step cost spread ``(max - min) / max`` across
            ranks with batches dealt in plan order, and with the balanced assignment.
        mean_fill, min_fill: The mean and the smallest use of the budget by the batches yielded
            (size-aware loaders; ``None`` for ``FastLoader`` and before a batch): a
            batch's cost as the budget charges it (``fixed_cost`` included) over
            ``max_total_size``, the column it fills most counting. Read from the plan, against the
            configured caps (also after a limit was lowered). The last batch of an epoch is
            often small, and so is ``min_fill``.
        real_tokens, padded_tokens: The tokens of the batches yielded, and ``B`` times the padded
            length summed over them: counted where batches are padded, with ``cost="padded"``
            (lengths padded to ``pad_to_multiple_of``, or padded features: each item's own cost,
            and ``B`` times the cost of the per-feature maxima) or with a
            ``PadCollator`` (as ``collate_fn`` or a dataset's ``collator``;
            ``sizeof`` then gives the lengths, padded to the collator's ``pad_to_multiple_of``).
            ``None`` elsewhere, and for costs of several columns.
        padding_efficiency: ``real_tokens / padded_tokens`` (``None`` where they are not counted
            or no token was padded).
        num_filler_rows: Filler rows in the batches yielded: with shape ``buckets``, a bucket's
            last batch completed to its batch size with repeats of its own items (marked False
            in the batch's ``sample_mask``). Their tokens count as padding: in ``padded_tokens``,
            not in ``real_tokens``. ``num_items`` counts real items only. ``None`` where the
            batches' figures are unknown.

    Examples:
        >>> import torch
        >>> from fastsab import FastSizeAwareLoader
        >>> loader = FastSizeAwareLoader(torch.arange(4), [3, 1, 4, 2], 8, cost="padded", shuffle=False)
        >>> [batch.tolist() for batch in loader]  # padded costs 2 * 3 and 2 * 4
        [[0, 1], [2, 3]]
        >>> stats = loader.stats
        >>> stats.mean_fill, stats.min_fill, stats.real_tokens, stats.padded_tokens, stats.padding_efficiency
        (0.875, 0.75, 10, 14, 0.7142857142857143)
    """

    epoch: int
    num_batches: int = 0
    num_items: int = 0
    num_skipped: int = 0
    skipped: list[int] = field(default_factory=list)
    num_dropped: int = 0
    dropped: list[int] = field(default_factory=list)
    limit_changes: list[tuple[int, Any, Any]] = field(default_factory=list)
    num_splits: int = 0
    num_padded: int = 0
    padded: list[int] = field(default_factory=list)
    spread_before: float = 0.0
    spread_after: float = 0.0
    # gives the figures of chunks planned without them (set by the loader's cursor)
    measure: Measure | None = field(default=None, repr=False, compare=False)
    # a mixture's figures per source (set by the loader: MixedOrder.source_figures of the epoch)
    source_figures: Callable[[], dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    _figures: _Figures = field(default_factory=lambda: _Figures(), repr=False, compare=False)

    def clear_reports(self) -> None:
        """Forget the skipped, dropped and padded items (a new plan of the epoch reports them again)."""
        self.num_skipped = self.num_dropped = 0
        self.skipped, self.dropped, self.padded = [], [], []

    def add(self, chunk: PlanChunk) -> None:
        self.num_skipped += len(chunk.skipped)
        self.skipped += chunk.skipped.tolist()
        self.num_dropped += len(chunk.dropped)
        self.dropped += chunk.dropped.tolist()
        self.padded += chunk.padded.tolist()

    def skipped_before(self, skipped: np.ndarray) -> None:
        """Report ``skipped`` before the items reported so far: a resumed epoch's, before its resume point."""
        self.num_skipped += len(skipped)
        self.skipped = skipped.tolist() + self.skipped

    def planned(self, position: int, chunk: PlanChunk) -> None:
        """``chunk``'s batches are the ones this epoch yields from its ``position``-th batch on (if it gets there)."""
        if not chunk.num_batches:
            return
        figures = chunk.figures
        if figures is None and self.measure is not None:
            figures = self.measure(chunk.ids, chunk.offsets)
        self._figures.planned(position, figures, self.num_batches)

    def replanned(self, position: int) -> None:
        """The batches from the ``position``-th one on are planned again (a lowered limit)."""
        self._figures.replanned(position)

    @property
    def sources(self) -> dict[str, Any] | None:
        """A ``Mixture``'s epoch per source (``SourceFigures``: items, cost, source epochs, share, target).

        ``None`` for one dataset.

        Counted in the epoch's plan (all ranks together, to its end), from the mixing rule's states.
        """
        return None if self.source_figures is None else self.source_figures()

    @property
    def mean_fill(self) -> float | None:
        totals = self._figures.totals(self.num_batches)
        return None if totals is None else totals[0] / self.num_batches

    @property
    def min_fill(self) -> float | None:
        totals = self._figures.totals(self.num_batches)
        return None if totals is None else totals[1]

    @property
    def real_tokens(self) -> int | float | None:
        totals = self._figures.totals(self.num_batches)
        return None if totals is None else _number(totals[2])

    @property
    def padded_tokens(self) -> int | float | None:
        totals = self._figures.totals(self.num_batches)
        return None if totals is None else _number(totals[3])

    @property
    def num_filler_rows(self) -> int | None:
        totals = self._figures.totals(self.num_batches)
        return None if totals is None else int(totals[4])

    @property
    def padding_efficiency(self) -> float | None:
        real, padded = self.real_tokens, self.padded_tokens
        return None if real is None or not padded else real / padded


def _number(value: float) -> int | float | None:
    """A sum of tokens: ``None`` if not counted (NaN), an ``int`` if whole."""
    if np.isnan(value):
        return None
    return int(value) if value.is_integer() else value


class _Figures:
    """The figures of the batches an epoch yields, held per planned chunk until no retry can take them back."""

    def __init__(self) -> None:
        # (position of the first batch, figures) of the chunks planned and not added up, in order
        self.pending: deque[tuple[int, np.ndarray]] = deque()
        self.measured = True  # every chunk planned came with figures
        self.done = 0  # batches added up into sums: fill sum, fill minimum, real and padded tokens, fillers
        self.sums = [0.0, float("inf"), 0.0, 0.0, 0.0]

    def planned(self, position: int, figures: np.ndarray | None, yielded: int) -> None:
        if figures is None:
            self.measured = False
            return
        self.pending.append((position, figures))
        # NOTE: chunks are planned ahead (prefetch, workers) and planned again after a lowered
        # limit: only the batches yielded count, and the last one yielded may yet be retried
        self._add_up(yielded - 1)

    def replanned(self, position: int) -> None:
        pending = self.pending
        while pending and pending[-1][0] >= position:
            pending.pop()
        if pending:
            start, figures = pending[-1]
            pending[-1] = (start, figures[:, : position - start])

    def _add_up(self, end: int) -> None:
        """Add the pending figures of the batches before the ``end``-th to the sums."""
        pending = self.pending
        while pending and pending[0][0] < end:
            start, figures = pending.popleft()
            taken = _accumulate(self.sums, start, figures, end)
            self.done = start + taken
            if taken < figures.shape[1]:
                pending.appendleft((self.done, figures[:, taken:]))

    def totals(self, yielded: int) -> list[float] | None:
        """Fill sum and minimum, real and padded tokens, fillers of the first ``yielded`` batches, or ``None``."""
        if not self.measured or not yielded:
            return None
        self._add_up(yielded - 1)
        sums, counted = list(self.sums), self.done
        for start, figures in self.pending:
            counted = start + _accumulate(sums, start, figures, yielded)
        return sums if counted >= yielded else None


def _accumulate(sums: list[float], start: int, figures: np.ndarray, end: int) -> int:
    """Add the figures of the batches before the ``end``-th (the first at ``start``) to ``sums``; how many."""
    taken = figures[:, : max(end - start, 0)]
    count: int = taken.shape[1]
    if count:
        total = taken.sum(axis=1).tolist()
        sums[0] += total[FILL]
        sums[1] = min(sums[1], float(taken[FILL].min()))
        sums[2] += total[REAL]
        sums[3] += total[PADDED]
        sums[4] += total[FILLER]
    return count
