"""The workers check: ``fastsab bench --suite workers`` swept over 1, 2, 4 and 8 workers, judged against the goal.

Run it once on a machine with many cores (a 16-core host), from anywhere (it runs this checkout's fastsab)::

    python tools/workers_check.py                   # 3.3 minutes on 2 cores, less on more; at most 4
    OUT=/some/folder python tools/workers_check.py  # also writes the summary to $OUT/workers_check.json

It runs two sweeps, each in its own process and under a time limit: the CPU-bound one
(``--workers-dataset cpu``: texts tokenized in Python, which workers share out over the cores) and
the I/O-bound proxy (``--workers-dataset io``: reads that wait a few ms a batch, which workers
overlap on any machine). For each sweep, loader and worker count it prints, from the later epochs
(started workers warm), the persistent workers' speed-up over one process and that speed-up per
worker, the workers started per epoch and the ``DataLoader``'s own speed-ups beside them, and the
loader's time against the ``DataLoader``'s with the same workers. The goal lines, each PASS or FAIL:

- a speed-up of at least ``PER_WORKER_GOAL`` x the workers, up to ``MOST_JUDGED`` workers (on the
  CPU sweep only for counts up to the usable cores; with 2 cores: 2 workers at least
  ``TWO_CORE_GOAL`` x one process);
- no slower than the ``DataLoader`` with the same workers (its time / the loader's at least
  ``DATALOADER_GOAL``: a 5% margin for the noise of one run).

Exit codes: 0 when every goal line passed, 1 otherwise (or a sweep failed or ran out of time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # (run as a script: tools.gpu_check from this checkout)

from fastsab.cli import workers_argument  # noqa: E402
from tools.gpu_check import run_limited  # noqa: E402

#: The worker counts swept.
COUNTS = (1, 2, 4, 8)
#: Samples of the two sweeps: texts of the CPU sweep, reads (of 8 ms a batch) of the I/O sweep.
CPU_SAMPLES = 10_000
IO_SAMPLES = 5_000
#: Epochs per case (a first epoch and 2 later ones, best of 2 new loaders).
EPOCHS = 3
#: Time limits of the two sweeps, in seconds (under 4 minutes in all). NOTE: sized on 2 busy shared cores, where
#: the CPU sweep took 114 s (its counts above 2 run at 2 workers' pace; on 16 cores they take 1/4 and 1/8 of
#: the 1-worker case's time) and the I/O sweep 84 s (its waits take the same time on any machine).
CPU_SECONDS = 130
IO_SECONDS = 100
#: The goal: speed-up over one process per worker, up to this many workers.
PER_WORKER_GOAL = 0.75
MOST_JUDGED = 8
#: The goal on 2 cores: the speed-up of 2 workers over one process.
TWO_CORE_GOAL = 1.4
#: The goal against the DataLoader: its time over the loader's, with the same workers.
DATALOADER_GOAL = 0.95
LOADERS = {"fixed size": "FastLoader", "size-aware": "FastSizeAwareLoader"}


def main(argv: list[str] | None = None) -> int:
    """Run both sweeps, print the summary, write it to ``--out`` (default ``$OUT``); the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=workers_argument, default=COUNTS, help="worker counts (default 1,2,4,8)")
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT") or None, help="folder of workers_check.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        runs = {
            dataset: run_sweep(Path(folder) / f"{dataset}.json", dataset, samples, args.counts, seconds)
            for dataset, samples, seconds in (("cpu", CPU_SAMPLES, CPU_SECONDS), ("io", IO_SAMPLES, IO_SECONDS))
        }
    summary = summarize(usable_cores(), os.cpu_count() or 1, runs)
    print(render(summary))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "workers_check.json").write_text(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the platform tells it)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def run_sweep(path: Path, dataset: str, samples: int, counts: tuple[int, ...], seconds: int) -> dict[str, Any]:
    """Run ``fastsab bench --suite workers`` over ``counts`` on ``dataset``; its JSON, or why there is none."""
    command = [sys.executable, "-m", "fastsab", "bench", "--suite", "workers", "--workers-dataset", dataset]
    command += [
        "--workers",
        ",".join(map(str, counts)),
        "--samples",
        str(samples),
        "--epochs",
        str(EPOCHS),
        "--quiet",
        "--json",
        str(path),
    ]
    code, output, took = run_limited(command, seconds)
    if code != 0 or not path.exists():
        reason = "timed out" if code is None else f"exit code {code}"
        return {"ok": False, "error": reason, "seconds": round(took, 1), "output_tail": output[-3000:]}
    return {"ok": True, "seconds": round(took, 1), "counts": list(counts), **json.loads(path.read_text())}


def goal(dataset: str, count: int, cores: int) -> tuple[float, str] | None:
    """The least speed-up over one process ``count`` workers must reach, and the goal in words; None: not judged."""
    if count > MOST_JUDGED:
        return None
    if dataset == "cpu" and count > cores:
        return None  # (the CPU sweep cannot share work out over cores the machine lacks)
    if dataset == "cpu" and cores <= 2 and count == 2:
        return TWO_CORE_GOAL, f">= {TWO_CORE_GOAL}x one process on 2 cores"
    return PER_WORKER_GOAL * count, f">= {PER_WORKER_GOAL} per worker"


