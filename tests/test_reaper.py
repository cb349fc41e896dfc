"""A test run leaves no process behind, even when it is killed or times out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.reaper import TOKEN_VARIABLE

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("end", ["killed", "timed out"])
def test_a_run_that_ends_abruptly_leaves_no_process_behind(tmp_path, end):
    # a run of its own (its own token and reaper), whose test starts a process that would outlive it
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom tests.conftest import _start_reaper\n"
    )
    pid_file = tmp_path / "pid"
    (tmp_path / "test_left.py").write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, time
            from pathlib import Path

            def test_starts_a_process_and_hangs():
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                Path({str(pid_file)!r}).write_text(str(child.pid))
                time.sleep(600)
            """
        )
    )
    env = {key: value for key, value in os.environ.items() if key != TOKEN_VARIABLE}
    timeout = ["--timeout=3", "--timeout-method=thread"] if end == "timed out" else ["--timeout=0"]
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(tmp_path),
         *timeout, str(tmp_path / "test_left.py")],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while not pid_file.exists() or not pid_file.read_text():
            assert run.poll() is None, "the inner run ended before its test started its process"
            psutil.wait_procs([], timeout=0.1)
        child = psutil.Process(int(pid_file.read_text()))
        if end == "killed":
            run.send_signal(signal.SIGKILL)
        run.wait(timeout=60)
        # invariant: the process the run started is ended by the run's reaper (a hang guard, not a timing)
        gone, alive = psutil.wait_procs([child], timeout=60)
        assert alive == [] and gone == [child]
    finally:
        run.kill()
        if pid_file.exists() and pid_file.read_text() and psutil.pid_exists(int(pid_file.read_text())):
            psutil.Process(int(pid_file.read_text())).kill()
