"""The ``fastsab`` command line.

``fastsab bench`` compares the loaders against DataLoader and the numpy floor;
``fastsab fit-memory`` measures a module's peak memory over input sizes and fits a model.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fastsab import bench
from fastsab.bench.varlen import VARLEN_SAMPLES

__all__ = ["main"]

SUITES = ("loaders", "kernels", "permutation", "first-batch", "adaptive", "varlen")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastsab", description="Fast, size-aware batching for PyTorch.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "bench",
        help="compare FastLoader and FastSizeAwareLoader with DataLoader and the numpy floor",
        description=(
            "Run the public workloads and print ms per epoch and the ratio to the numpy "
            "permutation+reshape floor measured in the same run (lower is faster)."
        ),
    )
    run.add_argument(
        "--samples",
        type=_positive_int,
        help="samples per epoch (default 300000; the varlen suite: 50000 sequences)",
    )
    run.add_argument("--batch-size", type=_positive_int, default=300, help="batch size (default 300)")
    run.add_argument("--epochs", type=_positive_int, default=5, help="timed epochs per method (default 5)")
    run.add_argument(
        "--suite",
        choices=(*SUITES, "fidelity", "all"),
        action="append",
        help="what to run (repeatable; default: loaders). 'all' adds the kernel, permutation and "
        "first-batch suites at 10**6 to 10**8 items, the adaptive overhead and the varlen suite (padded and "
        "packing efficiency of variable-length batches with and without sort_window), a few minutes in all. "
        "'fidelity' (not in 'all') measures memory budgets on small CPU models: per kind, the "
        "batches run, the batches over budget, and the mean and smallest use of the budget.",
    )
    run.add_argument("--markdown", action="store_true", help="print markdown tables instead of plain text")
    run.add_argument("--json", type=Path, metavar="PATH", help="also write the rows as JSON to PATH")
    run.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        help="also draw a bar chart (PNG) to PATH; the varlen suite draws padded efficiency against window size "
        "(to PATH, or next to it as NAME-varlen.png when the loaders are drawn too)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")

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
    fit.add_argument("--input-dim", type=_positive_int, default=64, help="feature size of the default input")
    fit.add_argument("--batch", type=_positive_int, default=1, help="batch size of the default input (default 1)")
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
    fit.add_argument("--batches", type=_positive_int, default=24, help="batches measured for a batch model")
    fit.add_argument(
        "--batch-lengths", type=_sizes, default=[2, 3, 4, 6, 8], help="items per measured batch (default 2,3,4,6,8)"
    )
    fit.add_argument("--seed", type=int, default=0, help="seeds the measured batches' shapes")
    return parser


#: The kinds of ``fastsab fit-memory --kind`` that fit a batch model: (features per item, batch cost).
BATCH_KINDS = {"images": (2, "padded"), "graphs": (2, "sum"), "sequences": (1, "padded"), "packed": (1, "sum")}


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


def run_fit_batch_memory(args: argparse.Namespace, module: torch.nn.Module, device: torch.device) -> int:
    """``fastsab fit-memory --kind images|graphs|sequences|packed``: measure batches, fit a batch model, save it."""
    import numpy as np

    from fastsab.memory.batch import fit_batch_memory, measure_batches
    from fastsab.memory.fit import module_work

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
        f"fitted batches: mean use of the prediction {model.fit.mean_utilization:.3f}"
    )
    if model.report is not None:
        report = model.report
        print(
            f"held-back batches ({report.num_batches}): expected use {report.mean_utilization:.3f} "
            f"(min {report.min_utilization:.3f}), worst under-prediction {report.worst_under_prediction:+.2%}"
        )
    print(f"saved the model to {args.out} (fastsab.memory.BatchMemoryModel.from_json)")
    return 0


def run_bench(args: argparse.Namespace) -> list[bench.Row]:
    suites = [suite for suite in args.suite or ["loaders"] if suite != "fidelity"]
    if "all" in suites:
        suites = list(SUITES)
    from tqdm import tqdm

    rows: list[bench.Row] = []
    with tqdm(total=len(suites), desc="fastsab bench", disable=args.quiet, file=sys.stderr) as bar:
        for suite in suites:
            bar.set_postfix_str(suite)
            if suite == "loaders":
                rows += bench.loader_rows(
                    args.samples or 300_000,
                    args.batch_size,
                    args.epochs,
                    progress=lambda name: bar.set_postfix_str(name),
                )
            elif suite == "varlen":
                rows += bench.varlen_rows(
                    args.samples or VARLEN_SAMPLES, args.epochs, progress=lambda name: bar.set_postfix_str(name)
                )
            elif suite == "kernels":
                rows += bench.kernel_rows([10**6, 10**7])
            elif suite == "permutation":
                rows += bench.permutation_rows([10**6, 10**8])
            elif suite == "adaptive":
                rows += bench.adaptive_rows()
            else:
                rows += bench.first_batch_rows(10**8)
            bar.update()
    return rows


def run_fidelity(args: argparse.Namespace) -> None:
    """Print the fidelity suite's table (markdown with ``--markdown``)."""
    from fastsab.bench.fidelity import fidelity_markdown, fidelity_results

    results = fidelity_results()
    if args.markdown:
        print(f"Measured on {bench.machine_info()}.\n")
        print(fidelity_markdown(results))
        return
    print(bench.machine_info())
    print("\nfidelity  (use = measured peak / budget; budget = 6 x the largest item's peak)")
    for r in results:
        print(
            f"  {r.kind:<48} window {r.sort_window or '-':>4}  batches {r.batches:>3}  over budget {r.over_budget:>2}  "
            f"mean use {r.mean_use:.2f}  min {r.min_use:.2f}  max {r.max_use:.2f}  margin {r.margin:.1%}  "
            f"{r.seconds:.0f} s"
        )


