"""The plan fingerprint: a digest of what determines a planner's batches, checked on resume.

``plan_identity`` digests the number of items, the order options, the configured
limits and the sizes, so that a state saved for another dataset or batching configuration is
refused (see ``parse_state``), and gives the same inputs but
the sizes as plain values, saved in the state so that a refusal names the setting that
differs (``plan_differences``). ``_plain`` writes numbers as plain Python numbers,
one value whatever their type, for the digest and for the state.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from fastsab.plan.plans import Planner

__all__ = ["older_fingerprints", "plan_differences", "plan_fingerprint", "plan_identity"]

#: The loader argument each plan option is given as, where the names differ.
_ARGUMENTS = {"limit": "max_total_size", "mixture": "the Mixture (its sources and their items, stop, by)"}

#: The value an option left out of the settings (unset) has as a loader argument; others are ``None``.
_UNSET = {"fixed_cost": 0}

#: What each planner batches by, as a user chooses it.
_KINDS = {"FixedSizePlanner": "a batch_size (FastLoader)", "SizeAwarePlanner": "a max_total_size (FastSizeAwareLoader)"}


def _plain(value: Any) -> Any:
    """Numbers (numpy or Python, also in lists) as plain Python numbers, for states and digests."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def plan_fingerprint(planner: Planner[Any]) -> str:
    """A short digest of what determines a planner's batches (besides seed and epoch).

    It covers the number of items, the order options, the configured limits and the sizes:
    all of them for an array of sizes, else the sizes of up to 4096 evenly spread items (a
    callable's sizes are not all computed just to fingerprint them). Numbers are compared by
    value: ``np.int64(100)``, ``100`` and ``100.0`` are the same cap.
    """
    return plan_identity(planner)[0]


def plan_identity(planner: Planner[Any]) -> tuple[str, dict[str, Any]]:
    """The ``plan_fingerprint`` of ``planner`` and its plan's settings as plain values.

    The settings are the fingerprint's inputs but the sizes: the planner's kind, the number
    of items, the order options and the plan options (plain JSON). A state carries them so
    that a refused state names what differs; they never decide whether a state is refused.

    Examples:
        >>> from fastsab.plan.epochs import EpochOrder
        >>> from fastsab.plan.fixed_size import FixedSizePlanner
        >>> digest, settings = plan_identity(FixedSizePlanner(EpochOrder(10, shuffle=True), 3, False))
        >>> settings["n"], settings["options"]
        (10, {'batch_size': 3, 'drop_last': False})
    """
    kind, options, sizes, _ = planner.plan_inputs()
    order = planner.order
    plain = _plain(options)
    settings = {"kind": kind, "n": order.n, "shuffle": order.shuffle, "group_size": order.group_size}
    settings |= {"rotate": order.rotate, "options": plain}
    identity = getattr(order, "identity", None)
    if identity is not None:  # (a mixture's: absent for one dataset, so that earlier states name nothing new)
        settings["mixture"] = identity
    return _digest(planner, kind, plain, sizes), _plain(settings)


def older_fingerprints(planner: Planner[Any]) -> list[str]:
    """The fingerprints an older fastsab gave ``planner``'s batches (``PlanInputs.older``): their states resume."""
    kind, _, sizes, older = planner.plan_inputs()
    return [_digest(planner, kind, _plain(options), sizes) for options in older]


def _digest(planner: Planner[Any], kind: str, plain: dict[str, Any], sizes: bytes | memoryview) -> str:
    """The fingerprint of ``planner``'s order with ``kind``, the ``plain`` options and ``sizes``."""
    order = planner.order
    digest = hashlib.blake2b(digest_size=12)
    digest.update(repr((kind, order.n, order.shuffle, order.group_size, order.rotate)).encode())
    digest.update(order_identity(order))
    digest.update(json.dumps(plain).encode())
    digest.update(sizes)
    return digest.hexdigest()


def order_identity(order: Any) -> bytes:
    """What decides a mixture's order besides its seed and sizes: its sources, their items, ``stop`` and ``by``.

    Empty for one dataset (so that its digests stay as they were). A mixture's weights are left
    out: weights given anew at a resume apply from the next epoch (``MixedOrder.load_entry``).
    """
    identity = getattr(order, "identity", None)
    return b"" if identity is None else json.dumps(identity, sort_keys=True).encode()


def plan_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between the settings a state was saved with and ``current`` (``plan_identity``).

    Each entry names a loader argument (or the dataset) with its saved and current value.
    With equal settings the fingerprints differ by the sizes, which the settings leave out.

    Examples:
        >>> base = {"kind": "SizeAwarePlanner", "n": 8, "options": {"limit": [100], "cost": "sum"}}
        >>> plan_differences(base, base | {"options": {"limit": [120], "cost": "sum"}})
        ['max_total_size was 100 when the state was saved and is 120 here']
        >>> plan_differences(base, base | {"n": 9})
        ['the dataset had 8 items when the state was saved and has 9 here']
    """
    kind = current["kind"]
    if saved.get("kind") != kind:
        was = _KINDS.get(str(saved.get("kind")), repr(saved.get("kind")))
        return [f"the state was saved by batching by {was}, and this object batches by {_KINDS.get(kind, kind)}"]
    if saved.get("n") != current["n"]:
        return [f"the dataset had {saved.get('n')!r} items when the state was saved and has {current['n']!r} here"]
    saved_options = saved.get("options")
    saved_options = saved_options if isinstance(saved_options, dict) else {}
    pairs = [(key, saved.get(key), current.get(key)) for key in ("shuffle", "group_size", "rotate", "mixture")]
    options = current["options"]
    # NOTE: an option absent from one side is unset there (options are left out when unset): it
    # is named with the argument's default (fixed_cost=0), as the user left it
    keys = dict.fromkeys([*saved_options, *options])
    pairs += [(key, saved_options.get(key, _UNSET.get(key)), options.get(key, _UNSET.get(key))) for key in keys]
    changes = [
        f"{_ARGUMENTS.get(key, key)} was {_shown(old)} when the state was saved and is {_shown(new)} here"
        for key, old, new in pairs
        if old != new
    ]
    return changes or ["the sizes differ: sizeof gives the same items other sizes than when the state was saved"]


def _shown(value: Any) -> str:
    """A setting as a user gave it: a single cap as a number."""
    return repr(value[0] if isinstance(value, list) and len(value) == 1 else value)
