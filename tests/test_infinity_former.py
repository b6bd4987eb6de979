"""∞-former: the continuous long-term memory against independent references, the model against Transformer-XL,
and its memory through checkpoints."""

import math

import pytest
import torch
from torch.testing import assert_close

from papers.infinity_former.ltm import (
    ContinuousLTM,
    LTMConfig,
    attention_histogram,
    bin_mass,
    continuous_read,
    evaluate_basis,
    exp_flushed,
    expected_basis,
    expected_basis_by_width,
    fit_positions,
    kl_to_sigma0,
    linear_samples,
    pad_positions,
    rbf_centres,
    read_basis,
    ridge_matrix,
    sticky_samples,
    update_positions,
)
from papers.infinity_former.model import InfinityFormer
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig

SMALL = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, n_token=22, dropout=0.0, dropatt=0.0)


def _signal(t: torch.Tensor) -> torch.Tensor:
    """A smooth 3-dimensional test signal on [0, 1]."""
    return torch.stack([torch.sin(2 * math.pi * t), 0.5 * torch.cos(6 * math.pi * t), t**2 - t], dim=-1)


def _fit(n_basis: int, x_PD: torch.Tensor, pos: torch.Tensor, widths=(0.01, 0.05), ridge=1.0):
    mu, sig = rbf_centres(n_basis, widths)
    return ridge_matrix(pos, mu, sig, ridge=ridge).T @ x_PD, (mu, sig)  # B (N, D)


# ---------------------------------------------------------------------------------------------- closed forms