def plot_rows(rows: list[bench.Row], path: Path) -> None:
    """Bar chart of ms per epoch (log scale) for the loader rows, one bar per method."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from err
    shown = [row for row in rows if row.suite == "loaders"] or rows
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(shown) + 1.5))
    names = [f"{row.method} [{row.workload}]" for row in shown]
    values = [row.seconds * 1e3 for row in shown]
    ax.barh(names, values, color=["#2e7d32" if row.method.startswith("Fast") else "#90a4ae" for row in shown])
    ax.set_xscale("log")
    ax.set_xlabel("ms per epoch (log scale, lower is faster)")
    ax.invert_yaxis()
    for y, row in enumerate(shown):
        ax.text(row.seconds * 1e3, y, f" {row.ratio:.2f}x floor", va="center", fontsize=8)
    ax.set_title(bench.machine_info(), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_plain(rows: list[bench.Row]) -> None:
    width = max(len(row.method) for row in rows)
    print(bench.machine_info())
    suite = None
    for row in rows:
        if row.suite != suite:
            suite = row.suite
            speedups = "; speed-up = DataLoader time / time" if row.speedup is not None else ""
            print(f"\n{suite}  (ratio = time / {row.baseline}{speedups})")
        speedup = f"speed-up {row.speedup:6.1f}x" if row.speedup is not None else ""
        line = (
            f"  {row.workload:<12} {row.method:<{width}} {row.seconds * 1e3:>10.2f} ms  {row.ratio:>8.2f}x  {speedup}"
        )
        print(f"{line}  {row.note}".rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastsab`` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "fit-memory":
        return run_fit_memory(args)
    if args.suite and "fidelity" in args.suite:
        run_fidelity(args)
        if set(args.suite) == {"fidelity"}:
            return 0
    rows = run_bench(args)
    if args.markdown:
        print(f"Measured on {bench.machine_info()}.\n")
        print(bench.to_markdown(rows))
    else:
        print_plain(rows)
    if args.json is not None:
        payload = {"machine": bench.machine_info(), "rows": [row.as_dict() for row in rows]}
        args.json.write_text(json.dumps(payload, indent=2))
    if args.plot is not None:
        plot_all(rows, args.plot, args.samples or VARLEN_SAMPLES)
    return 0


def plot_all(rows: list[bench.Row], path: Path, varlen_samples: int) -> None:
    """The bar chart of the timed rows, and the varlen suite's efficiency plot if it ran."""
    varlen = any(row.suite == "varlen" for row in rows)
    others = [row for row in rows if row.suite != "varlen"]
    if others:
        plot_rows(others, path)
    if varlen:
        bench.plot_varlen(path.with_name(f"{path.stem}-varlen{path.suffix}") if others else path, varlen_samples)
