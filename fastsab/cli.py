"""The ``fastsab`` command line.

``fastsab bench`` compares the loaders against DataLoader and the numpy floor;
``fastsab fit-memory`` measures a module's peak memory over input sizes and fits a model
(``fastsab.memory.cli``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from fastsab import bench
from fastsab._checks import positive_int_argument
from fastsab.bench import fidelity
from fastsab.bench.device import DEVICE_SAMPLES, bench_device, device_rows
from fastsab.bench.end_to_end import END_TO_END_MAX_EPOCHS, END_TO_END_SAMPLES
from fastsab.bench.loaders import PER_BATCH_SAMPLES, PER_BATCH_SIZES, per_batch_rows
from fastsab.bench.peers import PEERS_SAMPLES, peer_rows
from fastsab.bench.scale import scale_rows
from fastsab.bench.varlen import VARLEN_SAMPLES
from fastsab.bench.workers import IO_WAIT_S, WORKERS_SAMPLES, parse_worker_counts, workers_rows
from fastsab.memory.cli import add_fit_memory_parser, run_fit_memory

__all__ = ["main"]

SUITES = ("loaders", "kernels", "permutation", "first-batch", "adaptive", "varlen", "end-to-end", "scale", "workers")
#: The suites (not in 'all') that print a table of their own, with its own columns.
TABLE_SUITES = ("fidelity", "shapes", "mixing")


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
        type=positive_int_argument,
        help="samples per epoch (default 300000; the varlen suite: 50000 sequences; the end-to-end suite: 60000; "
        "the scale suite: 10**9 items; the workers suite: 10000 texts or reads; the peers suite: 10**6 lengths; the "
        "mixing suite: 10**6 items)",
    )
    run.add_argument("--batch-size", type=positive_int_argument, default=300, help="batch size (default 300)")
    run.add_argument(
        "--batch-sizes",
        type=batch_sizes_argument,
        default=PER_BATCH_SIZES,
        metavar="SIZES",
        help="batch sizes of the loaders suite's per-batch sweep, comma-separated (default 64,256,1024; "
        "240000 samples unless --samples)",
    )
    run.add_argument("--epochs", type=positive_int_argument, default=5, help="timed epochs per method (default 5)")
    run.add_argument(
        "--suite",
        choices=(*SUITES, "peers", *TABLE_SUITES, "all"),
        action="append",
        help="what to run (repeatable; default: loaders). 'all' adds the kernel, permutation and "
        "first-batch suites at 10**6 to 10**8 items (the kernels with fairseq's compiled kernel where it imports), "
        "the adaptive overhead and the varlen suite (padded and "
        "packing efficiency of variable-length batches with and without sort_window), the end-to-end suite (the "
        "loaders feeding a small model's training step on one thread, at most 3 timed epochs), the scale suite "
        "(rank 7 of 8 over 10**9 items: time and peak memory to the first batch of each loader) and the workers "
        "suite (a dataset whose __getitems__ tokenizes texts in Python, or waits with --workers-dataset io: one "
        "process, worker processes (2, or each count of --workers) started per epoch or persistent, and a DataLoader "
        "with as many persistent workers over the same plan; a new loader's first epoch and the epochs after it), a "
        "few minutes in all. "
        "'peers' (not in 'all') times fastsab's padded split beside fairseq's kernel and lhotse's SimpleCutSampler "
        "and DynamicBucketingSampler (where they import) on the same lengths, order and budget. "
        "'fidelity' (not in 'all') measures memory budgets on small models (on the CPU, or on --device): per kind, the "
        "batches run, the batches over budget, and the mean and smallest use of the budget. "
        "'shapes' (not in 'all') counts the batch shapes of variable-length batches (DataLoader, sort_window, shape "
        "buckets), their padded efficiency, and the graphs a model compiled for static shapes builds over two "
        "epochs, with its epoch times (50000 sequences, 8000 and 3000 for the compiled epochs; about two minutes; "
        "with --device, the model trains there, in CUDA graphs on a GPU). "
        "'mixing' (not in 'all') measures a Mixture of three sources (10**6 items unless --samples, weights in "
        "tokens): its share error beside HF interleave_datasets, torchdata MultiNodeWeightedSampler, lhotse "
        "CutSet.mux and Mosaic Streaming (where they import), the planning time of a mixed epoch against an "
        "unmixed one and the peers, padded efficiency against the sources batched alone, and a resume of 100 "
        "times as many items on rank 7 of 8 (a few minutes).",
    )
    run.add_argument(
        "--device",
        type=device_argument,
        help="also run the device suite on DEVICE ('cuda', 'cuda:1' or 'cpu'): an epoch of the loaders' and "
        "DataLoader(pin_memory=True)'s batches moved to the device against a pinned copy_ of the same bytes (on the "
        "CPU a plain copy), and the same loaders feeding a small model's step there (200000 samples unless "
        "--samples); the fidelity suite runs on DEVICE too. Without --suite: the device and fidelity suites alone",
    )
    run.add_argument(
        "--workers",
        type=workers_argument,
        metavar="COUNTS",
        help="worker counts of the workers suite, comma-separated (default 2): e.g. 1,2,4,8 sweeps them, each row "
        "noting its speed-up over one process and that speed-up per worker (counts above the cores run too); "
        "without --suite it runs the workers suite alone",
    )
    run.add_argument(
        "--workers-dataset",
        choices=("cpu", "io"),
        help="the workers suite's dataset: 'cpu' (default) tokenizes texts in Python, a few ms of CPU a batch, "
        "which workers share out only where there are cores; 'io' waits "
        f"{IO_WAIT_S * 1e3:g} ms a batch instead (as a remote read or slow disk), so workers overlap their waits on "
        "any machine and the sweep measures how well the loader keeps them busy",
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
    run.add_argument("--quiet", action="store_true", help="no progress bar (shown only where stderr is a terminal)")
    add_fit_memory_parser(commands)
    return parser


def batch_sizes_argument(text: str) -> tuple[int, ...]:
    """A command-line argument ``text`` as comma-separated positive integers (an ``argparse`` type)."""
    return tuple(positive_int_argument(part.strip()) for part in text.split(","))


def workers_argument(text: str) -> tuple[int, ...]:
    """A command-line argument ``text`` as the workers suite's worker counts (an ``argparse`` type)."""
    try:
        return parse_worker_counts(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def device_argument(text: str) -> torch.device:
    """A command-line argument ``text`` as the device suite's device (an ``argparse`` type)."""
    try:
        return bench_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def run_bench(args: argparse.Namespace) -> list[bench.Row]:
    # NOTE: --device alone asks for the device suite (and fidelity, run by main), not the default loaders suite
    default = ["loaders"] if args.device is None else []
    suites = [suite for suite in args.suite or default if suite not in TABLE_SUITES]
    if "all" in suites:
        suites = list(SUITES) + [suite for suite in suites if suite == "peers"]
    from tqdm import tqdm

    rows: list[bench.Row] = []
    if args.device is not None:
        rows += device_rows(args.device, args.samples or DEVICE_SAMPLES, args.batch_size, args.epochs)
    # NOTE: a bar only on a terminal: redirected to a log, its redraws would fill it with lines
    shown = not args.quiet and sys.stderr.isatty()
    with tqdm(total=len(suites), desc="fastsab bench", disable=not shown, file=sys.stderr) as bar:
        for suite in suites:
            bar.set_postfix_str(suite)
            if suite == "loaders":
                rows += bench.loader_rows(
                    args.samples or 300_000,
                    args.batch_size,
                    args.epochs,
                    progress=lambda name: bar.set_postfix_str(name),
                )
                rows += per_batch_rows(
                    args.samples or PER_BATCH_SAMPLES,
                    args.batch_sizes,
                    args.epochs,
                    progress=lambda name: bar.set_postfix_str(name),
                )
            elif suite == "varlen":
                rows += bench.varlen_rows(
                    args.samples or VARLEN_SAMPLES, args.epochs, progress=lambda name: bar.set_postfix_str(name)
                )
            elif suite == "kernels":
                rows += bench.kernel_rows([10**6, 10**7])
            elif suite == "peers":
                rows += peer_rows(args.samples or PEERS_SAMPLES)
            elif suite == "permutation":
                rows += bench.permutation_rows([10**6, 10**8])
            elif suite == "adaptive":
                rows += bench.adaptive_rows()
            elif suite == "end-to-end":
                rows += bench.end_to_end_rows(
                    args.samples or END_TO_END_SAMPLES,
                    args.batch_size,
                    min(args.epochs, END_TO_END_MAX_EPOCHS),
                    progress=lambda name: bar.set_postfix_str(name),
                )
            elif suite == "scale":
                rows += scale_rows(args.samples or 10**9)
            elif suite == "workers":
                rows += workers_rows(
                    args.samples or WORKERS_SAMPLES,
                    epochs=args.epochs,
                    worker_counts=args.workers or (2,),
                    progress=lambda name: bar.set_postfix_str(name),
                    dataset=args.workers_dataset or "cpu",
                )
            else:
                rows += bench.first_batch_rows(10**8)
            bar.update()
    return rows


def run_fidelity(args: argparse.Namespace) -> list[fidelity.FidelityResult]:
    """Run the fidelity suite on ``--device`` (default the CPU), print its table (markdown with ``--markdown``)."""
    results = fidelity.fidelity_results(device=args.device or "cpu")
    if args.markdown:
        print(f"Measured on {bench.machine_info(args.device)}.\n")
        print(fidelity.fidelity_markdown(results))
        return results
    print(bench.machine_info(args.device))
    print("\nfidelity  (use = measured peak / budget; budget = 6 x the largest item's peak)")
    for r in results:
        print(
            f"  {r.kind:<48} window {r.sort_window or '-':>4}  batches {r.batches:>3}  over budget {r.over_budget:>2}  "
            f"mean use {r.mean_use:.2f}  min {r.min_use:.2f}  max {r.max_use:.2f}  margin {r.margin:.1%}  "
            f"{r.seconds:.0f} s"
        )
    return results


def run_shapes(args: argparse.Namespace) -> None:
    """Print the shapes suite's table (the same markdown table with or without ``--markdown``)."""
    from tqdm import tqdm

    from fastsab.bench.shapes import SHAPES_SAMPLES, shapes_markdown, shapes_results

    shown = not args.quiet and sys.stderr.isatty()
    with tqdm(desc="fastsab bench shapes", disable=not shown, file=sys.stderr) as bar:
        results = shapes_results(args.samples or SHAPES_SAMPLES, progress=bar.set_postfix_str, device=args.device)
    print(f"Measured on {bench.machine_info(args.device)}.\n")
    print(shapes_markdown(results))


def run_mixing(args: argparse.Namespace) -> None:
    """Print the mixing suite's tables (the same markdown with or without ``--markdown``)."""
    from tqdm import tqdm

    from fastsab.bench.mixing import MIX_SAMPLES, mixing_markdown, mixing_results

    shown = not args.quiet and sys.stderr.isatty()
    with tqdm(desc="fastsab bench mixing", disable=not shown, file=sys.stderr) as bar:
        rows = mixing_results(args.samples or MIX_SAMPLES, progress=bar.set_postfix_str)
    print(f"Measured on {bench.machine_info()}.\n")
    print(mixing_markdown(rows))


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


def print_plain(rows: list[bench.Row], device: torch.device | None) -> None:
    width = max(len(row.method) for row in rows)
    print(bench.machine_info(device))
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "fit-memory":
        return run_fit_memory(args)
    if args.workers is not None or args.workers_dataset is not None:
        # NOTE: as --device picks its suite when none is named, the workers suite's options pick theirs
        if args.suite is None and args.device is None:
            args.suite = ["workers"]
        elif not {"workers", "all"} & set(args.suite or []):
            parser.error(
                f"--workers and --workers-dataset set the workers suite, which --suite {' '.join(args.suite or [])!r} "
                "does not run: add --suite workers."
            )
    asked = args.suite or (["fidelity"] if args.device is not None else [])
    results = run_fidelity(args) if "fidelity" in asked else []
    if "shapes" in asked:
        run_shapes(args)
    if "mixing" in asked:
        run_mixing(args)
    # NOTE: the suites printing tables of their own run alone, unless --device asks for the device suite too
    # (with the fidelity suite: the shapes suite alone trains its compiled model on --device)
    alone = bool(asked) and set(asked) <= set(TABLE_SUITES) and (args.device is None or set(asked) == {"shapes"})
    rows = [] if alone else run_bench(args)
    if rows and args.markdown:
        print(f"Measured on {bench.machine_info(args.device)}.\n")
        print(bench.to_markdown(rows))
    elif rows:
        print_plain(rows, args.device)
    if args.json is not None:
        payload = {
            "machine": bench.machine_info(args.device),
            "rows": [row.as_dict() for row in rows],
            "fidelity": [dataclasses.asdict(result) for result in results],
        }
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
