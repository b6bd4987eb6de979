"""Regenerate the LaMemo parity fixtures from a checkout of thu-coai/LaMemo:
`python tests/parity/make_lamemo.py CHECKOUT`.

Follows the shared convention of `tests/parity/common.py`. The authors' `pytorch/mem_transformer.py`
(`MemTransformerLM` with attn_type 3, 31, 32, 33) is imported from CHECKOUT with run-time shims only (a CUDA
version string for `utils/proj_adaptive_softmax.py`, which reads `torch.version.cuda` at import; their
`utils/` folder on the path, as their scripts' working directory gives it); none of their code is copied here.

Each case builds their model with small shapes, re-draws the weights large (`enlarge_`), runs fp32 in eval mode
over 4 segments of 2 streams carrying the memory, and saves to `tests/parity/lamemo/<case>.pt`: their state dict
(`weight.*`, the non-learned buffers `pos_emb.inv_freq` and `*_logits_constant` left out), the tokens
(`input.tokens`, `input.target`: (segments, B, T)), per-token losses (`output.loss`: (segments, B, T)) and, after
every segment, every tensor of their memory in their time-first layout, flattened and concatenated into one
`output.mems` (one record keeps the files small) with the shapes in `meta["mem_shapes"]` (per segment: the
embedding memory (M, B, D), then per layer the attention vectors (M, B, H, E) and log-normalisers (M, B, H)).

`param_counts.pt` holds the parameter counts of their model at the settings of every `configs/lamemo/paper/*.yaml`
(built on the meta device: nothing is materialised), with their scripts' vocabularies and cutoffs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.parity.common import HERE, checkout_commit, enlarge_, on_path, save_fixture

OUT = HERE / "lamemo"
N_TOKEN, D, H, E, D_INNER, N_LAYER, B, SEGMENTS = 23, 8, 2, 4, 8, 2, 2, 4
IGNORED_BUFFERS = ("pos_emb.inv_freq", "train_logits_constant", "eval_logits_constant")

# case -> settings; tgt/mem lengths chosen to cover memory equal to, longer than and shorter than the segment
CASES = {
    "attn3": dict(attn_type=3, tgt_len=4, mem_len=4),
    "attn31": dict(attn_type=31, tgt_len=4, mem_len=4),
    "attn32_preln": dict(attn_type=32, tgt_len=4, mem_len=4, pre_lnorm=True),
    "attn33": dict(attn_type=33, tgt_len=4, mem_len=4),
    "attn33_longmem": dict(attn_type=33, tgt_len=3, mem_len=5),
    "attn3_shortmem_adaptive": dict(attn_type=3, tgt_len=4, mem_len=3, cutoffs=[8, 16], div_val=2,
                                    tie_projs=[False, True, True]),
    "attn3_clamp_samelength": dict(attn_type=3, tgt_len=3, mem_len=5, clamp_len=2, same_length=True),
    # LaMemo beyond its training memory (where the arena's lamemo loses bpc): trained at mem_len 4, evaluated at 16
    # over 7 segments, so that the memory fills and slides. Their `reset_length` leaves each attention layer's own
    # mem_len (which cuts the log-normalisers' memory) at the training value, and the next segment then fails
    # (`torch.stack([mem_denom, denom])` of unequal lengths); the weights do not depend on mem_len, so their model
    # is built at the evaluation memory, as trained weights are evaluated by loading them into it
    "attn3_evalmem4x": dict(attn_type=3, tgt_len=4, mem_len=4, eval_mem_len=16, segments=7),
}

# configs/lamemo/paper/*.yaml at their scripts' settings (run_{wt103,enwik8,text8}_base_ddp.sh; train_ddp.py:
# `--adaptive` on wt103 leaves cutoffs [] and tie_projs [False]; the vocabularies of their data_utils.py)
PAPER = {
    "wt103": dict(n_token=267735, n_layer=16, d_model=410, n_head=10, d_head=41, d_inner=2100, tgt_len=150,
                  mem_len=150),
    "enwik8": dict(n_token=204, n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, tgt_len=512, mem_len=512),
    "text8": dict(n_token=27, n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, tgt_len=512, mem_len=512),
}


def _import(checkout: Path):
    if torch.version.cuda is None:
        torch.version.cuda = "10.0"  # read (not used) by their proj_adaptive_softmax at import
    import mem_transformer

    return mem_transformer


def build(mt, *, attn_type, tgt_len, mem_len, n_token=N_TOKEN, n_layer=N_LAYER, d_model=D, n_head=H, d_head=E,
          d_inner=D_INNER, pre_lnorm=False, clamp_len=-1, same_length=False, cutoffs=(), div_val=1, tie_projs=None):
    return mt.MemTransformerLM(
        n_token, n_layer, n_head, d_model, d_head, d_inner, dropout=0.0, dropatt=0.0, tie_weight=True,
        d_embed=d_model, div_val=div_val, tie_projs=list(tie_projs or [False]), pre_lnorm=pre_lnorm,
        tgt_len=tgt_len, ext_len=0, mem_len=mem_len, cutoffs=list(cutoffs), same_length=same_length,
        attn_type=attn_type, clamp_len=clamp_len)


def run_case(mt, name: str, settings: dict, commit: str) -> None:
    settings = dict(settings)
    eval_mem_len, segments = settings.pop("eval_mem_len", None), settings.pop("segments", SEGMENTS)
    if eval_mem_len is not None:  # built at the evaluation memory (see the case's comment)
        settings = {**settings, "mem_len": eval_mem_len, "train_mem_len": settings["mem_len"]}
    torch.manual_seed(0)
    model = build(mt, **{k: v for k, v in settings.items() if k != "train_mem_len"})
    enlarge_(model, std=0.2, seed=1)
    model.eval()
    # their adaptive softmax writes per-token losses in cluster order unless keep_order (the sum is the same);
    # token order is what a per-token comparison needs
    model.crit.keep_order = True
    t = settings["tgt_len"]
    g = torch.Generator().manual_seed(2)
    stream = torch.randint(0, N_TOKEN, (B, segments * t + 1), generator=g)
    tokens = stream[:, :-1].reshape(B, segments, t).transpose(0, 1).contiguous()  # (S, B, T)
    target = stream[:, 1:].reshape(B, segments, t).transpose(0, 1).contiguous()
    tensors = {f"weight.{k}": v for k, v in model.state_dict().items() if not k.endswith(IGNORED_BUFFERS)}
    tensors["input.tokens"], tensors["input.target"] = tokens, target
    losses, mems, flat, shapes = [], (), [], []
    with torch.no_grad():
        for s in range(segments):
            out, _ = model(tokens[s].t().contiguous(), target[s].t().contiguous(), *mems)
            losses.append(out[0].t())  # their (T, B) -> (B, T)
            mems = tuple(out[1:])
            for m in mems:  # one flat tensor for all memories keeps the file small (one record, not 5 × S)
                flat.append(m.float().reshape(-1))
                shapes.append(list(m.shape))
    tensors["output.loss"] = torch.stack(losses)
    tensors["output.mems"] = torch.cat(flat)
    meta = {"repo": "thu-coai/LaMemo", "commit": commit, "case": name, "n_token": N_TOKEN, "d_model": D,
            "n_head": H, "d_head": E, "d_inner": D_INNER, "n_layer": N_LAYER, "segments": segments,
            "pre_lnorm": False, "clamp_len": -1, "same_length": False, "cutoffs": [], "div_val": 1,
            "tie_projs": [False], "mem_shapes": shapes} | settings
    save_fixture(OUT / f"{name}.pt", tensors, meta)
    print(f"{name}: loss mean {tensors['output.loss'].mean():.4f}, {(OUT / f'{name}.pt').stat().st_size} bytes")


def run_grad_case(mt, commit: str) -> None:
    """`grad_attn3.pt`: their attn_type 3 model (the paper's) trained as their `train_ddp.py` steps it at the paper
    scripts' settings (`--batch_chunk 1`, no `--calc_mem_loss`): per segment, forward with the memory carried (in
    training mode their model returns `[loss, mem_loss] + mems`, mem_loss zeros without a memory target), then
    `((loss.mean() + mem_loss.mean()) / 2).backward()`, the gradients accumulating over the 4 segments (no optimizer
    step), dropout 0: the per-segment mean losses and every parameter's accumulated gradient. What the forward
    fixtures cannot show: which paths the backward pass takes (what is detached between segments, the look-ahead
    refresh of the memory within one) and the scale of the gradient their clip sees (half the loss's)."""
    settings = CASES["attn3"]
    torch.manual_seed(0)
    model = build(mt, **settings)
    enlarge_(model, std=0.2, seed=1)
    model.train()
    t = settings["tgt_len"]
    g = torch.Generator().manual_seed(2)
    stream = torch.randint(0, N_TOKEN, (B, SEGMENTS * t + 1), generator=g)
    tokens = stream[:, :-1].reshape(B, SEGMENTS, t).transpose(0, 1).contiguous()
    target = stream[:, 1:].reshape(B, SEGMENTS, t).transpose(0, 1).contiguous()
    tensors = {f"weight.{k}": v for k, v in model.state_dict().items() if not k.endswith(IGNORED_BUFFERS)}
    tensors["input.tokens"], tensors["input.target"] = tokens, target
    losses, mems = [], ()
    for s in range(SEGMENTS):
        out = model(tokens[s].t().contiguous(), target[s].t().contiguous(), *mems)
        loss, mem_loss, mems = out[0].float().mean(), out[1].float().mean(), tuple(out[2:])
        ((loss + mem_loss) / 2).backward()
        losses.append(loss.detach())
    tensors["output.loss_mean"] = torch.stack(losses)
    # every name a parameter has (tied weights under both names), as the forward fixtures list their weights
    tensors |= {f"grad.{n}": p.grad for n, p in model.named_parameters(remove_duplicate=False) if p.grad is not None}
    meta = {"repo": "thu-coai/LaMemo", "commit": commit, "case": "grad_attn3", "n_token": N_TOKEN, "d_model": D,
            "n_head": H, "d_head": E, "d_inner": D_INNER, "n_layer": N_LAYER, "segments": SEGMENTS,
            "pre_lnorm": False, "clamp_len": -1, "same_length": False, "cutoffs": [], "div_val": 1,
            "tie_projs": [False]} | settings
    save_fixture(OUT / "grad_attn3.pt", tensors, meta)
    print(f"grad_attn3: {sum(k.startswith('grad.') for k in tensors)} gradients, "
          f"{(OUT / 'grad_attn3.pt').stat().st_size} bytes")


def param_counts(mt, commit: str) -> None:
    counts = {}
    with torch.device("meta"):
        for ds, s in PAPER.items():
            for attn_type in (0, 3):
                model = build(mt, attn_type=attn_type, **s)
                # parameters() counts a tied weight once, as their train_ddp.py's n_all_param does
                counts[f"{ds}.attn{attn_type}"] = sum(p.numel() for p in model.parameters())
    meta = {"repo": "thu-coai/LaMemo", "commit": commit, "case": "param_counts", "counts": counts,
            "settings": PAPER}
    save_fixture(OUT / "param_counts.pt", {}, meta)
    print(counts)


def main(checkout: Path, only: list[str] | None = None) -> None:
    """Every fixture, or only the cases named (a new case written without rewriting the committed ones)."""
    commit = checkout_commit(checkout)
    unknown = sorted(set(only or []) - set(CASES))
    if unknown:
        raise SystemExit(f"no case {', '.join(unknown)}: the cases are {', '.join(CASES)}")
    with on_path(checkout / "pytorch"), on_path(checkout / "pytorch" / "utils"):
        mt = _import(checkout)
        for name, settings in CASES.items():
            if not only or name in only:
                run_case(mt, name, settings, commit)
        if not only:
            run_grad_case(mt, commit)
            param_counts(mt, commit)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python tests/parity/make_lamemo.py CHECKOUT [CASE ...]  (a clone of thu-coai/LaMemo)")
    main(Path(sys.argv[1]), sys.argv[2:])
