"""The GPU check: ``tests/gpu`` and ``fastsab bench --device cuda`` on one GPU, with a compact summary.

Run it once on a machine with a CUDA device, from anywhere (it runs this checkout's fastsab)::

    python tools/gpu_check.py                  # about 2 to 4 minutes on an H100; at most 8
    OUT=/some/folder python tools/gpu_check.py  # also writes the summary to $OUT/gpu_check.json

It runs, each in its own process and under a time limit: the GPU tests (``python -m pytest
tests/gpu``; pass, fail and skip counts from their JUnit report), then ``fastsab bench --device
cuda`` (the device suite and the fidelity suite on the GPU). It prints the GPU, the torch and CUDA
versions, the test counts and the key ratios: each loader's host-to-device epoch over a pinned
``copy_`` of the same bytes (and the share of the copy's throughput it reaches), each loader's
epoch of training steps over the steps alone, and per fidelity kind the batches over budget and
the mean use of the budget (target: none over, mean use at least ``MEAN_USE_TARGET``).

Exit codes: 0 when every GPU test passed, the bench ran and no batch went over its budget (a mean
use below the target is reported, not failed); 1 otherwise; and 0, after saying "no CUDA device",
where torch sees no GPU: nothing is run then, and the JSON says ``"cuda": false``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
#: Time limits of the two steps, in seconds (8 minutes in all at most).
TESTS_SECONDS = 240
BENCH_SECONDS = 180
#: The shapes suite on the GPU (its compiled model in CUDA graphs), cut off after this many seconds.
SHAPES_SECONDS = 150
#: The fidelity suite's target for the mean measured peak / budget of the planned batches.
MEAN_USE_TARGET = 0.90
NO_CUDA = (
    "no CUDA device: torch.cuda.is_available() is False, so the GPU check ran nothing. "
    "Run python tools/gpu_check.py on a machine with a GPU."
)


def main(argv: list[str] | None = None) -> int:
    """Run the check, print its summary, write it to ``--out`` (default ``$OUT``); the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000, help="samples per epoch of the device suite")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per case of the device suite")
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT") or None, help="folder of gpu_check.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA)
        _write(args.out, {"cuda": False, "message": NO_CUDA, "torch": torch.__version__})
        return 0
    with tempfile.TemporaryDirectory() as folder:
        tests = run_tests(Path(folder) / "junit.xml")
        bench = run_bench(Path(folder) / "bench.json", args.samples, args.epochs)
    summary = summarize(gpu_info(), tests, bench)
    summary["shapes"] = run_shapes()
    print(render(summary))
    _write(args.out, summary)
    return 0 if summary["ok"] else 1


