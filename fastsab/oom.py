"""The former home of ``is_out_of_memory``, kept so that ``fastsab.oom`` imports keep working.

The check now lives in ``fastsab.adaptive.oom``.
"""

from __future__ import annotations

from fastsab.adaptive.oom import OOM_MESSAGES, is_out_of_memory

__all__ = ["OOM_MESSAGES", "is_out_of_memory"]
