"""Make the Transformer-MGK parity fixtures from a checkout of minhtannguyen/transformer-mgk.

    python tests/parity/make_mgk.py /work/authors/transformer-mgk

Writes tests/parity/mgk/<case>.pt (format: tests/parity/common.py), read by tests/parity/test_mgk_parity.py:
- `lm_<variant>`: one decoder layer of `language-modeling/lmtool-fwms/src/mem_transformer.py` (attention + `pos_ff`,
  post-LN, dropout 0) on 3 independent segments (the paper's settings: mem_len 0, no fast-weight carry-over, so the
  official LM code carries no memory between segments). The soft E-step runs in training mode, so its π buffer is
  the state carried from segment to segment; it is saved after each.
  Variants: softmax (attn_type 2), linear4 (4), linear34 (34), mgk/smgk (200 `rbf2keys`/`rbf`: π by gradient),
  mgk_softe/smgk_softe (`soft2keys`/`soft`), mgk_harde/smgk_harde (`hard2keys`/`hard`), mlk/smlk (400 `rbf2keys`/`rbf`).
  `DecoderLayer` drops `update_mode` for attn_type 200 (it always builds the `hard` MGKAttn); the layer's attention
  is therefore built with `MGKAttn(update_mode=…)` directly, as the mode's name says.
- `lra_<variant>`: `lra/attention.py` `Attention` (W_q, W_k[, W_k2], W_v, ff and the attention) on 3 batches with
  padding; soft E-step in training mode (π carried). Variants softmax, mgk (key2), smgk (multi_gauss), their
  _softe/_harde, linear, mlk (linear + key2), smlk (linear + multi_gauss).
- `lra_classifier_<variant>`: `lra/model.py` `Model` + `lra/model_wrapper.py` `SCHead` (2 layers, mean pooling):
  logits for a padded batch.
- meta of `counts.pt`: parameter counts of the official modules at the paper configs' shapes (one LM decoder layer
  per configs/mgk/paper/wt103_*.yaml; one LRA `Transformer` block per variant and head count, width 64, head 32).

Run-time shims only (none of their code is copied; `papers.mgk.bench_authors.install_shims`): the CUDA extensions
that `mem_transformer.py` loads at import (`utils.fast_transformers`, `utils.fast_fast_weight`) are replaced by
modules holding a Python `fast_weight_sum` (out_t = q_t (W + Σ_{j≤t} k_j v_jᵀ), the kernel's sum rule);
`pdb.set_trace` (called in `MultiHeadAttn.forward`) is a no-op; gpytorch's `Distance._sq_dist` (imported by
lra/attention.py, not installed here) is the exact squared distance; `performer_pytorch` (imported by
lra/attention_linear.py, unused by the variants here) is a stub.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from papers.mgk.bench_authors import PAPER_LM, install_shims, official_lm_layer
from tests.parity.common import HERE, checkout_commit, enlarge_, on_path, save_fixture

OUT = HERE / "mgk"
REPO = "minhtannguyen/transformer-mgk"
# LM layer shapes (small): d_model 8, 2 heads of 4, d_inner 16, segments of 5, batch 2. The official π tables have
# 256 key positions; a segment reads the first qlen, so only those are saved (the test fills the rest with 0.5).
LM = dict(d_model=8, n_head=2, d_head=4, d_inner=16, qlen=5, bsz=2, n_seg=3)
LRA = dict(dim=8, n_head=2, head_dim=4, hidden=16, L=6, B=2, vocab=8, classes=3, max_seq_len=8, n_step=3)
LM_CASES = {  # case: (attn_type, update_mode)
    "softmax": (2, None), "linear4": (4, None), "linear34": (34, None),
    "mgk": (200, "rbf2keys"), "smgk": (200, "rbf"), "mgk_softe": (200, "soft2keys"), "smgk_softe": (200, "soft"),
    "mgk_harde": (200, "hard2keys"), "smgk_harde": (200, "hard"), "mlk": (400, "rbf2keys"), "smlk": (400, "rbf"),
}
LRA_CASES = {  # case: (attn_type, key2, multi_gauss, hard_em, soft_em)
    "softmax": ("softmax", False, False, False, False), "mgk": ("softmax", True, False, False, False),
    "smgk": ("softmax", False, True, False, False), "mgk_softe": ("softmax", True, False, False, True),
    "mgk_harde": ("softmax", True, False, True, False), "smgk_softe": ("softmax", False, True, False, True),
    "smgk_harde": ("softmax", False, True, True, False), "linear": ("linear", False, False, False, False),
    "mlk": ("linear", True, False, False, False), "smlk": ("linear", False, True, False, False),
}
CLASSIFIER_CASES = ("softmax", "mgk", "smgk_softe", "mlk")
def redraw_pi_(module: torch.nn.Module, seed: int) -> None:
    """π entries uniform in [0.1, 0.9] (after `enlarge_`, whose N(0, 0.2) would clamp about half of them to 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if name.split(".")[-1] in ("pi", "pi0", "pi1"):
                t.copy_(0.1 + 0.8 * torch.rand(t.shape, generator=g))


lm_layer = official_lm_layer


def fixture_lm_layer(mt, attn_type: int, mode: str | None):
    """The official LM layer of a case at the fixtures' shapes and weights, and its `weight.*` tensors (per-position
    π tables cut to the first qlen positions, the ones a segment reads)."""
    s = LM
    torch.manual_seed(0)
    layer = lm_layer(mt, attn_type, mode, n_head=s["n_head"], d_model=s["d_model"], d_head=s["d_head"],
                     d_inner=s["d_inner"])
    enlarge_(layer, seed=1)
    redraw_pi_(layer, seed=2)
    weights = {f"weight.{k}": (v[..., :s["qlen"]] if k.split(".")[-1] in ("pi", "pi0", "pi1") else v).clone()
               for k, v in layer.state_dict().items()}
    return layer, weights


def make_lm(mt, commit: str) -> None:
    s = LM
    for case, (attn_type, mode) in LM_CASES.items():
        layer, weights = fixture_lm_layer(mt, attn_type, mode)
        soft = mode in ("soft", "soft2keys")
        layer.train(soft)  # dropout 0: training mode only moves the soft E-step's π
        g = torch.Generator().manual_seed(3)
        tensors = dict(weights)
        mask = torch.triu(torch.ones(s["qlen"], s["qlen"], dtype=torch.bool), diagonal=1)[:, :, None]
        hs, outs, pis = [], [], []  # stacked over segments: fewer records, smaller files
        with torch.no_grad():
            for _ in range(s["n_seg"]):
                h = torch.randn(s["qlen"], s["bsz"], s["d_model"], generator=g)  # (T, B, D), as theirs
                hs.append(h)
                outs.append(layer(h, dec_attn_mask=mask))
                if soft:
                    pis.append(layer.dec_attn.pi[..., :s["qlen"]].clone())
        tensors["input.h"], tensors["output.out"] = torch.stack(hs), torch.stack(outs)
        if soft:
            tensors["output.pi"] = torch.stack(pis)
        save_fixture(OUT / f"lm_{case}.pt", tensors, dict(
            repo=REPO, commit=commit, case=f"lm_{case}", attn_type=attn_type, update_mode=mode or "",
            file="language-modeling/lmtool-fwms/src/mem_transformer.py", train=int(soft), **s))
        print(f"lm_{case}: {sum(t.numel() for t in tensors.values())} numbers")


def lra_config(attn_type, key2, multi_gauss, hard_em, soft_em, n_head=None, dim=None, head_dim=None, hidden=None):
    s = LRA
    return SimpleNamespace(
        attention_grad_checkpointing=False, transformer_dim=dim or s["dim"], embedding_dim=dim or s["dim"],
        head_dim=head_dim or s["head_dim"], num_head=n_head or s["n_head"], attn_type=attn_type, key2=key2,
        multi_gauss=multi_gauss, hard_em=hard_em, soft_em=soft_em, attention_dropout=0.0, save_attn=False,
        norm_qk=False, track_kk=False, split_attn_type=False, add_performer=False, pi0=0.0,
        max_seq_len=s["max_seq_len"], transformer_hidden_dim=hidden or s["hidden"], dropout_prob=0.0,
        vocab_size=s["vocab"], num_classes=s["classes"], fixed_pos_emb=False, debug=False, num_layers=2,
        tied_weights=False, cls_token=False, cls_last_layer=False, pooling_mode="MEAN", mixed_precision=False,
        mg_layer1=False, mg_layer2=False)


def lra_batch(g):
    s = LRA
    n_real = torch.tensor([s["L"], s["L"] - 3])  # the second example ends with 3 pads
    tokens = torch.randint(1, s["vocab"], (s["B"], s["L"]), generator=g)
    mask = (torch.arange(s["L"])[None] < n_real[:, None])
    return tokens * mask, mask.float()


def fixture_classifier(model_mod, wrapper_mod, case: str) -> torch.nn.ModuleDict:
    """The official LRA classifier of a case (`lra/model.py` `Model` + `SCHead`) at the fixtures' weights."""
    torch.manual_seed(0)
    cfg = lra_config(*LRA_CASES[case])
    both = torch.nn.ModuleDict({"model": model_mod.Model(cfg), "head": wrapper_mod.SCHead(cfg)})
    enlarge_(both, seed=1)
    redraw_pi_(both, seed=2)
    return both


def make_lra(attention_mod, model_mod, wrapper_mod, commit: str) -> None:
    s = LRA
    for case, spec in LRA_CASES.items():
        torch.manual_seed(0)
        att = attention_mod.Attention(lra_config(*spec))
        enlarge_(att, seed=1)
        redraw_pi_(att, seed=2)
        tensors = {f"weight.{k}": v.clone() for k, v in att.state_dict().items()}
        soft = spec[4]
        att.train(soft)
        g = torch.Generator().manual_seed(3)
        xs, masks, outs, pis = [], [], [], []
        with torch.no_grad():
            for _ in range(s["n_step"] if soft else 1):  # the soft E-step carries π from batch to batch
                _, mask = lra_batch(g)
                x = torch.randn(s["B"], s["L"], s["dim"], generator=g)
                xs.append(x), masks.append(mask), outs.append(att(x, mask))
                if soft:
                    pis.append((att.attn.multi_gauss_kernel.pi if spec[2] else att.attn.pi).clone())
        tensors.update({"input.x": torch.stack(xs), "input.mask": torch.stack(masks), "output.out": torch.stack(outs)})
        if soft:
            tensors["output.pi"] = torch.stack(pis)
        save_fixture(OUT / f"lra_{case}.pt", tensors, dict(
            repo=REPO, commit=commit, case=f"lra_{case}", file="lra/attention.py", attn_type=spec[0],
            key2=int(spec[1]), multi_gauss=int(spec[2]), hard_em=int(spec[3]), soft_em=int(spec[4]),
            train=int(soft), **s))
        print(f"lra_{case}: {sum(t.numel() for t in tensors.values())} numbers")
    for case in CLASSIFIER_CASES:
        both = fixture_classifier(model_mod, wrapper_mod, case)
        model, head = both["model"], both["head"]
        both.eval()
        tokens, mask = lra_batch(torch.Generator().manual_seed(3))
        with torch.no_grad():
            logits = head(model(tokens, mask))
        tensors = {f"weight.{k}": v.clone() for k, v in both.state_dict().items()}
        tensors.update({"input.tokens": tokens, "input.mask": mask, "output.logits": logits})
        save_fixture(OUT / f"lra_classifier_{case}.pt", tensors, dict(
            repo=REPO, commit=commit, case=f"lra_classifier_{case}", file="lra/model.py, lra/model_wrapper.py",
            **s))
        print(f"lra_classifier_{case}: logits {logits.tolist()}")


# training-gradient fixtures: the variants whose π is learned by gradient or absent, and one soft E-step of each kind
GRAD_LM_CASES = ("softmax", "linear34", "mgk", "smgk", "mlk", "smlk", "mgk_softe")
GRAD_LRA_CASES = ("softmax", "linear", "mgk", "smgk", "mlk", "smlk", "smgk_softe")
GRAD_CLASSIFIER_CASES = ("mgk", "mlk")


def _grads(module: torch.nn.Module, keep: int | None = None) -> dict[str, torch.Tensor]:
    """`grad.<name>` of every parameter; per-position π tables (pi, pi0, pi1) cut to the first `keep` positions,
    as their weights are saved (asserted: no gradient reaches the positions beyond)."""
    out = {}
    for name, prm in module.named_parameters():
        g = torch.zeros_like(prm) if prm.grad is None else prm.grad
        if keep is not None and name.split(".")[-1] in ("pi", "pi0", "pi1") and g.shape[-1] > keep:
            assert not g[..., keep:].any(), name
            g = g[..., :keep]
        out[f"grad.{name}"] = g.clone()
    return out


def make_grad(mt, attention_mod, model_mod, wrapper_mod, commit: str) -> None:
    """`grad_lm_<case>`, `grad_lra_<case>`, `grad_lra_classifier_<case>`: the same modules, weights and inputs as
    the forward fixtures of the same case (same seeds), trained: per segment or batch a loss is backpropagated and
    the gradients accumulate over all of them (no optimizer step; the soft E-step's π moves in training mode as in
    the forward fixtures). The layers' loss is Σ out ⊙ R with a fixed random R per segment (every output entry
    weighted differently); the classifier's is the cross-entropy of the logits with fixed labels, as lra/run_tasks.py
    trains it. Saved: weights, inputs, R / labels, every parameter's accumulated gradient."""
    s = LM
    for case in GRAD_LM_CASES:
        attn_type, mode = LM_CASES[case]
        layer, weights = fixture_lm_layer(mt, attn_type, mode)
        soft = mode in ("soft", "soft2keys")
        layer.train(soft)
        g = torch.Generator().manual_seed(3)
        mask = torch.triu(torch.ones(s["qlen"], s["qlen"], dtype=torch.bool), diagonal=1)[:, :, None]
        hs, rs = [], []
        for _ in range(s["n_seg"]):
            h = torch.randn(s["qlen"], s["bsz"], s["d_model"], generator=g)
            r = torch.randn(s["qlen"], s["bsz"], s["d_model"], generator=g)
            (layer(h, dec_attn_mask=mask) * r).sum().backward()
            hs.append(h), rs.append(r)
        tensors = weights | {"input.h": torch.stack(hs), "input.r": torch.stack(rs)} | _grads(layer, s["qlen"])
        save_fixture(OUT / f"grad_lm_{case}.pt", tensors, dict(
            repo=REPO, commit=commit, case=f"grad_lm_{case}", attn_type=attn_type, update_mode=mode or "",
            file="language-modeling/lmtool-fwms/src/mem_transformer.py", train=int(soft), **s))
        print(f"grad_lm_{case}: {sum(k.startswith('grad.') for k in tensors)} gradients")
    s = LRA
    for case in GRAD_LRA_CASES:
        spec = LRA_CASES[case]
        torch.manual_seed(0)
        att = attention_mod.Attention(lra_config(*spec))
        enlarge_(att, seed=1)
        redraw_pi_(att, seed=2)
        tensors = {f"weight.{k}": v.clone() for k, v in att.state_dict().items()}
        att.train(spec[4])
        g = torch.Generator().manual_seed(3)
        xs, masks, rs = [], [], []
        for _ in range(s["n_step"]):
            _, mask = lra_batch(g)
            x = torch.randn(s["B"], s["L"], s["dim"], generator=g)
            r = torch.randn(s["B"], s["L"], s["dim"], generator=g)
            (att(x, mask) * r).sum().backward()
            xs.append(x), masks.append(mask), rs.append(r)
        tensors |= {"input.x": torch.stack(xs), "input.mask": torch.stack(masks), "input.r": torch.stack(rs)}
        tensors |= _grads(att)
        save_fixture(OUT / f"grad_lra_{case}.pt", tensors, dict(
            repo=REPO, commit=commit, case=f"grad_lra_{case}", file="lra/attention.py", attn_type=spec[0],
            key2=int(spec[1]), multi_gauss=int(spec[2]), hard_em=int(spec[3]), soft_em=int(spec[4]),
            train=int(spec[4]), **s))
        print(f"grad_lra_{case}: {sum(k.startswith('grad.') for k in tensors)} gradients")
    for case in GRAD_CLASSIFIER_CASES:
        both = fixture_classifier(model_mod, wrapper_mod, case)
        model, head = both["model"], both["head"]
        tensors = {f"weight.{k}": v.clone() for k, v in both.state_dict().items()}
        both.train()  # dropout 0
        g = torch.Generator().manual_seed(3)
        toks, masks, labels = [], [], []
        for _ in range(s["n_step"]):
            tokens, mask = lra_batch(g)
            label = torch.randint(0, s["classes"], (s["B"],), generator=g)
            torch.nn.functional.cross_entropy(head(model(tokens, mask)), label).backward()
            toks.append(tokens), masks.append(mask), labels.append(label)
        tensors |= {"input.tokens": torch.stack(toks), "input.mask": torch.stack(masks),
                    "input.labels": torch.stack(labels)} | _grads(both)
        save_fixture(OUT / f"grad_lra_classifier_{case}.pt", tensors, dict(
            repo=REPO, commit=commit, case=f"grad_lra_classifier_{case}", file="lra/model.py, lra/model_wrapper.py",
            **s))
        print(f"grad_lra_classifier_{case}: {sum(k.startswith('grad.') for k in tensors)} gradients")


def count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def make_counts(mt, attention_mod, model_mod, commit: str) -> None:
    meta = dict(repo=REPO, commit=commit, case="counts")
    for name, (attn_type, mode, n_head) in PAPER_LM.items():
        layer = lm_layer(mt, attn_type, mode, n_head=n_head, d_model=128, d_head=16, d_inner=2048)
        meta[f"lm.{name}"] = count(layer)
    for case, spec in LRA_CASES.items():
        for n_head in (1, 2, 4, 8):
            cfg = lra_config(*spec, n_head=n_head, dim=64, head_dim=32, hidden=128)
            meta[f"lra.{case}.{n_head}"] = count(model_mod.Transformer(cfg))
    save_fixture(OUT / "counts.pt", {}, meta)
    print({k: v for k, v in meta.items() if k.startswith("lm.")})


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/parity/make_mgk.py PATH/TO/transformer-mgk "
                         "(a checkout of the authors' code)")
    checkout = Path(sys.argv[1])
    commit = checkout_commit(checkout)
    install_shims()
    torch.set_default_dtype(torch.float32)
    with on_path(checkout / "language-modeling" / "lmtool-fwms" / "src"):
        import mem_transformer as mt
        make_lm(mt, commit)
        with on_path(checkout / "lra"):
            import attention as attention_mod
            import model as model_mod
            import model_wrapper as wrapper_mod
            make_lra(attention_mod, model_mod, wrapper_mod, commit)
            make_counts(mt, attention_mod, model_mod, commit)
            make_grad(mt, attention_mod, model_mod, wrapper_mod, commit)


if __name__ == "__main__":
    main()
