"""The position behind what was handed out: batches a consumer received of a cursor's epoch.

A training loop behind ``DataLoader`` worker processes, or a trainer that fetches a batch
ahead of its step, receives batches later than an ``EpochCursor``
hands them out. ``ConsumedCount`` counts them where they are consumed, and its
``state_dict`` names that position, so that a resume runs exactly the
batches not consumed.
"""

from __future__ import annotations

from typing import Any

from fastsab.position.cursor import EpochCursor

__all__ = ["ConsumedCount"]


class ConsumedCount:
    """The ``(epoch, steps)`` a consumer received of the epoch ``cursor`` hands out.

    Call ``started`` once the cursor has started the epoch the consumer iterates (when
    it starts it, or at the latest when the first batch arrives), ``received`` for each
    batch consumed and ``ended`` when the iteration ran to its end.

    Examples:
        >>> import torch
        >>> from fastsab import FastLoader
        >>> loader = FastLoader(torch.arange(10), 2, shuffle=False)
        >>> count, batches = ConsumedCount(loader), iter(loader)
        >>> _ = next(batches), next(batches)  # handed out: 2 batches
        >>> count.started()
        >>> count.received()  # consumed: 1
        >>> loader.state_dict()["steps"], count.state_dict()["steps"]
        (2, 1)
    """

    def __init__(self, cursor: EpochCursor) -> None:
        self.cursor = cursor
        self.position: tuple[int, int] | None = None  # None: no iteration being consumed

    def started(self) -> None:
        """Count from where the cursor started its epoch (after a resume, the resumed steps)."""
        self.position = self.cursor.start_position or (self.cursor.epoch, 0)

    def received(self) -> None:
        """Count one more batch consumed (nothing outside an iteration)."""
        if self.position is not None:
            self.position = (self.position[0], self.position[1] + 1)

    def left(self) -> None:
        """The consumer left the iteration before its end: a ``set_epoch`` now chooses the next position."""
        if self.position is not None:
            # NOTE: the cursor may have handed out its whole epoch already (worker processes fetch
            # ahead), so its own iteration is not the one left
            self.cursor._iteration_left()

    def ended(self) -> None:
        """The iteration ran to its end: the cursor's own position holds again."""
        self.position = None

    def state_dict(self) -> dict[str, Any]:
        """The cursor's state, counted in batches consumed (see ``EpochCursor.consumed_state``)."""
        return self.cursor.consumed_state(self.position)
