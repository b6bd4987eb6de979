"""LaMemo: language modelling with look-ahead memory (Ji, Zhang, Huang; NAACL 2022, arXiv 2204.07341).

Reference code: thu-coai/LaMemo `pytorch/mem_transformer.py` (`LaMemoRelPartialLearnableMultiHeadAttn`, the
model's forward for attn_type 3, 31, 32, 33). Built on this repository's Transformer-XL backbone
(`papers/transformer_xl/model.py`): same embedding, layers, relative attention, adaptive softmax and
initialisation. Layout legend: B batch, T segment length, M memory length, K = M + T, W = min(M, T) look-ahead
keys, H heads, E head width, D model width; batch-first.

The mechanism (paper §3):
- Look-ahead attention. Transformer-XL's memory states were computed once, attending only to their left. In
  LaMemo every layer also lets each memory position attend, as a query, to the keys on its right that it has not
  seen yet, up to and including the first token of the current segment (never further: a current token reads
  the refreshed memory in the next layer, so a memory row that had seen token τ+2 would leak it to the
  prediction made at τ+1). These new keys are the last W−1 memory positions and the current segment's first
  position; a memory row attends to those after itself. Cost: M·W scores per layer, linear in M.
- Memory interpolation. The refreshed attention vector of a memory position is its previous one (carried,
  stop-gradient) and the look-ahead result, weighted by their shares of the unnormalised attention mass:
  α = S_old / (S_old + S_new), S = Σ exp(score) over each key set. That is exactly softmax attention over the
  union of the two key sets (`interpolate`). The log-normaliser log S of every memory position is carried with
  the memory and updated by log-add-exp.
- Disentangled relative positions. The look-ahead scores use the sinusoid of the distance 1…M to the right with
  a separate position bias v₊ (`r_r_bias_future`), the content bias u shared (variant `disentangled`, the
  reference's attn_type 3, the default); `txl` (attn_type 31) feeds negative distances to Transformer-XL's
  encoding with its bias v; `disentangled_v2` (attn_type 32) also learns a separate content bias u₊; `full`
  (attn_type 33) lets memory rows attend to every key of the look-ahead window, left and right (no mask).

What the memory holds (as the reference): per layer the attention vectors of the memory positions (before the
output projection) and their log-normalisers, plus the embedding-level memory (the layer-0 input). In each
layer the refreshed memory rows go through the output projection, residual, LayerNorm and feed-forward together
with the current rows, and are the memory input of the next layer: the refresh propagates upwards.

Where this differs from the reference (and why):
- α = sigmoid(log S_old − log S_new), the exact share; the reference adds 1e-6 to the denominator after
  subtracting the maximum, which makes α smaller by at most ~1e-6 relatively and breaks the union identity by as
  much.
- Position scores of the look-ahead: in blocks of W memory rows, the rows' queries against the position vectors
  of the distances they reach (`window_position_scores`), then each row's window picked by distance (key index −
  row index), instead of the reference's shift tricks (`_rel_shift_future`, `_rel_shift_full`). For attn_type
  3/31/32 the numbers are the same; for `full` the reference's index arithmetic needs a memory at least as long
  as the segment (mem_len ≥ tgt_len; with a shorter one its forward raises a shape error), ours holds for any
  lengths and equals the reference whenever mem_len ≥ tgt_len (tests/parity/test_lamemo_parity.py: `attn33`,
  `attn33_longmem`).
- Work whose result nothing reads is skipped: the last layer's memory rows get no output projection,
  LayerNorm or feed-forward (they would feed the layer above, and there is none), and its look-ahead refreshes
  only the memory rows the next memory keeps (none when mem_len ≤ tgt_len, as in the paper's settings). The
  reference computes both; the outputs and the next memory are the same.
- Memory states are batch-first tensors, one list: [embedding memory (B, M, D)] + per layer [attention vectors
  (B, M, H, E), log-normalisers (B, M, H) float32], so checkpoints and DDP re-sharding carry them unchanged.
- With `look_ahead: false` the model is the backbone's Transformer-XL exactly (same state dict, same outputs);
  the reference's attn_type 0 is the original Transformer-XL code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import nn

from papers.transformer_xl.model import DecoderLayer, TransformerXL, TransformerXLConfig
from repro.memory import MemoryMechanism, register
from repro.nn.attention import (
    RelPartialLearnableAttention,
    causal_mask,
    rel_shift,
    relative_distances,
    sinusoid_table,
    softmax_lse,
)
from repro.nn.dropout import dropout_matmul

VARIANTS = ("disentangled", "txl", "disentangled_v2", "full")
REFERENCE_ATTN_TYPE = {"disentangled": 3, "txl": 31, "disentangled_v2": 32, "full": 33}


@dataclass(frozen=True)
class LaMemoConfig:
    """`look_ahead: false` gives Transformer-XL (the reference's attn_type 0); `variant` names the reference's
    attn_type 3 (`disentangled`, default), 31 (`txl`), 32 (`disentangled_v2`) and 33 (`full`)."""

    look_ahead: bool = True
    variant: Literal["disentangled", "txl", "disentangled_v2", "full"] = "disentangled"

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"lamemo.variant is one of {', '.join(VARIANTS)}, got {self.variant!r}")


def interpolate(vec_old: torch.Tensor, lse_old: torch.Tensor, vec_new: torch.Tensor, lse_new: torch.Tensor):
    """Combine two softmax attentions over disjoint key sets into the attention over their union.

    vec_*: (…, E) attention results, lse_*: (…) their log-normalisers log Σ exp(score). With α = S_old/(S_old +
    S_new) = sigmoid(lse_old − lse_new): vec = α·vec_old + (1−α)·vec_new and lse = logaddexp(lse_old, lse_new).
    Returns (vec in vec_new's dtype, lse in float32)."""
    lse_old, lse_new = lse_old.float(), lse_new.float()
    alpha = torch.sigmoid(lse_old - lse_new).unsqueeze(-1)
    vec = alpha * vec_old.float() + (1 - alpha) * vec_new.float()
    return vec.to(vec_new.dtype), torch.logaddexp(lse_old, lse_new)


def look_ahead_start(m: int, t: int) -> int:
    """Index in [memory; segment] of the first look-ahead key: the window is keys start … m (the segment's first
    position), W = min(m, t) keys, the positions no memory row has attended to yet."""
    return max(1, m - t + 1)


class LaMemoAttention(RelPartialLearnableAttention):
    """Transformer-XL's relative attention (same parameters: `qkv_net`, `r_net`, `o_net`) that also returns the
    attention vectors and log-normalisers, and refreshes memory rows by look-ahead attention (`look_ahead`).

    The look-ahead is written once, in terms of four score hooks that another attention may give: `rows` (queries,
    keys and values of every row), `key_window` (the window's keys), `position_scores` (terms (b) + (d)) and
    `scored` (the content score with the position term and the mask added, its softmax, the values). MGK inside
    Transformer-XL (`papers.arena.mgk.LookAheadMGKAttention`) runs this `look_ahead` with its mixture score.

    `record`: when a list, each causal attention appends its probabilities (B, H, T, K) (utilisation analysis)."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float, full: bool = False):
        super().__init__(d_model=d_model, n_head=n_head, d_head=d_head, dropatt=dropatt)
        self.full = full
        self.record: list[torch.Tensor] | None = None

    # ---------------------------------------------------------------------------------------- the score hooks
    def rows(self, x_BKD):
        """(queries, keys, values), each (B, H, K, E), of every row of x. One projection of the K rows gives the
        queries of both kinds of row and the keys and values (the reference's single `qkv_net` call on [memory;
        segment]), unbound once: each indexing of a stacked (2, B, H, K, E) tensor would cost a zero-filled tensor
        of that size in backward."""
        b, k_len, _ = x_BKD.shape
        heads = self.qkv_net(x_BKD).view(b, k_len, 3, self.n_head, self.d_head).permute(2, 0, 3, 1, 4)
        q_BHKE, k_BHKE, v_BHKE = heads.unbind(0)
        return q_BHKE, k_BHKE.contiguous(), v_BHKE.contiguous()

    @staticmethod
    def key_window(k_BHKE, start: int, end: int):
        return k_BHKE[:, :, start:end]

    def position_scores(self, q_BHTE, r_KD, v_HE):
        """Terms (b) + (d): (q_i + v) · W_R R_{i−j} / √E, (B, H, T, K)."""
        r_HEK = self.r_net(r_KD).view(-1, self.n_head, self.d_head).permute(1, 2, 0)
        return rel_shift(((q_BHTE + v_HE[:, None]) * self.scale) @ r_HEK)

    def scored(self, q_BHTE, k_BHKE, v_BHKE, u_HE, position_BHTK, bias_TK, *, record: bool = False):
        """Transformer-XL's scores (a)+(c) plus `position_BHTK` and `bias_TK` (0 where a query may attend, −inf
        where not, or None; added: the same scores as masking, and nothing to do in backward) → (vectors
        (B,H,T,E), lse (B,H,T))."""
        scores = ((q_BHTE + u_HE[:, None]) * self.scale) @ k_BHKE.transpose(-1, -2)
        scores = scores.add_(position_BHTK)
        if bias_TK is not None:
            scores = scores.add_(bias_TK)
        prob, lse = softmax_lse(scores)
        if record and self.record is not None:
            self.record.append(prob.detach())
        # dropout and the value product in one (`repro.nn.dropout.dropout_matmul`: a bool mask kept, not the dropped
        # probabilities; same numbers)
        return dropout_matmul(prob, v_BHKE, self.dropatt), lse

    # ---------------------------------------------------------------------------------------------- the layer
    def forward(self, h_BTD, *, mem_BMD, mask_TK, pos, kv_mem=None):
        """The backbone's interface (Transformer-XL memory): (output, keys/values)."""
        if kv_mem is not None:
            raise ValueError("LaMemo keeps no key/value memory")
        r_KD, u_HE, v_HE = pos[:3]
        q_BHTE, kv = self.project(h_BTD, mem_BMD)
        k_BHKE, v_BHKE = kv.unbind(0)
        vec, _ = self.scored(q_BHTE, k_BHKE, v_BHKE, u_HE, self.position_scores(q_BHTE, r_KD, v_HE),
                             mask_bias(mask_TK), record=True)
        return self.output(vec), kv

    def window_scores(self, qm_BHME, r_KD, r_fut_MD, v_fut_HE, index_MW, *, m: int, t: int, first: int):
        """The look-ahead's position scores of memory rows first…m over their windows (`window_position_scores`),
        with the future table (after the causal one for `full`)."""
        table = torch.cat([r_KD, r_fut_MD], dim=0) if self.full else r_fut_MD
        r_HEN = self.r_net(table).view(-1, self.n_head, self.d_head).permute(1, 2, 0).to(qm_BHME.dtype)
        return window_position_scores((qm_BHME + v_fut_HE[:, None]) * self.scale, r_HEN, index_MW, m=m, t=t,
                                      first=first, full=self.full)

    def look_ahead(self, x_BKD, m: int, *, bias_TK, pos, recur_BMHE, lse_BMH, first: int = 0,
                   memory_output: bool = True):
        """Rows m… of x (the current segment): causal attention over all of x ([memory; segment]). Memory rows
        first…m: look-ahead attention over the window, interpolated with their carried vectors (rows before
        `first` are not refreshed: for the last layer, whose memory rows feed no further layer, only those kept in
        the next memory are). Returns (output of the current rows (B,T,D), output of the memory rows (B,M,D) or
        None without `memory_output`, refreshed vectors (B,m−first,H,E) and log-normalisers (B,m−first,H) float32
        of the memory rows (None when first ≥ m), vectors (B,T,H,E) and log-normalisers (B,T,H) of the current
        rows)."""
        r_KD, u_HE, v_HE, r_fut_MD, u_fut_HE, v_fut_HE, window = pos
        b, k_len, _ = x_BKD.shape
        q, k, v = self.rows(x_BKD)
        q_cur = q[:, :, m:]
        vec, lse = self.scored(q_cur, k, v, u_HE, self.position_scores(q_cur, r_KD, v_HE), bias_TK, record=True)
        out_cur, vec_cur, lse_cur = self.output(vec), vec.transpose(1, 2), lse.transpose(1, 2)
        if memory_output and first:
            raise ValueError("the memory rows' output needs every memory row refreshed (first = 0)")
        if first >= m:
            empty = x_BKD.new_empty(b, 0, x_BKD.shape[2]) if memory_output else None
            return out_cur, empty, None, None, vec_cur, lse_cur
        qm_BHME = q[:, :, first:m]
        start, index_MW, bias_MW = window
        bd_BHMW = self.window_scores(qm_BHME, r_KD, r_fut_MD, v_fut_HE, index_MW, m=m, t=k_len - m, first=first)
        vec_new, lse_new = self.scored(qm_BHME, self.key_window(k, start, m + 1), v[:, :, start : m + 1], u_fut_HE,
                                       bd_BHMW, bias_MW[first:] if bias_MW is not None else None)
        vec_mem, lse_mem = interpolate(recur_BMHE[:, first:], lse_BMH[:, first:], vec_new.transpose(1, 2),
                                       lse_new.transpose(1, 2))
        out_mem = self.o_net(vec_mem.reshape(b, m - first, -1)) if memory_output else None
        return out_cur, out_mem, vec_mem, lse_mem, vec_cur, lse_cur


