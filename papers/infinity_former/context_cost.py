"""`repro bench-context` (papers/infinity_former/commands.py): cost of one segment as the context grows — the
∞-former's claim that its attention cost does not depend on the context length (Martins et al. 2022, §3.1.1),
against Transformer-XL attending to all of it.

For each context length C (tokens already seen):
- Transformer-XL with a memory of C positions per layer (memory = context): one segment attends to C + T keys,
  so time and memory grow with C. The memory is filled with random hidden states of the model's width (the cost
  does not depend on their values).
- the ∞-former (STM of `stm` positions + continuous LTM of N basis functions) after actually reading C tokens
  segment by segment, with linear or sticky updates: the whole context is folded into N coefficients per layer,
  so time and memory per segment stay flat.
Each point is the median over `repeats` segments, evaluation mode, no gradient. `memory_state_mb` is the size of
the carried memory; `peak_mb` the peak of the tensors one segment's forward pass creates (attention scores,
activations; `repro.ops.memtrack.TensorPeak`, on any device, on one extra untimed segment). Measured, never asserted
in tests.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from papers.infinity_former.ltm import LTMConfig
from papers.infinity_former.model import InfinityFormer
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.io import atomic_write_text
from repro.ops.memtrack import TensorPeak
from repro.tracking import hardware


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _state_mb(mems) -> float:
    return sum(m.numel() * m.element_size() for m in mems) / 2**20


def _time_segment(model, x, mems, mem_len, dev):
    _sync(dev)
    t0 = time.perf_counter()
    _, new = model(x, mems, mem_len=mem_len)
    _sync(dev)
    return time.perf_counter() - t0, new


def _segment_peak_mb(model, x, mems, mem_len) -> float:
    """Peak of the tensors one segment's forward pass creates (`repro.ops.memtrack.TensorPeak`), on an untimed pass
    whose new memory is discarded."""
    with TensorPeak() as tracker:
        model(x, mems, mem_len=mem_len)
    return tracker.peak_mb


@torch.inference_mode()
def bench_context(*, contexts: list[int], segment: int = 128, batch: int = 1, n_layer: int = 2, d_model: int = 128,
                  n_head: int = 4, n_basis: int = 256, stm: int | None = None, sampling: str = "linear",
                  repeats: int = 5, device: str | None = None,
                  models: tuple[str, ...] = ("txl", "infty")) -> list[dict]:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = TransformerXLConfig(n_layer=n_layer, d_model=d_model, n_head=n_head, d_head=d_model // n_head,
                              d_inner=2 * d_model, n_token=32, dropout=0.0, tie_weight=False)
    stm = stm or segment
    g = torch.Generator().manual_seed(0)

    def tokens():
        return torch.randint(0, 32, (batch, segment), generator=g).to(dev)

    where = hardware() if dev.type == "cpu" else torch.cuda.get_device_name(dev)
    rows = []
    if "txl" in models:
        txl = TransformerXL(cfg).to(dev).eval()
        for c in contexts:
            mems = [torch.randn(batch, c, d_model, generator=g).to(dev) for _ in range(n_layer)]
            times = []
            for _ in range(repeats + 1):  # the first is warm-up
                dt, _ = _time_segment(txl, tokens(), mems, c, dev)
                times.append(dt)
            rows.append({"model": "Transformer-XL (memory = context)", "context": c, "segment": segment,
                         "ms_per_segment": round(statistics.median(times[1:]) * 1e3, 3),
                         "memory_state_mb": round(_state_mb(mems), 3),
                         "peak_mb": round(_segment_peak_mb(txl, tokens(), mems, c), 2), "device": where})
    if "infty" in models:
        ltm = LTMConfig(n_basis=n_basis, n_samples=min(512, 2 * n_basis), sampling=sampling)
        inf = InfinityFormer(cfg, ltm).to(dev).eval()
        mems, seen = None, 0
        for c in sorted(contexts):
            while seen < c:  # read the context, segment by segment
                _, mems = inf(tokens(), mems, mem_len=stm)
                seen += segment
            times = []
            for _ in range(repeats + 1):  # each timed segment also extends the context by one segment
                dt, mems = _time_segment(inf, tokens(), mems, stm, dev)
                seen += segment
                times.append(dt)
            rows.append({"model": f"∞-former (STM {stm} + LTM N={n_basis}, {sampling})", "context": c,
                         "segment": segment, "ms_per_segment": round(statistics.median(times[1:]) * 1e3, 3),
                         "memory_state_mb": round(_state_mb(mems), 3),
                         "peak_mb": round(_segment_peak_mb(inf, tokens(), mems, stm), 2), "device": where})
    base = {"batch": batch, "n_layer": n_layer, "d_model": d_model, "n_head": n_head, "torch": torch.__version__,
            "threads": torch.get_num_threads()}
    return [base | r for r in rows]


def add_arguments(p) -> None:
    """The options of `repro bench-context` (registered in papers/infinity_former/commands.py)."""
    p.add_argument("--contexts", default="1024,4096,16384,65536,262144",
                   help="comma-separated context lengths (tokens already seen)")
    p.add_argument("--segment", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--n-basis", type=int, default=256)
    p.add_argument("--stm", type=int, help="∞-former short-term memory (default: the segment length)")
    p.add_argument("--sampling", choices=["linear", "sticky"], default="linear")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", default="txl,infty")
    p.add_argument("--device")
    p.add_argument("--threads", type=int)
    p.add_argument("--output", help="also write the JSON lines to this file")
    p.add_argument("--rehearsal", choices=["true", "false"], default="false",
                   help="true: a rehearsal of the paper profile (rows marked, their table cells labelled)")


def main(args) -> None:
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    contexts = [int(x) for x in args.contexts.split(",")]
    if any(c <= 0 for c in contexts):
        raise ValueError("--contexts must be positive token counts, e.g. 1024,4096,16384")
    rows = bench_context(contexts=contexts, segment=args.segment, batch=args.batch, n_layer=args.layers,
                         d_model=args.d_model, n_head=args.heads, n_basis=args.n_basis, stm=args.stm,
                         sampling=args.sampling, repeats=args.repeats, device=args.device,
                         models=tuple(args.models.split(",")))
    if getattr(args, "rehearsal", "false") == "true":
        rows = [{**r, "rehearsal": True} for r in rows]
    lines = [json.dumps(r) for r in rows]
    if args.output:  # the rows go to the file; the terminal gets one line
        atomic_write_text(args.output, "\n".join(lines) + "\n")
        print(f"repro bench-context: {len(lines)} rows in {args.output}", flush=True)
    else:
        for line in lines:
            print(line, flush=True)
