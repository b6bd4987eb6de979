"""Transformer-MGK's cost against the authors' code, one decoder layer side by side: `repro bench-mgk-authors`.

Follows `repro.ops.sidebyside` (the codes in turns within each round, in one process, tokens/s per round) at the
layer level: the official WikiText-103 model (minhtannguyen/transformer-mgk `language-modeling/lmtool-fwms/src/
mem_transformer.py`, imported from a checkout and run unmodified) is 16 identical post-LN layers on absolute
positions with no memory, so one `DecoderLayer` with its attention (`MultiHeadAttn` for softmax, `MGKAttn` for MGK
and sMGK) and feed-forward at the paper configs' shapes (width 128, heads of 16, inner 2048, segment 256, dropout
0.1) times what differs between the codes. Ours: the layer of `configs/mgk/paper/<config>.yaml` (form
`lm_official`). Training step: forward, backward of the output's sum.

Differs from the full-model benchmarks: no embedding, adaptive softmax or optimizer (the same in both codes up to
what `repro bench-txl-authors` measures). The linear variants (attn_type 34/400) are left out: the
official code runs them through a CUDA kernel, which a CPU replaces by a Python loop (not the authors' speed).
`--device cuda` puts both layers on a GPU (the clock read with its queue drained).

Run-time shims only (`install_shims`, also used by tests/parity/make_mgk.py): the CUDA extensions imported by
`mem_transformer.py` are modules holding a Python `fast_weight_sum` (unused by the softmax-family layers timed
here), `pdb.set_trace` (called in `MultiHeadAttn.forward`) is a no-op, and the LRA code's `gpytorch` distance and
`performer_pytorch` import are stand-ins (read by tests/parity/make_mgk.py only).
"""

from __future__ import annotations

import importlib
import pdb
import sys
import types
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from papers.mgk.model import MGKLM, MGKConfig
from papers.transformer_xl.model import TransformerXLConfig
from repro.nn.attention import causal_mask
from repro.ops import sidebyside
from repro.ops.sidebyside import per_round
from repro.ops.timing import autocast

PROG = "repro bench-mgk-authors"

# paper LM configs → official (attn_type, update_mode, n_head); model d_model 128, d_head 16, d_inner 2048
PAPER_LM = {"wt103_softmax8": (2, None, 8), "wt103_linear8": (34, None, 8), "wt103_mgk4": (200, "rbf2keys", 4),
            "wt103_mgk8": (200, "rbf2keys", 8), "wt103_smgk8": (200, "rbf", 8), "wt103_mlk4": (400, "rbf2keys", 4),
            "wt103_mlk8": (400, "rbf2keys", 8)}
TIMED = ("wt103_softmax8", "wt103_mgk4", "wt103_mgk8", "wt103_smgk8")
ROOT = Path(__file__).resolve().parents[2]


def fast_weight_sum(q, k, v, w):
    """The sum-rule kernel of utils/fast_transformers: out_t = q_t (W + Σ_{j≤t} k_j v_jᵀ), (B, H, L, E) inputs."""
    state = w[:, :, None] + torch.cumsum(k[..., :, None] * v[..., None, :], dim=2)  # (B, H, L, E, M)
    return torch.einsum("bhle,bhlem->bhlm", q, state)


