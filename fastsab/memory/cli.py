"""The ``fastsab fit-memory`` command: its arguments, and the measuring and fitting it runs.

``--kind sizes`` (default) measures one input per size and fits a per-item polynomial
(``fit_memory_model``); the batch kinds measure whole batches and fit a
batch model (``fit_batch_memory``). The memory modules are imported when
the command runs, so that the rest of the command line starts without them.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

import torch

from fastsab._checks import positive_int_argument

__all__ = ["BATCH_KINDS", "add_fit_memory_parser", "run_fit_memory"]

#: The kinds of ``fastsab fit-memory --kind`` that fit a batch model: (features per item, batch cost).
BATCH_KINDS = {"images": (2, "padded"), "graphs": (2, "sum"), "sequences": (1, "padded"), "packed": (1, "sum")}


def add_fit_memory_parser(commands: Any) -> None:
    """Add the ``fit-memory`` command to ``commands`` (the subparsers of the ``fastsab`` parser)."""
    fit = commands.add_parser(
        "fit-memory",
        help="measure a module's peak memory over input sizes and fit a polynomial memory model",
        description=(
            "Import MODEL ('package.module:factory', a callable returning a torch.nn.Module), run it on "
            "inputs of each size (default input: torch.randn(batch, size, input_dim)), measure the peak "
            "memory of each run (CPU profiler, or CUDA allocator statistics), fit a polynomial that "
            "upper-bounds the measured peaks, and save it."
        ),
    )
    fit.add_argument("model", help="'package.module:factory' returning the torch.nn.Module to measure")
    fit.add_argument("--sizes", required=True, type=_sizes, help="'16,32,64' or 'start:stop:step' (stop included)")
    fit.add_argument("--input", dest="make_input", help="'package.module:function' mapping a size to the input")
    fit.add_argument("--input-dim", type=positive_int_argument, default=64, help="feature size of the default input")
    fit.add_argument(
        "--batch", type=positive_int_argument, default=1, help="batch size of the default input (default 1)"
    )
    fit.add_argument("--eval", action="store_true", help="forward only, without gradients (default: train step)")
    fit.add_argument("--degree", type=int, default=2, help="degree of the polynomial (default 2)")
    fit.add_argument("--device", default="cpu", help="'cpu' (default) or a CUDA device")
    fit.add_argument("--warmup", type=int, default=2, help="unmeasured runs before measuring (default 2)")
    fit.add_argument("--safety-margin", type=float, default=0.0, help="relative headroom, e.g. 0.05")
    fit.add_argument("--out", type=Path, default=Path("memory_model.json"), help="*.json, or a torch.save file")
    fit.add_argument("--plot", type=Path, help="also plot measured vs predicted peaks (PNG) to this path")
    fit.add_argument(
        "--kind",
        choices=("sizes", *BATCH_KINDS),
        default="sizes",
        help="'sizes' (default): one input per size, a per-item model. The others measure whole batches and "
        "fit a batch model (a fixed part once per batch + a per-item part): 'images' (H and W drawn from "
        "--sizes, padded to the batch's max H and max W: --input-dim channels), 'graphs' (nodes drawn from "
        "--sizes, 2 to 8 edges per node, joined into one graph: MODEL(x, edges)), 'sequences' (padded to the "
        "batch's longest) and 'packed' (joined into one sequence)",
    )
    fit.add_argument("--batches", type=positive_int_argument, default=24, help="batches measured for a batch model")
    fit.add_argument(
        "--batch-lengths", type=_sizes, default=[2, 3, 4, 6, 8], help="items per measured batch (default 2,3,4,6,8)"
    )
    fit.add_argument("--seed", type=int, default=0, help="seeds the measured batches' shapes")


def _sizes(text: str) -> list[int]:
    try:
        if ":" in text:
            start, stop, step = (int(part) for part in text.split(":"))
            values = list(range(start, stop + 1, step))
        else:
            values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected '16,32,64' or 'start:stop:step', got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return values


def _import(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"expected 'package.module:name', got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise SystemExit(f"cannot import {spec!r}: {err}") from err


def run_fit_memory(args: argparse.Namespace) -> int:
    from fastsab.memory.fit import fit_memory_model, module_work

    module = _import(args.model)()
    if not isinstance(module, torch.nn.Module):
        raise SystemExit(f"{args.model} returned {type(module).__name__}, not a torch.nn.Module")
    device = torch.device(args.device)
    module = module.to(device)
    if args.kind != "sizes":
        return run_fit_batch_memory(args, module, device)
    if args.make_input:
        make_input = _import(args.make_input)
    else:

        def make_input(size: int) -> torch.Tensor:
            return torch.randn(args.batch, size, args.input_dim, device=device)

    work, cleanup = module_work(module, make_input, train=not args.eval)
    fit = fit_memory_model(
        work,
        args.sizes,
        degree=args.degree,
        device=device,
        warmup=args.warmup,
        cleanup=cleanup,
        safety_margin=args.safety_margin,
    )
    fit.model.save(args.out)
    report = fit.report
    print(f"measured {len(fit.sizes)} sizes ({len(fit.skipped)} ran out of memory: {fit.skipped})")
    print(
        f"rmse {report.rmse / 2**20:.4f} MiB, max under-prediction {report.max_under_prediction / 2**20:.4f} MiB "
        f"before the bound, {report.max_under_prediction_final / 2**20:.4f} MiB after"
    )
    print(f"saved the model to {args.out}")
    if args.plot is not None:
        fit.plot(args.plot)
        print(f"plotted measured vs predicted to {args.plot}")
    return 0


def _batch_features(kind: str, sizes: list[int], count: int, rng: Any) -> Any:
    """``count`` items' features for ``kind``: sizes drawn from ``sizes`` (graphs: 2 to 8 edges per node)."""
    import numpy as np

    values = np.array(sizes)
    if kind == "images":
        return rng.choice(values, size=(count, 2))
    if kind == "graphs":
        nodes = rng.choice(values, size=count)
        return np.stack([nodes, nodes * rng.integers(2, 9, size=count)], axis=1)
    return rng.choice(values, size=(count, 1))


