"""The ∞-former's continuous long-term memory (Martins, Marinho, Martins; ACL 2022, arXiv 2109.00301, §3),
as a backbone-independent module: anything that has queries (B, H, T, E) and a stream of vectors (B, P, D) to
remember can use it (the Transformer-XL backbone in `model.py`; a GPT-2 block later).

Layout legend: B batch, H heads, T queries, E per-head width, D width of the remembered vectors, N basis
functions, P vectors fitted at one update, M samples of the old signal, K histogram bins (the paper's D).

The mechanism, with the paper's equations:
- A sequence X (P×D) at positions t_i ∈ [0, 1] becomes a continuous signal X̄(t) = Bᵀψ(t) (Eq. 3), ψ a vector of
  N Gaussian radial basis functions (centres on [0, 1], a few widths). B by ridge regression,
  Bᵀ = XᵀFᵀ(FFᵀ + λI)⁻¹ = XᵀG (Eq. 5); G depends only on the positions and is computed once per geometry.
- The smoothing gate X̃ = sigmoid(Conv1d_k=3(X)) ⊙ X comes before the regression (§3.4, Eq. 17).
- LTM keys and values per head: K_h = B W_K, V_h = B W_V (Eq. 7): the cost depends on N, not on the context.
- Each query gets a Gaussian density N(t; μ, σ²) with μ = sigmoid(affine(K q/√E)) and σ² = softplus(affine(K q/√E))
  (Eq. 8–9); the head output is z = Vᵀ E_p[ψ(t)] (Eq. 10), in closed form for Gaussian ψ and Gaussian p;
  the heads are concatenated and projected (W^O, Eq. 11).
- Unbounded memory (§3.2): sample the old signal at M points, contract them into [0, τ] (X̄(t/τ), Eq. 13–14),
  put the P new vectors on ]τ, 1] and refit. The M sample points are linearly spaced or, with sticky memories
  (§3.3, Eq. 16), drawn from a K-bin histogram of the attention mass the previous step put on each bin
  (integrals of the query Gaussians, via erf), so that attended regions keep more room in the next signal.
- KL regulariser (§3.4, Eq. 18–19): KL(N(μ, σ²) ‖ N(μ, σ₀²)) = ½(σ²/σ₀² − log(σ²/σ₀²) − 1); with `mu_0` set, the
  prior is N(μ₀, σ₀²) and ½(μ − μ₀)²/σ₀² is added (the official language-modelling code, mu_0 = −1).

Details taken from the official code (deep-spin/infinite-former, `sorting/long_term_attention.py`,
`basis_functions.py`, `continuous_softmax.py`; facts only):
- E_p[ψ_j] is the integral over the whole real line: N(μ; μ_j, σ² + σ_j²).
- The regression is padded: F is also evaluated at positions outside [0, 1] where the signal is taken to be zero
  (a grid of spacing 1/n, n/2 points on each side for n fitted positions), so the fit does not bend at the edges;
  only the rows of G of the real positions are kept. For a first fit of n evenly spaced positions ((i + ½)/n)
  our grid is the official one exactly (even and odd n); for an update see `grid` below.
- Centres: N/|widths| points on linspace(0, 1) for each width. σ² is clamped at ≥ 1e-6 (sorting; `min_var`),
  ≥ 1e-4 in both official GPT-2 codes (`finetune_gpt2`, `document_grounded_generation`).
- The update puts the M old samples at t = kτ/M (k = 1..M), read from the old signal at k/M, and the P new
  vectors at t = τ + (1 − τ)k/P (k = 1..P). The first fit (no old signal yet) spreads the P vectors evenly on
  [0, 1] at (i + ½)/P.
- The affine maps for μ and σ² are Linear(N → 1) without bias, shared by the heads; the queries are the
  self-attention's queries; the LTM attention output is added to the self-attention output.
- The KL term of a layer is averaged over batch, heads and queries (the official `kl_reg.mean()`, summed over
  layers) and weighted by λ_KL; the paper writes a sum.

Deviations from the official code (see papers/infinity_former/README.md):
- Sticky memories draw each sample point uniformly inside its histogram bin (a sample from the histogram's
  piecewise-constant density); the official code draws only the bin and takes its left edge.
- The paper's KL formula has −log(σ/σ₀) inside the ½(…); the official code (and ours) uses −log(σ²/σ₀²), the
  correct KL divergence.
- The regression and the continuous attention run in float32 even under bf16 autocast (G has entries of both
  signs and the fit is a long sum: bf16 would lose it).
- The continuous attention computes the same functions in another order (`ContinuousLTM.attend`,
  `continuous_read`): μ and σ² through q·W_K(Bᵀw) instead of affine maps of the (B, H, T, N) scores, Vᵀ E_p[ψ] in
  cache-sized blocks with a closed-form gradient, and Gaussian values whose exponential is below 1e−30 set to 0
  (`exp_flushed`); the official order differs from ours by float rounding (README, deviations).
- The update's padding grid (`grid`): the official G for the update (M + P positions) takes its pads from
  linspace(−½ + s, 3/2 − s, 2(M + P)) with s = 1/(2P + M) (`grid: official`, the paper configs): (M + P)/2 pads on
  each side, 0.26–0.45 of a spacing from the boundary. `grid: ours` (the default) applies the official first-fit
  recipe (s = 1/(2n) for n positions) to the M + P update positions: spacing 1/(M + P), the first pad half a
  spacing out — what s = 1/(2(P + M)) would have given, so we read 1/(2P + M) as a slip. The fits are identical.
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LTMConfig:
    """The long-term memory's hyper-parameters; defaults are the official sorting settings (PAPERS.md §2)."""

    n_basis: int = 512  # N (the official sorting script; the paper's Figure 3 used 1024)
    widths: tuple[float, ...] = (0.01, 0.05)  # σ_j of the Gaussian RBFs (GPT-2 runs: 0.005, 0.01)
    ridge: float = 1.0  # λ of the ridge regression (GPT-2 runs: 0.5)
    tau: float = 0.75  # contraction factor τ of the unbounded memory (GPT-2 runs: 0.5)
    n_samples: int = 512  # M, samples of the old signal at each update
    sampling: Literal["linear", "sticky"] = "linear"
    n_bins: int = 128  # K, bins of the sticky-memory histogram (the official GPT-2 code: 128)
    gate: bool = True  # the Conv1d smoothing gate (§3.4)
    sigma_0: float = 0.05  # σ₀ of the KL regulariser
    kl_weight: float = 1e-6  # λ_KL
    # μ₀ of the KL term's prior N(μ₀, σ₀²): None regularises σ² only (the paper; the official sorting and dialogue
    # code). A number adds ½(μ − μ₀)²/σ₀², as the official language-modelling code (finetune_gpt2
    # `LongTermAttention.forward`) does with its config's mu_0 = −1: its test `if self.mu_0 > 0` is inverted, so
    # the μ term applies exactly for μ₀ ≤ 0 — here it applies whenever μ₀ is set
    mu_0: float | None = None
    min_var: float = 1e-6  # σ² clamp: 1e-6 in the official sorting code, 1e-4 in both official GPT-2 codes
    pad_regression: bool = True  # zero padding outside [0, 1] in the regression (official)
    # the update's pad grid (`pad_positions`): `official` = the official G_inf (shift 1/(2P + M)), the paper
    # configs; `ours` = the official first-fit grid applied to the M + P update positions (spacing 1/(M + P))
    grid: Literal["official", "ours"] = "ours"
    # N(0, init_std) for the key / value / μ / σ² / output linear maps; None: PyTorch's default. The official GPT-2
    # codes build the LTM inside `GPT2PreTrainedModel`, whose `_init_weights` draws every nn.Linear from
    # N(0, initializer_range = 0.02); the gate (a torch.nn.Conv1d, not GPT-2's Conv1D) keeps PyTorch's default
    init_std: float | None = None

    def __post_init__(self):
        if self.n_basis <= 0 or not self.widths:
            raise ValueError("ltm.n_basis must be positive and ltm.widths non-empty")
        if self.n_basis % len(self.widths):
            raise ValueError(
                f"ltm.n_basis = {self.n_basis} does not split into {len(self.widths)} widths: use a multiple of "
                f"{len(self.widths)} (the centres are N/|widths| points per width)"
            )
        if any(w <= 0 for w in self.widths) or self.ridge < 0:
            raise ValueError("ltm.widths must be positive and ltm.ridge ≥ 0")
        if not 0.0 < self.tau < 1.0:
            raise ValueError(f"ltm.tau lies in ]0, 1[, got {self.tau}")
        if self.n_samples <= 0 or self.n_bins <= 0:
            raise ValueError("ltm.n_samples and ltm.n_bins must be positive")
        if self.sampling not in ("linear", "sticky"):
            raise ValueError(f"ltm.sampling is 'linear' or 'sticky', got {self.sampling!r}")
        if self.grid not in ("official", "ours"):
            raise ValueError(f"ltm.grid is 'official' or 'ours', got {self.grid!r}")
        if self.sigma_0 <= 0 or self.kl_weight < 0 or self.min_var <= 0:
            raise ValueError("ltm.sigma_0 and ltm.min_var must be positive, ltm.kl_weight ≥ 0")
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"ltm.init_std must be positive or null, got {self.init_std}")


