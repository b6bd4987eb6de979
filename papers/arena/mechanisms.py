"""The memory mechanisms of the four papers as plug-ins of the shared memory interface (`repro.memory`).

Each wraps its paper's own code, so that the arena composes the mechanisms the papers' models run, not copies:
- `compressive` (Rae et al. 2020, the ∞-former's baseline): `papers.infinity_former.compressive.CompressiveMemory`,
  defined there (the compressive transformer is the backbone with it) — the evicted rows compressed by f_c into a
  FIFO memory attended before the short memory, f_c trained by the attention reconstruction loss;
- `ltm` (the ∞-former, Martins et al. 2022): `papers.infinity_former.model.LongTermMemory`, defined there (the
  ∞-former is the backbone with it) — the evicted rows enter a continuous long-term memory at the next segment,
  read with the self-attention's queries and added to the attention's output (Eq. 12); `sampling: sticky` for
  sticky memories;
- `look_ahead` (LaMemo, Ji et al. 2022): `papers.lamemo.model.LookAhead`, defined there (LaMemo is the backbone
  with it) — owns the layer step: memory rows are refreshed by look-ahead attention and interpolation, layer by
  layer.

Memory states are laid out as each paper's model lays them out, so that a contestant with one mechanism carries
the same memory as that paper's model (`tests/test_arena.py` checks outputs and memories against the papers'
models with the same weights, over several segments; those models carry the parity with the authors' code).
"""

from __future__ import annotations

from papers.infinity_former.compressive import CompressiveMemory  # registers `compressive`
from papers.infinity_former.model import LongTermMemory  # registers `ltm`
from papers.lamemo.model import LookAhead  # registers `look_ahead`

__all__ = ["CompressiveMemory", "LongTermMemory", "LookAhead"]
