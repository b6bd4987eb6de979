"""Transformer-XL's speed side by side with the authors' code: `repro bench-txl-authors --checkout PATH`.

Follows `repro.ops.sidebyside` (the timed steps of `repro.ops.bench`, the codes taking turns for `--rounds` rounds
with the same threads, tokens and precision; the ratio of each round reported, and the range over rounds) with two
models of the same shape: ours (`papers.transformer_xl.model.TransformerXL`) and the official `MemTransformerLM`
(kimiyoung/transformer-xl `pytorch/mem_transformer.py`) imported from a checkout and run unmodified, with the
run-time shims of `tests/parity/make_transformer_xl.py` only (`torch.version.cuda` set for its import, `.byte()`
masks as booleans). Differs from the other papers' side-by-side commands in where the codes run: each in its own
process (`interleaved_processes`), so that each runs with the C allocator's policy it is run with: ours with
`repro.ops.allocator`'s (as the `repro` command sets it), theirs with the C library's default (as their `train.py`
runs), or with ours too (`--same-allocator`).

The row also says where each code's time goes against the machine: the floating-point operations of the matrix
products of one step with a full memory (`product_flops`: forward, and backward in training), each round's product
GFLOP/s that follows from the tokens/s, and the share of what this process measures a square product (n = 2048)
to reach in the same precision, the same threads and the same autocast (on a CPU without bf16 kernels,
`repro.precision`'s float32 products). A code whose share is near 1 is bound by the products themselves.

Shapes (those of the speed comparison): `enwik8_12l` (41M: 12 layers, width 512, 8 heads of 64, inner 2048, 204 symbols,
batch 2, segment = memory = 512, dropout 0.1) and `small` (4 layers, width 128, 4 heads of 32, inner 512, the
4,720-word vocabulary of `embedded-word`, batch 16, segment = memory = 128, dropout 0.1). Evaluation keeps the
shape with memory = segment, no clamp and no same_length. bf16 is `torch.autocast` on both. `--device cuda` runs
both on a GPU (the clock starts and stops with the GPU's queue drained) and `--batch` replaces the shape's batch
(e.g. the paper's 22 sequences per step, which a GPU needs to be measured doing more than launching kernels).
"""

from __future__ import annotations

import importlib
import statistics
from functools import partial
from pathlib import Path

import torch

from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.ops import sidebyside
from repro.ops.sidebyside import SegmentCode, TimeMajorCode
from repro.ops.timing import measured_peak_tflops

PROG = "repro bench-txl-authors"
SHAPES = {
    "enwik8_12l": dict(n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, n_token=204, batch=2, tgt=512,
                       mem=512),
    "small": dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, n_token=4720, batch=16, tgt=128,
                  mem=128),
}
DROPOUT = 0.1


def official_module(checkout: Path):
    """Their `pytorch/mem_transformer.py`, imported from the checkout (a bad checkout is refused in one line)."""
    with sidebyside.checkout_on_path(PROG, checkout, repository="kimiyoung/transformer-xl",
                                     folders=("pytorch", "pytorch/utils"), module="mem_transformer"):
        return importlib.import_module("mem_transformer")


def theirs(mt, s: dict) -> TimeMajorCode:
    """Their model at shape `s`, as their `train.py` builds it for a character or word model without adaptive
    softmax (one cluster, tied weights)."""
    return TimeMajorCode(mt.MemTransformerLM(s["n_token"], s["n_layer"], s["n_head"], s["d_model"], s["d_head"],
                                             s["d_inner"], DROPOUT, 0.0, tie_weight=True, d_embed=None, div_val=1,
                                             tie_projs=[False], pre_lnorm=False, tgt_len=s["tgt"], ext_len=0,
                                             mem_len=s["mem"], cutoffs=[], same_length=False, attn_type=0,
                                             clamp_len=-1))


def ours(s: dict, mode: str) -> SegmentCode:
    """Ours at shape `s` (dropout `s["dropout"]` where given); evaluation keeps keys and values (`repro.lm`)."""
    model = TransformerXL(TransformerXLConfig(
        n_layer=s["n_layer"], d_model=s["d_model"], n_head=s["n_head"], d_head=s["d_head"], d_inner=s["d_inner"],
        n_token=s["n_token"], dropout=s.get("dropout", DROPOUT), dropatt=0.0))
    return SegmentCode(model, mem_len=s["mem"], kv_memory=mode == "eval")


