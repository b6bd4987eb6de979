"""Attention with a mixture of Gaussian keys (Transformer-MGK; Nguyen et al., ICML 2022, arXiv 2110.08678).

Reference code: minhtannguyen/transformer-mgk (`language-modeling/lmtool-fwms/src/mem_transformer.py` `MGKAttn`,
`lra/attention.py`, `lra/attention_linear.py`). Layout legend: B batch, H heads, R mixture components, T queries,
K keys, E head width; tensors batch-first.

Softmax attention is the posterior of a Gaussian mixture whose components are the keys. MGK makes every key a
mixture of R Gaussians with weights π and variances σ²:

    a_ij = Σ_r π_r N(q_i; k_jr, σ_r²) / Σ_j' Σ_r π_r N(q_i; k_j'r, σ_r²),   N(q; k, σ²) ∝ exp(−‖q − k‖² / 2σ²)

computed here in log space, score_ij = logsumexp_r(log π_r − ‖q_i − k_jr‖² / 2σ_r²), then a masked softmax over j
(max-subtracted, so no exponential overflows; the reference exponentiates raw distances). The linear version
(MLK) replaces the kernel by a feature map φ: h_i = φ(q_i)ᵀ Σ_j Σ_r π_r φ(k_jr) v_jᵀ / φ(q_i)ᵀ Σ_j Σ_r π_r φ(k_jr).

Options, by config strings:
- keys: `separate` (MGK: one key projection per component) or `shifted` (sMGK/sMLK: one projection and a
  learned shift per component, k_jr = k_j − μ_r, μ_0 initialised at 0 as in the reference).
- pi: `gradient` (default: π learned by backpropagation), `soft_em` (π updated from the responsibilities,
  π_r = mean of γ_ijr, not by gradient) or `hard_em` (the sum over components replaced by a max; π unused).
- variances: σ_r² = √E · sigma2_ratios[r] (the reference: √E and √E/3), fixed or learned.

Where this differs from the reference (see papers/mgk/README.md): π is a per-head distribution over the R
components (a softmax of learned logits), shared by all key positions. The reference keeps a table of π per key
position, hard-coded to 256 positions (longer segments fail), and clamps each entry to [0, 1] without normalising.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

KeyKind = Literal["separate", "shifted"]
PiKind = Literal["gradient", "soft_em", "hard_em"]


class MixtureKeys(nn.Module):
    """Projections q, k_1…k_R (or k and shifts μ_r), v; returns q (B,H,T,E), k (B,H,R,K,E), v (B,H,K,E)."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, n_components: int, keys: KeyKind):
        super().__init__()
        if keys not in ("separate", "shifted"):
            raise ValueError(f"keys is 'separate' (MGK) or 'shifted' (sMGK), got {keys!r}")
        self.n_head, self.d_head, self.n_components, self.keys = n_head, d_head, n_components, keys
        n_keys = n_components if keys == "separate" else 1
        self.q_net = nn.Linear(d_model, n_head * d_head, bias=False)
        self.kv_net = nn.Linear(d_model, (n_keys + 1) * n_head * d_head, bias=False)
        if keys == "shifted":
            mu = torch.randn(n_components, n_head, d_head) * 0.5
            mu[0] = 0.0  # the reference starts the first shift at zero
            self.mu = nn.Parameter(mu)

    def forward(self, h_BTD: torch.Tensor, src_BKD: torch.Tensor):
        b, t, _ = h_BTD.shape
        k_len = src_BKD.shape[1]
        h, e = self.n_head, self.d_head
        q = self.q_net(h_BTD).view(b, t, h, e).transpose(1, 2)
        kv = self.kv_net(src_BKD).view(b, k_len, -1, h, e).permute(2, 0, 3, 1, 4)  # (n_keys+1, B, H, K, E)
        v = kv[-1]
        if self.keys == "separate":
            k = kv[:-1].permute(1, 2, 0, 3, 4)  # (B, H, R, K, E)
        else:
            k = kv[0][:, :, None] - self.mu.permute(1, 0, 2)[None, :, :, None]  # (B, H, R, K, E)
        return q, k, v


