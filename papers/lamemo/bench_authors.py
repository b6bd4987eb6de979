"""LaMemo's cost against Transformer-XL's, ours and the authors' side by side: `repro bench-lamemo-authors`.

Follows `papers.transformer_xl.bench_authors` (same timing, same interleaving, same token stream) with four
codes: the official `MemTransformerLM` of thu-coai/LaMemo (`pytorch/mem_transformer.py`, imported from a checkout,
run unmodified) at attn_type 3 (LaMemo, disentangled relative positions) and attn_type 0 (the original
Transformer-XL code, which the same file carries), and ours (`papers.lamemo.model.LaMemo`, `TransformerXL`) at the
same shape. What it reports is the slowdown of LaMemo relative to Transformer-XL within each code (issue 15: ours
must be at least the official code's own ratio and ≥ 0.65), and each model's speed against the authors'.

Shapes: `tiny_char` (the tiny profile's char models: 3 layers, width 128, 4 heads of 32, inner 256, segment =
memory = 32, batch 16, no dropout, 204 symbols) and `enwik8` (the paper's enwik8 base: 12 layers, width 512, 8 heads
of 64, inner 2048, segment = memory = 512, batch 2, dropout 0.1). Evaluation keeps the shape (memory = segment,
no clamp); our Transformer-XL evaluates with its key/value memory, our LaMemo with its state memory. `--device cuda`
puts all four on a GPU.

The row also counts each code's matrix-product FLOPs per step at full memory (`product_flops` of the Transformer-XL
benchmark): Transformer-XL's count over LaMemo's is the ratio the two would reach if each ran its products at the
same rate and did nothing else, the bound against which the measured ratios are read.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from papers.transformer_xl.bench_authors import (_Ours, _shims, check_device, device_name, interleaved,
                                                 product_flops, token_stream)

SHAPES = {
    "tiny_char": dict(n_layer=3, d_model=128, n_head=4, d_head=32, d_inner=256, n_token=204, batch=16, tgt=32,
                      mem=32, dropout=0.0),
    "enwik8": dict(n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, n_token=204, batch=2, tgt=512,
                   mem=512, dropout=0.1),
}


def _official(checkout: Path):
    source = checkout / "pytorch"
    if not (source / "mem_transformer.py").is_file():
        raise SystemExit(f"repro bench-lamemo-authors: {checkout} has no pytorch/mem_transformer.py; "
                         "pass a checkout of thu-coai/LaMemo with --checkout")
    torch.version.cuda = torch.version.cuda or "10.0"  # read (not used) by its adaptive softmax at import
    sys.modules.pop("mem_transformer", None)  # a Transformer-XL checkout's module of the same name
    sys.path[:0] = [str(source), str(source / "utils")]
    try:
        import mem_transformer  # noqa: PLC0415
    finally:
        del sys.path[:2]
    return mem_transformer


class _Theirs:
    def __init__(self, mt, s: dict, attn_type: int):
        self.model = mt.MemTransformerLM(
            s["n_token"], s["n_layer"], s["n_head"], s["d_model"], s["d_head"], s["d_inner"], dropout=s["dropout"],
            dropatt=0.0, tie_weight=True, d_embed=s["d_model"], div_val=1, tie_projs=[False], pre_lnorm=False,
            tgt_len=s["tgt"], ext_len=0, mem_len=s["mem"], cutoffs=[], same_length=False, attn_type=attn_type,
            clamp_len=-1)
        self.mems: tuple = ()

    def reset(self):
        self.mems = ()

    def detach(self):
        self.mems = tuple(m.detach() for m in self.mems)

    def forward(self, x_BT, y_BT):
        with _shims():
            out = self.model(x_BT.t().contiguous(), y_BT.t().contiguous(), *self.mems)
        if self.model.training:  # [loss, mem_loss] + memories (train_ddp.py without --calc_mem_loss)
            loss, self.mems = out[0], tuple(out[2:])
        else:  # ([loss] + memories, analysis)
            loss, self.mems = out[0][0], tuple(out[0][1:])
        return loss.float().mean()


def run(checkout: Path, *, shape: str, mode: str, precision: str, rounds: int, steps: int, warmup: int,
        threads: int, device: str = "cpu") -> dict:
    from papers.lamemo.model import LaMemo, LaMemoConfig
    from papers.transformer_xl.model import TransformerXLConfig

    torch.set_num_threads(threads)
    s = SHAPES[shape]
    mt = _official(checkout)
    torch.manual_seed(0)
    cfg = TransformerXLConfig(n_layer=s["n_layer"], d_model=s["d_model"], n_head=s["n_head"], d_head=s["d_head"],
                              d_inner=s["d_inner"], n_token=s["n_token"], dropout=s["dropout"], dropatt=0.0)
    codes = {
        "theirs_txl": _Theirs(mt, s, 0), "theirs_lamemo": _Theirs(mt, s, 3),
        "ours_txl": _Ours(s, mode), "ours_lamemo": _Ours(s, mode, model=LaMemo(cfg, LaMemoConfig()), kv_memory=False),
    }
    for code in codes.values():
        code.model.to(device)
    stream = token_stream(s, warmup + steps, device)
    flops = {k: product_flops(c, stream, mode=mode) for k, c in codes.items()}
    speeds = interleaved(codes, stream, mode=mode, precision=precision, rounds=rounds, steps=steps, warmup=warmup)

    def ratio(a: str, b: str) -> list[float]:
        return [round(x / y, 3) for x, y in zip(speeds[a], speeds[b])]

    return {"shape": shape, "mode": mode, "precision": precision, "threads": threads, "rounds": rounds,
            "steps": steps, "warmup": warmup, "batch": s["batch"], "segment": s["tgt"], "memory": s["mem"],
            "tokens_per_s": {k: [round(v, 1) for v in vs] for k, vs in speeds.items()},
            "lamemo_over_txl": {"theirs": ratio("theirs_lamemo", "theirs_txl"),
                                "ours": ratio("ours_lamemo", "ours_txl")},
            "ours_over_theirs": {"txl": ratio("ours_txl", "theirs_txl"), "lamemo": ratio("ours_lamemo", "theirs_lamemo")},
            "parameters": {k: sum(p.numel() for p in c.model.parameters()) for k, c in codes.items()},
            "product_gflop_per_step": {k: round(v / 1e9, 4) for k, v in flops.items()},
            "lamemo_over_txl_by_products": {w: round(flops[f"{w}_txl"] / flops[f"{w}_lamemo"], 3)
                                            for w in ("theirs", "ours")},
            "device": device_name(device), "torch": torch.__version__}


def main(argv: list[str]) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="repro bench-lamemo-authors", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, required=True, help="a checkout of thu-coai/LaMemo")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny_char")
    p.add_argument("--mode", choices=["train", "eval"], default="train")
    p.add_argument("--precision", choices=["32", "bf16"], default="32")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]: all four models on it")
    p.add_argument("--output", type=Path, help="append the row (one JSON line) to this file")
    a = p.parse_args(argv)
    check_device(p.prog, a.device)
    row = run(a.checkout, shape=a.shape, mode=a.mode, precision=a.precision, rounds=a.rounds, steps=a.steps,
              warmup=a.warmup, threads=a.threads, device=a.device)
    if a.output:
        with a.output.open("a") as f:
            f.write(json.dumps(row) + "\n")
    lt = row["lamemo_over_txl"]
    print(f"{a.shape} {a.mode} {a.precision}: LaMemo / Transformer-XL theirs "
          f"{'–'.join(f'{r:.2f}' for r in lt['theirs'])}, ours {'–'.join(f'{r:.2f}' for r in lt['ours'])}; "
          f"ours / theirs LaMemo {statistics.median(row['ours_over_theirs']['lamemo']):.2f}×; by matrix-product FLOPs "
          f"alone theirs {row['lamemo_over_txl_by_products']['theirs']:.2f}, ours "
          f"{row['lamemo_over_txl_by_products']['ours']:.2f}", flush=True)
