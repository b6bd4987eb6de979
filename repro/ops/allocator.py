"""The C allocator's policy for CPU training of the small profiles and for benchmarks: freed large blocks stay in the
process for reuse; off for the paper profile and its rehearsal, where it cost memory.

PyTorch's CPU tensors come from the C library's `malloc`. glibc serves a block of more than its mmap threshold
(128 KiB, raised as large blocks are freed, but never above 32 MiB) with a fresh `mmap` and gives it back to the
system on `free`, so every step of a training loop that creates such a tensor again pays the kernel's page faults
and zero-filling for it (a 2 × 8 × 512 × 1024 float32 attention score tensor is 32 MiB: about 7 ms to touch
fresh, 0.6 ms to overwrite). `keep_freed_memory()` turns glibc's direct mmaps off and its trimming of the heap
off (`mallopt(M_MMAP_MAX, 0)`, `mallopt(M_TRIM_THRESHOLD, 1 GiB)`), so that freed blocks are reused by the next
step. Arithmetic is untouched: every result is bit for bit the same. The cost: every block now lives in the heap,
whose free holes are not given back, so the process's resident memory is its heap's high-water mark. For the 41M
model below, three epochs of 8 training segments, each followed by evaluation at another batch size, held 2.50 GB
resident throughout, against 2.37–2.41 GB (peak 2.44) with glibc's default: no growth from phase to phase.

Measured (2 cores of an Intel Xeon with AMX, torch 2.13, 41M Transformer-XL at batch 2 × 512, memory 512,
training): float32 407–445 → 488–506 tokens/s, bf16 851–887 → 901–916 tokens/s.

Where it stays off. A paper-size model's step holds gigabytes of activations in tensors of many sizes, and the heap's
holes between them grow with it: Transformer-XL enwik8 24L (277M parameters; its rehearsal, batch 2 × 768, memory
768) peaked at 13.6 GiB under the policy against 11.3 GiB with glibc's default (+20%). Nor is it a matter of size
alone: in the 30 rehearsal steps of models below 100M parameters it raised the peak by more than 10% in 11, by up
to 47% (the ∞-former's sorting +33–47%, LRA ListOps and Retrieval +33%, LaMemo's Transformer-XL baselines +18–20%,
MGK's WikiText-103 models +6–14%, the 2-process fits of MGK and the ∞-former +17–18%; the 41M enwik8 12L +5%):
`results/rehearsal/allocator_policy.json`. So it is off (`policy_applies`)
- for the paper profile (`run.profile: paper`): its runs are meant for GPUs, where the C allocator holds no
  activations, and its rehearsal on a CPU holds paper-size ones; `repro rehearse` also runs every stage under
  REPRO_MALLOC=system, which covers its benchmarks and DDP ranks;
- for a model of `POLICY_MAX_PARAMETERS` or more in any profile;
- everywhere under REPRO_MALLOC=system.
`repro fit|validate|test|steps` (and so `repro runs`' workers) and `repro bench` decide once the model is built
(`keep_freed_memory(parameters=…, profile=…)`); a model for which it is off after one for which it was on, in one
process (`repro steps`), puts glibc's behaviour back (`_stand_down`: mmaps for blocks above 32 MiB, the largest
threshold its default reaches, and the heap's top trimmed); other commands (data, tables, RECL, generation) run
with glibc's default. It does nothing where the C library is not glibc (macOS, musl) and returns False there.
`release_freed_memory()` gives a finished run's freed memory back between the steps of one process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameters (malloc.h)
TRIM_THRESHOLD = 1 << 30
# glibc's defaults that `_stand_down` puts back: as many mmaps as it allows by default, its largest dynamic mmap
# threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit), and its trim threshold at that point (twice the mmap threshold)
DEFAULT_MMAP_MAX, DEFAULT_MMAP_THRESHOLD_MAX = 65536, 32 << 20
# the policy for models below this many parameters, and never for the paper profile (see the module's docstring)
POLICY_MAX_PARAMETERS = 100_000_000
NO_POLICY_PROFILES = ("paper",)
_applied = False


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it)
    except (OSError, AttributeError):
        return None
    return libc


def policy_applies(parameters: int | None = None, *, profile: str | None = None) -> bool:
    """Whether a process that runs a model of `parameters` parameters (None: a benchmark's explicit request) of the
    profile `profile` keeps freed memory: not under REPRO_MALLOC=system, not for the paper profile (nor so its
    rehearsal), and below `POLICY_MAX_PARAMETERS`."""
    if os.environ.get("REPRO_MALLOC", "").lower() == "system" or profile in NO_POLICY_PROFILES:
        return False
    return parameters is None or parameters < POLICY_MAX_PARAMETERS


def keep_freed_memory(*, parameters: int | None = None, profile: str | None = None) -> bool:
    """Keep freed blocks in the process (see the module's docstring) when `policy_applies(parameters, profile=…)`;
    True when the policy is in force afterwards. A model for which it is off after one for which it was on puts
    glibc's behaviour back (`_stand_down`)."""
    global _applied
    if not policy_applies(parameters, profile=profile):
        if _applied:
            _stand_down()
        return False
    if _applied:
        return True
    libc = _glibc()
    if libc is None:
        return False
    _applied = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied


def _stand_down() -> None:
    """Undo the policy: glibc's mmaps back on for blocks above the largest threshold its default reaches, the heap's
    top trimmed at twice that, and the free memory the policy kept given back now. (glibc's threshold no longer
    adapts once set, so this is its default's steady state, not its start.)"""
    global _applied
    libc = _glibc()
    if libc is None:
        return
    libc.mallopt(M_MMAP_THRESHOLD, DEFAULT_MMAP_THRESHOLD_MAX)
    libc.mallopt(M_TRIM_THRESHOLD, 2 * DEFAULT_MMAP_THRESHOLD_MAX)
    libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
    release_freed_memory()
    _applied = False


def release_freed_memory() -> bool:
    """Give back to the system the memory that a finished run's objects leave in this process: a garbage collection
    (a Trainer, its module and callbacks refer to each other), then glibc's `malloc_trim(0)`, which returns every
    free page of its heaps, not only those at the top. `repro steps` (and so each worker of `repro runs`) calls
    it between two steps: the test after a fit in the same process otherwise started beside the fit's freed heap
    (One Billion Word large's test peaked at 17.6 GiB after a 14.0 GiB fit). True where glibc returned
    memory; False elsewhere, or where nothing was free."""
    gc.collect()
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