def window_position_scores(qm_BHME, r_HEN, index_MW, *, m: int, t: int, first: int, full: bool) -> torch.Tensor:
    """The look-ahead's position scores (B, H, M − first, W) of memory rows first…m: each row's query against the
    position vectors of its window's distances, `r_HEN[..., index_MW[row, w]]`.

    A row's W distances are consecutive entries of the table, one entry lower per row. Rows go in blocks of W:
    each block's queries times the 2W − 1 table entries its rows reach (one product), then each row's W picked by
    index. At most 2 × M × W × E multiply-adds per head, linear in the memory length whatever the table's length,
    and no (M, W, H, E) gather of the position vectors (the backward of such a gather accumulates into the whole
    table: slow, and at the enwik8 shape 134M values per layer). With M ≤ T (W = M) this is one block (for the
    future table, all of it)."""
    start = look_ahead_start(m, t)
    w = m - start + 1
    base = m + t - 1 + start if full else start - 1  # index of (row i, key w') = base + w' − i (clamped at 0)
    n = r_HEN.shape[-1]
    parts = []
    for i0 in range(first, m, w):
        i1 = min(i0 + w, m)
        lo, hi = max(0, base - (i1 - 1)), min(n - 1, base + w - 1 - i0)
        part = qm_BHME[:, :, i0 - first : i1 - first] @ r_HEN[..., lo : hi + 1]
        index = index_MW[i0:i1] - lo
        parts.append(part.gather(-1, index.expand(*part.shape[:2], *index.shape)))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def mask_bias(mask: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """A boolean mask (True = may not attend) as an additive score bias: 0 or −inf."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))


def look_ahead_window(m: int, t: int, *, full: bool, device=None):
    """What every layer's look-ahead needs of the window: (its first key `start`, the (M, W) index into the
    position table of each (memory row, window key) pair, the (M, W) score bias: −inf at keys not on a row's
    right, 0 elsewhere, or None). The table is the future sinusoids (distance d = key − row ≥ 1 at index d − 1)
    or, for `full`, the causal ones (distances K−1 … 0) followed by the future ones (distance d at index
    K − 1 + d)."""
    start = look_ahead_start(m, t)
    dist_MW = torch.arange(start, m + 1, device=device)[None, :] - torch.arange(m, device=device)[:, None]
    if full:
        return start, m + t - 1 + dist_MW, None
    return start, (dist_MW - 1).clamp(min=0), mask_bias(dist_MW < 1)


def layer_look_ahead(layer: DecoderLayer, h_BTD, mem_BMD, *, bias_TK, pos, recur_BMHE, lse_BMH, first: int = 0,
                     memory_output: bool = True, read=None):
    """One backbone layer with look-ahead memory: the memory rows and the current rows go through the attention
    (`LaMemoAttention.look_ahead`), residual, LayerNorm and feed-forward together. Returns (current rows' output,
    memory rows' output = the next layer's memory, and the attention's vectors and log-normalisers as
    `look_ahead` returns them). Without `memory_output` (the last layer, whose memory rows feed no further layer)
    only the current rows go on after the attention, and the memory rows' output is None. `read`: None, or a
    function of the current rows' attention input whose result is added to their attention output (a memory
    mechanism's read, `repro.memory.MemoryMechanism.read`; the memory rows get none)."""
    m = mem_BMD.shape[1]
    x = torch.cat([mem_BMD.to(h_BTD.dtype), h_BTD], dim=1)
    xn = layer.attn_norm(x) if layer.pre_lnorm else x
    a_cur, a_mem, *attention = layer.attn.look_ahead(xn, m, bias_TK=bias_TK, pos=pos, recur_BMHE=recur_BMHE,
                                                     lse_BMH=lse_BMH, first=first, memory_output=memory_output)
    if read is not None:
        term = read(xn[:, m:])
        if term is not None:
            a_cur = a_cur + term.to(a_cur.dtype)
    if a_mem is None:
        x, a, m = h_BTD, a_cur, 0
    else:
        a = torch.cat([a_mem.to(a_cur.dtype), a_cur], dim=1)
    if layer.pre_lnorm:
        y = x + layer.drop(a)
        y = y + layer.ff(layer.ff_norm(y))
    else:
        y = layer.attn_norm(x + layer.drop(a))
        y = layer.ff_norm(y + layer.ff(y))
    return y[:, m:], (y[:, :m] if memory_output else None), *attention