def test_expected_basis_equals_numerical_integration():
    mu_N, sig_N = rbf_centres(8, (0.01, 0.05))
    t = torch.linspace(-3.0, 4.0, 400_001, dtype=torch.float64)
    for mu, var in [(0.3, 0.01), (0.9, 0.0004), (0.05, 0.2), (0.5, 1e-5)]:
        density = torch.exp(-0.5 * (t - mu) ** 2 / var) / math.sqrt(2 * math.pi * var)
        numeric = torch.trapezoid(density[:, None] * evaluate_basis(t, mu_N, sig_N), t, dim=0)
        closed = expected_basis(torch.tensor(mu, dtype=torch.float64), torch.tensor(var, dtype=torch.float64),
                                mu_N, sig_N)
        assert_close(closed, numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n_basis,widths", [(1024, (0.01, 0.05)), (12, (0.01, 0.05, 0.1)), (8, (0.02,))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_expected_basis_by_width_matches_the_full_basis(n_basis, widths, dtype):
    """The form from distinct centres and widths gives `expected_basis`'s values over the full basis, in the layout
    of `rbf_centres`, to rounding; values below ≈ 1e−30 are exactly 0 (`exp_flushed`)."""
    g = torch.Generator().manual_seed(0)
    mu = torch.rand(2, 3, 5, generator=g, dtype=dtype)
    var = torch.rand(2, 3, 5, generator=g, dtype=dtype) * 0.1 + 1e-6
    mu_N, sig_N = (x.to(dtype) for x in rbf_centres(n_basis, widths))
    w = len(widths)
    fast = expected_basis_by_width(mu, var, mu_N[::w], sig_N[:w])
    ref = expected_basis(mu, var, mu_N, sig_N)
    assert fast.shape == (2, 3, 5, n_basis)
    assert_close(fast, ref, rtol=2e-5 if dtype == torch.float32 else 1e-12, atol=1.2e-30)
    zero = fast == 0
    assert torch.all(zero[ref < 1e-30]) and not zero[ref >= 1.2e-30].any()  # 0 exactly where ref is below ~1e−30
    assert (ref < 1e-30).any() and (fast > 0).any()


def test_exp_flushed_sets_values_below_1e30_to_zero():
    x = torch.tensor([0.0, -10.0, -68.9, -69.1, -88.0, -200.0, float("-inf")])
    out = exp_flushed(x.clone())
    assert_close(out[:3], torch.exp(x[:3]), rtol=1e-6, atol=0)
    assert torch.equal(out[3:], torch.zeros(4))


def _reference_read(mu, var, v, mu_N, sig_N):
    return expected_basis(mu, var, mu_N, sig_N) @ v  # autograd through the closed form and a matrix product


# one block (every element by finite differences: the slow tier); several head-batches each; slices of one
@pytest.mark.parametrize("block", [pytest.param(1 << 18, marks=pytest.mark.slow), 40, 7])
def test_continuous_read_equals_autograd_through_the_closed_form(monkeypatch, block):
    """`continuous_read` (blocked, E_p[ψ] rebuilt in the backward, closed-form gradient) gives the output and the
    gradients (μ, σ², V) of autograd through `expected_basis(…) @ V`, in float64, for every blocking."""
    import papers.infinity_former.ltm as ltm_mod

    monkeypatch.setattr(ltm_mod, "_READ_BLOCK", block)
    g = torch.Generator().manual_seed(1)
    mu_N, sig_N = rbf_centres(24, (0.01, 0.05, 0.1))
    mu = torch.rand(2, 3, 9, generator=g, dtype=torch.float64).requires_grad_()
    var = (torch.rand(2, 3, 9, generator=g, dtype=torch.float64) * 0.02 + 1e-4).requires_grad_()
    v = torch.randn(2, 3, 24, 5, generator=g, dtype=torch.float64).requires_grad_()
    gz = torch.randn(2, 3, 9, 5, generator=g, dtype=torch.float64)
    z = continuous_read(mu, var, v, mu_N[::3], sig_N[:3])
    ref = _reference_read(mu, var, v, mu_N, sig_N)
    assert_close(z, ref, rtol=1e-12, atol=1e-12)
    ours = torch.autograd.grad((z * gz).sum(), (mu, var, v))
    theirs = torch.autograd.grad((ref * gz).sum(), (mu, var, v))
    for a, b in zip(ours, theirs):
        assert_close(a, b, rtol=1e-10, atol=1e-10)
    # the gradients are large against the tolerance: a wrong term of the closed form could not hide
    assert min(float(t.abs().max()) for t in theirs) > 1.0
    # finite differences too: every element at one block (the closed form), a random direction at the small blocks
    # (their blocking is what differs, and it is compared above; every element took 30 s a blocking there)
    assert torch.autograd.gradcheck(lambda a, b, c: continuous_read(a, b, c, mu_N[::3], sig_N[:3]),
                                    (mu, (var.detach() + 5e-3).requires_grad_(), v), fast_mode=block != 1 << 18)


def test_read_blocks_cover_every_row_once_and_are_large_on_an_accelerator():
    from papers.infinity_former.ltm import _read_blocks

    for bh, t, n in [(48, 1024, 1024), (32, 64, 64), (5, 7, 300000)]:
        for dev in ("cpu", "meta"):
            seen = torch.zeros(bh, t, dtype=torch.int64)
            blocks = list(_read_blocks(bh, t, n, dev))
            for i, j, t0, t1 in blocks:
                seen[i:j, t0:t1] += 1
            assert torch.all(seen == 1)
    assert len(list(_read_blocks(48, 1024, 1024, "cpu"))) == 96  # 2 MiB blocks on a CPU
    assert len(list(_read_blocks(48, 1024, 1024, "meta"))) == 1  # one kernel's worth elsewhere


def test_continuous_read_stays_float32_under_autocast():
    """Forward and backward inside a bf16 autocast region (Lightning runs the backward inside it) give the float32
    numbers exactly."""
    g = torch.Generator().manual_seed(2)
    mu_N, sig_N = rbf_centres(32, (0.01, 0.05))
    mu = torch.rand(1, 2, 6, generator=g).requires_grad_()
    var = (torch.rand(1, 2, 6, generator=g) * 0.02 + 1e-4).requires_grad_()
    v = torch.randn(1, 2, 32, 4, generator=g).requires_grad_()
    plain = continuous_read(mu, var, v, mu_N[::2].float(), sig_N[:2].float())
    grads = torch.autograd.grad(plain.sum(), (mu, var, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = continuous_read(mu, var, v, mu_N[::2].float(), sig_N[:2].float())
        auto_grads = torch.autograd.grad(auto.sum(), (mu, var, v))
    assert auto.dtype == torch.float32 and torch.equal(auto, plain)
    assert all(torch.equal(a, b) for a, b in zip(auto_grads, grads))


def test_ltm_attention_reads_mu_and_var_through_the_weights_as_the_scores_form():
    """μ and σ² as q·W_K(Bᵀw)/√E equal the paper's affine maps of the scores K q/√E (Eq. 8–9, the official code):
    output, μ, σ² and every gradient (queries, coefficients, all weights) to float32 rounding."""
    torch.manual_seed(0)
    ltm = ContinuousLTM(d_model=12, n_head=3, d_head=4, cfg=LTMConfig(n_basis=16, n_samples=6))
    for p in ltm.parameters():
        torch.nn.init.normal_(p, std=0.5)
    q = torch.randn(2, 3, 7, 4, requires_grad=True)
    coef = torch.randn(2, 16, 12, requires_grad=True)

    def scores_form():
        b, h, t, e = q.shape
        k = ltm.key(coef).view(b, 16, h, e).transpose(1, 2)
        v = ltm.value(coef).view(b, 16, h, e).transpose(1, 2)
        scores = (q / math.sqrt(e)) @ k.transpose(-1, -2)
        mu = torch.sigmoid(ltm.mu_net(scores)).squeeze(-1)
        var = torch.nn.functional.softplus(ltm.var_net(scores)).squeeze(-1).clamp(min=ltm.cfg.min_var)
        z = _reference_read(mu, var, v, ltm.basis_mu, ltm.basis_sigma)
        return ltm.out(z.transpose(1, 2).reshape(b, t, h * e)), mu, var

    ours, theirs = ltm.attend(q, coef), scores_form()
    for a, b in zip(ours, theirs):
        assert_close(a, b, rtol=1e-4, atol=1e-5)
    params = [q, coef, ltm.key.weight, ltm.value.weight, ltm.mu_net.weight, ltm.var_net.weight, ltm.out.weight]
    go = torch.randn_like(theirs[0])
    ga = torch.autograd.grad((ours[0] * go).sum() + ours[1].sum() + ours[2].sum(), params)
    gb = torch.autograd.grad((theirs[0] * go).sum() + theirs[1].sum() + theirs[2].sum(), params)
    for a, b in zip(ga, gb):
        assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())


def test_ltm_evaluation_has_the_output_of_training_and_cached_psi():
    """The attention gives the same output with and without gradients; the fixed-point ψ (linear samples, fitted
    positions) is computed once and equals ψ computed afresh (`read_basis`: `evaluate_basis` to rounding, values
    whose exponential is below 1e−30 set to 0: below ≈ 1e−28 after the normaliser)."""
    torch.manual_seed(0)
    ltm = ContinuousLTM(d_model=16, n_head=2, d_head=8, cfg=LTMConfig(n_basis=16, n_samples=6))
    coef, _ = ltm.update(None, torch.randn(2, 10, 16))
    coef, err = ltm.update(coef, torch.randn(2, 10, 16), with_error=True)
    for kind, pos in [("samples", linear_samples(6)), ("update", update_positions(6, 10, ltm.cfg.tau))]:
        cached = ltm.basis_at(kind, 6, 0 if kind == "samples" else 10, "cpu")
        assert torch.equal(cached, read_basis(pos.float(), ltm.basis_mu, ltm.basis_sigma))
        assert_close(cached, evaluate_basis(pos.float(), ltm.basis_mu, ltm.basis_sigma), rtol=1e-5, atol=1e-27)
    q = torch.randn(2, 2, 4, 8)
    with torch.enable_grad():
        train_form = ltm.attend(q.requires_grad_(), coef)[0].detach()
    with torch.inference_mode():
        eval_form = ltm.attend(q.detach(), coef)[0]
    assert torch.equal(eval_form, train_form)


def test_bin_mass_equals_numerical_integration_and_kl_formula():
    mu, var = torch.tensor([0.2, 0.7], dtype=torch.float64), torch.tensor([0.01, 0.04], dtype=torch.float64)
    mass = bin_mass(mu, var, 4)
    for i in range(2):
        for k in range(4):
            t = torch.linspace(k / 4, (k + 1) / 4, 20001, dtype=torch.float64)
            d = torch.exp(-0.5 * (t - mu[i]) ** 2 / var[i]) / torch.sqrt(2 * math.pi * var[i])
            assert mass[i, k].item() == pytest.approx(torch.trapezoid(d, t).item(), rel=1e-6, abs=1e-10)
    hist = attention_histogram(mu.view(1, 2, 1), var.view(1, 2, 1), 4)
    assert_close(hist, mass.sum(0, keepdim=True))
    # KL(N(μ, σ²) ‖ N(μ, σ₀²)) by numerical integration of p log p/q
    s2, s02 = 0.003, 0.05**2
    t = torch.linspace(-1.0, 1.0, 200_001, dtype=torch.float64)
    p = torch.exp(-0.5 * t**2 / s2) / math.sqrt(2 * math.pi * s2)
    log_ratio = -0.5 * t**2 / s2 + 0.5 * t**2 / s02 + 0.5 * math.log(s02 / s2)
    kl = torch.trapezoid(p * log_ratio, t).item()
    assert kl_to_sigma0(torch.tensor(s2, dtype=torch.float64), 0.05).item() == pytest.approx(kl, rel=1e-6)


# ------------------------------------------------------------------------------------------- ridge regression


def test_ridge_matrix_is_the_normal_equations_with_zero_padding():
    mu, sig = rbf_centres(6, (0.1, 0.3))
    pos = fit_positions(10)
    G = ridge_matrix(pos, mu, sig, ridge=0.5, pad=True)
    # reference: ridge regression on the 10 positions plus 5 zero-valued pad points on each side, solved with lstsq
    pad_left = torch.tensor([-(k + 0.5) / 10 for k in range(4, -1, -1)], dtype=torch.float64)
    pad_right = torch.tensor([1 + (k + 0.5) / 10 for k in range(5)], dtype=torch.float64)
    t_all = torch.cat([pad_left, pos, pad_right])
    x = torch.randn(10, 3, dtype=torch.float64)
    x_all = torch.cat([torch.zeros(5, 3, dtype=torch.float64), x, torch.zeros(5, 3, dtype=torch.float64)])
    Phi = evaluate_basis(t_all, mu, sig)  # (P, N)
    A = torch.cat([Phi, math.sqrt(0.5) * torch.eye(6, dtype=torch.float64)])  # min ‖ΦB − X‖² + λ‖B‖²
    b = torch.cat([x_all, torch.zeros(6, 3, dtype=torch.float64)])
    B_ref = torch.linalg.lstsq(A, b).solution
    assert_close(G.T @ x, B_ref, rtol=1e-8, atol=1e-8)
    # official centres for an even count: (i + 1/2)/n inside, the same grid continued outside
    assert_close(pos, torch.linspace(1 / 20, 1 - 1 / 20, 10, dtype=torch.float64))


def test_ridge_regression_reconstructs_a_smooth_signal_and_degrades_gracefully():
    """Stated error: relative mean squared error below 1e-3 on the interior (0.05, 0.95) with N = 256 basis
    functions for 1024 points; the error grows as N shrinks, and stays bounded (no blow-up) at N = 16."""
    pos = fit_positions(1024)
    x = _signal(pos)
    errors = {}
    for n in (256, 128, 64, 32, 16):
        B, (mu, sig) = _fit(n, x, pos)
        recon = evaluate_basis(pos, mu, sig) @ B
        inner = (pos > 0.05) & (pos < 0.95)
        errors[n] = (((recon - x) ** 2)[inner].mean() / (x**2)[inner].mean()).item()
    assert errors[256] < 1e-3
    assert errors[256] <= errors[128] <= errors[64] <= errors[32] <= errors[16]
    assert errors[16] < 0.5


def test_contraction_keeps_the_old_signal_on_zero_to_tau():
    """After an update with linear sampling, X̄_new(t) ≈ X̄_old(t/τ) on [0, τ] and the new vectors sit on ]τ, 1]."""
    cfg = LTMConfig(n_basis=256, n_samples=512, tau=0.75, gate=False, widths=(0.01, 0.05))
    ltm = ContinuousLTM(d_model=3, n_head=1, d_head=3, cfg=cfg)
    old_pos = fit_positions(512)
    coef, _ = ltm.update(None, _signal(old_pos).float()[None])
    new_x = (0.3 * torch.ones(256, 3)).float()[None]  # the next block: a constant signal
    coef2, _ = ltm.update(coef, new_x)
    mu, sig = rbf_centres(256, (0.01, 0.05))
    t = torch.linspace(0.05, 0.7, 200, dtype=torch.float64)
    before = evaluate_basis(t / 0.75, mu, sig) @ coef[0].double()
    after = evaluate_basis(t, mu, sig) @ coef2[0].double()
    assert ((after - before) ** 2).mean().sqrt() < 0.03 * before.abs().max()
    t_new = torch.linspace(0.8, 0.95, 50, dtype=torch.float64)
    assert_close(evaluate_basis(t_new, mu, sig) @ coef2[0].double(), torch.full((50, 3), 0.3, dtype=torch.float64),
                 atol=0.03, rtol=0)
    # positions of the update: old samples at kτ/M, new vectors at τ + (1 − τ)k/P
    pos = update_positions(4, 2, 0.5)
    assert pos.tolist() == pytest.approx([0.125, 0.25, 0.375, 0.5, 0.75, 1.0])


# ------------------------------------------------------------------------------------------------ sampling


def test_linear_sampling_is_exact():
    assert linear_samples(4).tolist() == [0.25, 0.5, 0.75, 1.0]
    ltm = ContinuousLTM(d_model=4, n_head=1, d_head=4, cfg=LTMConfig(n_basis=8, n_samples=5))
    pts = ltm.sample_points(3, None, torch.device("cpu"))
    assert pts.shape == (3, 5) and (pts == torch.tensor([0.2, 0.4, 0.6, 0.8, 1.0], dtype=torch.float64)).all()


def test_sticky_sampling_draws_in_proportion_to_the_histogram():
    hist = torch.tensor([[1.0, 0.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(1234)
    n = 40_000
    pts = sticky_samples(hist, n, generator=g)
    assert pts.shape == (2, n) and (pts[:, 1:] >= pts[:, :-1]).all()  # sorted
    counts = torch.bincount((pts[0] * 4).long().clamp(max=3), minlength=4).double()
    expected = torch.tensor([1.0, 0.0, 3.0, 4.0], dtype=torch.float64) / 8 * n
    assert counts[1] == 0
    nz = expected > 0
    chi2 = (((counts - expected) ** 2)[nz] / expected[nz]).sum().item()
    assert chi2 < 13.8  # χ² with 2 degrees of freedom, p = 0.001
    # inside a bin the points are uniform (a sample from the histogram's density, not the bin edges)
    inside = pts[0][(pts[0] >= 0.5) & (pts[0] < 0.75)]
    assert abs((inside - 0.5).mean().item() / 0.25 - 0.5) < 0.01
    # a histogram without mass falls back to uniform sampling on [0, 1]
    assert abs(pts[1].mean().item() - 0.5) < 0.01


def test_sticky_update_reads_the_old_signal_where_the_attention_was():
    cfg = LTMConfig(n_basis=64, n_samples=256, sampling="sticky", n_bins=8, gate=False)
    ltm = ContinuousLTM(d_model=2, n_head=1, d_head=2, cfg=cfg)
    hist = torch.zeros(1, 8)
    hist[0, 6] = 1.0  # all attention in [0.75, 0.875)
    torch.manual_seed(0)
    pts = ltm.sample_points(1, hist, torch.device("cpu"))
    assert ((pts >= 0.75) & (pts < 0.875)).all()


# --------------------------------------------------------------------------------------------------- model


def _txl_pair(seed=0):
    cfg = TransformerXLConfig(**SMALL)
    torch.manual_seed(seed)
    txl = TransformerXL(cfg).eval()
    torch.manual_seed(seed)
    inf = InfinityFormer(cfg, None).eval()
    return txl, inf


def test_ltm_off_is_transformer_xl_weight_for_weight():
    txl, inf = _txl_pair()
    a, b = txl.state_dict(), inf.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    tokens = torch.randint(0, 22, (2, 40))
    ma = mb = None
    with torch.no_grad():
        for s in range(5):
            seg = tokens[:, 8 * s : 8 * s + 8]
            ha, ma = txl(seg, ma, mem_len=12, clamp_len=10, same_length=s % 2 == 1)
            hb, mb = inf(seg, mb, mem_len=12, clamp_len=10, same_length=s % 2 == 1)
            assert torch.equal(ha, hb)
            assert len(ma) == len(mb) and all(torch.equal(x, y) for x, y in zip(ma, mb))
    # the TXL checkpoint loads strictly into the ∞-former without LTM
    inf.load_state_dict(txl.state_dict(), strict=True)


def test_ltm_memory_layout_and_what_enters_the_long_term_memory():
    cfg = TransformerXLConfig(**SMALL)
    ltm_cfg = LTMConfig(n_basis=16, n_samples=8, sampling="sticky", n_bins=4)
    model = InfinityFormer(cfg, ltm_cfg).eval()
    tokens = torch.randint(0, 22, (2, 24))
    mems = None
    with torch.no_grad():
        _, mems = model(tokens[:, :8], mems, mem_len=8)  # STM fills, nothing evicted
        assert len(mems) == 8 and mems[2].shape == (2, 0, 16) and mems[4].shape == (2, 0, 16)
        _, mems = model(tokens[:, 8:16], mems, mem_len=8)  # the first 8 positions leave the STM
        assert mems[2].shape == (2, 8, 16) and mems[4].shape == (2, 0, 16)
        stm_inputs = mems[0].clone()
        _, plain = model(tokens[:, 16:24], mems, mem_len=8)  # an evaluation pass does only the model's work
        assert "regression_error" not in model.diagnostics() and "ltm_kl" in model.diagnostics()
        with model.measuring_fit():  # the evaluation that reports the fit's error (Figure 3 right) asks for it
            _, mems = model(tokens[:, 16:24], mems, mem_len=8)  # they enter the LTM; the next 8 wait
        assert all(torch.equal(a, b) for a, b in zip(plain, mems))
        assert not any(m.measure_fit for m in model.modules() if hasattr(m, "measure_fit"))
        assert mems[4].shape == (2, 16, 16) and mems[6].shape == (2, 4)
        assert torch.equal(mems[2], stm_inputs)
        assert "regression_error" in model.diagnostics() and "ltm_kl" in model.diagnostics()
    model.train()
    _, _ = model(tokens[:, :8], mems, mem_len=8)
    aux = model.aux_losses()["ltm_kl"]
    assert aux.requires_grad and aux.item() == pytest.approx(1e-6 * model.diagnostics()["ltm_kl"].item())
    aux.backward()
    assert model.layers[0].attn.ltm.var_net.weight.grad is not None
    assert model.layers[0].attn.ltm.gate.weight.grad is not None  # the gate learns through the pending block


def test_ltm_changes_the_output_only_when_the_memory_holds_something():
    cfg = TransformerXLConfig(**SMALL)
    txl, _ = _txl_pair()
    model = InfinityFormer(cfg, LTMConfig(n_basis=16, n_samples=8))
    model.load_state_dict(txl.state_dict(), strict=False)
    model.eval()
    tokens = torch.randint(0, 22, (1, 16))
    with torch.no_grad():
        ha, ma = txl(tokens[:, :8], None, mem_len=4)
        hb, mb = model(tokens[:, :8], None, mem_len=4)
        assert torch.equal(ha, hb)  # the LTM is empty at the first segment
        ha, _ = txl(tokens[:, 8:], ma, mem_len=4)
        hb, _ = model(tokens[:, 8:], mb, mem_len=4)
        assert not torch.allclose(ha, hb)


def test_regression_and_attention_stay_float32_under_bf16_autocast():
    model = InfinityFormer(TransformerXLConfig(**SMALL), LTMConfig(n_basis=16, n_samples=8))
    tokens = torch.randint(0, 22, (2, 8))
    mems = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            h, mems = model(tokens, mems, mem_len=4)
    assert mems[4].dtype == torch.float32 and torch.isfinite(h).all()


def test_update_pad_grids_official_and_ours():
    """`grid: ours` continues the fit grid (spacing 1/n, first pad half a spacing out); `grid: official` is the
    official G_inf's linspace(−½ + s, 3/2 − s, 2n), s = 1/(2·n_new + n_old), n/2 pads per side, nearer the
    boundary; a first fit is the same under both."""
    left, right = pad_positions(40, n_old=32, grid="ours")
    assert_close(left, -(torch.arange(20, dtype=torch.float64).flip(0) + 0.5) / 40)
    assert_close(right, 1 + (torch.arange(20, dtype=torch.float64) + 0.5) / 40)
    left_o, right_o = pad_positions(40, n_old=32, grid="official")
    assert left_o.numel() == right_o.numel() == 20
    assert 0 < -left_o[-1].item() < 0.5 / 40 and 0 < right_o[0].item() - 1 < 0.5 / 40
    for a, b in zip(pad_positions(10, grid="official"), pad_positions(10, grid="ours")):
        assert_close(a, b)
    with pytest.raises(ValueError, match="'official' or 'ours'"):
        LTMConfig(grid="theirs")


def test_config_errors_say_what_to_do():
    with pytest.raises(ValueError, match="multiple of 2"):
        LTMConfig(n_basis=7)
    with pytest.raises(ValueError, match="tau"):
        LTMConfig(tau=1.0)
    with pytest.raises(ValueError, match="relative"):
        InfinityFormer(TransformerXLConfig(**SMALL, attention="absolute"), LTMConfig(n_basis=8))


def test_tables_set_our_runs_beside_the_paper_statements(tmp_path):
    import json

    from papers.infinity_former import tables
    from repro.tables import Results

    runs = tmp_path / "infinity_former" / "runs" / "tiny"
    runs.mkdir(parents=True)
    acc = {"txl": (0.9, 0.5, 0.2), "compressive": (0.8, 0.6, 0.4), "infty": (0.85, 0.8, 0.75)}
    for key, values in acc.items():
        for L, a in zip((256, 512, 1024), values):
            rec = {"paper": "infinity_former", "experiment": f"sort_{L}_{key}", "profile": "tiny", "stage": "test",
                   "metrics": {"test/acc": a, "test/regression_error": 0.1}, "provenance": {"steps": 100}}
            (runs / f"sort_{L}_{key}.test.json").write_text(json.dumps(rec))
    (runs / "bench_context.jsonl").write_text(
        json.dumps({"model": "TXL", "context": 1024, "ms_per_segment": 1.0, "memory_state_mb": 1.0, "peak_mb": None})
        + "\n")
    built = tables.build(Results("infinity_former", root=tmp_path))
    left = next(t for t in built if t.name == "fig3_left").markdown()
    assert "Transformer-XL best at 256: yes" in left and "∞-former degrades least: yes" in left
    assert "0.900" in left and "not run" in left  # sticky and paper rows were not run
    right = next(t for t in built if t.name == "fig3_right").markdown()
    assert "0.800" in right  # N = 64 at length 512 is the default tiny ∞-former run
    assert (tmp_path / "infinity_former" / "fig3_left_tiny.png").exists()
    assert (tmp_path / "infinity_former" / "context_cost.png").exists()


def test_language_model_module_adds_the_kl_term_to_the_loss():
    from papers.infinity_former.module import InfinityFormerLM
    from repro.lm import MemorySettings

    module = InfinityFormerLM(model={k: v for k, v in SMALL.items()}, backbone="infinity_former",
                              ltm={"n_basis": 8, "n_samples": 4}, memory={"mem_len": 4})
    tokens = torch.randint(0, 22, (2, 4))
    mems = None
    for _ in range(3):
        _, mems = module(tokens, mems, MemorySettings(mem_len=4))
    assert set(module.extra_loss()) == {"ltm_kl"} and module.describe()["backbone"] == "infinity_former"
    with pytest.raises(ValueError, match="needs its long-term memory"):
        InfinityFormerLM(model=SMALL, backbone="infinity_former")
    with pytest.raises(ValueError, match="backbone is one of"):
        InfinityFormerLM(model=SMALL, backbone="gpt")


def test_gpt2_tables_put_each_record_in_its_cell_and_check_the_claims_on_it(tmp_path):
    import json

    from papers.infinity_former import tables
    from repro.tables import Results

    runs = tmp_path / "infinity_former" / "runs" / "tiny" / "dialogue"  # a `repro runs` group folder
    runs.mkdir(parents=True)
    ppl = {"gpt2": 30.0, "compressive": 29.0, "inftyformer": 28.0, "inftyformer_sticky": 27.5}
    for key, p in ppl.items():
        rec = {"paper": "infinity_former", "experiment": f"gpt2_lm_{key}", "profile": "tiny", "stage": "test",
               "metrics": {"test/ppl": p}, "provenance": {"steps": 10}}
        (runs / f"gpt2_lm_{key}.test.json").write_text(json.dumps(rec))
    f1 = {"nodoc": 5.0, "gpt2": 6.0, "compressive": 7.0, "inftyformer": 8.0, "inftyformer_sticky": 7.5}
    for key, f in f1.items():
        metrics = {"test/ppl_official": 21.0 - f, "test/ppl": 20.0 - f, "test/f1": f, "test/rouge1": f + 1,
                   "test/rougeL": f + 0.5, "test/meteor": f - 1, "test/rouge1_recall": 40.0, "test/rougeL_recall": 41.0}
        rec = {"paper": "infinity_former", "experiment": f"gpt2_dog_{key}", "profile": "tiny", "stage": "test",
               "metrics": metrics, "provenance": {"steps": 10}}
        (runs / f"gpt2_dog_{key}.test.json").write_text(json.dumps(rec))
    results = Results("infinity_former", root=tmp_path)
    t1 = tables.table1(results)
    row = {r[0]: r for r in t1.rows}
    assert (row["GPT-2"][1].value, row["GPT-2"][2].value) == (16.85, 33.44)  # the paper's Table 1 (PAPERS.md §2)
    assert (row["∞-former (sticky memories)"][1].value, row["∞-former (sticky memories)"][2].value) == (16.61, 32.48)
    assert row["Compressive"][5].value == 29.0 and row["Compressive"][3].value == "not run"
    md = t1.markdown()
    assert "∞-former below GPT-2: yes" in md and "compressive below GPT-2: yes" in md
    t2 = tables.table2(results)
    rows = {(r[0], r[1]): r for r in t2.rows}
    paper = rows[("∞-former", "paper")]  # the paper's PPL under the official average, none per token
    assert [c.value for c in (paper[2], *paper[4:8])] == [18.02, 8.92, 15.28, 12.51, 7.52] and paper[3] == "—"
    ours = rows[("∞-former", "ours (tiny)")]
    assert [c.value for c in ours[2:10]] == [13.0, 12.0, 8.0, 9.0, 8.5, 7.0, 40.0, 41.0]
    md = t2.markdown()
    # PPL lower is better, the other metrics higher: ∞-former (ppl 12, F1 8) against GPT-2 (ppl 14, F1 6)
    assert "∞-former better than GPT-2: PPL yes, per-token PPL yes, F1 yes, ROUGE-1 yes, ROUGE-L yes, METEOR yes" in md
    assert "∞-former (sticky memories) better than ∞-former: PPL no, per-token PPL no, F1 no" in md


# ----------------------------------------------------------------------------------------------- deviations


def _test_functions(path) -> set[str]:
    """`name` and `Class::name` of every test function defined in a test file (read, not imported)."""
    import ast

    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names |= {f"{node.name}::{f.name}" for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test")}
    return names


def test_every_deviation_names_an_existing_test_and_a_measured_effect():
    """Each row of `papers/infinity_former/deviations.yaml` (the README's deviations table) names tests that exist
    (`tests/<file>.py::<function>`, a parametrised test by its function) and gives its effect as a number with where
    it was measured, or says "not measured"; the committed table is what the file gives."""
    from pathlib import Path

    from papers.infinity_former.tables import deviations, load_deviations

    root = Path(__file__).resolve().parents[1]
    rows = load_deviations()
    assert len({r["deviation"] for r in rows}) == len(rows) >= 20
    for row in rows:
        for test in row["test"] if isinstance(row["test"], list) else [row["test"]]:
            file, name = test.split("::", 1)
            assert file.startswith("tests/") and (root / file).is_file(), (row["deviation"], test)
            assert name in _test_functions(root / file), (row["deviation"], test)
        effect = row["effect"]
        assert effect.startswith("not measured") or (
            any(c.isdigit() for c in effect) and any(w in effect for w in ("test", "CHANGELOG.md", "results/"))), \
            (row["deviation"], effect)
    table = deviations()
    assert (root / "results" / "infinity_former" / "deviations.md").read_text() == table.markdown(), \
        "results/infinity_former/deviations.md differs from deviations.yaml: run `repro tables infinity_former`"


def test_a_deviation_without_its_fields_is_refused(tmp_path):
    from papers.infinity_former.tables import load_deviations

    path = tmp_path / "deviations.yaml"
    path.write_text("- deviation: x\n  reference: y\n  ours: z\n  why: w\n  effect: not measured\n")
    with pytest.raises(ValueError, match="exactly"):
        load_deviations(path)
    path.write_text("- {deviation: x, reference: y, ours: z, why: w, effect: not measured, test: test_x}\n")
    with pytest.raises(ValueError, match="tests/<file>.py::<test>"):
        load_deviations(path)
