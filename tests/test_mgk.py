"""Transformer-MGK attention against the paper's formulas written out as loops."""

import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from papers.mgk.attention import MGKAttention, MLKAttention, elu_feature_map
from repro.nn.attention import causal_mask

D, H, E = 12, 2, 6


def _randomise(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("logits"):
                p.copy_(torch.randn_like(p))


def naive_mgk(att, h, mask, *, hard=False, eps=0.0):
    """a_ij = Σ_r π_r exp(−‖q_i−k_jr‖²/2σ_r²) / (Σ_j' Σ_r … + eps)  (hard: max_r instead of Σ_r π_r), by loops;
    π per head, or per head and key position."""
    q, k, v = att.proj(h, h)
    b, nh, t, e = q.shape
    r_n = k.shape[2]
    s2 = att.log_sigma2.exp()
    pi_all = None if hard else att.weights.log_pi(k.shape[3]).exp()[0, :, 0]  # (H, K or 1, R)
    out = torch.zeros(b, nh, t, e, dtype=torch.float64)
    for bb in range(b):
        for hh in range(nh):
            for i in range(t):
                w = []
                for j in range(k.shape[3]):
                    if mask[i, j]:
                        w.append(0.0)
                        continue
                    terms = [math.exp(-((q[bb, hh, i] - k[bb, hh, r, j]) ** 2).sum().item() / (2 * s2[hh, r].item()))
                             for r in range(r_n)]
                    pi = None if hard else pi_all[hh, j if pi_all.shape[1] > 1 else 0]
                    w.append(max(terms) if hard else sum(pi[r].item() * terms[r] for r in range(r_n)))
                w = torch.tensor(w, dtype=torch.float64)
                out[bb, hh, i] = (w / (w.sum() + eps)) @ v[bb, hh].double()
    return att.o_net(out.float().transpose(1, 2).reshape(b, t, nh * e))


def test_lm_official_normalisation_equals_the_formula_where_the_epsilon_matters():
    """The paper configs' form (`lm_official`, π per key position): a / (Σ a + 1e-6), here with inputs far enough
    apart that Σ a is near 1e-6, so that the ε changes the output by far more than the tolerance."""
    torch.manual_seed(1)
    att = MGKAttention(d_model=D, n_head=H, d_head=E, dropatt=0.0, pi_layout="position", max_klen=8,
                       form="lm_official").eval()
    with torch.no_grad():
        att.weights.pi.uniform_(0.1, 0.9)
    h = torch.randn(2, 5, D) * 2.8
    mask = causal_mask(5, 5)
    out, _ = att(h, mask_TK=mask)
    with torch.no_grad():
        ref, ref_no_eps = naive_mgk(att, h, mask, eps=1e-6), naive_mgk(att, h, mask)
    assert (ref - ref_no_eps).abs().max() > 1000 * 1e-5  # the test has power: ε moves the output (0.06)
    assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("keys,pi,learn_var", [("separate", "gradient", False), ("shifted", "gradient", True),
                                                ("separate", "hard_em", False)])
def test_mgk_equals_the_formula_with_causal_masking(keys, pi, learn_var):
    torch.manual_seed(0)
    att = MGKAttention(d_model=D, n_head=H, d_head=E, dropatt=0.0, keys=keys, pi=pi, learn_variance=learn_var).eval()
    _randomise(att)
    if learn_var:
        with torch.no_grad():
            att.log_sigma2.add_(torch.randn_like(att.log_sigma2) * 0.3)
    h = torch.randn(2, 5, D) * 0.5
    mask = causal_mask(5, 5)
    out, _ = att(h, mask_TK=mask)
    assert_close(out, naive_mgk(att, h, mask, hard=pi == "hard_em"), rtol=1e-4, atol=1e-5)


def test_shifted_keys_are_one_projection_minus_a_shift():
    att = MGKAttention(d_model=D, n_head=H, d_head=E, dropatt=0.0, keys="shifted")
    h = torch.randn(1, 3, D)
    _, k, _ = att.proj(h, h)
    k0 = att.proj.kv_net(h)[..., : H * E].view(1, 3, H, E).transpose(1, 2)
    assert torch.equal(att.proj.mu[0], torch.zeros(H, E))
    for r in range(2):
        assert_close(k[:, :, r], k0 - att.proj.mu[r][None, :, None])


def test_mgk_reduces_to_softmax_attention():
    """R = 1, π = 1, σ² = √E and queries/keys of equal norm: MGK is exactly softmax(q·k/√E)."""
    att = MGKAttention(d_model=D, n_head=H, d_head=E, dropatt=0.0, n_components=1, sigma2_ratios=(1.0,))
    q = torch.nn.functional.normalize(torch.randn(2, H, 4, E), dim=-1) * 1.7
    k = torch.nn.functional.normalize(torch.randn(2, H, 1, 6, E), dim=-1) * 1.7
    mgk = torch.softmax(torch.logsumexp(att.component_scores(q, k), -1), -1)
    softmax = torch.softmax(q @ k[:, :, 0].transpose(-1, -2) / math.sqrt(E), -1)
    assert_close(mgk, softmax, rtol=1e-5, atol=1e-6)


def test_soft_e_step_matches_the_responsibilities_by_hand():
    att = MGKAttention(d_model=D, n_head=1, d_head=2, dropatt=0.0, pi="soft_em", sigma2_ratios=(1.0, 1.0))
    with torch.no_grad():
        att.log_sigma2.fill_(math.log(0.5))  # 1/2σ² = 1
        att.weights.pi.copy_(torch.tensor([[0.25, 0.75]]))
    q = torch.tensor([[[[0.0, 0.0]]]])  # one query at the origin
    k = torch.tensor([[[[[1.0, 0.0], [0.0, 0.0]], [[0.0, 2.0], [1.0, 1.0]]]]])  # (B,H,R=2,K=2,E)
    s = att.component_scores(q, k)  # (1,1,1,2,2)
    gamma = torch.softmax(s, -1)
    # key 0: 0.25·e^{-1} vs 0.75·e^{-4}; key 1: 0.25·e^{0} vs 0.75·e^{-2}
    g0 = torch.tensor([0.25 * math.exp(-1), 0.75 * math.exp(-4)])
    g1 = torch.tensor([0.25, 0.75 * math.exp(-2)])
    assert_close(gamma[0, 0, 0], torch.stack([g0 / g0.sum(), g1 / g1.sum()]))
    att.weights.e_step(gamma, torch.ones(1, 1, 1, 2, dtype=torch.bool))
    expect = (g0 / g0.sum() + g1 / g1.sum()) / 2
    assert_close(att.weights.pi[0], expect)
    assert_close(att.weights.pi.sum(-1), torch.ones(1))


def test_pi_stays_a_distribution():
    torch.manual_seed(1)
    att = MGKAttention(d_model=D, n_head=H, d_head=E, dropatt=0.0)
    opt = torch.optim.Adam(att.parameters(), lr=0.05)
    h, target = torch.randn(2, 7, D), torch.randn(2, 7, D)
    for _ in range(20):
        out, _ = att(h, mask_TK=causal_mask(7, 7))
        (out - target).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    pi = att.weights.log_pi(7)[0, :, 0, 0].exp()
    assert (pi >= 0).all() and torch.allclose(pi.sum(-1), torch.ones(H))
    assert not torch.allclose(pi, torch.full_like(pi, 0.5))  # learned away from uniform
    em = MGKAttention(d_model=D, n_head=H, d_head=E, dropatt=0.0, pi="soft_em").train()
    em(h, mask_TK=causal_mask(7, 7))
    assert (em.weights.pi >= 0).all() and torch.allclose(em.weights.pi.sum(-1), torch.ones(H))
    assert not torch.allclose(em.weights.pi, torch.full_like(em.weights.pi, 0.5))  # it was updated


def test_no_limit_on_sequence_length_and_stable_in_log_space():
    att = MGKAttention(d_model=D, n_head=H, d_head=E, dropatt=0.0).eval()
    h = torch.randn(1, 600, D) * 30  # distances that overflow exp() unless max-subtracted
    out, _ = att(h, mask_TK=causal_mask(600, 600))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("keys,r", [("separate", 1), ("separate", 2), ("shifted", 2)])
def test_causal_mlk_prefix_sums_equal_masked_quadratic(keys, r):
    torch.manual_seed(0)
    att = MLKAttention(d_model=D, n_head=H, d_head=E, n_components=r, keys=keys, causal=True)
    _randomise(att)
    h = torch.randn(2, 6, D)
    out, _ = att(h, mask_TK=causal_mask(6, 6))
    q, k, v = att.proj(h, h)
    pi = torch.softmax(att.weights.logits, -1) if att.weights is not None else torch.ones(H, 1)
    phi_k = sum(pi[None, :, i, None, None] * elu_feature_map(k[:, :, i]) for i in range(r))
    a = elu_feature_map(q) @ phi_k.transpose(-1, -2)  # (B,H,T,K) unnormalised
    a = a.masked_fill(causal_mask(6, 6), 0.0)
    ref = (a / a.sum(-1, keepdim=True)) @ v
    assert_close(out, att.o_net(ref.transpose(1, 2).reshape(2, 6, H * E)), rtol=1e-4, atol=1e-5)


def test_noncausal_mlk_ignores_padded_keys():
    torch.manual_seed(0)
    att = MLKAttention(d_model=D, n_head=H, d_head=E, causal=False)
    h = torch.randn(2, 5, D)
    pad = torch.tensor([[False, False, False, True, True], [False] * 5])[:, None, None, :]
    out, _ = att(h, mask_TK=pad)
    h2 = h.clone()
    h2[0, 3:] = torch.randn(2, D) * 9  # changing padded positions changes nothing for the real ones
    out2, _ = att(h2, mask_TK=pad)
    assert_close(out[0, :3], out2[0, :3])


@pytest.mark.parametrize("keys", ["separate", "shifted"])
@pytest.mark.parametrize("layout", ["head", "position", "global"])
@pytest.mark.parametrize("masking", ["causal", "padding"])
def test_joint_softmax_path_equals_the_component_scores_path(keys, layout, masking):
    """The fast path (one product of augmented vectors, a softmax over all (component, key) pairs, summed over
    components) gives the log-space path's weights and gradients: the same mixture, another order of operations."""
    torch.manual_seed(0)
    b, t, d, h, e = 2, 12, 16, 2, 8
    attn = MGKAttention(d_model=d, n_head=h, d_head=e, dropatt=0.0, keys=keys, pi_layout=layout,
                        max_klen=16, learn_variance=True)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0.0, 0.3)
        if layout != "head":
            attn.weights.pi.uniform_(0.05, 0.95)
    x = torch.randn(b, t, d)
    if masking == "causal":
        mask = causal_mask(t, t)
    else:
        mask = torch.zeros(b, 1, 1, t, dtype=torch.bool)
        mask[0, ..., 9:] = True
    q, k, v = attn.proj(x, x)
    fast = attn.joint_probabilities(q, k, mask).sum(-2)
    slow = torch.softmax(torch.logsumexp(attn.component_scores(q, k), -1).masked_fill(mask, float("-inf")), -1)
    assert_close(fast, slow, atol=1e-6, rtol=1e-5)
    g_fast = torch.autograd.grad((fast * torch.arange(t)).sum(), [*attn.parameters()], allow_unused=True,
                                 retain_graph=True)
    g_slow = torch.autograd.grad((slow * torch.arange(t)).sum(), [*attn.parameters()], allow_unused=True)
    for a, c in zip(g_fast, g_slow):
        assert (a is None) == (c is None)
        if a is not None:
            assert_close(a, c, atol=1e-5, rtol=1e-4)


