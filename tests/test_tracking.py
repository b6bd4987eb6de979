"""`repro.tracking.hardware`: what a record says about the machine it ran on."""

import os

import torch

from repro.tracking import cpu_model, hardware


def test_cpu_model_names_the_instruction_set_and_bf16_support():
    """bf16 runs repeat bit for bit only on a CPU of the same kind (README, "Profiles"), so the record says which."""
    m = cpu_model()
    assert torch.backends.cpu.get_cpu_capability() in m
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    for flag in ("amx_bf16", "avx512_bf16"):
        assert (flag in m) == (f" {flag}" in flags)
    assert ("no bf16 instructions" in m) == ("bf16" not in flags)
    if not torch.cuda.is_available():  # a CPU run's record carries it
        assert hardware() == f"CPU {os.uname().machine} {m} ×{os.cpu_count()} cores ({torch.get_num_threads()} threads)"
