"""bf16 autocast on a CPU without bf16 kernels: matrix products in float32 on bf16-rounded operands.

PyTorch runs a bf16 matrix product on the CPU through oneDNN where the CPU has AVX-512 (`avx512_core`, with or
without `avx512_bf16`/`amx_bf16`), and otherwise (AVX2 only: many AMD EPYC and older Intel hosts) through a
generic loop that reached 0.8–1.3 GFLOP/s on 2 cores, against 30–70 GFLOP/s for float32 on the same cores (an AMD
EPYC with AVX2 only, 2026-11-26). Every tiny and small config trains under bf16 autocast, so on such a CPU a tiny fit
took 8.6× its float32 time (docs/pipeline.md, "bf16 on CPUs").

`emulate_bf16_matmul()` replaces the autocast rule of the matrix products (`mm`, `bmm`, `addmm`, `baddbmm`,
`addbmm`, `matmul`, `linear`, `linalg_vecdot`, the convolutions, `scaled_dot_product_attention`) on the CPU:
autocast rounds their floating operands to bf16, as PyTorch's own rule does; here they are then widened back
to float32 (exactly: every bf16 value is a float32), the product runs in float32, and its result is rounded to
bf16, the dtype autocast gives. A bf16 product accumulates in float32 in both of PyTorch's kernels, and the
product of two bf16 numbers is exact in float32, so the result is the same bf16 number up to the order of the
float32 sums, which differs between any two kernels anyway (docs/pipeline.md, "bf16 on CPUs"). What differs: the
backward pass sees float32 products of bf16-rounded tensors where PyTorch's rule records bf16 products, and the gradient
is rounded to bf16 at the same place (the cast's backward), so it too differs only by summation order; the CPU's
bf16 attention kernel rounds the softmax weights to bf16 before multiplying by the values, where here they stay in
float32.

Installed by the `repro` command (`repro.cli.entry`) and the tests' conftest when `active()` says the CPU lacks
oneDNN's bf16 path; REPRO_BF16=native keeps PyTorch's own kernels. Nothing changes on a CPU with AVX-512. The
configs keep their precision, so that a run's numbers stay those of bf16 arithmetic."""

from __future__ import annotations

import os
import warnings

import torch

# the operators of autocast's lower-precision list on the CPU that are matrix products (aten/src/ATen/autocast_mode.cpp)
OPS = (
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "addbmm",
    "matmul",
    "linear",
    "linalg_vecdot",
    "conv1d",
    "conv1d.padding",
    "conv2d",
    "conv2d.padding",
    "conv3d",
    "conv3d.padding",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "scaled_dot_product_attention",
)

_installed: list = []  # the torch.library.Library holding the kernels (kept alive), once installed


def native_bf16() -> bool:
    """Whether PyTorch multiplies bf16 matrices on this CPU through oneDNN (AVX-512 or newer)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # an older or other build: AVX-512 is what oneDNN's bf16 path needs
        return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def installed() -> bool:
    """Whether this process runs bf16 autocast's products in float32 (what a run's record says of its CPU)."""
    return bool(_installed)


def active() -> bool:
    """Whether bf16 autocast on this CPU takes the float32 products (installed, or would be by
    `emulate_bf16_matmul`)."""
    if _installed:
        return True
    return os.environ.get("REPRO_BF16", "").lower() != "native" and not native_bf16()


LOW_OR_FLOAT = (torch.float32, torch.bfloat16, torch.float16)  # what autocast casts (float64 it leaves)


def _widen(x):
    if isinstance(x, torch.Tensor) and x.dtype in LOW_OR_FLOAT:
        # autocast's rounding, then exact widening (float64 is left, as autocast does)
        return x.to(torch.bfloat16).float()
    if isinstance(x, (list, tuple)):
        return type(x)(_widen(y) for y in x)
    return x


def _kernel(op):
    skip = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def kernel(*args, **kwargs):
        low = torch.get_autocast_dtype("cpu")
        if low != torch.bfloat16:  # float16 autocast: PyTorch's rule (its floating operands cast to float16), by hand
            def cast(x):
                return x.to(low) if isinstance(x, torch.Tensor) and x.dtype in LOW_OR_FLOAT else x

            with torch._C._ExcludeDispatchKeyGuard(skip):
                return op(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
        with torch._C._ExcludeDispatchKeyGuard(skip):
            out = op(*[_widen(a) for a in args], **{k: _widen(v) for k, v in kwargs.items()})
        return out.to(torch.bfloat16)

    return kernel


def emulate_bf16_matmul(force: bool = False) -> bool:
    """Install the float32 products for bf16 autocast on the CPU, once per process, where `active()` (or `force`).
    Returns whether they are installed."""
    if _installed:
        return True
    if not force and not active():
        return False
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore")
        for name in OPS:
            base, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, base), overload or "default")
            lib.impl(name, _kernel(op), "AutocastCPU")
    _installed.append(lib)
    return True
