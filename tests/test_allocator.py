"""`repro.ops.allocator`: with the policy applied, a large tensor comes from the heap and stays there when freed, for
the next step to reuse (glibc's own statistics say so); REPRO_MALLOC=system leaves glibc's default (a fresh mmap,
given back). Each case in a fresh process (Linux with glibc, as CI)."""

import subprocess
import sys

import pytest

CHECK = """
import ctypes, torch
from repro.ops.allocator import keep_freed_memory, _glibc
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc = _glibc()
libc.mallinfo2.restype = MallInfo2
applied = keep_freed_memory()
x = torch.ones(12 << 20)  # 48 MiB: above glibc's largest mmap threshold
during = libc.mallinfo2()
del x
after = libc.mallinfo2()
print(applied, during.hblkhd >= 48 << 20, after.fordblks >= 48 << 20)
"""


def _run(env_extra: dict) -> list[str]:
    import os

    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True,
                         env={**os.environ, **env_extra})
    return out.stdout.split()


def test_freed_large_tensors_stay_in_the_heap():
    applied, mmapped, kept = _run({"REPRO_MALLOC": ""})
    assert (applied, mmapped, kept) == ("True", "False", "True")  # served from the heap, kept there when freed


@pytest.mark.slow
def test_repro_malloc_system_keeps_the_c_librarys_default():
    applied, mmapped, kept = _run({"REPRO_MALLOC": "system"})
    assert (applied, mmapped, kept) == ("False", "True", "False")  # a fresh mmap, given back on free