def install_shims() -> None:
    """What importing the official LM and LRA code on a CPU needs (module docstring)."""
    ft = types.ModuleType("utils.fast_transformers")
    ft.fast_weight_sum = fast_weight_sum
    ffw = types.ModuleType("utils.fast_fast_weight")
    ffw.fast_weight_memory = None  # delta-rule kernel: no MGK variant uses it
    sys.modules["utils.fast_transformers"] = ft
    sys.modules["utils.fast_fast_weight"] = ffw
    pdb.set_trace = lambda *a, **k: None
    if torch.version.cuda is None:  # utils/proj_adaptive_softmax.py parses it at import
        torch.version.cuda = "10.0"

    class Distance:
        def _sq_dist(self, x1, x2, postprocess=False):
            return ((x1[..., :, None, :] - x2[..., None, :, :]) ** 2).sum(-1)

    for name in ("gpytorch", "gpytorch.kernels", "gpytorch.kernels.kernel"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["gpytorch.kernels.kernel"].Distance = Distance
    perf = types.ModuleType("performer_pytorch")
    perf.FastAttention = None
    sys.modules["performer_pytorch"] = perf


def official_lm_layer(mt, attn_type: int, mode: str | None, *, n_head: int, d_model: int, d_head: int,
                      d_inner: int, dropout: float = 0.0):
    """The official `DecoderLayer` for attn_type (and MGK update mode). `DecoderLayer` drops `update_mode` for
    attn_type 200 (it always builds the `hard` MGKAttn), so that layer's attention is built with `MGKAttn(
    update_mode=…)` directly, as the mode's name says."""
    kw = dict(dropatt=0.0, pre_lnorm=False, attn_type=attn_type)
    if attn_type in (34, 400):
        kw.update(layer_id=0, num_layer=1)
    if attn_type == 400:
        kw.update(update_mode=mode)
    layer = mt.DecoderLayer(n_head, d_model, d_head, d_inner, dropout, **kw)
    if attn_type == 200:
        layer.dec_attn = mt.MGKAttn(n_head, d_model, d_head, dropout, dropatt=0.0, pre_lnorm=False,
                                    update_mode=mode)
    return layer


def our_lm_layer(config: str) -> torch.nn.Module:
    """The decoder layer of `configs/mgk/paper/<config>.yaml`'s model (one of its identical layers)."""
    cfg = yaml.safe_load((ROOT / "configs/mgk/paper" / f"{config}.yaml").read_text())["model"]["init_args"]
    model = {k: (tuple(v) if isinstance(v, list) else v) for k, v in cfg["model"].items()}
    xl = replace(TransformerXLConfig(**model), n_layer=1, n_token=10, cutoffs=(), tie_projs=None)
    return MGKLM(xl, MGKConfig(**cfg["mgk"])).layers[0]


def official_module(checkout: Path):
    """Their `language-modeling/lmtool-fwms/src/mem_transformer.py`, imported from the checkout with the shims of
    `install_shims` (a bad checkout is refused in one line)."""
    with sidebyside.checkout_on_path(PROG, checkout, repository="minhtannguyen/transformer-mgk",
                                     folders=("language-modeling/lmtool-fwms/src",), module="mem_transformer"):
        install_shims()
        return importlib.import_module("mem_transformer")


def run(checkout: Path, *, configs=TIMED, precision: str, batch: int, segment: int, rounds: int, steps: int,
        warmup: int, threads: int, device: str = "cpu") -> list[dict]:
    torch.set_num_threads(threads)
    mt = official_module(checkout)
    dev = torch.device(device)
    cast = autocast(dev, precision)
    mask_theirs = torch.triu(torch.ones(segment, segment, dtype=torch.bool, device=dev), diagonal=1)[:, :, None]
    mask_ours = causal_mask(segment, segment, device=dev)
    rows = []
    for config in configs:
        attn_type, mode, n_head = PAPER_LM[config]
        torch.manual_seed(0)
        ours = our_lm_layer(config).train().to(dev)
        c = ours.attn.o_net.weight.shape  # (d_model, H·E)
        theirs = official_lm_layer(mt, attn_type, mode, n_head=n_head, d_model=c[0], d_head=c[1] // n_head,
                                   d_inner=ours.ff.net[0].out_features, dropout=ours.drop.p).train().to(dev)
        x_TBD = torch.randn(segment, batch, c[0]).to(dev)

        def step_theirs():
            x = x_TBD.clone().requires_grad_()
            with cast:
                out = theirs(x, dec_attn_mask=mask_theirs)
            out.float().sum().backward()

        def step_ours():
            x = x_TBD.transpose(0, 1).contiguous().requires_grad_()
            with cast:
                out, _ = ours(x, mem_BMD=None, mask_TK=mask_ours, pos=None)
            out.float().sum().backward()

        speeds, _ = sidebyside.interleaved_steps({"theirs": step_theirs, "ours": step_ours}, dev, rounds=rounds,
                                                 steps=steps, warmup=warmup, tokens_per_step=batch * segment)
        rows.append({"config": config, "attn_type": attn_type, "update_mode": mode or "", "precision": precision,
                     "batch": batch, "segment": segment, "threads": threads, "rounds": rounds, "steps": steps,
                     "warmup": warmup, "tokens_per_s": speeds,
                     "ours_over_theirs": per_round(speeds["ours"], speeds["theirs"]),
                     "parameters": {"theirs": sum(p.numel() for p in theirs.parameters()),
                                    "ours": sum(p.numel() for p in ours.parameters())},
                     "device": sidebyside.device_name(device), "torch": torch.__version__})
    return rows


def describe(row: dict) -> str:
    s, r = row["tokens_per_s"], row["ours_over_theirs"]
    return (f"{row['config']} {row['precision']}, batch {row['batch']} × {row['segment']}: theirs "
            f"{min(s['theirs']):,.0f}–{max(s['theirs']):,.0f} tokens/s, ours {min(s['ours']):,.0f}–"
            f"{max(s['ours']):,.0f}, ours / theirs {min(r):.2f}–{max(r):.2f}")


def main(argv: list[str]) -> None:
    p = sidebyside.parser(PROG, __doc__, repository="minhtannguyen/transformer-mgk", codes="both layers", rounds=3,
                          steps=4, warmup=2)
    p.add_argument("--configs", default=",".join(TIMED), help=f"comma-separated, of {', '.join(TIMED)}")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--segment", type=int, default=256)

    def prepare(a) -> None:
        a.configs = [c for c in a.configs.split(",") if c]
        bad = [c for c in a.configs if c not in TIMED]
        if bad:
            raise SystemExit(f"{PROG}: --configs takes {', '.join(TIMED)}; got {', '.join(bad)}")

    # both codes in this process, under the policy of the `repro` command
    sidebyside.main(p, argv, lambda a: run(a.checkout, configs=a.configs, precision=a.precision, batch=a.batch,
                                           segment=a.segment, rounds=a.rounds, steps=a.steps, warmup=a.warmup,
                                           threads=a.threads, device=a.device), describe,
                    prepare=prepare, keep_freed=True)