class LaMemo(TransformerXL):
    """`TransformerXL` with the look-ahead memory (`LookAhead`) in its loop. Memory: [embeddings (B,M,D)] + per
    layer [vectors (B,M,H,E), log-normalisers (B,M,H)]; with `look_ahead: false`, Transformer-XL's memory (one
    (B,M,D) per layer)."""

    def __init__(self, cfg: TransformerXLConfig, lamemo: LaMemoConfig = LaMemoConfig()):
        if cfg.attention != "relative":
            raise ValueError("LaMemo builds on relative attention: set model.attention: relative")
        self.__dict__["_lamemo"] = lamemo  # read by make_attention during the backbone's construction
        super().__init__(cfg, [(LookAhead, {"variant": lamemo.variant})] if lamemo.look_ahead else [])
        self.lamemo = lamemo
        # the parameter order of LaMemo's own model (the reference's): the look-ahead biases beside the backbone's
        # biases, before the embedding and the layers. Gradient clipping sums the parameters' norms in this order,
        # so that a run takes the same steps to the last bit, as it did with the biases held by the model itself
        for name in [n for n in self._modules if n != "mechanisms"]:
            self._modules[name] = self._modules.pop(name)
        self.register_load_state_dict_pre_hook(_renamed_future_biases)

    @property
    def supports_kv_memory(self) -> bool:
        return False  # the refreshed memory changes every segment: no cached keys and values

    def make_attention(self, cfg: TransformerXLConfig) -> nn.Module:
        lamemo: LaMemoConfig = self.__dict__["_lamemo"]
        return LaMemoAttention(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, dropatt=cfg.dropatt,
                               full=lamemo.look_ahead and lamemo.variant == "full")

    def __getattr__(self, name: str):
        if name in ("r_r_bias_future", "r_w_bias_future"):  # the look-ahead's biases, held by its mechanism
            mechanisms = self._modules.get("mechanisms")
            if mechanisms is not None and len(mechanisms) and hasattr(mechanisms[0], name):
                return getattr(mechanisms[0], name)
        return super().__getattr__(name)

    def memory_layout(self, batch: int, device=None, dtype=torch.float32) -> list[torch.Tensor]:
        """The empty memory of a split's first segment."""
        return self.empty_memory(batch, torch.empty(0, device=device, dtype=dtype))


