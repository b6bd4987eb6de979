"""LaMemo's cost against Transformer-XL's, ours and the authors' side by side: `repro bench-lamemo-authors`.

Follows `repro.ops.sidebyside` (the timed steps of `repro.ops.bench`, the codes taking turns in one process for
`--rounds` rounds on one token stream), as `repro bench-txl-authors` does, with four codes: the official
`MemTransformerLM` of thu-coai/LaMemo (`pytorch/mem_transformer.py`, imported from a checkout, run unmodified) at
attn_type 3 (LaMemo, disentangled relative positions) and attn_type 0 (the original Transformer-XL code, which the
same file carries), and ours (`papers.lamemo.model.LaMemo`, `TransformerXL`) at the same shape. What it reports is
the slowdown of LaMemo relative to Transformer-XL within each code (ours must be at least the official
code's own ratio and ≥ 0.65), and each model's speed against the authors'. Differs from `repro bench-txl-authors`
in where the codes run: all four in this process, under the C allocator's policy this process has.

Shapes: `tiny_char` (the tiny profile's char models: 3 layers, width 128, 4 heads of 32, inner 256, segment =
memory = 32, batch 16, no dropout, 204 symbols) and `enwik8` (the paper's enwik8 base: 12 layers, width 512, 8 heads
of 64, inner 2048, segment = memory = 512, batch 2, dropout 0.1). Evaluation keeps the shape (memory = segment,
no clamp); our Transformer-XL evaluates with its key/value memory, our LaMemo with its state memory. `--device cuda`
puts all four on a GPU.

The row also counts each code's matrix-product FLOPs per step at full memory (`sidebyside.product_flops`):
Transformer-XL's count over LaMemo's is the ratio the two would reach if each ran its products at the same rate and
did nothing else, the bound against which the measured ratios are read.
"""

from __future__ import annotations

import importlib
import statistics
from pathlib import Path

import torch

from papers.lamemo.model import LaMemo, LaMemoConfig
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.ops import sidebyside
from repro.ops.sidebyside import SegmentCode, TimeMajorCode, per_round

PROG = "repro bench-lamemo-authors"
SHAPES = {
    "tiny_char": dict(n_layer=3, d_model=128, n_head=4, d_head=32, d_inner=256, n_token=204, batch=16, tgt=32,
                      mem=32, dropout=0.0),
    "enwik8": dict(n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, n_token=204, batch=2, tgt=512,
                   mem=512, dropout=0.1),
}


def official_module(checkout: Path):
    """Their `pytorch/mem_transformer.py`, imported from the checkout (a bad checkout is refused in one line)."""
    with sidebyside.checkout_on_path(PROG, checkout, repository="thu-coai/LaMemo",
                                     folders=("pytorch", "pytorch/utils"), module="mem_transformer"):
        return importlib.import_module("mem_transformer")


class Theirs(TimeMajorCode):
    """Their `MemTransformerLM` at `attn_type` (3: LaMemo, 0: Transformer-XL), which returns more than
    kimiyoung's."""

    def __init__(self, mt, s: dict, attn_type: int):
        super().__init__(mt.MemTransformerLM(
            s["n_token"], s["n_layer"], s["n_head"], s["d_model"], s["d_head"], s["d_inner"], dropout=s["dropout"],
            dropatt=0.0, tie_weight=True, d_embed=s["d_model"], div_val=1, tie_projs=[False], pre_lnorm=False,
            tgt_len=s["tgt"], ext_len=0, mem_len=s["mem"], cutoffs=[], same_length=False, attn_type=attn_type,
            clamp_len=-1))

    def unpack(self, out):
        if self.model.training:  # [loss, mem_loss] + memories (train_ddp.py without --calc_mem_loss)
            return out[0], tuple(out[2:])
        return out[0][0], tuple(out[0][1:])  # ([loss] + memories, analysis)