def _reference_warm_up(s: int, warmup: int) -> float:
    """lmtool-fwms `train.py`: update 0 at the full rate; after update s (counted from 1) it sets lr·s/warmup."""
    return 1.0 if s == 0 else s / warmup


def test_warm_up_is_one_update_ahead_of_the_reference():
    """The WikiText-103 paper configs' warm-up (2,000 updates): ours runs update s at lr·(s+1)/2000, the reference
    update 0 at the full rate and update s at lr·s/2000 (a deviation of the README's table)."""
    import yaml

    from repro.lm import OptimConfig

    root = Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((root / "configs/mgk/paper/wt103_mgk4.yaml").read_text())
    optim, steps = OptimConfig(**cfg["model"]["init_args"]["optim"]), cfg["trainer"]["max_steps"]
    warmup = optim.warmup_steps
    assert warmup == 2000
    assert optim.factor(0, steps) == 1 / warmup and _reference_warm_up(0, warmup) == 1.0
    for s in (1, 2, 1000, warmup - 2):
        assert optim.factor(s, steps) == _reference_warm_up(s + 1, warmup) != _reference_warm_up(s, warmup)
    assert optim.factor(warmup - 1, steps) == 1.0


def test_every_deviation_names_an_existing_test(request):
    """Each row of papers/mgk/deviations.yaml (the README's deviations table) names tests that pytest collects,
    parametrised ids included, and results/mgk/deviations.md is what the file gives (`repro tables mgk`)."""
    from papers.mgk import tables

    root = Path(__file__).resolve().parents[1]
    rows = tables.deviation_rows()
    assert len(rows) >= 10 and all(row["test"] for row in rows)
    named = {t for row in rows for t in row["test"]}
    collected: dict[str, set[str]] = {}
    for path in sorted({t.split("::")[0] for t in named}):
        assert (root / path).is_file(), f"{path} (named in deviations.yaml) does not exist"
        module = pytest.Module.from_parent(request.session, path=root / path)
        collected[path] = {item.name for item in module.collect() if isinstance(item, pytest.Function)}
    missing = sorted(t for t in named if t.partition("::")[2] not in collected[t.partition("::")[0]])
    assert not missing, f"deviations.yaml names tests that do not exist: {missing}"
    table = (root / "results" / "mgk" / "deviations.md").read_text()
    assert table == tables.deviations().markdown(), "results/mgk/deviations.md is stale: run `repro tables mgk`"
    for row in rows:
        assert row["effect"].strip(), f"{row['deviation']}: an effect is a measured number or 'not measured'"
