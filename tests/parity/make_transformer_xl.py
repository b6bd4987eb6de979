"""Make the Transformer-XL parity fixtures from a checkout of kimiyoung/transformer-xl: `python
tests/parity/make_transformer_xl.py CHECKOUT` writes `tests/parity/transformer_xl/<case>.pt`.

Follows `tests/parity/common.py`. The official `pytorch/mem_transformer.py` `MemTransformerLM` is imported from
the checkout and run unmodified, with run-time shims only (its files are never edited or copied):
- `torch.version.cuda = "10.0"`: `utils/proj_adaptive_softmax.py` parses the CUDA version at import;
- `Tensor.byte` returns a bool tensor while the official model runs: its masks are `.byte()`, which
  `masked_fill` refuses in torch 2.x (the same mask, as booleans);
- `crit.keep_order = True`: without it the official adaptive softmax writes the losses grouped by cluster, not
  in token order (the mean is the same); we need them per token;
- the first segment gets memories shaped (0, B, D) instead of `init_mems`' shapeless (0,): attn_type 2 adds the
  positions in place to the layer-0 memory (`mems_i += pos_emb[:mlen]`), which a shapeless tensor refuses.
  Same computation otherwise (an empty memory).

Every case runs fp32, eval mode (no dropout), over >= 3 segments carrying the memory, with weights re-drawn large
(`enlarge_`) and the pair r_w_bias / r_r_bias clearly different. Saved: the official state dict (tied entries
once, the tie recorded in meta), the token segments, per-token losses of every segment (T, B) and the official
memories after every segment (the n_layer layer inputs, (n_layer, M, B, D)), and the official parameter count.

`meta["paper_param_counts"]` of `params.pt` holds the official parameter count of every
`configs/transformer_xl/paper/*.yaml` shape (built on the meta device: nothing is materialised).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from repro.ops.sidebyside import byte_masks_as_bool as shims  # the benchmark's shim, the same
from tests.parity.common import HERE, checkout_commit, enlarge_, on_path, save_fixture

OUT = HERE / "transformer_xl"
REPO = "kimiyoung/transformer-xl"
B = 2
SMALL = dict(n_layer=2, n_head=2, d_model=12, d_head=4, d_inner=16)

# case → (model kwargs, run settings). Lengths: tgt (segment), mem; `eval` re-sets lengths like eval.py does.
CASES = {
    # attn_type 0 with memory longer than the segment: the relative attention over [memory; segment]
    "rel_mem": dict(model=dict(attn_type=0, n_token=24), tgt=4, mem=6, segments=4),
    # eval.py's protocol: model built with training lengths, then reset_length(tgt, 0, mem), clamp_len, same_length
    "rel_eval": dict(model=dict(attn_type=0, n_token=24), tgt=4, mem=4, segments=4,
                     eval=dict(tgt=3, mem=7, clamp_len=3, same_length=True)),
    # attn_type 2 (Vaswani sinusoids at the input; our `attention: absolute`) with memory longer than the
    # segment: the official in-place `mems_i += pos_emb[:mlen]` then accumulates positions in the memory
    "abs_mem": dict(model=dict(attn_type=2, n_token=24), tgt=4, mem=6, segments=4),
    # no recurrence (the Table 6 ablations and the vanilla baseline): mem_len 0, the official mems are None
    "abs_nomem": dict(model=dict(attn_type=2, n_token=24), tgt=5, mem=0, segments=3),
    # WikiText-103 base: adaptive softmax/input with div_val 1 (one shared matrix, no projections), tied
    "adaptive_div1": dict(model=dict(attn_type=0, n_token=30, cutoffs=[10, 20], div_val=1,
                                     tie_projs=[False, True, True]), tgt=4, mem=6, segments=3),
    # WikiText-103 large / One Billion Word: div_val > 1, projections tied (cluster 1) and untied (0 and 2)
    "adaptive_div2": dict(model=dict(attn_type=0, n_token=30, cutoffs=[10, 20], div_val=2,
                                     tie_projs=[False, True, False]), tgt=4, mem=6, segments=3),
}

# training-gradient cases (`make_grad_case`): train.py's step over 4 segments, the memory carried, no optimizer step
GRAD_CASES = {
    # the relative attention with a plain softmax output (ours: the row-blocked float32 cross-entropy on a CPU)
    "grad_rel_mem": dict(model=dict(attn_type=0, n_token=24), tgt=4, mem=6, segments=4),
    # the adaptive softmax and input with div_val 2, tied and untied projections (WikiText-103 large, lm1b)
    "grad_adaptive_div2": dict(model=dict(attn_type=0, n_token=30, cutoffs=[10, 20], div_val=2,
                                          tie_projs=[False, True, False]), tgt=4, mem=6, segments=4),
}


def import_official(checkout: Path):
    torch.version.cuda = torch.version.cuda or "10.0"
    with on_path(checkout / "pytorch"), on_path(checkout / "pytorch" / "utils"):
        import mem_transformer
    return mem_transformer


def build(mt, *, n_token, attn_type, tgt, mem, cutoffs=(), div_val=1, tie_projs=None, tie_weight=True,
          d_embed=None, **shape):
    tie_projs = list(tie_projs) if tie_projs is not None else [False]
    return mt.MemTransformerLM(n_token, shape["n_layer"], shape["n_head"], shape["d_model"], shape["d_head"],
                               shape["d_inner"], 0.0, 0.0, tie_weight=tie_weight, d_embed=d_embed,
                               div_val=div_val, tie_projs=tie_projs, tgt_len=tgt, ext_len=0, mem_len=mem,
                               cutoffs=list(cutoffs), attn_type=attn_type)


def draw_tokens(n_token: int, cutoffs: list[int], shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Tokens whose every adaptive cluster holds 0 or >= 2 of them per segment: the official code squeezes the
    index list of a cluster, which a single index turns into a scalar."""
    bounds = [0, *cutoffs, n_token]
    while True:
        x = torch.randint(0, n_token, shape, generator=g)
        ok = all(((x[:, s] >= lo) & (x[:, s] < hi)).sum().item() != 1
                 for s in range(shape[1]) for lo, hi in zip(bounds, bounds[1:]))
        if ok:
            return x


