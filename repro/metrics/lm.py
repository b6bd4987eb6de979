"""Language-model metrics from summed token NLL (PAPERS.md §5).

Perplexity and bits per character come from the NLL summed over every scored token of the split and the number
of those tokens, synced across DDP ranks by summing both: never an average of per-batch or per-rank means, which
weights a short last segment or a rank with fewer tokens wrongly.
"""

from __future__ import annotations

import math
import warnings

import torch
from torchmetrics import Metric


class TokenNLL(Metric):
    """Accumulates Σ NLL (nats) and the token count; `compute()` gives the mean NLL per token and the count,
    both over all ranks."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # float64: 10^8 tokens of ~1 nat summed in float32 would lose the third decimal of the perplexity
        self.add_state("nll_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, nll: torch.Tensor) -> None:
        """`nll`: per-token NLL of the scored tokens, any shape."""
        self.nll_sum += nll.detach().double().sum()
        self.tokens += nll.numel()

    def compute(self) -> dict[str, torch.Tensor]:
        if self.tokens == 0:  # a user's setting, not a fault of the code: one line that says what to change
            raise ValueError("this evaluation scored no token: the batches it ran hold no scored position (is "
                             "--trainer.limit_val_batches or limit_test_batches below the segments of one "
                             "sequence? the sorting task scores only the answer at each sequence's end); let it "
                             "run more batches")
        return {"mean_nll": self.nll_sum / self.tokens, "tokens": self.tokens.clone()}


def scored(metric: TokenNLL) -> dict[str, torch.Tensor]:
    """`metric.compute()` (over all ranks) without torchmetrics' warning for a metric never updated on this rank:
    where no rank scored a token, the one-line error of `compute` says what to change."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*called before the ``update`` method.*")
        return metric.compute()


def perplexity(mean_nll: float) -> float:
    return math.exp(mean_nll)


def bpc(mean_nll: float) -> float:
    return mean_nll / math.log(2)
