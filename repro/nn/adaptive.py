"""Adaptive input embeddings (Baevski & Auli 2019) and the projected adaptive softmax (Grave et al. 2017), as the
Transformer-XL reference parameterises them (`AdaptiveEmbedding`, `ProjectedAdaptiveLogSoftmax`), so that its
checkpoints' tensors map one to one.

The vocabulary (sorted by frequency) is cut at `cutoffs` into a head shortlist and tail clusters. Cluster i has
width d_embed // div_val**i and a projection to/from d_proj (the model width); with div_val = 1 all clusters
share one embedding matrix and the projection is dropped when d_embed = d_proj. The softmax head scores the
shortlist plus one logit per tail cluster; log p(w) = log p_head(cluster of w) + log p_cluster(w).

Layout: hidden (N, d_proj) with N flattened tokens, targets (N,).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from repro.nn import blocked


def _bounds(n_token: int, cutoffs: tuple[int, ...]) -> list[int]:
    if list(cutoffs) != sorted(set(cutoffs)) or (cutoffs and (cutoffs[0] <= 0 or cutoffs[-1] >= n_token)):
        raise ValueError(
            f"cutoffs {list(cutoffs)} must increase strictly inside (0, {n_token}) (the vocabulary size); "
            "a smaller vocabulary needs fewer or smaller cutoffs"
        )
    return [0, *cutoffs, n_token]


class AdaptiveEmbedding(nn.Module):
    def __init__(self, *, n_token: int, d_embed: int, d_proj: int, cutoffs: tuple[int, ...] = (), div_val: int = 1):
        super().__init__()
        self.bounds = _bounds(n_token, cutoffs)
        self.div_val, self.d_embed, self.d_proj = div_val, d_embed, d_proj
        self.emb_scale = d_proj**0.5
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if div_val == 1:
            self.emb_layers.append(nn.Embedding(n_token, d_embed))
            if d_proj != d_embed:
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)))
        else:
            for i in range(len(self.bounds) - 1):
                d_i = d_embed // div_val**i
                self.emb_layers.append(nn.Embedding(self.bounds[i + 1] - self.bounds[i], d_i))
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_i)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.div_val == 1:
            emb = self.emb_layers[0](tokens)
            if len(self.emb_projs):
                emb = F.linear(emb, self.emb_projs[0])
            return emb * self.emb_scale
        flat = tokens.reshape(-1)
        out = torch.zeros(flat.numel(), self.d_proj, dtype=self.emb_projs[0].dtype, device=flat.device)
        for i in range(len(self.bounds) - 1):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            idx = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            emb_i = F.linear(self.emb_layers[i](flat[idx] - lo), self.emb_projs[i])
            out = out.index_copy(0, idx, emb_i.to(out.dtype))
        return (out * self.emb_scale).view(*tokens.shape, self.d_proj)


class ProjectedAdaptiveLogSoftmax(nn.Module):
    def __init__(self, *, n_token: int, d_embed: int, d_proj: int, cutoffs: tuple[int, ...] = (), div_val: int = 1):
        super().__init__()
        self.bounds = _bounds(n_token, cutoffs)
        self.n_clusters = len(self.bounds) - 2
        self.div_val = div_val
        self.shortlist = self.bounds[1]
        if self.n_clusters > 0:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))
        self.out_layers = nn.ModuleList()
        # out_projs[i] is None where no projection is needed; kept as a plain list so that tying can replace an
        # entry with the embedding's Parameter (registered under `emb_projs` there).
        self.out_projs: list[nn.Parameter | None] = []
        if div_val == 1:
            self.out_layers.append(nn.Linear(d_embed, n_token))
            for i in range(self.n_clusters + 1):
                self._set_proj(i, nn.Parameter(torch.empty(d_proj, d_embed)) if d_proj != d_embed else None)
        else:
            for i in range(self.n_clusters + 1):
                d_i = d_embed // div_val**i
                self.out_layers.append(nn.Linear(d_i, self.bounds[i + 1] - self.bounds[i]))
                self._set_proj(i, nn.Parameter(torch.empty(d_proj, d_i)))

    def _set_proj(self, i: int, p: nn.Parameter | None) -> None:
        while len(self.out_projs) <= i:
            self.out_projs.append(None)
        self.out_projs[i] = p
        name = f"out_proj_{i}"
        if p is None:
            if name in self._parameters:
                del self._parameters[name]
        else:
            self.register_parameter(name, p)

    def tie_proj(self, i: int, p: nn.Parameter | None) -> None:
        self._set_proj(i, p)

    def _cluster_params(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.div_val == 1:
            lo, hi = self.bounds[i], self.bounds[i + 1]
            w, b = self.out_layers[0].weight[lo:hi], self.out_layers[0].bias[lo:hi]
        else:
            w, b = self.out_layers[i].weight, self.out_layers[i].bias
        if i == 0 and self.n_clusters > 0:
            w = torch.cat([w, self.cluster_weight], dim=0)
            b = torch.cat([b, self.cluster_bias], dim=0)
        return w, b

    def _cluster_column(self, i: int) -> int:
        # The reference reads cluster i's head logit at column -i (the cluster rows in reverse); kept so that
        # its checkpoints load unchanged.
        return self.shortlist + self.n_clusters - i

    @staticmethod
    def _logit(hidden, weight, bias, proj):
        if proj is not None:
            hidden = F.linear(hidden, proj.t())
        return F.linear(hidden, weight, bias)

    def forward(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """NLL (nats) of every target, (N,), in float32."""
        if hidden.shape[0] != target.shape[0]:
            raise ValueError(f"{hidden.shape[0]} hidden states for {target.shape[0]} targets")
        if self.n_clusters == 0:
            logit = self._logit(hidden, *self._cluster_params(0), self.out_projs[0])
            if logit.device.type == "cpu":  # the same numbers in cache-sized blocks (repro.nn.blocked)
                return blocked.cross_entropy_float32(logit, target)
            return F.cross_entropy(logit.float(), target, reduction="none")
        head_logprob = torch.log_softmax(self._logit(hidden, *self._cluster_params(0), self.out_projs[0]).float(), -1)
        nll = torch.empty(target.shape, dtype=torch.float32, device=hidden.device)
        for i in range(self.n_clusters + 1):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            idx = ((target >= lo) & (target < hi)).nonzero().squeeze(1)
            if idx.numel() == 0:
                continue
            t_i = target[idx] - lo
            if i == 0:
                logprob = head_logprob[idx].gather(1, t_i[:, None]).squeeze(1)
            else:
                tail = self._logit(hidden[idx], *self._cluster_params(i), self.out_projs[i]).float()
                tail_logprob = torch.log_softmax(tail, -1).gather(1, t_i[:, None]).squeeze(1)
                logprob = head_logprob[idx, self._cluster_column(i)] + tail_logprob
            nll = nll.index_copy(0, idx, -logprob)
        return nll

    def log_prob(self, hidden: torch.Tensor) -> torch.Tensor:
        """log p(w) for the whole vocabulary, (N, n_token): for sampling and for tests."""
        head_logprob = torch.log_softmax(self._logit(hidden, *self._cluster_params(0), self.out_projs[0]).float(), -1)
        if self.n_clusters == 0:
            return head_logprob
        parts = [head_logprob[:, : self.shortlist]]
        for i in range(1, self.n_clusters + 1):
            tail = torch.log_softmax(self._logit(hidden, *self._cluster_params(i), self.out_projs[i]).float(), -1)
            parts.append(head_logprob[:, self._cluster_column(i), None] + tail)
        return torch.cat(parts, dim=1)