class MixtureWeights(nn.Module):
    """log π (H, R) for the `gradient` and `soft_em` options."""

    def __init__(self, *, n_head: int, n_components: int, pi: PiKind, momentum: float = 1.0):
        super().__init__()
        if pi not in ("gradient", "soft_em", "hard_em"):
            raise ValueError(f"pi is 'gradient', 'soft_em' or 'hard_em', got {pi!r}")
        self.kind = pi
        self.momentum = momentum
        if pi == "gradient":
            self.logits = nn.Parameter(torch.zeros(n_head, n_components))  # uniform, as the reference's 0.5/0.5
        elif pi == "soft_em":
            self.register_buffer("pi", torch.full((n_head, n_components), 1.0 / n_components))

    def log_pi(self) -> torch.Tensor | None:
        if self.kind == "gradient":
            return torch.log_softmax(self.logits, dim=-1)
        if self.kind == "soft_em":
            return self.pi.clamp_min(1e-12).log()
        return None

    @torch.no_grad()
    def e_step(self, resp_BHTKR: torch.Tensor, valid_BHTK: torch.Tensor) -> None:
        """Soft E-step: π_r ← Σ γ_ijr / N over the valid (query, key) pairs of the batch, per head."""
        w = valid_BHTK.to(resp_BHTKR.dtype)[..., None]
        n = w.sum(dim=(0, 2, 3)).clamp_min(1.0)  # (H, 1)
        new = (resp_BHTKR * w).sum(dim=(0, 2, 3)) / n  # (H, R)
        self.pi.mul_(1 - self.momentum).add_(self.momentum * new.to(self.pi.dtype))


class MGKAttention(nn.Module):
    """Softmax-family MGK / sMGK attention with the repository's attention interface (no memory).

    `forward(h_BTD, *, mem_BMD=None, mask_TK, pos=None, kv_mem=None) -> (out_BTD, None)`; `mask_TK` is any
    boolean mask broadcastable to (B, H, T, K), True where attention is forbidden (causal or padding).
    """

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float, n_components: int = 2,
                 keys: KeyKind = "separate", pi: PiKind = "gradient",
                 sigma2_ratios: tuple[float, ...] = (1.0, 1.0 / 3.0), learn_variance: bool = False):
        super().__init__()
        if len(sigma2_ratios) != n_components:
            raise ValueError(f"sigma2_ratios needs one ratio per component ({n_components}), got {sigma2_ratios}")
        self.n_head, self.d_head = n_head, d_head
        self.proj = MixtureKeys(d_model=d_model, n_head=n_head, d_head=d_head, n_components=n_components, keys=keys)
        self.weights = MixtureWeights(n_head=n_head, n_components=n_components, pi=pi)
        log_s2 = torch.log(torch.tensor(sigma2_ratios, dtype=torch.float32) * math.sqrt(d_head))
        log_s2 = log_s2[None].expand(n_head, n_components).clone()
        if learn_variance:
            self.log_sigma2 = nn.Parameter(log_s2)
        else:
            self.register_buffer("log_sigma2", log_s2)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.dropatt = nn.Dropout(dropatt)

    def component_scores(self, q_BHTE, k_BHRKE) -> torch.Tensor:
        """log π_r − ‖q_i − k_jr‖² / 2σ_r², (B, H, T, K, R) (log π omitted for hard E)."""
        inv2s2 = (0.5 * torch.exp(-self.log_sigma2)).to(q_BHTE.dtype)  # (H, R)
        qk = torch.einsum("bhte,bhrke->bhtkr", q_BHTE, k_BHRKE)
        q2 = (q_BHTE * q_BHTE).sum(-1)[..., None, None]  # (B, H, T, 1, 1)
        k2 = (k_BHRKE * k_BHRKE).sum(-1).permute(0, 1, 3, 2)[:, :, None]  # (B, H, 1, K, R)
        s = -(q2 + k2 - 2 * qk) * inv2s2[None, :, None, None, :]
        log_pi = self.weights.log_pi()
        if log_pi is not None:
            s = s + log_pi[None, :, None, None, :].to(s.dtype)
        return s

    def forward(self, h_BTD, *, mem_BMD=None, mask_TK, pos=None, kv_mem=None):
        if (mem_BMD is not None and mem_BMD.shape[1]) or kv_mem is not None:
            raise ValueError("MGK attention keeps no memory: use mem_len 0")
        b, t, _ = h_BTD.shape
        q, k, v = self.proj(h_BTD, h_BTD)
        s = self.component_scores(q.float(), k.float())  # (B, H, T, K, R), float32: distances lose bits in bf16
        if self.weights.kind == "hard_em":
            scores = s.amax(-1)
        else:
            scores = torch.logsumexp(s, dim=-1)
            if self.weights.kind == "soft_em" and self.training:
                valid = ~mask_TK.expand(b, self.n_head, t, scores.shape[-1])
                self.weights.e_step(torch.softmax(s, dim=-1), valid)
        scores = scores.masked_fill(mask_TK, float("-inf"))
        prob = self.dropatt(torch.softmax(scores, dim=-1))
        out = prob.to(v.dtype) @ v  # (B, H, T, E)
        return self.o_net(out.transpose(1, 2).reshape(b, t, self.n_head * self.d_head)), None


