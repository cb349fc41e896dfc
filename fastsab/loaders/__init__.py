"""The public loaders, which wire the stages: plan -> position -> fetch.

``FastLoader`` and ``FastSizeAwareLoader``
(``loader``) over their shared base (``loader_base``), their
options (``options``), ``DataLoader``'s keywords and what they take instead
(``dataloader_keywords``), and the plan handed to a ``DataLoader``
(``planned``).

Imports ``fastsab.fetch``, ``fastsab.position`` and ``fastsab.plan``.
"""
