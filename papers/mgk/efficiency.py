"""`repro bench-attention` (papers/mgk/commands.py): the cost of attention variants across sequence lengths
(Transformer-MGK's efficiency claim: MGK with half the heads costs less than softmax with all of them, and MLK-4
less than linear-8).

For each variant and length the model is the paper's LRA classifier (`papers.mgk.lra`: 2 layers, width 64, MLP 128,
heads of 32, 10 classes) on random tokens, in training mode. One JSON line per (variant, length):

- `parameters` (whole model) and `attention_parameters` (the attention layers);
- `flops_forward` / `flops_train`: floating-point operations of one forward pass / forward + backward for the
  batch, counted by `torch.utils.flop_counter.FlopCounterMode` (matrix products: mm, bmm, einsum, linear; the
  elementwise work — exp, norms, softmax — is not counted);
- `ms_per_step`: median wall time of a training step (forward, backward, AdamW) after warm-up;
- `saved_activation_mb`: bytes of the tensors autograd keeps for the backward pass (each storage once) — the
  memory that grows with the sequence length, deterministic and the same on any device;
- `peak_memory_mb`: on a GPU the CUDA allocator's peak during the timed steps; on the CPU null (the process's
  resident peak mixes every earlier measurement, so it is not reported).

Timings on a shared CPU are noisy; the FLOP and activation counts are exact.
"""

from __future__ import annotations

import json
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from repro.io import atomic_write_text

DEFAULT_VARIANTS = ("softmax8", "mgk4", "smgk4", "linear8", "mlk4")
DEFAULT_LENGTHS = (256, 512, 1024, 2048)


def saved_activation_bytes(fn) -> int:
    """Bytes autograd saves for backward while `fn()` runs, every storage counted once. fn's result is dropped and
    cannot be backpropagated: the hooks keep no saved tensor. (A pack hook that returns the tensor itself ties each
    op's saved output to that op's own graph node, a cycle inside autograd that Python's collector cannot see: every
    call leaked its saved outputs — the attention maps — and inflated the CUDA peaks measured after it.)"""
    seen: dict[int, int] = {}
    alive = []  # every saved tensor lives until fn returns, as in a real forward: no address is reused meanwhile

    def pack(t: torch.Tensor) -> None:
        alive.append(t)
        try:
            st = t.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. meta, sparse)
            pass

    def unpack(_) -> torch.Tensor:
        raise RuntimeError("saved_activation_bytes keeps no saved tensor: its result cannot be backpropagated")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        fn()
    alive.clear()
    return sum(seen.values())


def measure(variant: str, length: int, *, batch_size: int = 4, steps: int = 3, warmup: int = 1,
            device: str | None = None, precision: str = "32", n_token: int = 257) -> dict:
    from papers.mgk.lra import LRAClassifier, LRAConfig, Variant  # heavy: Lightning

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    g = torch.Generator().manual_seed(0)
    cfg = LRAConfig(n_token=n_token, num_classes=10, max_len=length)
    torch.manual_seed(0)
    model = LRAClassifier(cfg, Variant.parse(variant)).to(dev).train()
    x = torch.randint(1, n_token, (batch_size, length), generator=g).to(dev)
    y = torch.randint(0, 10, (batch_size,), generator=g).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def loss_fn():
        with amp:
            return torch.nn.functional.cross_entropy(model(x).float(), y)

    with FlopCounterMode(display=False) as fc:
        loss_fn()  # not kept: its graph's saved activations would stay allocated through the CUDA peak below
    flops_fwd = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        loss_fn().backward()
    flops_train = fc.get_total_flops()
    opt.zero_grad(set_to_none=True)
    saved = saved_activation_bytes(loss_fn)

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for i in range(warmup + steps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        loss_fn().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return {
        "variant": variant, "length": length, "batch_size": batch_size, "precision": precision,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)",
        "parameters": sum(p.numel() for p in model.parameters()),
        "attention_parameters": sum(p.numel() for layer in model.encoder.layers for p in layer.attn.parameters()),
        "flops_forward": flops_fwd, "flops_train": flops_train,
        "ms_per_step": round(statistics.median(times) * 1e3, 2), "steps": steps, "warmup": warmup,
        "saved_activation_mb": round(saved / 2**20, 3),
        "peak_memory_mb": round(torch.cuda.max_memory_allocated(dev) / 2**20, 1) if dev.type == "cuda" else None,
        "torch": torch.__version__,
    }


def main(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = args.variants.split(",") if args.variants else list(DEFAULT_VARIANTS)
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else list(DEFAULT_LENGTHS)
    lines = []
    for length in lengths:
        for v in variants:
            row = measure(v, length, batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                          device=args.device, precision=args.precision)
            if getattr(args, "rehearsal", "false") == "true":
                row["rehearsal"] = True
            lines.append(json.dumps(row))
            if not args.output:
                print(lines[-1], flush=True)
    if args.output:  # the rows go to the file; the terminal gets one line
        atomic_write_text(args.output, "\n".join(lines) + "\n")
        print(f"repro bench-attention: {len(lines)} rows in {args.output}", flush=True)


def add_arguments(b) -> None:
    """The options of `repro bench-attention` (registered in papers/mgk/commands.py)."""
    b.add_argument("--variants", help=f"comma-separated LRA variants (default {','.join(DEFAULT_VARIANTS)})")
    b.add_argument("--lengths",
                   help=f"comma-separated sequence lengths (default {','.join(map(str, DEFAULT_LENGTHS))})")
    b.add_argument("--batch-size", type=int, default=4)
    b.add_argument("--steps", type=int, default=3, help="timed training steps (after warm-up)")
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--precision", choices=["32", "bf16"], default="32")
    b.add_argument("--device")
    b.add_argument("--threads", type=int)
    b.add_argument("--output", help="also write the JSON lines to this file")
    b.add_argument("--rehearsal", choices=["true", "false"], default="false",
                   help="true: a rehearsal of the paper profile (rows marked, their table cells labelled)")