def build(which: str, checkout: Path | None, s: dict, mode: str):
    """The code a timed process builds (`interleaved_processes`): `theirs` from the checkout, or `ours`."""
    return theirs(official_module(checkout), s) if which == "theirs" else ours(s, mode)


def stream_of(s: dict) -> dict:
    """`sidebyside.token_stream`'s shape arguments for shape `s`."""
    return dict(n_token=s["n_token"], batch=s["batch"], segment=s["tgt"])


def run(checkout: Path, *, shape: str, mode: str, precision: str, rounds: int, steps: int, warmup: int,
        threads: int, same_allocator: bool = False, device: str = "cpu", batch: int | None = None) -> dict:
    s = dict(SHAPES[shape], batch=batch or SHAPES[shape]["batch"])
    official_module(checkout)  # a bad checkout fails here, in one line, before any process starts
    codes = {"theirs": (partial(build, "theirs", checkout, s, mode), same_allocator),  # theirs as train.py runs
             "ours": (partial(build, "ours", checkout, s, mode), True)}
    speeds, params, policy, flops = sidebyside.interleaved_processes(
        codes, stream=stream_of(s), mode=mode, precision=precision, rounds=rounds, steps=steps, warmup=warmup,
        threads=threads, device=device)
    ratios = [o / t for o, t in zip(speeds["ours"], speeds["theirs"])]
    torch.set_num_threads(threads)
    # after the rounds, in this process: no code is running beside it
    peak = measured_peak_tflops(torch.device(device), precision, n=2048) * 1e3
    tokens = s["batch"] * s["tgt"]
    rates = {k: [flops[k] * v / tokens / 1e9 for v in vs] for k, vs in speeds.items()}
    return {"shape": shape, "mode": mode, "precision": precision, "threads": threads, "rounds": rounds,
            "steps": steps, "warmup": warmup, "batch": s["batch"], "segment": s["tgt"], "memory": s["mem"],
            "allocator": {k: "repro (freed memory kept)" if v else "C library default" for k, v in policy.items()},
            "tokens_per_s": {k: [round(v, 1) for v in vs] for k, vs in speeds.items()},
            "ratio": [round(r, 3) for r in ratios], "ratio_median": round(statistics.median(ratios), 3),
            "parameters": params, "device": sidebyside.device_name(device), "torch": torch.__version__,
            "product_gflop_per_step": {k: round(v / 1e9, 3) for k, v in flops.items()},
            "product_gflop_per_s": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
            "matmul_gflop_per_s": round(peak, 1),
            "product_share": {k: [round(v / peak, 3) for v in vs] for k, vs in rates.items()}}


def describe(row: dict) -> str:
    tps, per_step, share = row["tokens_per_s"], row["product_gflop_per_step"], row["product_share"]
    return (f"{row['shape']} {row['mode']} {row['precision']}: ours {'/'.join(f'{v:.0f}' for v in tps['ours'])} "
            f"tokens/s, theirs {'/'.join(f'{v:.0f}' for v in tps['theirs'])} → "
            f"{'–'.join(f'{r:.2f}' for r in row['ratio'])}×\n"
            f"  matrix products: ours {per_step['ours']:.2f}, theirs {per_step['theirs']:.2f} GFLOP per step; "
            f"{'–'.join(f'{v:.0%}' for v in share['ours'])} and {'–'.join(f'{v:.0%}' for v in share['theirs'])} "
            f"of a 2048² product's {row['matmul_gflop_per_s']:.0f} GFLOP/s here")


def main(argv: list[str]) -> None:
    p = sidebyside.parser(PROG, __doc__, repository="kimiyoung/transformer-xl", codes="both codes", rounds=2,
                          steps=8, warmup=3)
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--mode", choices=["train", "eval"], default="train")
    p.add_argument("--batch", type=int, help="sequences per step instead of the shape's (e.g. a GPU's batch)")
    p.add_argument("--same-allocator", action="store_true",
                   help="run theirs with our allocator policy too (repro.ops.allocator); default: the C library's")
    sidebyside.main(p, argv, lambda a: [run(
        a.checkout, shape=a.shape, mode=a.mode, precision=a.precision, rounds=a.rounds, steps=a.steps,
        warmup=a.warmup, threads=a.threads, same_allocator=a.same_allocator, device=a.device, batch=a.batch)],
        describe)
