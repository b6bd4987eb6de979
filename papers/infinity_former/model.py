"""The ∞-former on the repository's Transformer-XL backbone (Martins, Marinho, Martins; ACL 2022, §3, Fig. 1).

Reference code: deep-spin/infinite-former `sorting/mem_transformer.py` (`RelPartialLearnableMultiHeadAttn` with
`long_term_attention`) and `sorting/long_term_attention.py`. Layout legend: B batch, T segment length, S short-term
memory length, P vectors waiting to enter the long-term memory, N basis functions, K histogram bins, D width.

Each layer keeps Transformer-XL's short-term memory (STM: the last `mem_len` inputs of the layer, attended with
relative positions) and a continuous long-term memory (`ltm.ContinuousLTM`): the vectors that leave the STM enter
the LTM at the next segment, whose attention output (with the self-attention's queries) is added to the
self-attention output before the residual, LayerNorm and feed-forward (Eq. 12: Z = Z_T + Z_LTM).

The memory is a list of batch-first tensors, so `SegmentLM` checkpoints, restores and re-shards it like
Transformer-XL's:
- LTM off: one (B, S, D) tensor per layer — exactly Transformer-XL's memory;
- LTM on: 4 × n_layer tensors, `[STM ×n, pending ×n, coefficients ×n, histogram ×n]`: the STM (B, S, D); the
  vectors evicted from the STM at the last segment, not yet in the LTM (B, P, D); the signal's coefficients
  (B, N, D), (B, 0, D) before the first fit; the sticky histogram of the last step's attention (B, K), (B, 0)
  without sticky memories.
The official code evicts through a memory of mem_len + augment_len states and reads the older half; carrying the
evicted block explicitly is the same for its setting (segment = STM = augment length) and stays right when the
segment length differs from the STM length. The gate's gradient flows through the pending block as in the
official code, where the block is gated inside the step that fits it.

With `ltm=None` this is Transformer-XL weight for weight (same parameters, same initialisation, same outputs and
memory); `tests/test_infinity_former.py` checks it against `papers.transformer_xl.model.TransformerXL`.

Deviations (also in README.md): the LTM query is the self-attention query without the u bias, as the official
code; relative attention only (the official sorting runs use attn_type 0); no key/value evaluation memory.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papers.infinity_former.ltm import ContinuousLTM, LTMConfig, LTMStep
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.memory import evict_oldest
from repro.nn.attention import RelPartialLearnableAttention, causal_mask, relative_distances, sinusoid_table


@dataclass
class LTMContext:
    """One layer's long-term memory for one forward pass: inputs, and the step's results written back."""

    coef_BND: torch.Tensor | None
    pending_BPD: torch.Tensor | None
    hist_BK: torch.Tensor | None
    step: LTMStep | None = None


class InfinityAttention(RelPartialLearnableAttention):
    """Transformer-XL attention plus, when configured, the continuous LTM attention added to its output.

    `pos` is (r_KD, u_HE, v_HE, ctx): Transformer-XL's positions and biases, and this layer's `LTMContext`."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float, ltm: LTMConfig | None):
        super().__init__(d_model=d_model, n_head=n_head, d_head=d_head, dropatt=dropatt)
        self.ltm = ContinuousLTM(d_model=d_model, n_head=n_head, d_head=d_head, cfg=ltm) if ltm is not None else None

    def forward(self, h_BTD, *, mem_BMD, mask_TK, pos, kv_mem=None):
        r_KD, u_HE, v_HE, ctx = pos
        out, kv = super().forward(h_BTD, mem_BMD=mem_BMD, mask_TK=mask_TK, pos=(r_KD, u_HE, v_HE), kv_mem=kv_mem)
        if self.ltm is None or ctx is None:
            return out, kv
        b, t, _ = h_BTD.shape
        he = self.n_head * self.d_head
        # the self-attention's queries (the official LTM reads `w_head_q`, without the u bias)
        q_BHTE = F.linear(h_BTD, self.qkv_net.weight[:he]).view(b, t, self.n_head, self.d_head).transpose(1, 2)
        z_BTD, ctx.step = self.ltm(q_BHTE, coef_BND=ctx.coef_BND, new_BPD=ctx.pending_BPD, hist_BK=ctx.hist_BK)
        if z_BTD is not None:
            out = out + z_BTD.to(out.dtype)  # Z = Z_T + Z_LTM (Eq. 12), before residual, LayerNorm and FF
        return out, kv