# ------------------------------------------------------------------------------------------ basis functions


def _float32(device: torch.device):
    """Autocast off (float32 regions); nothing on the meta device, which has no autocast (FLOP counts by shape)."""
    return contextlib.nullcontext() if device.type == "meta" else torch.autocast(device.type, enabled=False)


def rbf_centres(n_basis: int, widths: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ_N, σ_N): N/|widths| centres on linspace(0, 1) for each width (float64)."""
    per = n_basis // len(widths)
    centres = torch.linspace(0.0, 1.0, per, dtype=torch.float64)
    mu = centres.repeat_interleave(len(widths))
    sigma = torch.tensor(widths, dtype=torch.float64).repeat(per)
    return mu, sigma


_EXP_FLOOR = -69.0  # e^−69 ≈ 1e−30: below it the LTM's Gaussian values are taken as 0 (`exp_flushed`)


def exp_flushed(arg: torch.Tensor) -> torch.Tensor:
    """exp(arg) in place, with every value below e^−69 ≈ 1e−30 set to 0. For the Gaussians that the LTM reads its
    signal with (ψ, E_p[ψ]), whose values fall to nothing a few widths from a centre: float32's exp of an argument
    below ≈ −88 takes a slow path (≈ 80× slower here), and subnormal values (< 1.2e−38), in the exp's results or in
    their products with coefficients, slow the matrix products 2–11×. A value below 1e−30 is far below the
    rounding of any sum it enters (every row also holds values ≥ 1e−3), so the results are the same to rounding."""
    return torch.threshold_(arg.clamp_(min=_EXP_FLOOR).exp_(), 1.1e-30, 0.0)


def gaussian(t: torch.Tensor, mu: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """N(t; μ, σ²) (broadcasting)."""
    return torch.exp(-0.5 * (t - mu) ** 2 / var) / torch.sqrt(2 * math.pi * var)


def evaluate_basis(t: torch.Tensor, mu_N: torch.Tensor, sigma_N: torch.Tensor) -> torch.Tensor:
    """ψ(t) for every t: (…, N)."""
    return gaussian(t[..., None], mu_N, sigma_N**2)


def read_basis(t: torch.Tensor, mu_N: torch.Tensor, sigma_N: torch.Tensor) -> torch.Tensor:
    """ψ(t) as the LTM reads its signal with it (X̄(t) = Bᵀψ(t)): `evaluate_basis` with values whose exponential
    is below ≈ 1e−30 set to 0 (`exp_flushed`; below ≈ 1e−28 after the normaliser): the same products to rounding
    without the slow paths (ψ at an update's 1,536 positions times (1024 × 300) coefficients: 34 ms with ψ's
    subnormal values, 3.1 ms without)."""
    var = sigma_N**2
    return exp_flushed(-0.5 * (t[..., None] - mu_N) ** 2 / var) / torch.sqrt(2 * math.pi * var)


def expected_basis(mu: torch.Tensor, var: torch.Tensor, mu_N: torch.Tensor, sigma_N: torch.Tensor) -> torch.Tensor:
    """E_{N(t; μ, σ²)}[ψ_j(t)] = ∫ N(t; μ, σ²) N(t; μ_j, σ_j²) dt = N(μ; μ_j, σ² + σ_j²), (…, N)."""
    return gaussian(mu[..., None], mu_N, var[..., None] + sigma_N**2)


def _basis_by_width(mu: torch.Tensor, var: torch.Tensor, centres_C: torch.Tensor, widths_W: torch.Tensor
                    ) -> torch.Tensor:
    """E_p[ψ] in width-major layout (…, W, C): the function of width w and centre c at [w, c]."""
    d = -0.5 * (mu[..., None] - centres_C) ** 2  # (…, C)
    v = var[..., None] + widths_W**2  # (…, W)
    log_norm = -0.5 * torch.log(2 * math.pi * v)
    arg = torch.mul(v.reciprocal()[..., None], d[..., None, :]).add_(log_norm[..., None])  # −½(μ−μ_c)²/s_w − ½log 2πs_w
    return exp_flushed(arg)


def expected_basis_by_width(mu: torch.Tensor, var: torch.Tensor, centres_C: torch.Tensor, widths_W: torch.Tensor
                            ) -> torch.Tensor:
    """`expected_basis` for the basis of `rbf_centres` (N = C·W, function c·W + w has centre c and width w) from the
    C distinct centres and the W distinct widths: −½(μ − μ_c)², 1/s_w = 1/(σ² + σ_w²) and the log-normaliser
    −½ log 2πs_w are computed once each, not once per function; over all N run the exponent (an outer product and
    an addition) and one exp. The same values as `expected_basis` to float rounding, except that values below
    ≈ 1e−30 are 0 (`exp_flushed`: float32's slow paths for exp and subnormal numbers)."""
    return _basis_by_width(mu, var, centres_C, widths_W).transpose(-1, -2).flatten(-2)


class _ContinuousRead(torch.autograd.Function):
    """z = E_p[ψ]ᵀ V per query (Eq. 10) for the basis of `rbf_centres`, in blocks of rows that stay in cache.

    The (B, H, T, N) tensor E_p[ψ] is never whole: each block of ≈ `_READ_BLOCK` values is built from the C
    centres and W widths (`expected_basis_by_width`, width-major: V's rows are reordered to match), multiplied by V
    at once, and dropped; the backward builds it again block by block. Its gradient is the closed form of the
    Gaussian's: with a = μ_c − μ and s = σ² + σ_w², ∂r/∂μ = r·a/s and ∂r/∂σ² = r·(a²/s − 1)/(2s), so with
    g = ∂L/∂r, ∂L/∂μ = Σ_w S₁/s and ∂L/∂σ² = Σ_w (S₂/s − S₀)/(2s), where S_k = Σ_c g·r·a^k (one small product per
    row). Against autograd through `expected_basis` and a matrix product (≈ 30 passes over (B, H, T, N) in float32,
    the tensor and its intermediates kept for the backward): 5 elementwise passes per block forward (exponent,
    exp, flush) and 6 backward (the same, and g·r), each over a block in cache, and no (B, H, T, N) memory."""

    @staticmethod
    def forward(ctx, mu_BHT, var_BHT, v_BHNE, centres_C, widths_W):
        with _float32(mu_BHT.device):
            return _ContinuousRead._forward(ctx, mu_BHT, var_BHT, v_BHNE, centres_C, widths_W)

    @staticmethod
    def _forward(ctx, mu_BHT, var_BHT, v_BHNE, centres_C, widths_W):
        b, h, t = mu_BHT.shape
        n, e = v_BHNE.shape[-2:]
        c, w = centres_C.numel(), widths_W.numel()
        mu, var = mu_BHT.reshape(b * h, t), var_BHT.reshape(b * h, t)
        v = v_BHNE.reshape(b * h, c, w, e).transpose(1, 2).reshape(b * h, n, e)  # rows width-major
        z = v.new_empty(b * h, t, e)
        for i, j, t0, t1 in _read_blocks(b * h, t, n, mu.device):
            r = _basis_by_width(mu[i:j, t0:t1], var[i:j, t0:t1], centres_C, widths_W)  # (g, τ, W, C)
            torch.bmm(r.flatten(-2), v[i:j], out=z[i:j, t0:t1])
        ctx.save_for_backward(mu_BHT, var_BHT, v, centres_C, widths_W)
        return z.view(b, h, t, e)

    @staticmethod
    def backward(ctx, dz_BHTE):
        # float32 as the forward, also when the backward runs inside an autocast region (Lightning's)
        with _float32(dz_BHTE.device):
            return _ContinuousRead._backward(ctx, dz_BHTE)

    @staticmethod
    def _backward(ctx, dz_BHTE):
        mu_BHT, var_BHT, v, centres_C, widths_W = ctx.saved_tensors
        b, h, t = mu_BHT.shape
        n, e = v.shape[-2:]
        c, w = centres_C.numel(), widths_W.numel()
        mu, var = mu_BHT.reshape(b * h, t), var_BHT.reshape(b * h, t)
        dz = dz_BHTE.reshape(b * h, t, e).to(v.dtype)
        dmu, dvar = torch.empty_like(mu), torch.empty_like(var)
        dv = torch.zeros_like(v) if ctx.needs_input_grad[2] else None
        for i, j, t0, t1 in _read_blocks(b * h, t, n, mu.device):
            m, s = mu[i:j, t0:t1], var[i:j, t0:t1][..., None] + widths_W**2  # (g, τ), (g, τ, W)
            r = _basis_by_width(m, var[i:j, t0:t1], centres_C, widths_W).flatten(-2)  # (g, τ, N), as the forward
            if dv is not None:
                dv[i:j].baddbmm_(r.transpose(1, 2), dz[i:j, t0:t1])
            gr = torch.bmm(dz[i:j, t0:t1], v[i:j].transpose(1, 2)).mul_(r)  # g·r, (g, τ, N)
            powers = torch.empty(m.numel(), 3, c, dtype=m.dtype, device=m.device)  # rows 1, a, a² per query
            powers[:, 0].fill_(1)
            torch.sub(centres_C, m.reshape(-1, 1), out=powers[:, 1])  # a = μ_c − μ
            torch.mul(powers[:, 1], powers[:, 1], out=powers[:, 2])
            S = torch.bmm(gr.view(-1, w, c), powers.transpose(1, 2)).view(*m.shape, w, 3).unbind(-1)  # S₀, S₁, S₂
            dmu[i:j, t0:t1] = (S[1] / s).sum(-1)
            dvar[i:j, t0:t1] = ((S[2] / s - S[0]) / (2 * s)).sum(-1)
        if dv is not None:  # back to the caller's row order (centre-major)
            dv = dv.view(b * h, w, c, e).transpose(1, 2).reshape(b, h, n, e)
        return dmu.view_as(mu_BHT), dvar.view_as(var_BHT), dv, None, None


_READ_BLOCK = 1 << 19  # values of E_p[ψ] per block of `_ContinuousRead` on a CPU (2 MiB in float32: cache-sized)
_READ_BLOCK_ACCELERATOR = 1 << 26  # on a GPU (256 MiB): a few large kernels, not thousands of small launches


def _read_blocks(bh: int, t: int, n: int, device: torch.device | str = "cpu"):
    """(i, j, t0, t1): blocks of ≈ `_READ_BLOCK` values (`_READ_BLOCK_ACCELERATOR` off the CPU) over (head-batch,
    query) rows; several head-batches when a whole one is smaller, else one head-batch's rows in slices."""
    block = _READ_BLOCK if torch.device(device).type == "cpu" else _READ_BLOCK_ACCELERATOR
    if t * n <= block:
        g = max(1, block // (t * n))
        for i in range(0, bh, g):
            yield i, min(i + g, bh), 0, t
    else:
        rows = max(1, block // n)
        for i in range(bh):
            for t0 in range(0, t, rows):
                yield i, i + 1, t0, min(t0 + rows, t)


def continuous_read(mu_BHT: torch.Tensor, var_BHT: torch.Tensor, v_BHNE: torch.Tensor, centres_C: torch.Tensor,
                    widths_W: torch.Tensor) -> torch.Tensor:
    """Vᵀ E_p[ψ] (B, H, T, E) for queries' densities N(μ, σ²) (B, H, T) and values V (B, H, N, E) over the basis of
    `rbf_centres` (its C distinct centres and W widths): `expected_basis(μ, σ², …) @ V` without the (B, H, T, N)
    tensor (`_ContinuousRead`)."""
    return _ContinuousRead.apply(mu_BHT, var_BHT, v_BHNE, centres_C, widths_W)


def pad_positions(n: int, *, n_old: int = 0, grid: Literal["official", "ours"] = "ours"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The zero-signal pad points (left of 0, right of 1) of a regression over n positions, n_old of which are old
    samples (0 for a first fit), float64.

    A first fit, and every fit with `grid="ours"`: n//2 points of spacing 1/n on each side, the nearest half a
    spacing from the boundary (the official fit grid, linspace(−½ + 1/(2n), 3/2 − 1/(2n), 2n) for even n, its
    odd-n form for odd n). An update with `grid="official"`: the part below 0 and above 1 of
    linspace(−½ + s, 3/2 − s, 2n) with s = 1/(2·n_new + n_old), in float32 as the official `LongTermAttention`
    builds its G_inf (n_new = n − n_old)."""
    if n_old == 0 or grid == "ours":
        k = torch.arange(n // 2, dtype=torch.float64)
        return (-(k + 0.5) / n).flip(0), 1 + (k + 0.5) / n
    shift = 1 / float(2 * (n - n_old) + n_old)
    line = torch.linspace(-0.5 + shift, 1.5 - shift, 2 * n, dtype=torch.float32).double()
    left, right = line[line < 0], line[line > 1]
    # the official slices G as if n//2 pads lay on each side (`compute_G`); true for every size we tried
    if left.numel() != n // 2 or right.numel() != n // 2:
        raise ValueError(f"the official update grid has {left.numel()} + {right.numel()} pads for {n_old} samples "
                         f"+ {n - n_old} vectors, not {n // 2} per side as its slice assumes: use ltm.grid: ours")
    return left, right


def ridge_matrix(positions: torch.Tensor, mu_N: torch.Tensor, sigma_N: torch.Tensor, *, ridge: float,
                 pad: bool = True, n_old: int = 0, grid: Literal["official", "ours"] = "ours") -> torch.Tensor:
    """G (P, N) with Bᵀ = XᵀG for vectors X (P×D) at `positions`: G = Fᵀ(FFᵀ + λI)⁻¹ (Eq. 5), in float64.

    With `pad`, F also holds ψ at the pad points of `pad_positions` (n_old old samples among the positions, the
    update's `grid`), where the signal is taken to be zero; only the rows of the real positions are returned."""
    t = positions.to(torch.float64)
    n = t.numel()
    if pad:
        left, right = pad_positions(n, n_old=n_old, grid=grid)
        t_all = torch.cat([left, t, right])
    else:
        t_all = t
    F_NP = evaluate_basis(t_all, mu_N, sigma_N).T  # (N, P_all)
    A = F_NP @ F_NP.T + ridge * torch.eye(F_NP.shape[0], dtype=torch.float64)
    G = torch.linalg.solve(A, F_NP).T  # (P_all, N) = Fᵀ A⁻¹ (A symmetric)
    return G[n // 2 : n // 2 + n] if pad else G


def fit_positions(n: int) -> torch.Tensor:
    """Evenly spaced positions (i + ½)/n on [0, 1] of a first fit."""
    return (torch.arange(n, dtype=torch.float64) + 0.5) / n


def update_positions(n_old: int, n_new: int, tau: float) -> torch.Tensor:
    """Positions of an update (§3.2): old samples at kτ/M (k = 1..M), new vectors at τ + (1 − τ)k/P (k = 1..P)."""
    old = torch.arange(1, n_old + 1, dtype=torch.float64) * tau / n_old
    new = tau + (1 - tau) * torch.arange(1, n_new + 1, dtype=torch.float64) / n_new
    return torch.cat([old, new])


def linear_samples(n_samples: int) -> torch.Tensor:
    """Linearly spaced sample points k/M (k = 1..M) at which the old signal is read."""
    return torch.arange(1, n_samples + 1, dtype=torch.float64) / n_samples


# ---------------------------------------------------------------------------------------- sticky memories


def bin_mass(mu: torch.Tensor, var: torch.Tensor, n_bins: int) -> torch.Tensor:
    """∫ over each of K equal bins of [0, 1] of N(t; μ, σ²), via erf (Eq. 16–17): (…, K)."""
    edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=mu.dtype, device=mu.device)
    z = (edges - mu[..., None]) / torch.sqrt(2 * var[..., None])
    cdf = 0.5 * (1 + torch.erf(z))
    return cdf[..., 1:] - cdf[..., :-1]


def attention_histogram(mu_BHT: torch.Tensor, var_BHT: torch.Tensor, n_bins: int) -> torch.Tensor:
    """p(d_k) ∝ Σ_h Σ_i ∫_{d_k} N(t; μ_hi, σ²_hi) dt (Eq. 16), unnormalised: (B, K)."""
    b = mu_BHT.shape[0]
    return bin_mass(mu_BHT.reshape(b, -1), var_BHT.reshape(b, -1), n_bins).sum(1)


def sticky_samples(hist_BK: torch.Tensor, n_samples: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """M sample points per row drawn from the histogram's piecewise-constant density, sorted: (B, M).

    A bin is chosen with probability proportional to its mass, then a point uniformly inside it."""
    b, k = hist_BK.shape
    p = hist_BK.double().clamp(min=0)
    empty = p.sum(1, keepdim=True) <= 0
    p = torch.where(empty, torch.ones_like(p), p)  # no attention mass on [0, 1] at all: uniform
    bins = torch.multinomial(p / p.sum(1, keepdim=True), n_samples, replacement=True, generator=generator)
    u = torch.rand(b, n_samples, dtype=torch.float64, generator=generator, device=hist_BK.device)
    return ((bins.double() + u) / k).sort(dim=1).values


def kl_to_sigma0(var: torch.Tensor, sigma_0: float) -> torch.Tensor:
    """KL(N(μ, σ²) ‖ N(μ, σ₀²)) = ½(σ²/σ₀² − log(σ²/σ₀²) − 1), elementwise."""
    ratio = var / sigma_0**2
    return 0.5 * (ratio - torch.log(ratio) - 1)


def kl_regulariser(mu: torch.Tensor, var: torch.Tensor, *, sigma_0: float, mu_0: float | None) -> torch.Tensor:
    """The KL term, elementwise: KL(N(μ, σ²) ‖ N(μ, σ₀²)) for μ₀ = None, else KL(N(μ, σ²) ‖ N(μ₀, σ₀²)), which adds
    ½(μ − μ₀)²/σ₀² (the official language-modelling code with its mu_0 = −1)."""
    kl = kl_to_sigma0(var, sigma_0)
    return kl if mu_0 is None else kl + 0.5 * (mu - mu_0) ** 2 / sigma_0**2


# ------------------------------------------------------------------------------------------------ module


@dataclass
class LTMStep:
    """What one call of `ContinuousLTM.forward` produced (besides its output)."""

    coef_BND: torch.Tensor | None = None  # the signal attended to (detached when stored as memory)
    mu_BHT: torch.Tensor | None = None
    var_BHT: torch.Tensor | None = None
    kl: torch.Tensor | None = None  # mean KL over batch, heads and queries (unweighted)
    hist_BK: torch.Tensor | None = None  # sticky histogram of this step's attention (detached)
    regression_error: torch.Tensor | None = None  # relative squared error of the last fit (eval diagnostics)


_SHARED_G: dict[tuple, torch.Tensor] = {}  # ridge matrices by geometry and regression settings (`ridge_G`)


class ContinuousLTM(nn.Module):
    """Continuous long-term-memory attention: `update` refits the signal with new vectors, `attend` reads it.

    Args:
        d_model: width D of the remembered vectors and of the output.
        n_head, d_head: heads and per-head width E of the queries (H·E = width of keys and values).
        cfg: `LTMConfig`.
    """

    def __init__(self, *, d_model: int, n_head: int, d_head: int, cfg: LTMConfig):
        super().__init__()
        self.cfg, self.n_head, self.d_head = cfg, n_head, d_head
        he = n_head * d_head
        self.gate = nn.Conv1d(d_model, d_model, kernel_size=3, padding=1) if cfg.gate else None
        self.key = nn.Linear(d_model, he, bias=False)  # W_K (Eq. 7)
        self.value = nn.Linear(d_model, he, bias=False)  # W_V
        self.mu_net = nn.Linear(cfg.n_basis, 1, bias=False)  # affine for μ (Eq. 8), shared by the heads
        self.var_net = nn.Linear(cfg.n_basis, 1, bias=False)  # affine for σ² (Eq. 9)
        self.out = nn.Linear(he, d_model, bias=False)  # W^O (Eq. 11)
        if cfg.init_std is not None:
            for lin in (self.key, self.value, self.mu_net, self.var_net, self.out):
                nn.init.normal_(lin.weight, mean=0.0, std=cfg.init_std)
        mu_N, sigma_N = rbf_centres(cfg.n_basis, cfg.widths)
        self.register_buffer("basis_mu", mu_N.float(), persistent=False)
        self.register_buffer("basis_sigma", sigma_N.float(), persistent=False)
        # the same values, once each (`expected_basis_by_width`)
        self.register_buffer("basis_centres", mu_N[:: len(cfg.widths)].float(), persistent=False)
        self.register_buffer("basis_widths", sigma_N[: len(cfg.widths)].float(), persistent=False)
        self._psi: dict[tuple, torch.Tensor] = {}  # ψ at fixed points (`basis_at`)
        # evaluation also measures each fit's reconstruction error (`update(with_error=True)`, Figure 3 right's
        # metric, ~a twelfth of an evaluation step at the paper's sizes): set by the evaluation that reports it
        # (`InfinityFormer.measuring_fit`), not by every forward pass without gradients
        self.measure_fit = False
        self._G: dict[tuple, torch.Tensor] = {}  # ridge matrices per geometry (positions depend only on sizes)

    # ----------------------------------------------------------------------------------------- regression
    def ridge_G(self, kind: str, n_old: int, n_new: int, device) -> torch.Tensor:
        """G for a first fit of n_new vectors (`kind="fit"`) or an update of n_old samples + n_new vectors.

        A constant of the geometry, shared by every layer (and model) with the same regression settings: one
        solve per geometry and process (`_SHARED_G`), not one per layer (a 1024-basis solve takes ~0.1 s on a CPU
        core). `self._G` holds what this module uses, and may be set directly (the parity tests do)."""
        key = (kind, n_old, n_new, str(device))
        if key not in self._G:
            c = self.cfg
            shared = (key, c.n_basis, c.widths, c.ridge, c.pad_regression, c.grid, c.tau if kind == "update" else None)
            if shared not in _SHARED_G:
                if len(_SHARED_G) >= 64:  # geometries of one run are few; a sweep in one process must not pile up
                    _SHARED_G.pop(next(iter(_SHARED_G)))
                # built outside inference mode so that training can reuse it after evaluation
                with torch.inference_mode(False):
                    _SHARED_G[shared] = self._build_G(kind, n_old, n_new, device)
                if kind == "update" and torch.device(device).type != "meta":  # meta: shapes only, no values
                    self._warn_if_growing(_SHARED_G[shared], n_new)
            self._G[key] = _SHARED_G[shared]
        return self._G[key]

    def update_gain(self, n_new: int, G: torch.Tensor | None = None) -> float:
        """The factor by which an update of n_new vectors multiplies the carried memory: the spectral radius of the
        linear map from old coefficients to new ones, B ← G_oldᵀ Ψ B (Ψ: the basis at the linear sample points,
        G_old: the update G's rows for the old samples). Below 1 the memory fades (the paper's geometries: 0.53);
        above 1 it grows at every update (papers/infinity_former/stability.py, `repro ltm-gain`)."""
        m = self.cfg.n_samples
        if G is None:
            G = self.ridge_G("update", m, n_new, "cpu")
        G_old = G[:m].detach().double().cpu()
        psi = read_basis(linear_samples(m).double().cpu(), self.basis_mu.double().cpu(),
                         self.basis_sigma.double().cpu())
        # the nonzero eigenvalues of G_oldᵀ Ψ (N × N) are those of Ψ G_oldᵀ (M × M): the smaller problem
        small = psi @ G_old.T if m <= self.cfg.n_basis else G_old.T @ psi
        return float(torch.linalg.eigvals(small).abs().max())

    def _warn_if_growing(self, G: torch.Tensor, n_new: int) -> None:
        """One line, once per geometry and process, when this geometry's updates amplify the memory."""
        gain = self.update_gain(n_new, G)
        if gain > 1:
            c = self.cfg
            print(f"warning: ∞-former LTM with N {c.n_basis}, widths {'/'.join(f'{w:g}' for w in c.widths)}, "
                  f"{c.n_samples} update samples and {n_new} new vectors per update multiplies its memory by "
                  f"{gain:.2f} at every update (it grows without bound; more samples or wider basis functions make "
                  "it fade: `repro ltm-gain`)", file=sys.stderr, flush=True)

    def basis_at(self, kind: str, n_old: int, n_new: int, device) -> torch.Tensor:
        """ψ (P, N) at positions that depend only on sizes, computed once: the linear sample points of an update
        (`kind="samples"`, n_old of them) or the fitted positions of a first fit or an update (`"fit"`,
        `"update"`; the evaluation's reconstruction error). The same numbers as evaluating ψ at every step."""
        key = (kind, n_old, n_new, str(device))
        if key not in self._psi:
            if kind == "samples":
                pos = linear_samples(n_old)
            else:
                pos = fit_positions(n_new) if kind == "fit" else update_positions(n_old, n_new, self.cfg.tau)
            with torch.inference_mode(False), torch.no_grad():  # reusable by training after evaluation
                self._psi[key] = read_basis(pos.float().to(device), self.basis_mu, self.basis_sigma)
        return self._psi[key]

    def _build_G(self, kind: str, n_old: int, n_new: int, device) -> torch.Tensor:
        pos = fit_positions(n_new) if kind == "fit" else update_positions(n_old, n_new, self.cfg.tau)
        mu, sig = rbf_centres(self.cfg.n_basis, self.cfg.widths)
        return ridge_matrix(pos, mu, sig, ridge=self.cfg.ridge, pad=self.cfg.pad_regression,
                            n_old=0 if kind == "fit" else n_old, grid=self.cfg.grid).float().to(device)

    def smooth(self, x_BPD: torch.Tensor) -> torch.Tensor:
        """X̃ = sigmoid(Conv1d_k=3(X)) ⊙ X over time (§3.4), or X without the gate."""
        if self.gate is None:
            return x_BPD
        x_BDP = x_BPD.transpose(1, 2)
        return (torch.sigmoid(self.gate(x_BDP)) * x_BDP).transpose(1, 2)

    def _sticky(self, hist_BK: torch.Tensor | None) -> bool:
        """Whether an update draws its sample points from a histogram (else they are linear, a constant)."""
        return self.cfg.sampling == "sticky" and hist_BK is not None and bool(hist_BK.shape[-1])

    def sample_points(self, b: int, hist_BK: torch.Tensor | None, device) -> torch.Tensor:
        """(B, M) points at which the old signal is read: linear, or drawn from the sticky histogram."""
        m = self.cfg.n_samples
        if self._sticky(hist_BK):
            return sticky_samples(hist_BK.to(device), m)
        return linear_samples(m).to(device).expand(b, m)

    def update(self, coef_BND: torch.Tensor | None, new_BPD: torch.Tensor, *,
               hist_BK: torch.Tensor | None = None, with_error: bool = False):
        """The signal after appending `new_BPD` (§3.2): (B, N, D) coefficients [, relative squared fit error].

        Gradients reach the gate through the new vectors; the old coefficients are constants (detached)."""
        with _float32(new_BPD.device):
            x = self.smooth(new_BPD.float())
            b, p, _ = x.shape
            if coef_BND is None or coef_BND.shape[1] == 0:
                G = self.ridge_G("fit", 0, p, x.device)
                X = x
            else:
                if self._sticky(hist_BK):
                    t_BM = self.sample_points(b, hist_BK, x.device)
                    psi_BMN = read_basis(t_BM.float(), self.basis_mu, self.basis_sigma)
                else:  # linear sample points: ψ at them is a constant of the geometry
                    psi_BMN = self.basis_at("samples", self.cfg.n_samples, 0, x.device).expand(b, -1, -1)
                past_BMD = psi_BMN @ coef_BND.detach().float()  # X̄(t_m), read before contraction
                G = self.ridge_G("update", self.cfg.n_samples, p, x.device)
                X = torch.cat([past_BMD, x], dim=1)  # the old samples go to [0, τ], the new ones to ]τ, 1]
            if X is x:
                coef = G.T @ x  # Bᵀ = XᵀG
            else:  # the same as G.T @ X, with the gradient taken through the new rows only (the old are constants)
                m = X.shape[1] - p
                coef = torch.baddbmm(G[:m].T @ X[:, :m], G[m:].T.expand(b, -1, -1), x)
            if not with_error:
                return coef, None
            n_old = X.shape[1] - p
            recon = self.basis_at("fit" if n_old == 0 else "update", n_old, p, x.device) @ coef  # (B, P_all, D)
            err = ((recon - X) ** 2).sum((1, 2)) / (X**2).sum((1, 2)).clamp(min=1e-12)
            return coef, err.mean()

    # ------------------------------------------------------------------------------------------ attention
    def attend(self, q_BHTE: torch.Tensor, coef_BND: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Z_LTM (B, T, D) with the densities' μ and σ² (B, H, T) (Eq. 7–11).

        μ and σ² are affine maps w of the scores K q/√E (Eq. 8–9), read here as q·(Kᵀw)/√E with Kᵀw = W_K(Bᵀw):
        the same numbers to rounding, without the (B, H, T, N) scores or the (B, N, H·E) keys."""
        with _float32(q_BHTE.device):
            b, h, t, e = q_BHTE.shape
            n = coef_BND.shape[1]
            coef = coef_BND.float()
            w_2N = torch.cat([self.mu_net.weight, self.var_net.weight])  # (2, N): the affine maps of μ and σ²
            kw_BHE2 = self.key(w_2N @ coef).view(b, 2, h, e).permute(0, 2, 3, 1)  # Kᵀw per head
            logits_BHT2 = (q_BHTE.float() / math.sqrt(e)) @ kw_BHE2
            mu = torch.sigmoid(logits_BHT2[..., 0])
            var = F.softplus(logits_BHT2[..., 1]).clamp(min=self.cfg.min_var)
            v_BHNE = self.value(coef).view(b, n, h, e).transpose(1, 2)
            z_BHTE = continuous_read(mu, var, v_BHNE, self.basis_centres, self.basis_widths)  # Vᵀ E_p[ψ]
            out = self.out(z_BHTE.transpose(1, 2).reshape(b, t, h * e))
        return out, mu, var

    def forward(self, q_BHTE: torch.Tensor, *, coef_BND: torch.Tensor | None, new_BPD: torch.Tensor | None,
                hist_BK: torch.Tensor | None = None) -> tuple[torch.Tensor | None, LTMStep]:
        """Append `new_BPD` to the memory (if any), then attend with the queries. Returns (Z_LTM or None when the
        memory is still empty, what the step produced)."""
        step = LTMStep()
        if new_BPD is not None and new_BPD.shape[1]:
            coef_BND, step.regression_error = self.update(coef_BND, new_BPD, hist_BK=hist_BK,
                                                          with_error=self.measure_fit and not self.training)
        if coef_BND is None or coef_BND.shape[1] == 0:
            return None, step
        out, mu, var = self.attend(q_BHTE, coef_BND)
        step.coef_BND, step.mu_BHT, step.var_BHT = coef_BND, mu, var
        step.kl = kl_regulariser(mu, var, sigma_0=self.cfg.sigma_0, mu_0=self.cfg.mu_0).mean()
        if self.cfg.sampling == "sticky":
            with torch.no_grad():
                step.hist_BK = attention_histogram(mu.detach(), var.detach(), self.cfg.n_bins)
        return out, step
