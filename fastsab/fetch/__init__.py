"""Ids -> a batch on the device: the third stage of a batch's walk.

Reading a batch from the dataset in as few calls as possible (``fetcher``), batch and
dataset pytrees (``pytree``), moving them to the device
(``transfer``), making a loader's batches in order
(``batch_maker``), a thread ahead (``prefetch``) and worker
processes (``workers``, ``sending``).

Imports ``fastsab.position`` and ``fastsab.plan`` only.
"""
