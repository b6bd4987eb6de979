"""What the benchmarks measure with: the clock barrier and a timed run of steps, the precision of a timed step, a
square product's rate and the FLOP count of a step. Used by `repro bench` (`repro.ops.bench`), by the side-by-side
benchmarks of the papers against the authors' code (`repro.ops.sidebyside`) and by the papers' own benchmarks.

Follows PyTorch's own benchmark utilities (`torch.utils.benchmark` drains the GPU's queue before it reads the
clock; `torch.utils.flop_counter` counts the matrix products and attention). Differs in weight: it imports torch
and `repro.nn.attention` only, not Lightning (which `repro.ops.bench` brings through `repro.lm`), because each
side-by-side code is timed in a process of its own that starts from this module. The flop counter is imported
here, first: imported after an authors' checkout has set `torch.version.cuda` on a CPU build (their adaptive
softmax reads it at import), it warns on the terminal that there is no triton.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch.utils.flop_counter import FlopCounterMode

from repro.nn.attention import attention_kernel


def sync(device: torch.device) -> None:
    """The clock barrier: a GPU's queue drained, so that the clock reads the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Callable[[], object], n: int, device: torch.device) -> float:
    """Seconds of `n` calls of `step`, the clock started and read with the device's queue drained."""
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return time.perf_counter() - start


def autocast(device: torch.device, precision: str):
    """The precision of a timed step: `bf16` is `torch.autocast` (on a CPU without bf16 kernels,
    `repro.precision`'s float32 products), `32` plain float32."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def measured_peak_tflops(device: torch.device, precision: str, *, n: int | None = None, repeats: int = 5) -> float:
    """The best TFLOP/s of `repeats` (n, n) × (n, n) products in `precision` (bf16 under autocast, as the timed
    steps) on random data, after one untimed product, with this process's threads. n: 8192 on a GPU, 2048 on a
    CPU."""
    n = n or (8192 if device.type == "cuda" else 2048)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=g)
    b = torch.randn(n, n, device=device, generator=g)
    best = float("inf")
    with autocast(device, precision):
        for i in range(repeats + 1):
            sync(device)
            t0 = time.perf_counter()
            a @ b
            sync(device)
            if i:
                best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e12


def count_flops(step, model: torch.nn.Module) -> int:
    """FLOPs of one call of `step` (matrix products and attention, `torch.utils.flop_counter`), with `model`'s
    attention on the eager kernel whatever kernel is timed, so that every kernel and compiled form of a model is
    divided by the same count."""
    counter = FlopCounterMode(display=False)
    with attention_kernel(model, "eager"), counter:
        step()
    return counter.get_total_flops()