def gpu_info() -> dict[str, Any]:
    """The GPU and the versions the check ran on."""
    properties = torch.cuda.get_device_properties(0)
    return {
        "cuda": True,
        "gpu": properties.name,
        "gpu_memory_gib": round(properties.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
    }


def run_limited(command: list[str], seconds: int) -> tuple[int | None, str, float]:
    """``command`` run from the checkout (its fastsab first on the path): exit code (None: timed out), output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as expired:
        partial = expired.stdout or ""
        output = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        return None, output, time.perf_counter() - start
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def run_tests(junit: Path) -> dict[str, Any]:
    """Run ``tests/gpu``; its counts, the failed tests' names and the end of its output."""
    command = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-n", "0", "-p", "no:cacheprovider"]
    command.append(f"--junitxml={junit}")
    code, output, seconds = run_limited(command, TESTS_SECONDS)
    # NOTE: no report where pytest was stopped by the time limit: nothing counted, and the exit code says why
    none: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
    counts = junit_counts(junit.read_text()) if junit.exists() else none
    return {**counts, "exit_code": code, "seconds": round(seconds, 1), "output_tail": output[-3000:]}


def junit_counts(xml: str) -> dict[str, Any]:
    """Passed, failed (failures and errors) and skipped tests of a JUnit report, and the failed ones' names."""
    root = ElementTree.fromstring(xml)
    cases = list(root.iter("testcase"))
    failures = [
        f"{case.get('classname')}::{case.get('name')}" for case in cases if case.find("failure") is not None
    ] + [f"{case.get('classname')}::{case.get('name')}" for case in cases if case.find("error") is not None]
    skipped = sum(1 for case in cases if case.find("skipped") is not None)
    return {
        "passed": len(cases) - len(failures) - skipped,
        "failed": len(failures),
        "skipped": skipped,
        "failures": failures,
    }


def run_bench(path: Path, samples: int, epochs: int) -> dict[str, Any]:
    """Run ``fastsab bench --device cuda``; its JSON, or the error and the end of its output."""
    command = [sys.executable, "-m", "fastsab", "bench", "--device", "cuda", "--quiet", "--json", str(path)]
    command += ["--samples", str(samples), "--epochs", str(epochs)]
    code, output, seconds = run_limited(command, BENCH_SECONDS)
    if code != 0 or not path.exists():
        reason = "timed out" if code is None else f"exit code {code}"
        return {"ok": False, "error": reason, "seconds": round(seconds, 1), "output_tail": output[-3000:]}
    return {"ok": True, "seconds": round(seconds, 1), **json.loads(path.read_text())}


def run_shapes() -> dict[str, Any]:
    """Run ``fastsab bench --suite shapes --device cuda`` on 20,000 sequences; its table, or why there is none.

    Reported, not judged: the check's exit code does not depend on it.
    """
    command = [sys.executable, "-m", "fastsab", "bench", "--suite", "shapes", "--device", "cuda", "--quiet"]
    code, output, seconds = run_limited([*command, "--samples", "20000"], SHAPES_SECONDS)
    if code != 0:
        reason = "timed out" if code is None else f"exit code {code}"
        return {"ok": False, "error": reason, "seconds": round(seconds, 1), "output_tail": output[-3000:]}
    return {"ok": True, "seconds": round(seconds, 1), "table": output[output.find("|") :].strip()}


def summarize(gpu: dict[str, Any], tests: dict[str, Any], bench: dict[str, Any]) -> dict[str, Any]:
    """The check's summary: the GPU, the test counts, the key ratios of the bench, and whether all is well."""
    rows = bench.get("rows", [])
    copies = [row for row in rows if row["suite"] == "host-to-device" and row["method"] != row["baseline"]]
    steps = [row for row in rows if row["suite"] == "device step" and row["method"] != row["baseline"]]
    fidelity = [
        {
            "kind": result["kind"],
            "sort_window": result["sort_window"],
            "batches": result["batches"],
            "over_budget": result["over_budget"],
            "mean_use": round(result["mean_use"], 3),
            "meets_target": result["over_budget"] == 0 and result["mean_use"] >= MEAN_USE_TARGET,
        }
        for result in bench.get("fidelity", [])
    ]
    ok = (
        tests["failed"] == 0
        and tests["exit_code"] == 0
        and bench["ok"]
        and all(result["over_budget"] == 0 for result in fidelity)
    )
    return {
        **gpu,
        "ok": ok,
        "tests": tests,
        "bench": {key: value for key, value in bench.items() if key not in ("rows", "fidelity")},
        "host_to_device": [
            {
                "workload": row["workload"],
                "method": row["method"],
                "time_over_pinned_copy": round(row["ratio"], 3),
                "share_of_copy_throughput": round(1 / row["ratio"], 3),
                "speedup_over_dataloader": row["speedup"],
            }
            for row in copies
        ],
        "device_step": [
            {
                "workload": row["workload"],
                "method": row["method"],
                "time_over_step_alone": round(row["ratio"], 3),
                "speedup_over_dataloader": row["speedup"],
            }
            for row in steps
        ],
        "fidelity": fidelity,
        "fidelity_target": {"over_budget": 0, "mean_use_at_least": MEAN_USE_TARGET},
        "rows": rows,
    }


def render(summary: dict[str, Any]) -> str:
    """The summary in a few lines."""
    tests = summary["tests"]
    lines = [
        f"GPU check: {'OK' if summary['ok'] else 'FAILED'}",
        f"{summary['gpu']} ({summary['gpu_memory_gib']} GiB), torch {summary['torch']}, CUDA {summary['cuda_version']}",
        f"tests/gpu: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped "
        f"({tests['seconds']} s)",
    ]
    lines += [f"  failed: {name}" for name in tests["failures"]]
    bench = summary["bench"]
    if not bench["ok"]:
        lines.append(f"fastsab bench --device cuda: {bench['error']}")
    for row in summary["host_to_device"]:
        lines.append(
            f"host-to-device  {row['method']:<45} {row['time_over_pinned_copy']:>6.2f}x the pinned copy_'s time "
            f"({row['share_of_copy_throughput']:.0%} of its throughput)"
        )
    for row in summary["device_step"]:
        lines.append(f"device step     {row['method']:<45} {row['time_over_step_alone']:>6.2f}x the step alone")
    for result in summary["fidelity"]:
        window = f", window {result['sort_window']}" if result["sort_window"] else ""
        verdict = "meets the target" if result["meets_target"] else "MISSES the target"
        lines.append(
            f"fidelity  {result['kind']}{window}: {result['over_budget']} of {result['batches']} batches over budget, "
            f"mean use {result['mean_use']:.2f} ({verdict})"
        )
    shapes = summary.get("shapes")
    if shapes is not None:
        lines.append("fastsab bench --suite shapes --device cuda:")
        lines.append(shapes["table"] if shapes["ok"] else f"  {shapes['error']} after {shapes['seconds']} s")
    return "\n".join(lines)


def _write(folder: Path | None, summary: dict[str, Any]) -> None:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gpu_check.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    sys.exit(main())
