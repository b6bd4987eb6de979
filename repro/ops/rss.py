"""Peak resident memory (RSS) of this process and of the processes it runs, for run records (`repro fit|validate|
test --run.record`) and the rehearsal's summary (paper-size stages were ended by the kernel's OOM killer
at 15.7 and 22.3 GB, and nothing recorded how close each stage came to the machine's memory).

The kernel's own counters, not sampling: `getrusage(2)`'s `ru_maxrss` is the high-water mark of a process's
resident set over its whole life (a peak between two samples is never missed); for `RUSAGE_CHILDREN` it is that of
the largest child that ended, counting every descendant it waited for (a `dvc repro` stage, its `repro runs`, that
command's workers: `run_measured`). Two consequences. A process's figure covers its whole life: under `repro runs`
and `repro steps`, which run several experiments in one process, a run's record holds the largest RSS of the
process so far, its own run or an earlier one. And Linux starts the count of a process that a larger one started
(fork, then exec) at its parent's size at that moment: a DDP rank launched by rank 0 counts rank 0's resident set
at the launch, and `run_measured` starts commands from a small launcher for this reason. (Linux can reset the
mark, `/proc/self/clear_refs`, but that also lowers what the parent is told when the process ends: the
rehearsal's per-stage peak would then lose every run but the last.)
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass


def _mb(maxrss: int) -> float:
    """`ru_maxrss` in MiB: Linux counts it in KiB, macOS in bytes."""
    return maxrss / (2**20 if sys.platform == "darwin" else 1024)


def peak_rss_mb() -> float:
    """This process's peak resident memory since it started, in MiB."""
    return _mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


@dataclass(frozen=True)
class Measured:
    returncode: int
    seconds: float
    peak_rss_mb: float  # the largest process of the command's tree that was waited for (see the module's docstring)


# A small interpreter between us and the command. Linux gives a process that was forked and then exec'd the peak
# of the address space it left at exec — its parent's, shared by fork or vfork — so the `wait4` figure of any
# command we start is at least our own size (a bare `python -c pass` read 240 MiB from the test process). Started
# from this launcher (~10 MiB), the command's own peak shows; the launcher reports its children's through a pipe.
# It outlives Ctrl-C (the command, which got the signal too, decides when to stop, e.g. after saving a checkpoint).
_LAUNCHER = """
import os, resource, subprocess, sys
fd, cmd = int(sys.argv[1]), sys.argv[2:]
try:
    proc = subprocess.Popen(cmd)
except OSError as err:
    print(f"{cmd[0]}: {err}", file=sys.stderr)
    os.write(fd, b"0")
    sys.exit(127)
while True:
    try:
        code = proc.wait()
        break
    except KeyboardInterrupt:
        continue
os.write(fd, str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss).encode())
sys.exit(code if code >= 0 else 128 - code)
"""


def run_measured(cmd: list[str], **popen_kwargs) -> Measured:
    """Run `cmd` as `subprocess.run` would (no capture unless `popen_kwargs` asks) and return its exit code, its
    seconds and its peak RSS (the largest process of its tree, through `_LAUNCHER`). On Ctrl-C the command, which
    got the signal too, is waited for, then the interrupt goes on."""
    read, write = os.pipe()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(write), *cmd], pass_fds=(write,),
                                **popen_kwargs)
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as pipe:
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.wait()
            raise
        maxrss = int(pipe.read() or b"0")
    return Measured(code, time.monotonic() - t0, _mb(maxrss))
