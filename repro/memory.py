"""Segment-level memory (Transformer-XL §3.2), and the interface through which memory mechanisms compose.

A memory is a list of batch-first tensors: Transformer-XL's holds one (B, M, D) per layer, M ≤ mem_len; the first
segment of a split starts with an empty memory (M = 0), as the reference does, not with zeros. `MemoryMechanism`
is the contract of one mechanism (compressed memory, continuous long-term memory, look-ahead refresh, or a new
one) in a layer loop that keeps the short memory; mechanisms register by name (`register`), so that a config
names them and the shared layer knows none of them.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types
import typing
from typing import Literal

import torch
from torch import nn


def empty_memory(n_layers: int, *, batch: int, d_model: int, device=None, dtype=torch.float32) -> list[torch.Tensor]:
    return [torch.empty(batch, 0, d_model, device=device, dtype=dtype) for _ in range(n_layers)]


@torch.no_grad()
def update_memory(old: list[torch.Tensor], new: list[torch.Tensor], *, mem_len: int) -> list[torch.Tensor]:
    """The last `mem_len` positions of [old; new] per layer, detached (no gradient crosses segments)."""
    if mem_len < 0:
        raise ValueError(f"mem_len must be ≥ 0, got {mem_len}")
    if len(old) != len(new):
        raise ValueError(f"memory has {len(old)} layers, the new states {len(new)}")
    return [evict_oldest(m, h, mem_len)[0] for m, h in zip(old, new)]


def memory_length(mems: list[torch.Tensor] | None) -> int:
    return 0 if not mems else mems[0].shape[1]


# --------------------------------------------------------------------------------------------------------------
# The memory interface: how a mechanism plugs into a segment-recurrent layer loop
# --------------------------------------------------------------------------------------------------------------

class MemoryMechanism(nn.Module):
    """One memory mechanism of a segment-recurrent Transformer, composable with others in one layer loop.

    The loop (Transformer-XL's, `papers/transformer_xl/model.py`) keeps the short memory itself: per layer
    the last `mem_len` inputs of the layer. A mechanism adds to it through four hooks, each called per layer `i`
    with that layer's `state` (a tuple of `len(slots)` batch-first tensors):

    - `context(i, state)`: rows attended before the short memory (the compressed memory), or None;
    - `read(i, layer, x_BTD, state)`: a term added to the attention's output before the residual (the ∞-former's
      long-term memory, Eq. 12), from the attention's input `x_BTD`, or None;
    - `write(i, layer, state, evicted_BOD, inputs_BTD)`: the next state, from the rows the short memory evicted at
      this segment (oldest first; none while it fills) and the layer's inputs of the segment;
    - `evict(short_BMD, new_BTD, mem_len)`: which rows the short memory keeps and which leave it; None keeps
      Transformer-XL's rule (the last `mem_len`). At most one mechanism of a model may define it.

    `begin()` is called once before each forward pass (a mechanism resets what it collects per pass there), and
    `context_len` is the most rows `context` returns (the evaluation's `same_length` counts them as memory).

    A mechanism may also own the layer step (`owns_layer_step`, LaMemo's look-ahead refresh of the memory rows);
    at most one of a model may. The backbone's loop then asks it for the layers' input (`layer_inputs`, once per
    segment) and runs each layer through its `layer_step` instead of the layer's own forward. A mechanism may give
    the attention the backbone's layers are built with (`layer_attention`, a class method: it is called before the
    mechanism exists, the backbone drawing its weights first), and keep a module in each layer's attention
    (`layer_module`). `aux_losses()` gives the weighted auxiliary losses of the last forward pass (added to the NLL
    as they are), `diagnostics` its unweighted measurements (logged, never added). State tensors are detached and
    batch-first, so that checkpoints save them and DDP re-shards them like Transformer-XL's memory;
    `empty(batch, like)` gives one layer's state before the first segment.

    A new mechanism is one file: a subclass registered by name (`@register("name")`), then named in a config.
    """

    slots: tuple[str, ...] = ()
    # how the per-layer states lie in the model's flat memory: "by_slot" (every layer's first slot, then every
    # layer's second: the ∞-former's and the compressive memory's) or "by_layer" (layer 0's slots, then layer 1's:
    # LaMemo's), each paper's own layout, so that its checkpoints keep their memory
    layout = "by_slot"
    owns_layer_step = False
    context_len = 0
    # the name of the module `layer_module` gives, in each layer's attention (`layers.<i>.attn.<name>`)
    layer_module_name = ""
    # the last forward pass's unweighted measurements; a mechanism that measures assigns a new dict each pass
    diagnostics: dict[str, torch.Tensor] = {}
    # the dataclass of the mechanism's options (`check_mechanisms` checks a config's against its fields, types and
    # own checks); None: the keyword parameters of `__init__` after the backbone's config
    settings: type | None = None

    def begin(self) -> None:
        return None

    def empty(self, batch: int, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return ()

    def context(self, i: int, state: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        return None

    def read(self, i: int, layer: nn.Module, x_BTD: torch.Tensor, state: tuple[torch.Tensor, ...]
             ) -> torch.Tensor | None:
        return None

    def write(self, i: int, layer: nn.Module, state: tuple[torch.Tensor, ...], evicted_BOD: torch.Tensor,
              inputs_BTD: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return state

    def evict(self, short_BMD: torch.Tensor, new_BTD: torch.Tensor, mem_len: int
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None

    def aux_losses(self) -> dict[str, torch.Tensor]:
        return {}

    @classmethod
    def layer_module(cls, cfg, **options) -> nn.Module | None:
        """A module this mechanism keeps in each backbone layer's attention, under `layer_module_name`, or None: built
        with the layer, it draws its weights with the layer's and the backbone initialises it as its own (the
        ∞-former's long-term memory, which its paper puts inside the attention). `read` finds it on
        `layer.attn`."""
        return None

    @classmethod
    def layer_attention(cls, cfg, **options) -> nn.Module | None:
        """The attention module of one backbone layer when this mechanism is in the model, or None (the backbone's
        own); `options` are the mechanism's config options."""
        return None

    def layer_inputs(self, model: nn.Module, *, emb_BTD: torch.Tensor, memory_BMD: torch.Tensor, mem_len: int,
                     clamp_len: int, same_length: bool) -> tuple[torch.Tensor, object]:
        """For a mechanism that owns the layer step (`owns_layer_step`): from the segment's embeddings (dropout not
        yet applied) and the short memory it keeps (`memory_BMD`, the layer-0 input of the memory rows), the first
        layer's input and what every `layer_step` of the segment shares (positions, mask, …)."""
        raise NotImplementedError(f"{type(self).__name__} owns no layer step")

    def layer_step(self, i: int, layer: nn.Module, h_BTD: torch.Tensor, memory_BMD: torch.Tensor, *, shared,
                   state: tuple[torch.Tensor, ...], read) -> tuple[torch.Tensor, torch.Tensor | None, tuple]:
        """For a mechanism that owns the layer step: layer i on the segment's rows `h_BTD` and the memory rows
        `memory_BMD` (layer i's input of them), with `shared` from `layer_inputs`, the mechanism's own layer state
        and the other mechanisms' read (None or a function of the attention's input). Returns (the segment's output,
        the memory rows' output = the next layer's `memory_BMD` (None after the last layer), the next state)."""
        raise NotImplementedError(f"{type(self).__name__} owns no layer step")


def defines(mechanism: MemoryMechanism | type[MemoryMechanism], hook: str) -> bool:
    """Whether a mechanism (or its class) overrides one of the interface's hooks."""
    cls = mechanism if isinstance(mechanism, type) else type(mechanism)
    return getattr(cls, hook) is not getattr(MemoryMechanism, hook)


MECHANISMS: dict[str, type[MemoryMechanism]] = {}


def register(name: str):
    """Class decorator: makes a `MemoryMechanism` subclass available to configs under `name`."""

    def add(cls: type[MemoryMechanism]) -> type[MemoryMechanism]:
        if not (isinstance(cls, type) and issubclass(cls, MemoryMechanism)):
            raise TypeError(f"{cls!r} is not a MemoryMechanism subclass")
        if MECHANISMS.get(name, cls) is not cls:
            raise ValueError(f"memory mechanism {name!r} is registered twice ({MECHANISMS[name].__qualname__} and "
                             f"{cls.__qualname__}): rename one")
        MECHANISMS[name] = cls
        return cls

    return add


def evict_oldest(short_BMD: torch.Tensor, new_BTD: torch.Tensor, mem_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Transformer-XL's rule: (the last `mem_len` rows of [short; new], the rows before them), detached. The one
    eviction rule of every model: `update_memory` per layer, the ∞-former's short memory and what leaves it, LaMemo's
    embedding memory and its evicted rows, the arena's default."""
    with torch.no_grad():
        cat = torch.cat([short_BMD.to(new_BTD.dtype), new_BTD], dim=1) if short_BMD.shape[1] else new_BTD
        cut = max(0, cat.shape[1] - mem_len)
        return cat[:, cut:].detach(), cat[:, :cut].detach()


def _fits(value, hint) -> bool:
    """Whether a config value (YAML's types: lists for tuples) fits a type hint; hints it cannot judge pass."""
    origin = typing.get_origin(hint)
    if hint is typing.Any or isinstance(hint, typing.TypeVar):
        return True
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is tuple or origin is tuple or hint is list or origin is list:
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return isinstance(value, (list, tuple)) and all(_fits(v, args[0]) for v in value) if args else \
            isinstance(value, (list, tuple))
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    return True


def _options(cls: type[MemoryMechanism]) -> dict[str, object]:
    """A mechanism's options and their type hints: its `settings` dataclass's fields, else its `__init__`'s keyword
    parameters after the backbone's config."""
    if cls.settings is not None:
        hints = typing.get_type_hints(cls.settings)
        return {f.name: hints.get(f.name, typing.Any) for f in dataclasses.fields(cls.settings)}
    hints = typing.get_type_hints(cls.__init__)
    params = list(inspect.signature(cls.__init__).parameters.values())[2:]  # self, the backbone's config
    return {p.name: hints.get(p.name, typing.Any) for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_mechanisms(entries, *, key: str = "mechanisms") -> list[tuple[type[MemoryMechanism], dict]]:
    """The mechanisms a config names, `[{name: …, module: … (optional), …options}]`, checked before anything is
    built: (class, options) per entry. `module` imports the file that registers a mechanism first. A wrong name,
    an unknown option, a value of the wrong type or one the mechanism's settings refuse raises a one-line
    `ValueError` naming the config key (`key[i].option`)."""
    out = []
    for i, entry in enumerate(entries or []):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: a mechanism is a mapping {{name: …, …options}}, got {entry!r}")
        options = dict(entry)
        name, module = options.pop("name", None), options.pop("module", None)
        if module:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise ValueError(f"{where}.module: cannot import {module!r} ({err})") from None
        if name not in MECHANISMS:
            raise ValueError(f"{where}.name: unknown memory mechanism {name!r}: known are "
                             f"{', '.join(sorted(MECHANISMS))} (a new one registers with repro.memory.register; "
                             "name its file under `module:`)")
        cls = MECHANISMS[name]
        known = _options(cls)
        for option, value in options.items():
            if option not in known:
                raise ValueError(f"{where}.{option}: {name} has no option {option!r}; its options are "
                                 f"{', '.join(known) or 'none'}")
            if not _fits(value, known[option]):
                hint = getattr(known[option], "__name__", None) or str(known[option]).replace("typing.", "")
                raise ValueError(f"{where}.{option}: {name} takes {hint}, got {value!r}")
        if cls.settings is not None:
            try:
                cls.settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})
            except (TypeError, ValueError) as err:
                raise ValueError(f"{where}: {err}") from None
        out.append((cls, options))
    return out
