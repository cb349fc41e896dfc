"""The public loaders, which wire the stages: plan -> position -> fetch.

:class:`~fastsab.loaders.loader.FastLoader` and :class:`~fastsab.loaders.loader.FastSizeAwareLoader`
(:mod:`~fastsab.loaders.loader`) over their shared base (:mod:`~fastsab.loaders.loader_base`), their
options (:mod:`~fastsab.loaders.options`), ``DataLoader``'s keywords and what they take instead
(:mod:`~fastsab.loaders.dataloader_keywords`), and the plan handed to a ``DataLoader``
(:mod:`~fastsab.loaders.planned`).

Imports :mod:`fastsab.fetch`, :mod:`fastsab.position` and :mod:`fastsab.plan`.
"""
