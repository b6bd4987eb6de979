"""The memory arena's model: Transformer-XL's backbone with any composition of memory mechanisms.

Follows `papers/transformer_xl/model.py` (embedding, relative attention, layers, adaptive softmax, initialisation:
the backbone draws its weights first, so that without mechanisms this is `TransformerXL` weight for weight, and
delegates to it, key/value evaluation memory included). The layer loop keeps Transformer-XL's short memory and
calls each mechanism through the shared interface, `repro.memory.MemoryMechanism`: its `context` rows are
attended before the short memory (relative distances run over all keys, as in the compressive transformer),
its `read` is added to the attention's output before the residual, and after the layers it `write`s its next
state from the rows the short memory evicted. A mechanism that owns the layer step (LaMemo's look-ahead) runs
the layers instead; the others then read on the current rows and receive the rows leaving its memory.

Mechanisms are named in the config, `mechanisms: [{name: ltm, n_basis: 64, …}, …]`, by the name they registered
under (`repro.memory.register`); `module: pkg.mod` imports the file that registers a new one first.

Memory layout (a flat list of batch-first tensors, as `SegmentLM` checkpoints and re-shards it): the short memory
(one (B, M, D) per layer; with a layer-step owner, its embedding memory, one tensor), then per mechanism, per
slot, one tensor per layer. With one mechanism this is that paper's model's layout (for LaMemo its slots are
grouped by slot, not by layer).
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from papers.arena import mechanisms as _builtin  # noqa: F401  (registers compressive, ltm, look_ahead)
from papers.arena.mgk import LookAheadMGKAttention, RelativeMGKAttention
from papers.lamemo.model import look_ahead_inputs, look_ahead_layers
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.memory import MECHANISMS, MemoryMechanism, evict_oldest
from repro.nn.attention import causal_mask, relative_distances, sinusoid_table


def resolve(entry: dict) -> tuple[type[MemoryMechanism], dict]:
    """(class, options) of one config entry `{name: …, module: … (optional), …options}`."""
    entry = dict(entry)
    name = entry.pop("name", None)
    module = entry.pop("module", None)
    if module:
        importlib.import_module(module)
    if name not in MECHANISMS:
        raise ValueError(f"unknown memory mechanism {name!r}: known are {', '.join(sorted(MECHANISMS))} (a new one "
                         "registers with repro.memory.register; name its file under `module:`)")
    return MECHANISMS[name], entry


def _defines(mech: MemoryMechanism | type, hook: str) -> bool:
    cls = mech if isinstance(mech, type) else type(mech)
    return getattr(cls, hook) is not getattr(MemoryMechanism, hook)


class Arena(TransformerXL):
    """`TransformerXL` with the memory mechanisms `mechanisms` (config entries, see the module docstring) and, with
    `score: {name: mgk, …MGKAttention options}`, MGK's mixture-of-Gaussian keys in every layer's attention."""

    supports_memory = True

    def __init__(self, cfg: TransformerXLConfig, mechanisms: tuple[dict, ...] | list[dict] = (),
                 score: dict | None = None):
        if (mechanisms or score) and cfg.attention != "relative":
            raise ValueError("memory mechanisms build on relative attention: set model.attention: relative")
        if score is not None and score.get("name") != "mgk":
            raise ValueError(f"score.name is mgk (mixture-of-Gaussian keys) or the score is left out (softmax), "
                             f"got {score.get('name')!r}")
        specs = [resolve(e) for e in mechanisms]
        owners = [(cls, kw) for cls, kw in specs if cls.owns_layer_step]
        if len(owners) > 1:
            raise ValueError("at most one memory mechanism may own the layer step, got "
                             f"{', '.join(c.__name__ for c, _ in owners)}")
        self.__dict__["_owner_spec"] = owners[0] if owners else None  # read by make_attention
        self.__dict__["_score"] = score
        self.score = score
        super().__init__(cfg)
        self.mechanisms = nn.ModuleList(cls(cfg, **kw) for cls, kw in specs)
        # plain references, not submodules: the mechanisms' parameters are registered once, under `mechanisms`
        self.__dict__["owner"] = next((m for m in self.mechanisms if m.owns_layer_step), None)
        evictors = [m for m in self.mechanisms if _defines(m, "evict")]
        if len(evictors) > 1:
            raise ValueError("at most one memory mechanism may choose what the short memory evicts, got "
                             f"{', '.join(type(m).__name__ for m in evictors)}")
        if self.owner is not None and any(_defines(m, "context") or _defines(m, "evict") for m in self.mechanisms):
            raise ValueError(f"{type(self.owner).__name__} runs the layers itself and attends to no extra context: "
                             "combine it with mechanisms that read and write only")
        self.__dict__["evictor"] = evictors[0] if evictors else None
        self._aux: dict[str, torch.Tensor] = {}

    @property
    def supports_kv_memory(self) -> bool:
        return not self.mechanisms and self.score is None and self.cfg.attention == "relative"

    def make_attention(self, cfg: TransformerXLConfig) -> nn.Module:
        owner = self.__dict__["_owner_spec"]
        score = self.__dict__["_score"]
        if score is not None:  # MGK inside Transformer-XL (papers/arena/mgk.py)
            opts = {k: tuple(v) if isinstance(v, list) else v for k, v in score.items() if k != "name"}
            common = dict(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, dropatt=cfg.dropatt, **opts)
            if owner is not None:
                return LookAheadMGKAttention(full=owner[1].get("variant") == "full", **common)
            return RelativeMGKAttention(**common)
        if owner is not None and hasattr(owner[0], "attention"):
            return owner[0].attention(cfg, **owner[1])
        return super().make_attention(cfg)

    def aux_losses(self) -> dict[str, torch.Tensor]:
        return dict(self._aux)

    # ------------------------------------------------------------------------------------------------ memory
    def empty_memory(self, batch: int, like: torch.Tensor) -> list[torch.Tensor]:
        n = len(self.layers)
        short = [like.new_empty(batch, 0, self.cfg.d_model)] * (1 if self.owner is not None else n)
        out = list(short)
        for mech in self.mechanisms:
            state = mech.empty(batch, like)
            for x in state:
                out += [x] * n
        return out

    def _unpack(self, mems: list[torch.Tensor]):
        n = len(self.layers)
        n_short = 1 if self.owner is not None else n
        expected = n_short + n * sum(len(m.slots) for m in self.mechanisms)
        if len(mems) != expected:
            raise ValueError(f"the memory holds {len(mems)} tensors, this model expects {expected}: it comes from "
                             "another model; start with an empty memory")
        short, off, states = list(mems[:n_short]), n_short, []
        for mech in self.mechanisms:
            k = len(mech.slots)
            chunks = [mems[off + j * n : off + (j + 1) * n] for j in range(k)]
            states.append([tuple(ch[i] for ch in chunks) for i in range(n)])
            off += k * n
        return short, states

    def _pack(self, short, states) -> list[torch.Tensor]:
        out = [x.detach() for x in short]
        for per_layer in states:
            for j in range(len(per_layer[0]) if per_layer else 0):
                out += [state[j].detach() for state in per_layer]
        return out

    def _reader(self, i: int, states):
        readers = [(m, s[i]) for m, s in zip(self.mechanisms, states) if _defines(m, "read")]
        if not readers:
            return None

        def read(x_BTD):
            terms = [t for t in (m.read(i, self.layers[i], x_BTD, st) for m, st in readers) if t is not None]
            return sum(terms[1:], terms[0]) if terms else None

        return read

    # ------------------------------------------------------------------------------------------------- forward
    def forward(self, tokens_BT, mems, *, mem_len: int, clamp_len: int = -1, same_length: bool = False,
                kv_memory: bool = False):
        if not self.mechanisms:
            return super().forward(tokens_BT, mems, mem_len=mem_len, clamp_len=clamp_len, same_length=same_length,
                                   kv_memory=kv_memory)
        if kv_memory:
            raise ValueError("a model with memory mechanisms keeps hidden states; evaluate without kv_memory")
        b, t = tokens_BT.shape
        emb = self.word_emb(tokens_BT)
        for mech in self.mechanisms:
            mech.begin()
        short, states = self._unpack(mems if mems else self.empty_memory(b, emb))
        if self.owner is not None:
            h, short, inputs, evicted = self._look_ahead_layers(emb, short[0], states, mem_len=mem_len,
                                                                clamp_len=clamp_len, same_length=same_length)
        else:
            h, short, inputs, evicted = self._layers(emb, short, states, mem_len=mem_len, clamp_len=clamp_len,
                                                     same_length=same_length)
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

    def _layers(self, emb, short, states, *, mem_len, clamp_len, same_length):
        """The backbone's layer loop with the mechanisms' context and reads; (output, next short memory, the
        layers' inputs, the evicted rows per layer)."""
        contexts = [[c for c in (m.context(i, s[i]) for m, s in zip(self.mechanisms, states)) if c is not None]
                    for i in range(len(self.layers))]
        c = sum(x.shape[1] for x in contexts[0])
        m = short[0].shape[1]
        k = c + m + emb.shape[1]
        extra = sum(mech.context_len for mech in self.mechanisms)
        mask_TK = causal_mask(emb.shape[1], k, same_length=same_length, mem_len=mem_len + extra, device=emb.device)
        pos_KD = sinusoid_table(relative_distances(k, clamp_len=clamp_len, device=emb.device), self.cfg.d_model)
        h = self.drop(emb)  # dropout draws in the backbone's order: embedding, then positions
        pos = (self.drop(pos_KD.to(emb.dtype)), self.r_w_bias, self.r_r_bias)
        inputs = []
        for i, layer in enumerate(self.layers):
            ctx = torch.cat([x.to(short[i].dtype) for x in contexts[i]] + [short[i]], dim=1) if c else short[i]
            inputs.append(h)
            h, _ = layer(h, mem_BMD=ctx, mask_TK=mask_TK, pos=pos, read=self._reader(i, states))
        evict = self.evictor.evict if self.evictor is not None else evict_oldest
        kept, evicted = zip(*(evict(s, x, mem_len) for s, x in zip(short, inputs)))
        return h, list(kept), inputs, list(evicted)

    def _look_ahead_layers(self, emb, emb_mem, states, *, mem_len, clamp_len, same_length):
        """The layer-step owner's loop (`papers.lamemo.model.look_ahead_layers`) with the other mechanisms' reads."""
        owner = self.owner
        index = list(self.mechanisms).index(owner)
        u_fut, v_fut = owner.future_biases(self)
        pos, bias_TK = look_ahead_inputs(self, emb_mem.shape[1], emb.shape[1], variant=owner.variant, u_fut=u_fut,
                                         v_fut=v_fut, clamp_len=clamp_len, same_length=same_length,
                                         mem_len=mem_len, like=emb)
        reads = [self._reader(i, states) for i in range(len(self.layers))]
        evicted, inputs = [], []
        h, emb_next, la_states = look_ahead_layers(self.layers, self.drop(emb), emb_mem, states[index], pos=pos,
                                                   bias_TK=bias_TK, mem_len=mem_len, reads=reads, evicted=evicted,
                                                   inputs=inputs)
        states[index] = la_states
        return h, [emb_next], inputs, evicted