def causal_linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, *, chunk: int = 64):
    """num_t = Σ_{j≤t} (φq_t·φk_j) v_j and den_t = Σ_{j≤t} φq_t·φk_j for (B, H, T, E) inputs, chunk by chunk.

    The prefix-sum form materialises a (T, E, E) running state per head; here the sequence is cut into chunks of
    C: inside a chunk the masked (C × C) products, across chunks one (E, E) state per chunk (an exclusive prefix
    sum over chunks). Same sums, in another order: O(T·(C + E)·E) time and O(T/C·E²) state instead of O(T·E²)."""
    b, h, t, e = phi_q.shape
    n = -(-t // chunk)
    pad = n * chunk - t
    if pad:  # zero keys and values add nothing; the padded queries are dropped at the end
        phi_q, phi_k, v = (F.pad(x, (0, 0, 0, pad)) for x in (phi_q, phi_k, v))
    q = phi_q.view(b, h, n, chunk, e)
    k = phi_k.view(b, h, n, chunk, e)
    vv = v.reshape(b, h, n, chunk, v.shape[-1])
    tri = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    a = (q @ k.transpose(-1, -2)).masked_fill(~tri, 0.0)  # (B, H, n, C, C) within each chunk, j ≤ t
    state = torch.einsum("bhnce,bhncf->bhnef", k, vv)  # each chunk's Σ φk_j v_jᵀ
    state = state.cumsum(2) - state  # exclusive: the chunks before
    ksum = k.sum(3)
    ksum = ksum.cumsum(2) - ksum  # (B, H, n, E)
    num = a @ vv + q @ state
    den = a.sum(-1, keepdim=True) + (q * ksum[:, :, :, None, :]).sum(-1, keepdim=True)
    num = num.reshape(b, h, n * chunk, -1)[:, :, :t]
    den = den.reshape(b, h, n * chunk, 1)[:, :, :t]
    return num, den


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 (Katharopoulos et al. 2020), the feature map of linear attention."""
    return F.elu(x) + 1.0


class MLKAttention(nn.Module):
    """Linear attention with mixture keys (MLK / sMLK; R = 1 with `separate` keys is plain linear attention).

    Causal attention is the prefix-sum form computed chunk by chunk (`causal_linear_attention`: O(T·(C + E)·E)
    time, O(T/C·E²) state); non-causal attention sums over the unmasked keys. `mask_TK`: the causal (T, K) mask when
    `causal`, else a padding mask broadcastable to (B, 1, 1, K).
    """

    chunk = 64  # C of the chunked causal form

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float = 0.0, n_components: int = 2,
                 keys: KeyKind = "separate", causal: bool = True, eps: float = 1e-6):
        super().__init__()
        self.n_head, self.d_head, self.causal, self.eps = n_head, d_head, causal, eps
        self.proj = MixtureKeys(d_model=d_model, n_head=n_head, d_head=d_head, n_components=n_components, keys=keys)
        self.weights = MixtureWeights(n_head=n_head, n_components=n_components, pi="gradient")
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)

    def forward(self, h_BTD, *, mem_BMD=None, mask_TK=None, pos=None, kv_mem=None):
        if (mem_BMD is not None and mem_BMD.shape[1]) or kv_mem is not None:
            raise ValueError("MLK attention keeps no memory: use mem_len 0")
        b, t, _ = h_BTD.shape
        q, k, v = self.proj(h_BTD, h_BTD)
        pi = torch.softmax(self.weights.logits, dim=-1).to(k.dtype)  # (H, R)
        phi_q = elu_feature_map(q)  # (B, H, T, E)
        phi_k = (elu_feature_map(k) * pi[None, :, :, None, None]).sum(2)  # Σ_r π_r φ(k_jr): (B, H, K, E)
        if self.causal:
            num, den = causal_linear_attention(phi_q, phi_k, v, chunk=self.chunk)
        else:
            if mask_TK is not None:  # key padding (B, 1, 1, K): padded keys contribute nothing
                if mask_TK.dim() != 4 or mask_TK.shape[1] != 1 or mask_TK.shape[2] != 1:
                    raise ValueError(f"non-causal MLK takes a key padding mask of shape (B, 1, 1, K), got {tuple(mask_TK.shape)}")
                phi_k = phi_k * (~mask_TK).to(phi_k.dtype).reshape(b, 1, -1, 1)
            kv = torch.einsum("bhke,bhkf->bhef", phi_k, v)
            num = phi_q @ kv
            den = (phi_q * phi_k.sum(2, keepdim=True)).sum(-1, keepdim=True)
        out = num / (den + self.eps)
        return self.o_net(out.transpose(1, 2).reshape(b, t, self.n_head * self.d_head)), None
