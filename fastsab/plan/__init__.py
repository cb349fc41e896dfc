"""Order and cost -> batches of ids: the first stage of a batch's walk.

An epoch's order (:mod:`~fastsab.plan.shuffle`, :mod:`~fastsab.plan.epochs`), what items and batches
cost (:mod:`~fastsab.plan.cost_sources`, :mod:`~fastsab.plan.costs`, :mod:`~fastsab.plan.exact_caps`),
the greedy split (:mod:`~fastsab.plan.batching` and its kernels), and the planners that turn an epoch
into :class:`~fastsab.plan.plans.PlanChunk` s (:mod:`~fastsab.plan.planners`,
:mod:`~fastsab.plan.fixed_size`, :mod:`~fastsab.plan.window_epoch` over :mod:`~fastsab.plan.windows`).

Imports only ``fastsab._checks`` and ``fastsab._arrays``: every other stage builds on this one.
"""
