"""`repro bench-sdpa` (papers/mgk/commands.py): our LRA softmax-8 and MGK-4 attention layers against the same layers
through `torch.nn.functional.scaled_dot_product_attention` (SDPA), to see whether a fused kernel would change the
efficiency comparison (papers/mgk/README.md, "Efficiency on a GPU").

One attention layer at the LRA classifier's width (d 64, heads of 32), batch 8, a padding mask over the last eighth
of the keys, training step of the layer alone (forward and backward), no dropout, float32 and bf16 autocast:
- `softmax8` / `softmax8_sdpa`: `SoftmaxAttention` (explicit scores and softmax) / its projections through SDPA;
- `mgk4` / `mgk4_sdpa`: `MGKAttention` (R = 2 separate keys, π, the joint softmax over the R·K (component, key)
  pairs from augmented vectors, `MGKAttention.joint_probabilities`) / the same augmented q and k
  [q, ‖q‖², 1]·[2c k_r, −c, log π_r − c‖k_r‖²], padded to a multiple of 8, through SDPA with scale 1 and the values
  repeated R times (Σ_r P_rj v_j = Σ_(r,j) P_rj v_j).
Each SDPA form is checked first against ours (eval mode, the relative max difference printed), then timed. Not a
replacement in the models: with dropout the SDPA kernel draws its masks differently, and the LRA numbers would move
at rounding level. Prints one line per length and precision. Timed with `repro.ops.timing` (the clock read with a
GPU's queue drained, bf16 as autocast), as the side-by-side benchmarks are.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from papers.mgk.attention import MGKAttention, SoftmaxAttention
from repro.ops.timing import autocast, timed

D_MODEL, D_HEAD = 64, 32


def sdpa_softmax(m: SoftmaxAttention, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`m(h, mask_TK=mask)[0]` through SDPA (its default scale 1/√E is ours)."""
    b, t, _ = h.shape
    q, k, v = m.proj(h, h)
    out = F.scaled_dot_product_attention(q, k[:, :, 0], v, attn_mask=~mask)
    return m.o_net(out.transpose(1, 2).reshape(b, t, m.n_head * m.d_head))


def sdpa_mgk(m: MGKAttention, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`m(h, mask_TK=mask)[0]` (no norm_eps, no E-step in training) through SDPA over the R·K augmented keys."""
    b, t, _ = h.shape
    q, k, v = m.proj(h, h)
    q, k = q.float(), k.float()
    inv2s2 = (0.5 * torch.exp(-m.log_sigma2))[None, :, :, None, None]
    _, hh, r, kl, e = k.shape
    q2 = (q * q).sum(-1, keepdim=True)
    q_aug = torch.cat([q, q2, torch.ones_like(q2)], -1)
    const = -(k * k).sum(-1, keepdim=True) * inv2s2
    log_pi = m.weights.log_pi(kl)
    if log_pi is not None:
        const = const + log_pi[:, :, 0].permute(0, 1, 3, 2)[..., None]
    k_aug = torch.cat([k * (2 * inv2s2), (-inv2s2).expand(b, hh, r, kl, 1), const], -1).reshape(b, hh, r * kl, e + 2)
    pad = -(e + 2) % 8
    q_aug, k_aug = F.pad(q_aug, (0, pad)), F.pad(k_aug, (0, pad))
    vv = v.float().unsqueeze(2).expand(b, hh, r, kl, e).reshape(b, hh, r * kl, e)
    keep = (~mask).expand(b, 1, 1, kl).repeat(1, 1, 1, r)
    out = F.scaled_dot_product_attention(q_aug, k_aug, vv, attn_mask=keep, scale=1.0).to(v.dtype)
    return m.o_net(out.transpose(1, 2).reshape(b, t, m.n_head * m.d_head))


def layers(device) -> tuple[SoftmaxAttention, MGKAttention]:
    sm = SoftmaxAttention(d_model=D_MODEL, n_head=8, d_head=D_HEAD, dropatt=0.0).to(device)
    mg = MGKAttention(d_model=D_MODEL, n_head=4, d_head=D_HEAD, dropatt=0.0, n_components=2, keys="separate",
                      sigma2_ratios=(1.0, 1.0)).to(device)
    return sm, mg


def padding_mask(batch: int, length: int, device) -> torch.Tensor:
    mask = torch.zeros(batch, 1, 1, length, dtype=torch.bool, device=device)
    mask[..., length - length // 8:] = True
    return mask


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="repro bench-sdpa", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", help="default: cuda where there is a GPU, else cpu")
    p.add_argument("--lengths", default="512,1024", help="comma-separated sequence lengths")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if not lengths or min(lengths) < 8 or args.batch < 1 or args.steps < 1:
        raise ValueError("--lengths ≥ 8 tokens each, --batch and --steps ≥ 1")

    def timeit(fn) -> float:  # ms per step
        for _ in range(args.warmup):
            fn()
        return timed(fn, args.steps, dev) / args.steps * 1e3

    torch.manual_seed(0)
    for t in lengths:
        sm, mg = layers(dev)
        h = torch.randn(args.batch, t, D_MODEL, device=dev, requires_grad=True)
        mask = padding_mask(args.batch, t, dev)
        with torch.no_grad():
            diff = {}
            for name, m, f in (("softmax8", sm, sdpa_softmax), ("mgk4", mg, sdpa_mgk)):
                ref = m(h, mask_TK=mask)[0]
                diff[name] = ((f(m, h, mask) - ref).abs().max() / ref.abs().max()).item()
        for prec in ("fp32", "bf16"):
            amp = autocast(dev, "bf16" if prec == "bf16" else "32")

            def step(fn):
                def go():
                    with amp:
                        out = fn()
                    out.float().sum().backward()
                return go

            ms = {name: timeit(step(fn)) for name, fn in (
                ("softmax8", lambda: sm(h, mask_TK=mask)[0]), ("softmax8_sdpa", lambda: sdpa_softmax(sm, h, mask)),
                ("mgk4", lambda: mg(h, mask_TK=mask)[0]), ("mgk4_sdpa", lambda: sdpa_mgk(mg, h, mask)))}
            print(f"T={t} {prec} {dev.type}: ms/step " + "  ".join(f"{k} {v:.2f}" for k, v in ms.items())
                  + f"  | mgk4/softmax8 {ms['mgk4'] / ms['softmax8']:.2f}, through SDPA "
                  f"{ms['mgk4_sdpa'] / ms['softmax8_sdpa']:.2f}  | SDPA vs ours (relative max difference): "
                  f"softmax8 {diff['softmax8']:.1e}, mgk4 {diff['mgk4']:.1e}", flush=True)
