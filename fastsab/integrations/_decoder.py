"""Decoding of WebDataset samples by field extension, without unpickling by default.

``safe_decoder`` is a public name of ``fastsab.integrations.webdataset``; it lives here so
that the Lightning data modules (``fastsab.integrations._webdataset_modules``) use it without
importing the module that loads them.
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastsab._checks import user_stacklevel

__all__ = ["safe_decoder"]

PICKLE_EXTENSIONS = ("pyd", "pickle", "pkl")


def safe_decoder(*, allow_pickle: bool = False) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Decode the fields of a WebDataset sample by extension, without unpickling by default.

    Extensions (the part of the key after its last dot): ``pth``/``pt`` (``torch.load``
    with ``weights_only=True``), ``npy`` (``numpy.load`` with ``allow_pickle=False``),
    ``json``, ``txt``/``text``, ``cls``/``index`` (an int). Other fields stay bytes;
    ``__key__``-like fields are kept. Pickled fields raise ``ValueError`` unless
    ``allow_pickle=True``.

    Examples:
        >>> buffer = io.BytesIO()
        >>> torch.save(torch.arange(3), buffer)
        >>> decode = safe_decoder()
        >>> decode({"__key__": "a", "x.pth": buffer.getvalue(), "y.cls": b"7"})
        {'__key__': 'a', 'x.pth': tensor([0, 1, 2]), 'y.cls': 7}
    """
    if not isinstance(allow_pickle, bool):
        raise TypeError(f"allow_pickle must be a bool, got {allow_pickle!r}.")
    if allow_pickle:
        warnings.warn(
            "allow_pickle=True: pickled fields of the shards will be unpickled, which can run arbitrary code; "
            "read only shards you trust.",
            stacklevel=user_stacklevel(),
        )

    def decode(sample: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in sample.items():
            if key.startswith("__") or not isinstance(value, (bytes, bytearray)):
                out[key] = value
                continue
            extension = key.rsplit(".", 1)[-1].lower()
            if extension in ("pth", "pt"):
                out[key] = torch.load(io.BytesIO(value), weights_only=True)
            elif extension == "npy":
                out[key] = np.load(io.BytesIO(value), allow_pickle=False)
            elif extension == "json":
                out[key] = json.loads(value)
            elif extension in ("txt", "text"):
                out[key] = bytes(value).decode("utf-8")
            elif extension in ("cls", "index"):
                out[key] = int(value)
            elif extension in PICKLE_EXTENSIONS:
                if not allow_pickle:
                    raise ValueError(
                        f"field {key!r} of sample {sample.get('__key__')!r} is pickled; refusing to unpickle it "
                        "(it could run code). Pass allow_pickle=True only for shards you trust."
                    )
                out[key] = pickle.loads(value)
            else:
                out[key] = value
        return out

    return decode
