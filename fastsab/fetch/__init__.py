"""Ids -> a batch on the device: the third stage of a batch's walk.

Reading a batch from the dataset in as few calls as possible (:mod:`~fastsab.fetch.fetcher`), batch and
dataset pytrees (:mod:`~fastsab.fetch.pytree`), moving them to the device
(:mod:`~fastsab.fetch.transfer`), making a loader's batches in order
(:mod:`~fastsab.fetch.batch_maker`), a thread ahead (:mod:`~fastsab.fetch.prefetch`) and worker
processes (:mod:`~fastsab.fetch.workers`, :mod:`~fastsab.fetch.sending`).

Imports :mod:`fastsab.position` and :mod:`fastsab.plan` only.
"""
