"""Attention with a mixture of Gaussian keys (Transformer-MGK; Nguyen et al., ICML 2022, arXiv 2110.08678).

Reference code: minhtannguyen/transformer-mgk (`language-modeling/lmtool-fwms/src/mem_transformer.py` `MGKAttn`
(attn_type 200), `CudaFastWeightSumTwoLinearTransformerLayer` (attn_type 400) and, for plain linear attention,
`utils/cuda_fast_weight_layer.py` `CudaFastWeightSumLinearTransformerLayer` (attn_type 34); `lra/attention.py`
`SoftmaxAttention`/`MultiGaussKernel`, `lra/attention_linear.py` `LinearAttention`). Layout legend: B batch,
H heads, R mixture components, T queries, K keys, E head width; tensors batch-first.

Softmax attention is the posterior of a Gaussian mixture whose components are the keys. MGK makes every key a
mixture of R Gaussians with weights π and variances σ²:

    a_ij = Σ_r π_r N(q_i; k_jr, σ_r²) / Σ_j' Σ_r π_r N(q_i; k_j'r, σ_r²),   N(q; k, σ²) ∝ exp(−‖q − k‖² / 2σ²)

computed here in log space, score_ij = logsumexp_r(log π_r − ‖q_i − k_jr‖² / 2σ_r²), then a masked softmax over j
(max-subtracted, so no exponential overflows; the reference exponentiates raw distances). Where π is learned by
gradient (and in evaluation), the same weights come from one softmax over all (component, key) pairs of scores
built by a single product of augmented vectors, summed over components (`MGKAttention.joint_probabilities`):
no (T, K, R) temporaries, and the backward keeps one (T, R·K) tensor, which makes MGK-4 cheaper than softmax-8
in time and activation memory instead of dearer (README, efficiency); the `lm_official` form's a / (Σ a + ε)
normalisation is that softmax times S / (S + ε), S = Σ a from its log-normaliser (`softmax_lse`). The linear version
(MLK) replaces the kernel by a feature map φ: h_i = φ(q_i)ᵀ Σ_j Σ_r π_r φ(k_jr) v_jᵀ / φ(q_i)ᵀ Σ_j Σ_r π_r φ(k_jr).

Options, by config strings:
- keys: `separate` (MGK: one key projection per component) or `shifted` (sMGK/sMLK: one projection and a
  learned shift per component, k_jr = k_j − μ_r, μ_0 initialised at 0 as in the reference).
- pi: `gradient` (π learned by backpropagation), `soft_em` (π updated from the responsibilities, not by
  gradient) or `hard_em` (the sum over components replaced by a max; π unused).
- pi_layout: `head` (a per-head distribution over the R components, a softmax of learned logits: length-free),
  `position` (the official language-model form: one entry per (component, head, key position), a table of
  `max_klen` = 256 positions, each clamped to [0, 1], not normalised, initialised at 1/R = 0.5) or `global` (the
  official LRA form: R numbers shared by all heads and positions, clamped, initialised at 0.5).
- form: `ours` (the formulas above), `lm_official` or `lra_official`: the numerics of the authors' LM or LRA code
  where they differ from the formulas (listed per class below; README "Deviations" gives the measured effects).
- variances: σ_r² = √E · sigma2_ratios[r], fixed or learned (LM code: √E and √E/3; LRA code: √E for both).
- bias: biases on the q/k/v/output projections (the LRA code has them, the LM code not).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from repro.nn.attention import attend, softmax_lse

KeyKind = Literal["separate", "shifted"]
PiKind = Literal["gradient", "soft_em", "hard_em"]
PiLayout = Literal["head", "position", "global"]
Form = Literal["ours", "lm_official", "lra_official"]
FORMS = ("ours", "lm_official", "lra_official")
NORM_EPS_LM = 1e-6  # MGKAttn: attn_prob / (attn_prob.sum + 1e-6), and resp0 = π e0 / (attn_prob + 1e-6)
ESTEP_EPS = 1e-6  # the same guard in both official E-steps (mem_transformer.py MGKAttn, lra/attention.py)


class MixtureKeys(nn.Module):
    """Projections q, k_1…k_R (or k and shifts μ_r), v; returns q (B,H,T,E), k (B,H,R,K,E), v (B,H,K,E).

    `kv_net` stacks [k_1 | … | k_R | v] (each H·E rows), as the reference's `kv_net` = [k | k1 | v] of `MGKAttn`."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, n_components: int, keys: KeyKind,
                 bias: bool = False):
        super().__init__()
        if keys not in ("separate", "shifted"):
            raise ValueError(f"keys is 'separate' (MGK) or 'shifted' (sMGK), got {keys!r}")
        self.n_head, self.d_head, self.n_components, self.keys = n_head, d_head, n_components, keys
        n_keys = n_components if keys == "separate" else 1
        self.q_net = nn.Linear(d_model, n_head * d_head, bias=bias)
        self.kv_net = nn.Linear(d_model, (n_keys + 1) * n_head * d_head, bias=bias)
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
    """The mixture weights π in one of three layouts (see the module docstring); `weights(k_len)` gives π as a
    tensor broadcastable to (B, H, T, K, R), `log_pi(k_len)` its log (None for the hard E-step)."""

    def __init__(self, *, n_head: int, n_components: int, pi: PiKind, layout: PiLayout = "head",
                 max_klen: int = 256):
        super().__init__()
        if pi not in ("gradient", "soft_em", "hard_em"):
            raise ValueError(f"pi is 'gradient', 'soft_em' or 'hard_em', got {pi!r}")
        if layout not in ("head", "position", "global"):
            raise ValueError(f"pi_layout is 'head', 'position' or 'global', got {layout!r}")
        if pi == "soft_em" and layout == "global":
            raise ValueError("the soft E-step keeps π per head ('head') or per key position ('position')")
        self.kind, self.layout, self.max_klen, self.n_components = pi, layout, max_klen, n_components
        uniform = 1.0 / n_components  # the reference's 0.5 / 0.5
        if pi == "hard_em":
            return
        shape = {"head": (n_head, n_components), "position": (n_components, n_head, max_klen),
                 "global": (n_components,)}[layout]
        if pi == "gradient" and layout == "head":
            self.logits = nn.Parameter(torch.zeros(shape))  # softmax(0) = uniform
        elif pi == "gradient":
            self.pi = nn.Parameter(torch.full(shape, uniform))  # mem_transformer.py pi0/pi1, lra/attention.py pi
        else:
            self.register_buffer("pi", torch.full(shape, uniform))

    def weights(self, k_len: int) -> torch.Tensor:
        """π as (1, H, 1, K, R) (`position`), (1, H, 1, 1, R) (`head`) or (1, 1, 1, 1, R) (`global`)."""
        if self.kind == "hard_em":
            raise ValueError("the hard E-step uses no π")
        if self.layout == "head":
            pi = torch.softmax(self.logits, -1) if self.kind == "gradient" else self.pi
            return pi[None, :, None, None, :]
        if self.layout == "global":
            return self.pi.clamp(0.0, 1.0)[None, None, None, None, :]
        if k_len > self.max_klen:
            raise ValueError(f"π per key position has {self.max_klen} positions (the reference's 256), the keys "
                             f"number {k_len}: raise mgk.max_klen or use pi_layout: head")
        return self.pi[:, :, :k_len].clamp(0.0, 1.0).permute(1, 2, 0)[None, :, None]  # (1, H, 1, K, R)

    def log_pi(self, k_len: int) -> torch.Tensor | None:
        if self.kind == "hard_em":
            return None
        if self.layout == "head" and self.kind == "gradient":
            return torch.log_softmax(self.logits, -1)[None, :, None, None, :]
        return self.weights(k_len).clamp_min(1e-30).log()

    @torch.no_grad()
    def e_step(self, resp_BHTKR: torch.Tensor, weight_BHTK: torch.Tensor, *, update_K: torch.Tensor | None = None):
        """Soft E-step: π ← Σ w γ / Σ w over (batch, query) (and key, for `head`), w the pair weights.

        `position` layout: the new π of key position k is the weighted mean over (batch, query); positions beyond
        K, or where `update_K` is False, keep their value; the last component is 1 − Σ of the others, as the
        reference keeps π_0 only and uses 1 − π_0."""
        w = weight_BHTK.to(resp_BHTKR.dtype)[..., None]
        if self.layout == "head":
            new = (resp_BHTKR * w).sum(dim=(0, 2, 3)) / w.sum(dim=(0, 2, 3)).clamp_min(1e-30)  # (H, R)
            self.pi.copy_(new.to(self.pi.dtype))
            return
        k_len = resp_BHTKR.shape[3]
        new = (resp_BHTKR * w).sum(dim=(0, 2)) / w.sum(dim=(0, 2))  # (H, K, R)
        new = new.permute(2, 0, 1)  # (R, H, K)
        new[-1] = 1.0 - new[:-1].sum(0)
        old = self.pi[:, :, :k_len]
        if update_K is not None:
            new = torch.where(update_K[None, None], new, old)
        old.copy_(new.to(self.pi.dtype))