def _batch_input(kind: str, rows: Any, input_dim: int, device: torch.device) -> Any:
    """The input of one batch of items with features ``rows`` (see ``--kind``)."""
    if kind == "images":
        height, width = (int(v) for v in rows.max(axis=0))
        return torch.randn(len(rows), input_dim, height, width, device=device)
    if kind == "graphs":
        nodes, edges = int(rows[:, 0].sum()), int(rows[:, 1].sum())
        return torch.randn(nodes, input_dim, device=device), torch.randint(0, nodes, (2, edges), device=device)
    if kind == "sequences":
        return torch.randn(len(rows), int(rows[:, 0].max()), input_dim, device=device)
    return torch.randn(1, int(rows[:, 0].sum()), input_dim, device=device)


def _refuse_sizes_options(args: argparse.Namespace) -> None:
    """Exit if an option of ``--kind sizes`` alone was given with a batch kind (it would be ignored)."""
    # NOTE: a batch model has its own margin (the smallest covering every fitted batch) and
    # inputs (see _batch_input): a margin, input or plot asked for would silently not apply
    given = {
        "--safety-margin": args.safety_margin if args.safety_margin != 0.0 else None,
        "--plot": None if args.plot is None else str(args.plot),
        "--input": args.make_input,
        "--batch": args.batch if args.batch != 1 else None,
    }
    for option, value in given.items():
        if value is not None:
            raise SystemExit(
                f"{option} {value!r} does not apply to --kind {args.kind}: it is an option of --kind sizes."
            )


def run_fit_batch_memory(args: argparse.Namespace, module: torch.nn.Module, device: torch.device) -> int:
    """``fastsab fit-memory --kind images|graphs|sequences|packed``: measure batches, fit a batch model, save it."""
    import numpy as np

    from fastsab.memory.batch import fit_batch_memory, measure_batches
    from fastsab.memory.fit import module_work

    _refuse_sizes_options(args)
    rng = np.random.default_rng(args.seed)
    _, cost = BATCH_KINDS[args.kind]
    batches = [
        _batch_features(args.kind, args.sizes, int(rng.choice(args.batch_lengths)), rng) for _ in range(args.batches)
    ]
    work, cleanup = module_work(
        module, lambda rows: _batch_input(args.kind, rows, args.input_dim, device), train=not args.eval
    )
    for _ in range(args.warmup):
        work(batches[0])
        cleanup()
    peaks = measure_batches(work, batches, device, cleanup)
    model = fit_batch_memory(batches, peaks, cost=cost, degree=args.degree, seed=args.seed)  # type: ignore[arg-type]
    args.out.write_text(model.to_json())
    print(f"measured {len(batches)} batches of {args.kind} ({cost}): fixed {model.fixed / 2**20:.4f} MiB per batch")
    print(
        f"relative margin {model.margin:.2%}; "
        f"all {model.fit.num_batches} batches: mean use of the prediction {model.fit.mean_utilization:.3f}"
    )
    if model.report is not None:
        report = model.report
        print(
            f"held-back batches ({report.num_batches}): expected use {report.mean_utilization:.3f} "
            f"(min {report.min_utilization:.3f}), worst under-prediction {report.worst_under_prediction:+.2%} "
            "(by a fit without them)"
        )
    print(model.advice)
    print(f"saved the model to {args.out} (fastsab.memory.BatchMemoryModel.from_json)")
    return 0