def _renamed_future_biases(module, state_dict, prefix, *args) -> None:
    """Checkpoints that hold the future biases at the model's top level (as the reference's model holds them) load
    into the look-ahead mechanism."""
    for name in ("r_r_bias_future", "r_w_bias_future"):
        if prefix + name in state_dict:
            state_dict[prefix + "mechanisms.0." + name] = state_dict.pop(prefix + name)


def look_ahead_inputs(model: TransformerXL, m: int, t: int, *, variant: str, u_fut, v_fut, clamp_len: int,
                      same_length: bool, mem_len: int, like: torch.Tensor):
    """What every look-ahead layer reads: (`pos` of `LaMemoAttention.look_ahead`, the causal score bias (T, K)),
    for a memory of m rows and a segment of t; `u_fut`, `v_fut` the look-ahead's content and position biases. The
    model's dropout draws the positions' masks (causal table, then the future one)."""
    k = m + t
    dev, dt = like.device, like.dtype
    mask_TK = causal_mask(t, k, same_length=same_length, span=mem_len, device=dev)
    r_KD = sinusoid_table(relative_distances(k, clamp_len=clamp_len, device=dev), model.cfg.d_model).to(dt)
    fut = torch.arange(1, m + 1, device=dev)
    if variant == "txl":
        fut = -fut
    elif clamp_len > 0:
        fut = fut.clamp(max=clamp_len)
    r_fut = sinusoid_table(fut, model.cfg.d_model).to(dt)
    window = look_ahead_window(m, t, full=variant == "full", device=dev) if m else None
    pos = (model.drop(r_KD), model.r_w_bias, model.r_r_bias, model.drop(r_fut), u_fut, v_fut, window)
    return pos, mask_bias(mask_TK)


