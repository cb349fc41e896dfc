"""A rank's share of the plan and the saved position: the second stage of a batch's walk.

Dealing an epoch's batches to ranks in equal steps (:mod:`~fastsab.position.distributed`,
:mod:`~fastsab.position.dealing`, :mod:`~fastsab.position.shares`), the batches a rank has left
(:mod:`~fastsab.position.stream`), the cursor that knows the epoch, the position, ``len()`` and the
state (:mod:`~fastsab.position.cursor`, :mod:`~fastsab.position.epoch_state`), what was handed out
(:mod:`~fastsab.position.consumed`), what the epoch yielded (:mod:`~fastsab.position.stats`) and where
a trainer sets the epoch (:mod:`~fastsab.position.trainer_sampler`).

Imports :mod:`fastsab.plan` and the checks only.
"""