def run(checkout: Path, *, shape: str, mode: str, precision: str, rounds: int, steps: int, warmup: int,
        threads: int, device: str = "cpu") -> dict:
    torch.set_num_threads(threads)
    s = SHAPES[shape]
    mt = official_module(checkout)
    torch.manual_seed(0)
    cfg = TransformerXLConfig(n_layer=s["n_layer"], d_model=s["d_model"], n_head=s["n_head"], d_head=s["d_head"],
                              d_inner=s["d_inner"], n_token=s["n_token"], dropout=s["dropout"], dropatt=0.0)
    codes = {
        "theirs_txl": Theirs(mt, s, 0), "theirs_lamemo": Theirs(mt, s, 3),
        # our Transformer-XL evaluates with its key/value memory, our LaMemo with its state memory
        "ours_txl": SegmentCode(TransformerXL(cfg), mem_len=s["mem"], kv_memory=mode == "eval"),
        "ours_lamemo": SegmentCode(LaMemo(cfg, LaMemoConfig()), mem_len=s["mem"]),
    }
    for code in codes.values():
        code.model.to(device)
    stream = sidebyside.token_stream(n_token=s["n_token"], batch=s["batch"], segment=s["tgt"],
                                     segments=warmup + steps, device=device)
    flops = {k: sidebyside.product_flops(c, stream, mode=mode) for k, c in codes.items()}
    speeds = sidebyside.interleaved(codes, stream, mode=mode, precision=precision, rounds=rounds, steps=steps,
                                    warmup=warmup)
    return {"shape": shape, "mode": mode, "precision": precision, "threads": threads, "rounds": rounds,
            "steps": steps, "warmup": warmup, "batch": s["batch"], "segment": s["tgt"], "memory": s["mem"],
            "tokens_per_s": {k: [round(v, 1) for v in vs] for k, vs in speeds.items()},
            "lamemo_over_txl": {"theirs": per_round(speeds["theirs_lamemo"], speeds["theirs_txl"]),
                                "ours": per_round(speeds["ours_lamemo"], speeds["ours_txl"])},
            "ours_over_theirs": {"txl": per_round(speeds["ours_txl"], speeds["theirs_txl"]),
                                 "lamemo": per_round(speeds["ours_lamemo"], speeds["theirs_lamemo"])},
            "parameters": {k: sum(p.numel() for p in c.model.parameters()) for k, c in codes.items()},
            "product_gflop_per_step": {k: round(v / 1e9, 4) for k, v in flops.items()},
            "lamemo_over_txl_by_products": {w: round(flops[f"{w}_txl"] / flops[f"{w}_lamemo"], 3)
                                            for w in ("theirs", "ours")},
            "device": sidebyside.device_name(device), "torch": torch.__version__}


def describe(row: dict) -> str:
    lt, by_products = row["lamemo_over_txl"], row["lamemo_over_txl_by_products"]
    return (f"{row['shape']} {row['mode']} {row['precision']}: LaMemo / Transformer-XL theirs "
            f"{'–'.join(f'{r:.2f}' for r in lt['theirs'])}, ours {'–'.join(f'{r:.2f}' for r in lt['ours'])}; "
            f"ours / theirs LaMemo {statistics.median(row['ours_over_theirs']['lamemo']):.2f}×; by matrix-product "
            f"FLOPs alone theirs {by_products['theirs']:.2f}, ours {by_products['ours']:.2f}")


def main(argv: list[str]) -> None:
    p = sidebyside.parser(PROG, __doc__, repository="thu-coai/LaMemo", codes="all four models", rounds=2, steps=8,
                          warmup=3)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny_char")
    p.add_argument("--mode", choices=["train", "eval"], default="train")
    sidebyside.main(p, argv, lambda a: [run(a.checkout, shape=a.shape, mode=a.mode, precision=a.precision,
                                            rounds=a.rounds, steps=a.steps, warmup=a.warmup, threads=a.threads,
                                            device=a.device)], describe)
