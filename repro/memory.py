"""Segment-level memory, as pure functions (Transformer-XL §3.2).

A memory is a list with one tensor per layer, (B, M, D) batch-first, M ≤ mem_len; the first segment of a split
starts with an empty memory (M = 0), as the reference does, not with zeros.
"""

from __future__ import annotations

import torch


def empty_memory(n_layers: int, *, batch: int, d_model: int, device=None, dtype=torch.float32) -> list[torch.Tensor]:
    return [torch.empty(batch, 0, d_model, device=device, dtype=dtype) for _ in range(n_layers)]


@torch.no_grad()
def update_memory(old: list[torch.Tensor], new: list[torch.Tensor], *, mem_len: int) -> list[torch.Tensor]:
    """The last `mem_len` positions of [old; new] per layer, detached (no gradient crosses segments)."""
    if mem_len < 0:
        raise ValueError(f"mem_len must be ≥ 0, got {mem_len}")
    if len(old) != len(new):
        raise ValueError(f"memory has {len(old)} layers, the new states {len(new)}")
    out = []
    for m, h in zip(old, new):
        cat = torch.cat([m.to(h.dtype), h], dim=1) if m.shape[1] else h
        out.append(cat[:, max(0, cat.shape[1] - mem_len):].detach())
    return out


def memory_length(mems: list[torch.Tensor] | None) -> int:
    return 0 if not mems else mems[0].shape[1]