class LookAheadSegment(NamedTuple):
    """What every layer step of one segment shares: the positions and biases (`look_ahead_inputs`), the mask's
    additive bias, the memory's length m, how many rows of [memory; segment] leave the memory (`keep`: the next
    memory is positions keep… of them, `evict_oldest`'s cut) and the index of the last layer."""

    pos: tuple
    bias_TK: torch.Tensor
    m: int
    keep: int
    last: int


@register("look_ahead")
class LookAhead(MemoryMechanism):
    """LaMemo's look-ahead memory as a mechanism of the backbone's loop: it owns the layer step (`layer_step`, one
    layer of `layer_look_ahead`). The short memory it keeps is the embedding memory (the layer-0 input of the
    memory rows); state per layer: (attention vectors (B, M, H, E), log-normalisers (B, M, H) float32) of the
    memory rows, laid out by layer as the reference's memory. Other mechanisms read on the current rows and
    receive, per layer, the layer's inputs of the rows leaving the memory."""

    slots = ("vectors", "lse")
    layout = "by_layer"
    owns_layer_step = True

    def __init__(self, cfg: TransformerXLConfig, variant: str = "disentangled"):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"look_ahead.variant is one of {', '.join(VARIANTS)}, got {variant!r}")
        if cfg.attention != "relative":
            raise ValueError("the look-ahead memory builds on relative attention: set model.attention: relative")
        self.variant = variant
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        # Xavier uniform, as LaMemo (the reference's `weights_init` leaves the look-ahead biases as drawn)
        if variant in ("disentangled", "disentangled_v2", "full"):
            self.r_r_bias_future = nn.Parameter(nn.init.xavier_uniform_(torch.empty(cfg.n_head, cfg.d_head)))
        if variant == "disentangled_v2":
            self.r_w_bias_future = nn.Parameter(nn.init.xavier_uniform_(torch.empty(cfg.n_head, cfg.d_head)))

    @classmethod
    def layer_attention(cls, cfg: TransformerXLConfig, variant: str = "disentangled") -> nn.Module:
        """The attention the backbone's layers are built with."""
        return LaMemoAttention(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, dropatt=cfg.dropatt,
                               full=variant == "full")

    def layer_inputs(self, model, *, emb_BTD, memory_BMD, mem_len, clamp_len, same_length):
        """The segment's positions, biases and mask (`look_ahead_inputs`), drawn before the embeddings' dropout as
        the reference draws them."""
        m, t = memory_BMD.shape[1], emb_BTD.shape[1]
        u_fut, v_fut = self.future_biases(model)
        pos, bias_TK = look_ahead_inputs(model, m, t, variant=self.variant, u_fut=u_fut, v_fut=v_fut,
                                         clamp_len=clamp_len, same_length=same_length, mem_len=mem_len, like=emb_BTD)
        shared = LookAheadSegment(pos, bias_TK, m, keep=max(0, m + t - mem_len), last=len(model.layers) - 1)
        return model.drop(emb_BTD), shared

    def layer_step(self, i, layer, h_BTD, memory_BMD, *, shared, state, read):
        """`layer_look_ahead`, then the layer's next state: the attention vectors and log-normalisers of the rows the
        next memory keeps (refreshed memory rows, then the segment's); the last layer refreshes only those."""
        m, keep = shared.m, shared.keep
        last = i == shared.last
        first = min(keep, m) if last else 0
        h, mem, vec_mem, lse_mem, vec_cur, lse_cur = layer_look_ahead(
            layer, h_BTD, memory_BMD, bias_TK=shared.bias_TK, pos=shared.pos, recur_BMHE=state[0], lse_BMH=state[1],
            first=first, memory_output=not last, read=read)
        if keep >= m:  # the memory rows drop out of the next memory
            vec, lse = vec_cur[:, keep - m :], lse_cur[:, keep - m :]
        else:  # refreshed rows first… (first ≤ keep) are rows keep… of [memory; segment]
            vec = torch.cat([vec_mem[:, keep - first :], vec_cur.to(vec_mem.dtype)], dim=1)
            lse = torch.cat([lse_mem[:, keep - first :], lse_cur], dim=1)
        return h, mem, (vec.detach(), lse.detach())

    def empty(self, batch, like):
        return (like.new_empty(batch, 0, self.n_head, self.d_head),
                like.new_empty(batch, 0, self.n_head).float())

    def future_biases(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """(u₊, v₊): the look-ahead's content and position biases for the variant."""
        v_fut = model.r_r_bias if self.variant == "txl" else self.r_r_bias_future
        u_fut = self.r_w_bias_future if self.variant == "disentangled_v2" else model.r_w_bias
        return u_fut, v_fut
