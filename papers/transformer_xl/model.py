"""Transformer-XL (Dai, Yang, Yang, Carbonell, Le, Salakhutdinov; ACL 2019, arXiv 1901.02860).

Reference code: kimiyoung/transformer-xl `pytorch/mem_transformer.py` (`MemTransformerLM`, attn_type 0 and 2).
Read top-down: config → decoder layer → model. Layout legend: B batch, T segment length, M memory length,
K = M + T, D model width; tensors are batch-first (the reference is time-first).

Where this differs from the reference (and why):
- Queries are projected for the current segment only; the reference projects q, k, v for [memory; segment] and
  throws the memory queries away. Same weights (one `qkv_net`), same result, a third less projection work.
- Only the inputs of the n_layer layers are kept as memory; the reference also caches the last layer's output,
  which nothing reads.
- `attention="absolute"` (the reference's attn_type 2) adds the positions to the layer-0 memory out of place;
  the reference adds them in place (`mems_i += pos_emb[:mlen]`), so the cached memory gains another copy of the
  position table at every segment.
- The cluster logits of the adaptive softmax keep the reference's (reversed) order, so its checkpoints load.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from repro.memory import MemoryMechanism, defines, evict_oldest
from repro.nn.adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax
from repro.nn.attention import (
    AbsoluteAttention,
    PositionwiseFF,
    RelPartialLearnableAttention,
    attribute_within,
    causal_mask,
    relative_distances,
    sinusoid_table,
)
from repro.nn.dropout import Dropout


@dataclass(frozen=True)
class TransformerXLConfig:
    """Model hyper-parameters; the paper configs in `configs/transformer_xl/` give each value's source."""

    n_layer: int
    d_model: int
    n_head: int
    d_head: int
    d_inner: int
    n_token: int = 0  # set from the data module's vocabulary
    dropout: float = 0.1
    dropatt: float = 0.0
    d_embed: int | None = None  # None: d_model (the reference's d_embed = -1)
    div_val: int = 1
    cutoffs: tuple[int, ...] = ()  # adaptive softmax/input cluster bounds; () = full softmax
    tie_weight: bool = True
    # None: the reference's default for WikiText-103, [False] + [True] * len(cutoffs)
    tie_projs: tuple[bool, ...] | None = None
    pre_lnorm: bool = False
    attention: Literal["relative", "absolute"] = "relative"
    init_std: float = 0.02  # normal(0, 0.02) for weights, u and v; LayerNorm weights normal(1, 0.02)
    proj_init_std: float = 0.01  # adaptive input/softmax projections
    # dropout on the attention's output before the residual (the reference's `attn_out = self.drop(attn_out)`);
    # the ∞-former's sorting code (its fork of the relative attention) has none: its paper configs set false
    attn_out_dropout: bool = True

    def __post_init__(self):
        for name in ("n_layer", "d_model", "n_head", "d_head", "d_inner", "div_val"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        if not (0.0 <= self.dropout < 1.0 and 0.0 <= self.dropatt < 1.0):
            raise ValueError("dropout and dropatt must lie in [0, 1)")
        if self.attention not in ("relative", "absolute"):
            raise ValueError(f"model.attention is 'relative' or 'absolute', got {self.attention!r}")
        if self.tie_projs is not None and len(self.tie_projs) != len(self.cutoffs) + 1:
            raise ValueError(f"tie_projs needs {len(self.cutoffs) + 1} entries (one per cluster), "
                             f"got {len(self.tie_projs)}")
        if self.d_model % 2:
            raise ValueError("d_model must be even (sinusoid positions come in sin/cos pairs)")

    @property
    def embed_dim(self) -> int:
        return self.d_embed or self.d_model

    @property
    def proj_ties(self) -> tuple[bool, ...]:
        return self.tie_projs if self.tie_projs is not None else (False,) + (True,) * len(self.cutoffs)


class DecoderLayer(nn.Module):
    """Attention and feed-forward, each with residual and LayerNorm (post-LN unless `pre_lnorm`)."""

    def __init__(self, cfg: TransformerXLConfig, attn: nn.Module):
        super().__init__()
        self.attn = attn
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.drop = Dropout(cfg.dropout) if cfg.attn_out_dropout else nn.Identity()
        self.ff = PositionwiseFF(d_model=cfg.d_model, d_inner=cfg.d_inner, dropout=cfg.dropout)
        self.ff_norm = nn.LayerNorm(cfg.d_model)
        self.pre_lnorm = cfg.pre_lnorm

    def forward(self, h_BTD, *, mem_BMD, mask_TK, pos, kv_mem=None, read=None):
        """(output, keys/values of [memory; segment]) — see `repro.nn.attention`. `read`: None, or a function of the
        attention's input that returns a term added to the attention's output before the residual (a memory
        mechanism's read, `repro.memory.MemoryMechanism.read`)."""
        if self.pre_lnorm:
            mem = self.attn_norm(mem_BMD) if mem_BMD is not None and mem_BMD.shape[1] else mem_BMD
            x = self.attn_norm(h_BTD)
            a, kv = self.attn(x, mem_BMD=mem, mask_TK=mask_TK, pos=pos, kv_mem=kv_mem)
            if read is not None:
                a = _add(a, read(x))
            h = h_BTD + self.drop(a)
            return h + self.ff(self.ff_norm(h)), kv
        a, kv = self.attn(h_BTD, mem_BMD=mem_BMD, mask_TK=mask_TK, pos=pos, kv_mem=kv_mem)
        if read is not None:
            a = _add(a, read(h_BTD))
        h = self.attn_norm(h_BTD + self.drop(a))
        return self.ff_norm(h + self.ff(h)), kv


def _add(a: torch.Tensor, term: torch.Tensor | None) -> torch.Tensor:
    return a if term is None else a + term.to(a.dtype)


class TransformerXL(nn.Module):
    """`forward(tokens, mems, mem_len=…) -> (hidden, new_mems)`; `nll(hidden, target)` scores it.

    With `mechanisms` (`(class, options)` pairs of `repro.memory.MemoryMechanism`s), the one layer loop through
    which memory mechanisms compose: each mechanism's `context` rows are attended before the short memory (relative
    distances run over all keys, as in the compressive transformer), its `read` is added to the attention's output
    before the residual, and after the layers it `write`s its next state from the rows the short memory evicted
    (`evict`: at most one mechanism chooses them; else Transformer-XL's rule). A mechanism that owns the layer step
    (LaMemo's look-ahead) gives the layers' input (`layer_inputs`) and runs each layer in the same loop
    (`layer_step`), with the others' reads. The backbone draws its weights first and the mechanisms theirs after,
    so that without mechanisms this is Transformer-XL weight for weight.

    Memory layout with mechanisms (a flat list of batch-first tensors, as `SegmentLM` checkpoints and re-shards it):
    the short memory (one (B, M, D) per layer; with a layer-step owner, its one embedding memory), then each
    mechanism's states, per slot one tensor per layer, or per layer its slots (`MemoryMechanism.layout`)."""

    supports_memory = True

    @property
    def supports_kv_memory(self) -> bool:
        return self.cfg.attention == "relative" and not self.mechanisms

    @property
    def supports_checkpoint_layers(self) -> bool:
        """Whether training may checkpoint the layers (`checkpoint_layers`): not with memory mechanisms, whose reads
        and writes a recomputed layer would repeat."""
        return type(self).forward is TransformerXL.forward and not self.mechanisms

    @property
    def prefix_invariant(self) -> bool:
        """Without memory, a position's output depends on its prefix only, not on how many tokens the forward holds:
        relative positions are distances; absolute ones count from the segment's end (`SegmentLM._sliding_nll`)."""
        return self.cfg.attention == "relative"

    def __init__(self, cfg: TransformerXLConfig,
                 mechanisms: Sequence[tuple[type[MemoryMechanism], dict]] = ()):
        super().__init__()
        if cfg.n_token <= 0:
            raise ValueError("model.n_token (the vocabulary size) must be set, normally from the data module")
        specs = list(mechanisms)
        if specs and cfg.attention != "relative":
            raise ValueError("memory mechanisms build on relative attention: set model.attention: relative")
        owners = [(cls, kw) for cls, kw in specs if cls.owns_layer_step]
        if len(owners) > 1:
            raise ValueError("at most one memory mechanism may own the layer step, got "
                             f"{', '.join(c.__name__ for c, _ in owners)}")
        self._owner_spec = owners[0] if owners else None  # read by make_attention, while the layers are built
        self.__dict__["_specs"] = specs  # read by _layer_attention, for the mechanisms' per-layer modules
        self.cfg = cfg
        # `repro fit --run.checkpoint_layers true`: each layer's activations recomputed in the backward pass
        self.checkpoint_layers = False
        d_embed = cfg.embed_dim
        self.word_emb = AdaptiveEmbedding(n_token=cfg.n_token, d_embed=d_embed, d_proj=cfg.d_model,
                                          cutoffs=cfg.cutoffs, div_val=cfg.div_val)
        self.drop = Dropout(cfg.dropout)
        self.layers = nn.ModuleList(DecoderLayer(cfg, self._layer_attention(cfg)) for _ in range(cfg.n_layer))
        if cfg.attention == "relative":
            self.r_w_bias = nn.Parameter(torch.empty(cfg.n_head, cfg.d_head))  # u
            self.r_r_bias = nn.Parameter(torch.empty(cfg.n_head, cfg.d_head))  # v
        self.crit = ProjectedAdaptiveLogSoftmax(n_token=cfg.n_token, d_embed=d_embed, d_proj=cfg.d_model,
                                                cutoffs=cfg.cutoffs, div_val=cfg.div_val)
        self.apply(self._init_weights)
        self._tie()
        # after the backbone's weights, so that they are drawn as without mechanisms
        self.mechanisms = nn.ModuleList(cls(cfg, **kw) for cls, kw in specs)
        # plain references, not submodules: the mechanisms' parameters are registered once, under `mechanisms`
        self.__dict__["owner"] = next((m for m in self.mechanisms if m.owns_layer_step), None)
        evictors = [m for m in self.mechanisms if defines(m, "evict")]
        if len(evictors) > 1:
            raise ValueError("at most one memory mechanism may choose what the short memory evicts, got "
                             f"{', '.join(type(m).__name__ for m in evictors)}")
        if self.owner is not None and any(defines(m, "context") or defines(m, "evict") for m in self.mechanisms):
            raise ValueError(f"{type(self.owner).__name__} runs the layers itself and attends to no extra context: "
                             "combine it with mechanisms that read and write only")
        self.__dict__["evictor"] = evictors[0] if evictors else None
        self._aux: dict[str, torch.Tensor] = {}

    def aux_losses(self) -> dict[str, torch.Tensor]:
        """The mechanisms' weighted auxiliary losses of the last forward pass (none without mechanisms)."""
        return dict(self._aux)

    def diagnostics(self) -> dict[str, torch.Tensor]:
        """The mechanisms' unweighted diagnostics of the last forward pass (`MemoryMechanism.diagnostics`)."""
        return {k: v for m in self.mechanisms for k, v in m.diagnostics.items()}

    @contextmanager
    def measuring_fit(self):
        """Evaluation forward passes inside also measure what a mechanism measures only when asked (the ∞-former's
        reconstruction error of its fits, `diagnostics()["regression_error"]`); outside, an evaluation does only the
        model's work."""
        with attribute_within([m for m in self.modules() if hasattr(m, "measure_fit")], "measure_fit", True):
            yield

    def compile_units(self) -> list[nn.Module]:
        """What `SegmentLM.compile_model` compiles: the decoder layers (the embedding and the adaptive softmax stay
        eager)."""
        return list(self.layers)

    def _layer_attention(self, cfg: TransformerXLConfig) -> nn.Module:
        """One layer's attention (`make_attention`) holding the mechanisms' per-layer modules
        (`MemoryMechanism.layer_module`), each under the mechanism's `layer_module_name`: built here, they draw their
        weights with the layer's and are initialised as the backbone's own."""
        attn = self.make_attention(cfg)
        for cls, kw in self.__dict__["_specs"]:
            module = cls.layer_module(cfg, **kw)
            if module is None:
                continue
            if cls.layer_module_name in attn._modules:
                raise ValueError(f"two memory mechanisms keep a per-layer {cls.layer_module_name!r}: combine at most "
                                 f"one {cls.__name__}")
            attn.add_module(cls.layer_module_name, module)
        return attn

    def make_attention(self, cfg: TransformerXLConfig) -> nn.Module:
        """One layer's attention: a layer-step owner's (`MemoryMechanism.layer_attention`), else the backbone's;
        other papers' models override this to put their attention in the backbone."""
        owner = self._owner_spec
        if owner is not None and (attn := owner[0].layer_attention(cfg, **owner[1])) is not None:
            return attn
        attn = RelPartialLearnableAttention if cfg.attention == "relative" else AbsoluteAttention
        return attn(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, dropatt=cfg.dropatt)

    # -------------------------------------------------------------------------------------------- init & tying
    def _init_weights(self, m: nn.Module) -> None:
        std, proj_std = self.cfg.init_std, self.cfg.proj_init_std
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.normal_(m.weight, 1.0, std)
            nn.init.zeros_(m.bias)
        elif isinstance(m, AdaptiveEmbedding):
            for p in m.emb_projs:
                nn.init.normal_(p, 0.0, proj_std)
        elif isinstance(m, ProjectedAdaptiveLogSoftmax):
            if m.n_clusters > 0:
                nn.init.normal_(m.cluster_weight, 0.0, std)
                nn.init.zeros_(m.cluster_bias)
            for p in m.out_projs:
                if p is not None:
                    nn.init.normal_(p, 0.0, proj_std)
        elif isinstance(m, TransformerXL) and self.cfg.attention == "relative":
            nn.init.normal_(m.r_w_bias, 0.0, std)
            nn.init.normal_(m.r_r_bias, 0.0, std)

    def _tie(self) -> None:
        cfg = self.cfg
        if cfg.tie_weight:
            for out, emb in zip(self.crit.out_layers, self.word_emb.emb_layers):
                out.weight = emb.weight
        for i, tie in enumerate(cfg.proj_ties):
            if not tie:
                continue
            if cfg.div_val == 1 and cfg.d_model != cfg.embed_dim:
                self.crit.tie_proj(i, self.word_emb.emb_projs[0])
            elif cfg.div_val != 1:
                self.crit.tie_proj(i, self.word_emb.emb_projs[i])

    # ------------------------------------------------------------------------------------------------- forward
    def forward(
        self,
        tokens_BT: torch.Tensor,
        mems: list[torch.Tensor] | None,
        *,
        mem_len: int,
        clamp_len: int = -1,
        same_length: bool = False,
        kv_memory: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Hidden states of the segment (B, T, D) and the next memory: without mechanisms one (B, ≤mem_len, D) per
        layer, else the layout of the class docstring.

        The memory holds each layer's input hidden states (Transformer-XL's h̃). With `kv_memory` (evaluation,
        relative attention, no mechanisms) it holds each layer's keys and values instead, computed once per
        position: the same outputs without re-projecting the whole memory at every segment. The one layer loop
        (`_layers`) runs, then the mechanisms write their next states."""
        if mem_len < 0:
            raise ValueError(f"mem_len must be ≥ 0, got {mem_len}")
        if kv_memory and self.mechanisms:
            raise ValueError("a model with memory mechanisms keeps no key/value memory: evaluate with "
                             "kv_memory=False")
        if kv_memory and (self.training or torch.is_grad_enabled() or self.cfg.attention != "relative"):
            raise ValueError("a key/value memory is for evaluation of relative attention, without gradients")
        b, t = tokens_BT.shape
        emb = self.word_emb(tokens_BT)
        for mech in self.mechanisms:
            mech.begin()
        short, states = self._unpack(mems if mems else self.empty_memory(b, emb, kv_memory=kv_memory))
        reads = [self._reader(i, states) for i in range(len(self.layers))]
        h, short, inputs, evicted = self._layers(emb, short, states, reads, mem_len=mem_len, clamp_len=clamp_len,
                                                 same_length=same_length, kv_memory=kv_memory)
        new_states = []
        for mech, per_layer in zip(self.mechanisms, states):
            if mech is self.owner:
                new_states.append(per_layer)
                continue
            new_states.append([mech.write(i, layer, per_layer[i], evicted[i], inputs[i])
                               for i, layer in enumerate(self.layers)])
        self._aux = {}
        for mech in self.mechanisms:
            self._aux.update(mech.aux_losses())
        return self.drop(h), self._pack(short, new_states)

    # ------------------------------------------------------------------------------- the loop with mechanisms
    def empty_memory(self, batch: int, like: torch.Tensor, *, kv_memory: bool = False) -> list[torch.Tensor]:
        """The memory before a stream's first segment, in the layout of the class docstring (with `kv_memory`, per
        layer an empty (2, B, H, 0, E) of keys and values)."""
        n, c = len(self.layers), self.cfg
        shape = (2, batch, c.n_head, 0, c.d_head) if kv_memory else (batch, 0, c.d_model)
        short = [like.new_empty(shape) for _ in range(1 if self.owner is not None else n)]
        return self._pack(short, [[mech.empty(batch, like)] * n for mech in self.mechanisms], detach=False)

    def _unpack(self, mems: list[torch.Tensor]):
        n = len(self.layers)
        n_short = 1 if self.owner is not None else n
        slots = sum(len(m.slots) for m in self.mechanisms)
        expected = n_short + n * slots
        if len(mems) != expected:
            raise ValueError(f"the memory holds {len(mems)} tensors, this model expects {expected} = {n_short} + "
                             f"{n} × {slots} tensors (the short memory, then per layer the mechanisms' slots): it "
                             "comes from another model; start with an empty memory")
        short, off, states = list(mems[:n_short]), n_short, []
        for mech in self.mechanisms:
            k = len(mech.slots)
            block = mems[off : off + k * n]
            if mech.layout == "by_layer":
                states.append([tuple(block[i * k : (i + 1) * k]) for i in range(n)])
            else:
                states.append([tuple(block[j * n + i] for j in range(k)) for i in range(n)])
            off += k * n
        return short, states

    def _pack(self, short, states, *, detach: bool = True) -> list[torch.Tensor]:
        """The flat memory (the class docstring), each mechanism's states in its own `layout`."""
        def out_of(x):
            return x.detach() if detach else x

        out = [out_of(x) for x in short]
        for mech, per_layer in zip(self.mechanisms, states):
            if mech.layout == "by_layer":
                out += [out_of(x) for state in per_layer for x in state]
            else:
                out += [out_of(state[j]) for j in range(len(mech.slots)) for state in per_layer]
        return out

    def _reader(self, i: int, states):
        """Layer i's read: the sum of the mechanisms' `read` terms, as a function of the attention's input."""
        readers = [(m, s[i]) for m, s in zip(self.mechanisms, states) if defines(m, "read")]
        if not readers:
            return None

        def read(x_BTD):
            terms = [t for t in (m.read(i, self.layers[i], x_BTD, st) for m, st in readers) if t is not None]
            return sum(terms[1:], terms[0]) if terms else None

        return read

    def _layers(self, emb, short, states, reads, *, mem_len, clamp_len, same_length, kv_memory=False):
        """The one layer loop: per layer the mechanisms' context rows and the short memory (or, with `kv_memory`,
        its keys and values), the mechanisms' reads, activation checkpointing when asked, or the layer-step owner's
        `layer_step` (its own state updated in `states`); (output, next short memory, the layers' inputs, the rows
        each layer's memory evicted)."""
        owner = self.owner
        if owner is not None:  # one memory, the layer-0 input of the memory rows, refreshed layer by layer
            index = list(self.mechanisms).index(owner)
            own = states[index]
            mem = short[0]
            h, shared = owner.layer_inputs(self, emb_BTD=emb, memory_BMD=mem, mem_len=mem_len, clamp_len=clamp_len,
                                           same_length=same_length)
        else:
            contexts = [[c for c in (m.context(i, s[i]) for m, s in zip(self.mechanisms, states)) if c is not None]
                        for i in range(len(self.layers))]
            c = sum(x.shape[1] for x in contexts[0]) if contexts else 0
            t = emb.shape[1]
            m = short[0].shape[3] if kv_memory else short[0].shape[1]
            k = c + m + t
            extra = sum(mech.context_len for mech in self.mechanisms)
            mask_TK = causal_mask(t, k, same_length=same_length, span=mem_len + extra, device=emb.device)
            pos_KD = sinusoid_table(relative_distances(k, clamp_len=clamp_len, device=emb.device), self.cfg.d_model)
            pos_KD = pos_KD.to(emb.dtype)
            if self.cfg.attention == "relative":
                h = self.drop(emb)  # dropout draws: the embedding, then the positions
                pos = (self.drop(pos_KD), self.r_w_bias, self.r_r_bias)
            else:  # absolute: distances to the segment end, added to the input and to the layer-0 memory
                h = self.drop(emb + pos_KD[m:])
                pos = None
        checkpointed = self.checkpoint_layers and self.training and torch.is_grad_enabled()
        inputs, memories, new_kv = [], [], []
        for i, layer in enumerate(self.layers):
            if owner is not None:
                inputs.append(h)
                memories.append(mem)
                h, mem, own[i] = owner.layer_step(i, layer, h, mem, shared=shared, state=own[i], read=reads[i])
                continue
            mem = short[i]
            if pos is None and i == 0 and m:
                mem = mem + pos_KD[:m]
            if c:
                mem = torch.cat([x.to(mem.dtype) for x in contexts[i]] + [mem], dim=1)
            if kv_memory:
                h, kv = layer(h, mem_BMD=None, mask_TK=mask_TK, pos=pos, kv_mem=mem)
                new_kv.append(kv.narrow(3, max(0, k - mem_len), min(k, mem_len)))  # (2, B, H, ≤mem_len, E)
                continue
            inputs.append(h)
            memories.append(short[i])
            if checkpointed:
                # activation checkpointing: the layer's activations are recomputed in the backward pass (the
                # random state too, so dropout draws the same masks) instead of kept
                h, _ = checkpoint(layer, h, mem_BMD=mem, mask_TK=mask_TK, pos=pos, read=reads[i],
                                  use_reentrant=False)
            else:
                h, _ = layer(h, mem_BMD=mem, mask_TK=mask_TK, pos=pos, read=reads[i])
        if kv_memory:
            return h, new_kv, [], []
        evict = self.evictor.evict if self.evictor is not None else evict_oldest
        kept, evicted = zip(*(evict(s, x, mem_len) for s, x in zip(memories, inputs)))
        # the layer-step owner keeps the one embedding memory: layer 0's kept rows
        return h, list(kept[:1] if owner is not None else kept), inputs, list(evicted)

    def nll(self, hidden_BTD: torch.Tensor, target_BT: torch.Tensor) -> torch.Tensor:
        """Per-token NLL (B, T), float32."""
        b, t, d = hidden_BTD.shape
        return self.crit(hidden_BTD.reshape(b * t, d), target_BT.reshape(b * t)).view(b, t)

    def log_prob(self, hidden_BTD: torch.Tensor) -> torch.Tensor:
        b, t, d = hidden_BTD.shape
        return self.crit.log_prob(hidden_BTD.reshape(b * t, d)).view(b, t, -1)