def weights_once(model) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """`weight.<name>` of the state dict with each tied tensor once, and the tie (other name → saved name)."""
    tensors, tied, seen = {}, {}, {}
    for k, v in model.state_dict().items():
        ptr = (v.data_ptr(), tuple(v.shape))
        if ptr in seen:
            tied[k] = seen[ptr]
        else:
            seen[ptr] = k
            tensors[f"weight.{k}"] = v
    return tensors, tied


def make_case(mt, name: str, case: dict, commit: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    m = dict(case["model"])
    model = build(mt, tgt=case["tgt"], mem=case["mem"], **m, **SMALL)
    enlarge_(model, std=0.2, seed=seed)
    with torch.no_grad():  # u and v clearly apart, so that swapping them is visible
        model.r_w_bias.add_(0.5) if hasattr(model, "r_w_bias") else None
        model.r_r_bias.sub_(0.5) if hasattr(model, "r_r_bias") else None
    model.eval()
    model.crit.keep_order = True
    ev = case.get("eval")
    tgt, mem = case["tgt"], case["mem"]
    if ev:  # eval.py: reset_length, then clamp_len and same_length as attributes
        tgt, mem = ev["tgt"], ev["mem"]
        model.reset_length(tgt, 0, mem)
        model.clamp_len = ev["clamp_len"]
        model.same_length = ev["same_length"]
    n_seg = case["segments"]
    stream = draw_tokens(m["n_token"], m.get("cutoffs", []), (n_seg * tgt + 1, B), g)  # time-first, as theirs
    tensors, tied = weights_once(model)
    tensors["input.stream"] = stream
    mems = [torch.empty(0, B, SMALL["d_model"]) for _ in range(SMALL["n_layer"] + 1)] if mem > 0 else []
    losses = []
    with torch.no_grad(), shims():
        for s in range(n_seg):
            data, target = stream[s * tgt:(s + 1) * tgt], stream[s * tgt + 1:(s + 1) * tgt + 1]
            out = model(data, target, *mems)
            losses.append(out[0])  # (T, B)
            mems = out[1:]
            if mems:
                # (n_layer, M, B, D): the layers' inputs; the official list's extra last entry (the last layer's
                # output) is read by nothing and left out to keep the fixture small
                tensors[f"output.mems.{s}"] = torch.stack(mems[:-1])
    tensors["output.loss"] = torch.stack(losses)  # (segments, T, B)
    meta = {
        "repo": REPO, "commit": commit, "case": name, "file": "pytorch/mem_transformer.py",
        "model": {**SMALL, **{k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in m.items()}},
        "train_tgt_len": case["tgt"], "train_mem_len": case["mem"], "tgt_len": tgt, "mem_len": mem,
        "clamp_len": model.clamp_len, "same_length": bool(model.same_length), "segments": n_seg, "batch": B,
        "tied": tied, "official_param_count": sum(p.numel() for p in model.parameters()),
    }
    save_fixture(OUT / f"{name}.pt", tensors, meta)
    print(f"{name}: {sum(t.numel() for t in tensors.values())} numbers, loss/segment "
          + " ".join(f"{x.mean():.3f}" for x in tensors["output.loss"]))


def make_grad_case(mt, name: str, case: dict, commit: str, seed: int) -> None:
    """A training-gradient fixture: the official model in training mode (dropout 0) stepped as `train.py` steps it
    (`--batch_chunk 1`): per segment, `ret = model(data, target, *mems)`, `loss = ret[0].float().mean()`,
    `loss.backward()`, the memory `ret[1:]` carried, here without `zero_grad` or an optimizer step in between, so
    that the gradients of all segments accumulate. Saved: weights, the token stream, each segment's mean loss and
    every parameter's accumulated gradient (under every name a tied parameter has). What the forward fixtures
    cannot show: which paths the backward pass takes (the memory detached between segments, the relative shift's and
    the adaptive softmax's backward) and the scale of the gradient that train.py's clip sees."""
    g = torch.Generator().manual_seed(seed)
    m = dict(case["model"])
    tgt, mem, n_seg = case["tgt"], case["mem"], case["segments"]
    model = build(mt, tgt=tgt, mem=mem, **m, **SMALL)
    enlarge_(model, std=0.2, seed=seed)
    with torch.no_grad():
        model.r_w_bias.add_(0.5)
        model.r_r_bias.sub_(0.5)
    model.train()
    stream = draw_tokens(m["n_token"], m.get("cutoffs", []), (n_seg * tgt + 1, B), g)
    tensors, tied = weights_once(model)
    tensors["input.stream"] = stream
    mems = [torch.empty(0, B, SMALL["d_model"]) for _ in range(SMALL["n_layer"] + 1)]
    losses = []
    with shims():
        for s in range(n_seg):
            data, target = stream[s * tgt:(s + 1) * tgt], stream[s * tgt + 1:(s + 1) * tgt + 1]
            ret = model(data, target, *mems)
            loss = ret[0].float().mean()
            loss.backward()
            mems = ret[1:]
            losses.append(loss.detach())
    tensors["output.loss_mean"] = torch.stack(losses)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    tensors |= {f"grad.{n}": v for n, v in grads.items()}
    meta = {
        "repo": REPO, "commit": commit, "case": name, "file": "pytorch/mem_transformer.py, pytorch/train.py",
        "model": {**SMALL, **{k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in m.items()}},
        "train_tgt_len": tgt, "train_mem_len": mem, "tgt_len": tgt, "mem_len": mem, "clamp_len": model.clamp_len,
        "same_length": bool(model.same_length), "segments": n_seg, "batch": B, "tied": tied,
        "official_param_count": sum(p.numel() for p in model.parameters()),
        "unused_parameters": sorted(n for n, p in model.named_parameters() if p.grad is None),
    }
    save_fixture(OUT / f"{name}.pt", tensors, meta)
    print(f"{name}: {len(grads)} gradients, loss/segment " + " ".join(f"{x:.3f}" for x in losses))


def paper_shape(path: Path) -> dict:
    """The official `MemTransformerLM` arguments that `train.py` derives for one of our paper configs."""
    from repro.data.corpora import spec

    cfg = yaml.safe_load(path.read_text())
    m = cfg["model"]["init_args"]["model"]
    corpus = cfg["data"]["init_args"]["corpus"]
    cutoffs = list(m.get("cutoffs", []))
    return dict(
        n_token=spec(corpus).vocab_size, n_layer=m["n_layer"], n_head=m["n_head"], d_model=m["d_model"],
        d_head=m["d_head"], d_inner=m["d_inner"], d_embed=m.get("d_embed"), div_val=m.get("div_val", 1),
        cutoffs=cutoffs,
        # train.py: tie_projs = [False] + ([True] * 3 for wt103, [False] * 3 for lm1b); --not_tied unset
        tie_projs=[False] + ([corpus == "wt103"] * len(cutoffs)),
        attn_type=2 if m.get("attention") == "absolute" else 0,
    )


def paper_counts(mt) -> dict:
    counts = {}
    for path in sorted((HERE.parents[1] / "configs/transformer_xl/paper").glob("*.yaml")):
        if path.name.endswith(".eval.yaml"):
            continue
        shape = paper_shape(path)
        with torch.device("meta"):
            model = build(mt, tgt=1, mem=0, **shape)
        counts[path.stem] = {"official": sum(p.numel() for p in model.parameters()),
                             "n_token": shape["n_token"], "tie_projs": shape["tie_projs"],
                             "attn_type": shape["attn_type"]}
        print(f"{path.stem}: {counts[path.stem]['official']:,} official parameters (n_token {shape['n_token']})")
    return counts


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/parity/make_transformer_xl.py PATH/TO/transformer-xl (the checkout)")
    checkout = Path(sys.argv[1])
    if not (checkout / "pytorch" / "mem_transformer.py").is_file():
        raise SystemExit(f"{checkout}: no pytorch/mem_transformer.py; pass a checkout of {REPO}")
    commit = checkout_commit(checkout)
    torch.manual_seed(0)
    mt = import_official(checkout)
    for seed, (name, case) in enumerate(CASES.items()):
        make_case(mt, name, case, commit, seed)
    for seed, (name, case) in enumerate(GRAD_CASES.items(), start=len(CASES)):
        make_grad_case(mt, name, case, commit, seed)
    save_fixture(OUT / "params.pt", {}, {"repo": REPO, "commit": commit, "case": "params",
                                          "paper_param_counts": paper_counts(mt)})


if __name__ == "__main__":
    main()
