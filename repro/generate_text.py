"""Seeded nucleus sampling (Holtzman et al., 2020), the decoding of the ∞-former dialogue experiment.

PAPERS.md §2: top-p 0.9, temperature 1, at most 50 tokens, responses with ≥ 3 previous utterances (the official
eval.py). The nucleus is the smallest set of most probable tokens whose probability reaches `top_p` (the most probable
token is always in it); the next token is drawn from the distribution renormalised over the nucleus, with a
`torch.Generator` owned by the caller, so a seed fixes every draw.

`sample_response` runs the loop for any model given as a function from the tokens generated so far to the
next-token logits; it stops at `max_tokens` or at a stop token. As the official script's `min_length = 1`, the
first token is never a stop token (the official script re-drew up to 10 times; here stop tokens are removed from
the first step's distribution, which is what re-drawing until a non-stop token does).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingSettings:
    top_p: float = 0.9
    temperature: float = 1.0
    max_tokens: int = 50
    seed: int = 0

    def __post_init__(self):
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be ≥ 1, got {self.max_tokens}")


def nucleus_mask(logits_V: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean mask (V,) of the nucleus: the most probable tokens whose cumulative probability first reaches
    `top_p`."""
    probs = torch.softmax(logits_V.float(), dim=-1)
    sorted_p, order = torch.sort(probs, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the more probable tokens
    keep_sorted = before < top_p  # a token is in while the mass before it has not reached top_p
    keep_sorted[0] = True
    mask = torch.zeros_like(keep_sorted)
    mask[order] = keep_sorted
    return mask & (probs > 0)


def sample_token(logits_V: torch.Tensor, settings: SamplingSettings, generator: torch.Generator,
                 banned: Collection[int] = ()) -> int:
    # drawn where the generator lives (a CPU generator: the same draws on any device and in any DDP rank)
    logits = logits_V.float().to(generator.device) / settings.temperature
    if banned:
        logits = logits.clone()
        logits[list(banned)] = float("-inf")
    mask = nucleus_mask(logits, settings.top_p)
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def sample_response(next_logits: Callable[[list[int]], torch.Tensor], settings: SamplingSettings,
                    generator: torch.Generator, stop: Collection[int]) -> list[int]:
    """Tokens drawn one by one; `next_logits(generated)` gives the (V,) logits after the context + `generated`."""
    out: list[int] = []
    for step in range(settings.max_tokens):
        tok = sample_token(next_logits(out), settings, generator, banned=stop if step == 0 else ())
        if tok in stop:
            break
        out.append(tok)
    return out
