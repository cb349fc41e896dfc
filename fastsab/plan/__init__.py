"""Order and cost -> batches of ids: the first stage of a batch's walk.

An epoch's order (``shuffle``, ``epochs``), what items and batches
cost (``cost_sources``, ``costs``, ``exact_caps``),
the greedy split (``batching`` and its kernels), and the planners that turn an epoch
into ``PlanChunk`` s (``planners``,
``fixed_size``, ``window_epoch`` over ``windows``).

Imports only ``fastsab._checks`` and ``fastsab._arrays``: every other stage builds on this one.
"""