def summarize(cores: int, cpu_count: int, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The check's summary: per sweep, loader and worker count, the speed-ups and the goal lines judged."""
    lines = []
    for dataset, run in runs.items():
        later = [row for row in run.get("rows", []) if row["workload"].endswith("later epochs")]
        for kind, loader in LOADERS.items():
            rows = {row["method"]: row for row in later if row["workload"].startswith(kind)}
            # NOTE: every count the sweep was asked for is judged: one without its rows fails, rather
            # than the check passing on what it did not measure
            for count in sorted(({_count(method) for method in rows} | set(run.get("counts", []))) - {0}):
                lines.append(
                    _line(dataset, kind, count, cores, [rows.get(method) for method in _methods(loader, count)])
                )
    verdicts = [line[key] for line in lines for key in ("meets_goal", "meets_dataloader_goal")]
    judged = {line["dataset"] for line in lines}
    ok = all(run["ok"] and dataset in judged for dataset, run in runs.items())
    ok = ok and all(verdict is not False for verdict in verdicts)
    return {
        "ok": ok,
        "cores": cores,
        "cpu_count": cpu_count,
        "python": platform.python_version(),
        "runs": {dataset: {key: value for key, value in run.items() if key != "rows"} for dataset, run in runs.items()},
        "lines": lines,
        "rows": {dataset: run.get("rows", []) for dataset, run in runs.items()},
    }


def _methods(loader: str, count: int) -> tuple[str, str, str]:
    """The methods of a count's rows: persistent workers, workers started per epoch, the ``DataLoader``."""
    return (
        f"{loader}(num_workers={count}, persistent_workers=True)",
        f"{loader}(num_workers={count})",
        f"DataLoader(num_workers={count}, persistent_workers=True, batch_sampler={loader}.batch_sampler())",
    )


def _line(dataset: str, kind: str, count: int, cores: int, rows: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The goal line of ``count`` workers from its rows (persistent, started per epoch, ``DataLoader``); one
    of them missing: a failed line."""
    line: dict[str, Any] = {"dataset": dataset, "kind": kind, "workers": count, "missing": None in rows}
    persistent, started, dataloader = rows
    if persistent is None or started is None or dataloader is None:
        return {**line, "goal": "rows measured", "meets_goal": False, "meets_dataloader_goal": False}
    speedup = 1 / persistent["ratio"]
    judged = goal(dataset, count, cores)
    return {
        **line,
        "speedup": round(speedup, 3),
        "per_worker": round(speedup / count, 3),
        "started_per_epoch_speedup": round(1 / started["ratio"], 3),
        "dataloader_speedup": round(1 / dataloader["ratio"], 3),
        "over_dataloader": round(persistent["speedup"], 3),
        "goal": None if judged is None else judged[1],
        "meets_goal": None if judged is None else speedup >= judged[0],
        "meets_dataloader_goal": None if judged is None else persistent["speedup"] >= DATALOADER_GOAL,
    }


def _count(method: str) -> int:
    """The worker count a row's method names (0: one process)."""
    found = re.search(r"num_workers=(\d+)", method)
    return int(found.group(1)) if found else 0


def render(summary: dict[str, Any]) -> str:
    """The summary in a few lines."""
    lines = [
        f"workers check: {'PASS' if summary['ok'] else 'FAIL'} ({summary['cores']} usable cores of "
        f"{summary['cpu_count']}, Python {summary['python']}; later epochs, persistent workers)"
    ]
    for dataset, run in summary["runs"].items():
        if not run["ok"]:
            lines.append(f"{dataset}: fastsab bench --suite workers {run['error']} after {run['seconds']} s")
            lines.append(run["output_tail"][-1000:])
        elif not any(line["dataset"] == dataset for line in summary["lines"]):
            lines.append(f"{dataset}: the sweep's table has no later-epoch rows to judge: FAIL")
    for line in summary["lines"]:
        if line["missing"]:
            lines.append(
                f"{line['dataset']:<3} {line['kind']:<10} {line['workers']:>2} workers: FAIL (no rows for this count "
                "in the sweep's table)"
            )
            continue
        if line["goal"] is None:
            verdict = "not judged (more workers than cores, or than the goal's 8)"
        else:
            verdict = (
                f"{'PASS' if line['meets_goal'] else 'FAIL'} (goal {line['goal']}); "
                f"{line['over_dataloader']:.2f}x DataLoader's speed "
                f"{'PASS' if line['meets_dataloader_goal'] else 'FAIL'} (goal >= {DATALOADER_GOAL})"
            )
        lines.append(
            f"{line['dataset']:<3} {line['kind']:<10} {line['workers']:>2} workers: "
            f"{line['speedup']:5.2f}x one process, "
            f"{line['per_worker']:.2f} per worker  [started per epoch {line['started_per_epoch_speedup']:.2f}x, "
            f"DataLoader {line['dataloader_speedup']:.2f}x]  {verdict}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