class InfinityFormer(TransformerXL):
    """`forward(tokens, mems, mem_len=…) -> (hidden, new_mems)` with mem_len = the STM length; `aux_losses()`
    gives the last forward's λ_KL-weighted KL term, `diagnostics()` its unweighted KL and, inside `measuring_fit()`,
    the fits' regression error."""

    supports_memory = True

    def __init__(self, cfg: TransformerXLConfig, ltm: LTMConfig | None):
        if cfg.attention != "relative":
            raise ValueError("the ∞-former backbone uses Transformer-XL's relative attention: "
                             "set model.attention: relative")
        self.__dict__["_ltm_cfg"] = ltm  # read by make_attention during the backbone's construction
        super().__init__(cfg)
        self.ltm_cfg = ltm
        self._aux: dict[str, torch.Tensor] = {}
        self._diag: dict[str, torch.Tensor] = {}

    @property
    def supports_kv_memory(self) -> bool:
        return False

    def make_attention(self, cfg: TransformerXLConfig) -> nn.Module:
        return InfinityAttention(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, dropatt=cfg.dropatt,
                                 ltm=self.__dict__["_ltm_cfg"])

    def aux_losses(self) -> dict[str, torch.Tensor]:
        return dict(self._aux)

    def diagnostics(self) -> dict[str, torch.Tensor]:
        return dict(self._diag)

    @contextmanager
    def measuring_fit(self):
        """Evaluation forward passes inside also measure the LTM fits' reconstruction error
        (`diagnostics()["regression_error"]`); outside, an evaluation does only the model's work."""
        ltms = [m for m in self.modules() if isinstance(m, ContinuousLTM)]
        before = [m.measure_fit for m in ltms]
        for m in ltms:
            m.measure_fit = True
        try:
            yield
        finally:
            for m, b in zip(ltms, before):
                m.measure_fit = b

    # ------------------------------------------------------------------------------------------------ memory
    def _unpack(self, mems, b: int, like: torch.Tensor):
        n, d = self.cfg.n_layer, self.cfg.d_model
        ltm = self.ltm_cfg is not None
        if not mems:
            empty = like.new_empty(b, 0, d)
            return [empty] * n, [empty] * n, [empty.float()] * n, [like.new_empty(b, 0).float()] * n
        expected = 4 * n if ltm else n
        if len(mems) != expected:
            raise ValueError(f"the memory holds {len(mems)} tensors, this model expects {expected} "
                             f"({'STM, pending, coefficients, histogram' if ltm else 'STM'} per layer): "
                             "it comes from another model; start with an empty memory")
        if not ltm:
            return list(mems), None, None, None
        return list(mems[:n]), list(mems[n : 2 * n]), list(mems[2 * n : 3 * n]), list(mems[3 * n :])

    # ------------------------------------------------------------------------------------------------- forward
    def forward(self, tokens_BT, mems, *, mem_len: int, clamp_len: int = -1, same_length: bool = False,
                kv_memory: bool = False):
        if kv_memory:
            raise ValueError("the ∞-former keeps a hidden-state memory; evaluate without kv_memory")
        b, t = tokens_BT.shape
        emb = self.word_emb(tokens_BT)
        stm, pending, coef, hist = self._unpack(mems, b, emb)
        m = stm[0].shape[1]
        k = m + t
        mask_TK = causal_mask(t, k, same_length=same_length, mem_len=mem_len, device=emb.device)
        pos_KD = sinusoid_table(relative_distances(k, clamp_len=clamp_len, device=emb.device), self.cfg.d_model)
        h = self.drop(emb)
        r = self.drop(pos_KD.to(emb.dtype))
        ltm = self.ltm_cfg is not None
        inputs, ctxs = [], []
        for i, layer in enumerate(self.layers):
            ctx = LTMContext(coef[i], pending[i], hist[i]) if ltm else None
            ctxs.append(ctx)
            inputs.append(h)
            h, _ = layer(h, mem_BMD=stm[i], mask_TK=mask_TK, pos=(r, self.r_w_bias, self.r_r_bias, ctx))
        new_mems = self._update(stm, inputs, ctxs, coef, hist, mem_len=mem_len)
        self._collect(ctxs)
        return self.drop(h), new_mems

    @torch.no_grad()
    def _update(self, stm, inputs, ctxs, coef, hist, *, mem_len: int) -> list[torch.Tensor]:
        """STM: the last mem_len layer inputs of [STM; segment] (Transformer-XL); with the LTM, the rest is the
        block evicted from the STM, which the next segment appends to the LTM (§3.2)."""
        kept = [evict_oldest(s, x, mem_len) for s, x in zip(stm, inputs)]
        new_stm, evicted = [k for k, _ in kept], [e for _, e in kept]
        if self.ltm_cfg is None:
            return new_stm
        new_coef, new_hist = [], []
        for ctx, c, hs in zip(ctxs, coef, hist):
            step = ctx.step
            new_coef.append(step.coef_BND.detach().float() if step is not None and step.coef_BND is not None else c)
            new_hist.append(step.hist_BK.float() if step is not None and step.hist_BK is not None else hs)
        return new_stm + evicted + new_coef + new_hist

    def _collect(self, ctxs) -> None:
        self._aux, self._diag = {}, {}
        steps = [c.step for c in ctxs if c is not None and c.step is not None]
        kls = [s.kl for s in steps if s.kl is not None]
        if kls:
            kl = torch.stack(kls).sum()  # mean over batch, heads, queries; summed over layers (official)
            self._diag["ltm_kl"] = kl.detach()
            if self.ltm_cfg.kl_weight > 0:
                self._aux["ltm_kl"] = self.ltm_cfg.kl_weight * kl
        errs = [s.regression_error for s in steps if s.regression_error is not None]
        if errs:
            self._diag["regression_error"] = torch.stack(errs).mean().detach()
