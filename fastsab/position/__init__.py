"""A rank's share of the plan and the saved position: the second stage of a batch's walk.

Dealing an epoch's batches to ranks in equal steps (``distributed``,
``dealing``, ``shares``), the batches a rank has left
(``stream``), the cursor that knows the epoch, the position, ``len()`` and the
state (``cursor``, ``epoch_state``), what was handed out
(``consumed``), what the epoch yielded (``stats``) and where
a trainer sets the epoch (``trainer_sampler``).

Imports ``fastsab.plan`` and the checks only.
"""
