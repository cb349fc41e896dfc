"""Ends what a test run started once the run itself has ended, however it ended.

The run (``tests/conftest.py``) marks its environment with a token that every process it starts
inherits: DataLoader workers, torchrun and its ranks, scripts, notebook kernels. It starts this module
detached (a process of its own session, not a child of the run: tests that count the run's child
processes do not see it). It waits for the run's process to end (done, timed out by
pytest-timeout's ``os._exit``, interrupted or killed), then kills every process still carrying the
token.

``python tests/reaper.py --detach TOKEN PID`` starts it and returns at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

#: The environment variable that carries a run's token.
TOKEN_VARIABLE = "FASTSAB_TEST_RUN"


def carrying(token: str) -> list[psutil.Process]:
    """The processes (other than this one) whose environment carries ``token``."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(TOKEN_VARIABLE) == token:
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def reap(token: str) -> int:
    """Kill the processes carrying ``token``; how many there were."""
    processes = carrying(token)
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(processes, timeout=10)
    return len(processes)


def wait_for(run: psutil.Process) -> None:
    """Return once ``run`` has ended (a zombie has ended too)."""
    # NOTE: polled, not a pipe's end-of-file: a forked DataLoader worker inherits every descriptor
    # of the run, so a pipe would stay open as long as the processes this is meant to end
    while True:
        try:
            if run.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.5)


def main() -> None:
    if sys.argv[1] == "--detach":
        command = [sys.executable, __file__, *sys.argv[2:]]
        subprocess.Popen(command, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        return
    token, pid = sys.argv[1], int(sys.argv[2])
    try:
        run = psutil.Process(pid)
    except psutil.NoSuchProcess:
        run = None
    if run is not None:
        wait_for(run)
    reaped = reap(token)
    if reaped:
        print(f"tests/reaper.py: killed {reaped} process(es) the test run left behind", file=sys.stderr)


if __name__ == "__main__":
    main()