class SoftmaxAttention(nn.Module):
    """Standard attention with optional projection biases (the LRA code's `Attention` with `SoftmaxAttention`:
    W_q, W_k, W_v and the output `ff` all have biases). No memory. `mask_TK` broadcastable to (B, H, T, K)."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float, bias: bool = True):
        super().__init__()
        self.n_head, self.d_head = n_head, d_head
        self.proj = MixtureKeys(d_model=d_model, n_head=n_head, d_head=d_head, n_components=1, keys="separate",
                                bias=bias)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=bias)
        self.dropatt = nn.Dropout(dropatt)
        self.kernel = "auto"  # `attend`'s kernel (`repro.nn.attention.set_attention_kernel`)

    def forward(self, h_BTD, *, mem_BMD=None, mask_TK, pos=None, kv_mem=None):
        if (mem_BMD is not None and mem_BMD.shape[1]) or kv_mem is not None:
            raise ValueError("this softmax attention keeps no memory: use mem_len 0")
        b, t, _ = h_BTD.shape
        q, k, v = self.proj(h_BTD, h_BTD)
        out = attend(q / math.sqrt(self.d_head), k[:, :, 0], v, mask_TK=mask_TK, dropatt=self.dropatt,
                     kernel=self.kernel)
        return self.o_net(out.transpose(1, 2).reshape(b, t, self.n_head * self.d_head)), None


class MGKAttention(nn.Module):
    """Softmax-family MGK / sMGK attention with the repository's attention interface (no memory).

    `forward(h_BTD, *, mem_BMD=None, mask_TK, pos=None, kv_mem=None) -> (out_BTD, None)`; `mask_TK` is any
    boolean mask broadcastable to (B, H, T, K), True where attention is forbidden (causal or padding).

    `form`, where the official code's numerics differ from the formulas (all but the E-step only in the last
    digits unless the mixture density underflows):
    - `lm_official` (`MGKAttn`): the weights are normalised as a / (Σ_j a + 1e-6) (gradient and soft π; the
      hard E-step is a plain softmax); the soft E-step's γ is π_0 e_0 / (Σ_r π_r e_r + 1e-6) and π of key
      position k is the mean of γ over all B·T (batch, query) rows, the causally masked pairs included.
    - `lra_official` (`lra/attention.py`): the soft E-step averages γ (same guard) over the (valid query, valid
      key) pairs and updates the positions that hold a real token in some example of the batch.
    - `ours`: the soft E-step averages the responsibilities over the valid (unmasked) pairs.
    """

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float, n_components: int = 2,
                 keys: KeyKind = "separate", pi: PiKind = "gradient",
                 sigma2_ratios: tuple[float, ...] = (1.0, 1.0 / 3.0), learn_variance: bool = False,
                 pi_layout: PiLayout = "head", max_klen: int = 256, form: Form = "ours", bias: bool = False):
        super().__init__()
        if len(sigma2_ratios) != n_components:
            raise ValueError(f"sigma2_ratios needs one ratio per component ({n_components}), got {sigma2_ratios}")
        if form not in FORMS:
            raise ValueError(f"form is one of {FORMS}, got {form!r}")
        if form != "ours" and pi == "soft_em" and pi_layout != "position":
            raise ValueError(f"the {form} soft E-step keeps π per key position: set pi_layout: position")
        self.n_head, self.d_head, self.form = n_head, d_head, form
        self.proj = MixtureKeys(d_model=d_model, n_head=n_head, d_head=d_head, n_components=n_components, keys=keys,
                                bias=bias)
        self.weights = MixtureWeights(n_head=n_head, n_components=n_components, pi=pi, layout=pi_layout,
                                      max_klen=max_klen)
        log_s2 = torch.log(torch.tensor(sigma2_ratios, dtype=torch.float32) * math.sqrt(d_head))
        log_s2 = log_s2[None].expand(n_head, n_components).clone()
        if learn_variance:
            self.log_sigma2 = nn.Parameter(log_s2)
        else:
            self.register_buffer("log_sigma2", log_s2)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=bias)
        self.dropatt = nn.Dropout(dropatt)
        self.norm_eps = NORM_EPS_LM if form == "lm_official" and pi != "hard_em" else 0.0

    def component_scores(self, q_BHTE, k_BHRKE) -> torch.Tensor:
        """log π_r − ‖q_i − k_jr‖² / 2σ_r², (B, H, T, K, R) (log π omitted for hard E)."""
        inv2s2 = (0.5 * torch.exp(-self.log_sigma2)).to(q_BHTE.dtype)  # (H, R)
        qk = torch.einsum("bhte,bhrke->bhtkr", q_BHTE, k_BHRKE)
        q2 = (q_BHTE * q_BHTE).sum(-1)[..., None, None]  # (B, H, T, 1, 1)
        k2 = (k_BHRKE * k_BHRKE).sum(-1).permute(0, 1, 3, 2)[:, :, None]  # (B, H, 1, K, R)
        s = -(q2 + k2 - 2 * qk).clamp_min(0.0) * inv2s2[None, :, None, None, :]
        log_pi = self.weights.log_pi(k_BHRKE.shape[3])
        if log_pi is not None:
            s = s + log_pi.to(s.dtype)
        return s

    def _soft_e_step(self, s_BHTKR: torch.Tensor, mask_TK: torch.Tensor) -> None:
        b, h, t, k, _ = s_BHTKR.shape
        if self.form == "ours":
            self.weights.e_step(torch.softmax(s_BHTKR, -1), ~mask_TK.expand(b, h, t, k))
            return
        # γ_r = π_r e_r / (Σ π e + 1e-6), stably: exp(s_r − lse) / (1 + 1e-6·exp(−lse))
        lse = torch.logsumexp(s_BHTKR, -1, keepdim=True)
        resp = torch.exp(s_BHTKR - lse) / (1.0 + ESTEP_EPS * torch.exp(-lse))
        if self.form == "lm_official":  # every (batch, query) row, masked pairs included
            self.weights.e_step(resp, torch.ones(b, h, t, k, dtype=resp.dtype, device=resp.device))
            return
        # lra_official: mask_TK is the (B, 1, 1, K) key padding; queries are the same tokens (T = K)
        valid_BK = ~mask_TK.reshape(b, k)
        w = (valid_BK[:, None, :, None] & valid_BK[:, None, None, :]).expand(b, h, t, k)
        self.weights.e_step(resp, w, update_K=valid_BK.any(0))

    def joint_probabilities(self, q_BHTE, k_BHRKE, mask_TK, *, with_lse: bool = False, score_bias=None):
        """P (B, H, T, R, K): the softmax over all R·K (component, key) pairs of the component scores, so that
        Σ_r P[..., r, j] is the attention weight of key j (softmax over j of logsumexp_r: the same number). With
        `with_lse`, (P, log-normaliser (B, H, T)): the log of Σ_j Σ_r π_r exp(−c_r‖q_i − k_jr‖²).

        The scores come from one matrix product of augmented vectors: with c_r = 1/2σ_r²,
        log π_rj − c_r‖q_i − k_jr‖² = [q_i, ‖q_i‖², 1] · [2c_r k_jr, −c_r, log π_rj − c_r‖k_jr‖²]. Unlike
        `component_scores` nothing of size (T, K, R, E) or several (T, K, R) temporaries is built, and the backward
        keeps only P. `score_bias`: None, or a term per (query, key) broadcastable to (B, H, T, K), added to every
        component's score of the key (a relative-position term: the memory arena's MGK inside Transformer-XL)."""
        inv2s2 = (0.5 * torch.exp(-self.log_sigma2)).to(q_BHTE.dtype)[None, :, :, None, None]  # (1, H, R, 1, 1)
        b, h, r, k_len, _ = k_BHRKE.shape
        q2 = (q_BHTE * q_BHTE).sum(-1, keepdim=True)
        q_aug = torch.cat([q_BHTE, q2, torch.ones_like(q2)], dim=-1)  # (B, H, T, E+2)
        k2 = (k_BHRKE * k_BHRKE).sum(-1, keepdim=True)  # (B, H, R, K, 1)
        const = -k2 * inv2s2
        log_pi = self.weights.log_pi(k_len)  # broadcastable to (B, H, T, K, R)
        if log_pi is not None:
            const = const + log_pi[:, :, 0].permute(0, 1, 3, 2)[..., None].to(const.dtype)  # (1, H, R, K|1, 1)
        k_aug = torch.cat([k_BHRKE * (2 * inv2s2), (-inv2s2).expand(b, h, r, k_len, 1), const], dim=-1)
        scores = q_aug @ k_aug.reshape(b, h, r * k_len, -1).transpose(-1, -2)  # (B, H, T, R·K)
        t = scores.shape[2]
        scores = scores.view(b, h, t, r, k_len)
        if score_bias is not None:
            scores = scores + score_bias.unsqueeze(-2).to(scores.dtype)
        scores = scores.masked_fill(mask_TK.unsqueeze(-2), float("-inf"))
        if with_lse:
            prob, lse = softmax_lse(scores.view(b, h, t, r * k_len))
            return prob.view(b, h, t, r, k_len), lse
        return torch.softmax(scores.view(b, h, t, r * k_len), dim=-1).view(b, h, t, r, k_len)

    def forward(self, h_BTD, *, mem_BMD=None, mask_TK, pos=None, kv_mem=None):
        if (mem_BMD is not None and mem_BMD.shape[1]) or kv_mem is not None:
            raise ValueError("MGK attention keeps no memory: use mem_len 0")
        b, t, _ = h_BTD.shape
        q, k, v = self.proj(h_BTD, h_BTD)
        e_step = self.weights.kind == "soft_em" and self.training
        if self.weights.kind != "hard_em" and not e_step:
            # float32, as below: squared distances lose bits in bf16
            if self.norm_eps:  # the reference's a / (Σ a + ε) is the softmax times S / (S + ε), S = Σ a
                joint, lse = self.joint_probabilities(q.float(), k.float(), mask_TK, with_lse=True)
                prob = joint.sum(-2) * torch.sigmoid(lse - math.log(self.norm_eps))[..., None]
            else:
                prob = self.joint_probabilities(q.float(), k.float(), mask_TK).sum(-2)
            out = self.dropatt(prob).to(v.dtype) @ v
            return self.o_net(out.transpose(1, 2).reshape(b, t, self.n_head * self.d_head)), None
        s = self.component_scores(q.float(), k.float())  # (B, H, T, K, R), float32: distances lose bits in bf16
        if self.weights.kind == "hard_em":
            scores = s.amax(-1)
        else:
            scores = torch.logsumexp(s, dim=-1)
            if self.weights.kind == "soft_em" and self.training:
                self._soft_e_step(s, mask_TK)
        scores = scores.masked_fill(mask_TK, float("-inf"))
        if self.norm_eps:  # a / (Σ a + eps) with a = exp(score), max-subtracted
            m = scores.amax(-1, keepdim=True).clamp_min(-1e30)
            a = torch.exp(scores - m)
            prob = a / (a.sum(-1, keepdim=True) + self.norm_eps * torch.exp(-m))
        else:
            prob = torch.softmax(scores, dim=-1)
        prob = self.dropatt(prob)
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
    """Linear attention with mixture keys (MLK / sMLK; R = 1 is plain linear attention, with no π).

    Causal attention is the prefix-sum form computed chunk by chunk (`causal_linear_attention`: O(T·(C + E)·E)
    time, O(T/C·E²) state); non-causal attention sums over the unmasked keys. `mask_TK`: the causal (T, K) mask when
    `causal`, else a padding mask broadcastable to (B, 1, 1, K).

    `form`:
    - `ours`: φ = elu + 1, φ(k_j) = Σ_r π_r φ(k_jr), out = num / (den + eps).
    - `lm_official` (attn_type 400, and 34 for R = 1): φ(q) and each φ(k_jr) divided by the sum of its own E
      entries, φ(k_j) = Σ_r π_r φ(k_jr), out = (1/√E) · num / (den + 1e-5).
    - `lra_official` (`lra/attention_linear.py`): the raw keys are mixed first, k_j = Σ_r π_r k_jr, then
      φ = elu + 1; no denominator: out = φ(Q) (φ(K)ᵀ V) / √L over the unpadded keys, L the padded length.
    """

    chunk = 64  # C of the chunked causal form

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float = 0.0, n_components: int = 2,
                 keys: KeyKind = "separate", causal: bool = True, eps: float | None = None,
                 pi_layout: PiLayout = "head", max_klen: int = 256, form: Form = "ours", bias: bool = False):
        super().__init__()
        if form not in FORMS:
            raise ValueError(f"form is one of {FORMS}, got {form!r}")
        if form == "lra_official" and causal:
            raise ValueError("the LRA linear attention is not causal")
        self.n_head, self.d_head, self.causal, self.form = n_head, d_head, causal, form
        self.eps = eps if eps is not None else (1e-5 if form == "lm_official" else 1e-6)
        self.proj = MixtureKeys(d_model=d_model, n_head=n_head, d_head=d_head, n_components=n_components, keys=keys,
                                bias=bias)
        # one component needs no weight (the official linear layers have none)
        self.weights = MixtureWeights(n_head=n_head, n_components=n_components, pi="gradient", layout=pi_layout,
                                      max_klen=max_klen) if n_components > 1 else None
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=bias)

    def _pi(self, k_len: int, dtype) -> torch.Tensor:
        """π as (1, H, R, K or 1, 1), broadcastable to k (B, H, R, K, E)."""
        return self.weights.weights(k_len)[:, :, 0].permute(0, 1, 3, 2)[..., None].to(dtype)

    def forward(self, h_BTD, *, mem_BMD=None, mask_TK=None, pos=None, kv_mem=None):
        if (mem_BMD is not None and mem_BMD.shape[1]) or kv_mem is not None:
            raise ValueError("MLK attention keeps no memory: use mem_len 0")
        b, t, _ = h_BTD.shape
        q, k, v = self.proj(h_BTD, h_BTD)
        k_len = k.shape[3]
        if self.form == "lra_official":
            return self._lra_official(q, k, v, mask_TK)
        phi_q = elu_feature_map(q)  # (B, H, T, E)
        phi_k = elu_feature_map(k)  # (B, H, R, K, E)
        if self.form == "lm_official":
            phi_q = phi_q / phi_q.sum(-1, keepdim=True)
            phi_k = phi_k / phi_k.sum(-1, keepdim=True)
        phi_k = (phi_k * self._pi(k_len, k.dtype)).sum(2) if self.weights is not None else phi_k[:, :, 0]
        if self.causal:
            num, den = causal_linear_attention(phi_q, phi_k, v, chunk=self.chunk)
        else:
            if mask_TK is not None:  # key padding (B, 1, 1, K): padded keys contribute nothing
                if mask_TK.dim() != 4 or mask_TK.shape[1] != 1 or mask_TK.shape[2] != 1:
                    raise ValueError("non-causal MLK takes a key padding mask of shape (B, 1, 1, K), "
                                     f"got {tuple(mask_TK.shape)}")
                phi_k = phi_k * (~mask_TK).to(phi_k.dtype).reshape(b, 1, -1, 1)
            kv = torch.einsum("bhke,bhkf->bhef", phi_k, v)
            num = phi_q @ kv
            den = (phi_q * phi_k.sum(2, keepdim=True)).sum(-1, keepdim=True)
        out = num / (den + self.eps)
        if self.form == "lm_official":
            out = out / math.sqrt(self.d_head)
        return self.o_net(out.transpose(1, 2).reshape(b, t, self.n_head * self.d_head)), None

    def _lra_official(self, q, k, v, mask_TK):
        b, _, t, _ = q.shape
        k = (k * self._pi(k.shape[3], k.dtype)).sum(2) if self.weights is not None else k[:, :, 0]  # raw keys mixed
        keep = torch.ones(b, 1, t, 1, dtype=q.dtype, device=q.device)
        if mask_TK is not None:
            keep = (~mask_TK).to(q.dtype).reshape(b, 1, -1, 1)
        phi_q = elu_feature_map(q)
        phi_k = elu_feature_map(k) * keep
        out = phi_q @ (phi_k.transpose(-1, -2) @ (v * keep)) / math.sqrt(t)  # √L: lra code divides Q and K by L^¼
        return self.o_net(out.transpose(1, 2).reshape(b, t, self.n_head * self.d_head)), None
