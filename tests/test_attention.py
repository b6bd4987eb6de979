"""Relative attention, masks and positions against naive per-(i, j) computations written here."""

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from repro.nn.attention import (
    AbsoluteAttention,
    RelPartialLearnableAttention,
    attention_kernel,
    causal_mask,
    rel_shift,
    relative_distances,
    set_attention_kernel,
    sinusoid_table,
    softmax_lse,
    uses_sdpa,
)


def naive_visible(i, j, *, t, k, same_length, mem_len):
    m = k - t
    ok = j <= m + i
    if same_length:
        ok = ok and j > m + i - mem_len
    return ok


@pytest.mark.parametrize("t,k,same_length,mem_len", [(4, 4, False, 0), (3, 8, False, 5), (5, 9, True, 4),
                                                    (5, 7, True, 6), (4, 6, True, 10), (6, 6, True, 3)])
def test_causal_mask_matches_definition(t, k, same_length, mem_len):
    mask = causal_mask(t, k, same_length=same_length, span=mem_len)
    for i in range(t):
        for j in range(k):
            assert bool(mask[i, j]) == (not naive_visible(i, j, t=t, k=k, same_length=same_length, mem_len=mem_len))


def test_same_length_gives_every_query_mem_len_keys():
    mask = causal_mask(5, 5 + 8, same_length=True, span=8)
    assert (~mask).sum(1).tolist() == [8] * 5


@pytest.mark.parametrize("grad", [False, True])
def test_rel_shift_reindexes_by_distance(grad):
    t, k = 4, 7
    m = k - t
    raw = torch.randn(2, 3, t, k, requires_grad=grad)  # column c holds distance k-1-c
    out = rel_shift(raw)
    for i in range(t):
        for j in range(m + i + 1):
            dist = m + i - j
            assert_close(out[..., i, j], raw[..., i, k - 1 - dist])


def padded_rel_shift(x):
    """The reference's shift (pad a zero column, view as (K+1, T), drop the first row), written here."""
    *lead, t, k = x.shape
    padded = torch.nn.functional.pad(x, (1, 0))
    return padded.view(*lead, k + 1, t)[..., 1:, :].reshape(*lead, t, k)


@pytest.mark.parametrize("t,k", [(4, 7), (5, 5), (1, 3), (6, 13)])
def test_rel_shift_gradient_equals_the_padded_shift(t, k):
    """The strided view's backward (the overlapping last column added) gives the gradient the reference's padded
    shift gives, once the future keys are masked as every caller does; a non-contiguous input as well."""
    mask = causal_mask(t, k)
    upstream = torch.randn(2, 3, t, k)
    grads = []
    for shift in (rel_shift, padded_rel_shift):
        g = torch.Generator(torch.get_default_device()).manual_seed(0)  # the test device's (REPRO_TEST_DEVICE)
        raw = torch.randn(2, 3, k, t, generator=g).requires_grad_()
        out = shift(raw.transpose(-1, -2) * 2.0).masked_fill(mask, 0.0)
        (out * upstream).sum().backward()
        grads.append((out.detach(), raw.grad))
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])


def test_sinusoid_table_values():
    pos = torch.tensor([0.0, 3.0])
    table = sinusoid_table(pos, 6)
    inv = [1 / 10000 ** (2 * i / 6) for i in range(3)]
    expect = torch.tensor([[math.sin(p * f) for f in inv] + [math.cos(p * f) for f in inv] for p in (0.0, 3.0)])
    assert_close(table, expect)


def naive_relative_attention(attn, h, mem, r, u, v, *, same_length, mem_len):
    """score(i,j) = (q_i+u)·k_j + (q_i+v)·W_r R_{M+i-j}, scaled, masked, softmax, values, output projection."""
    b, t, d = h.shape
    nh, e = attn.n_head, attn.d_head
    cat = torch.cat([mem, h], 1)
    k_len = cat.shape[1]
    m = k_len - t
    w = attn.qkv_net.weight
    q = (h @ w[: nh * e].T).view(b, t, nh, e)
    kk = (cat @ w[nh * e : 2 * nh * e].T).view(b, k_len, nh, e)
    vv = (cat @ w[2 * nh * e :].T).view(b, k_len, nh, e)
    rk = attn.r_net(r).view(k_len, nh, e)  # row c: distance k_len-1-c
    out = torch.zeros(b, t, nh, e, dtype=h.dtype)
    for bb in range(b):
        for hh in range(nh):
            for i in range(t):
                scores = []
                for j in range(k_len):
                    if not naive_visible(i, j, t=t, k=k_len, same_length=same_length, mem_len=mem_len):
                        scores.append(float("-inf"))
                        continue
                    dist = m + i - j
                    r_j = rk[k_len - 1 - dist, hh]
                    s = (q[bb, i, hh] + u[hh]) @ kk[bb, j, hh] + (q[bb, i, hh] + v[hh]) @ r_j
                    scores.append(s / math.sqrt(e))
                p = torch.softmax(torch.stack([torch.as_tensor(s) for s in scores]), 0)
                out[bb, i, hh] = p @ vv[bb, :, hh]
    return attn.o_net(out.reshape(b, t, nh * e))


@pytest.mark.parametrize("mem,same_length,clamp", [(0, False, -1), (5, False, -1), (5, True, -1), (6, False, 3)])
def test_relative_attention_equals_naive_loop(mem, same_length, clamp):
    d, nh, e, t, b = 12, 3, 4, 4, 2
    attn = RelPartialLearnableAttention(d_model=d, n_head=nh, d_head=e, dropatt=0.0).eval()
    h, memory = torch.randn(b, t, d), torch.randn(b, mem, d)
    k_len = mem + t
    r = sinusoid_table(relative_distances(k_len, clamp_len=clamp), d)
    u, v = torch.randn(nh, e), torch.randn(nh, e)
    mem_len = 6
    mask = causal_mask(t, k_len, same_length=same_length, span=mem_len)
    fast, kv = attn(h, mem_BMD=memory, mask_TK=mask, pos=(r, u, v))
    assert kv.shape == (2, b, nh, mem + t, e)
    slow = naive_relative_attention(attn, h, memory, r, u, v, same_length=same_length, mem_len=mem_len)
    assert_close(fast, slow, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mem,same_length,clamp", [(0, False, -1), (5, True, -1), (6, False, 3)])
def test_sdpa_kernel_equals_naive_loop_in_float64(mem, same_length, clamp):
    """The fused kernel's path (the positional term and the mask as one additive bias of
    `scaled_dot_product_attention`) against the per-(i, j) loop, everything in float64."""
    d, nh, e, t, b = 12, 3, 4, 4, 2
    attn = RelPartialLearnableAttention(d_model=d, n_head=nh, d_head=e, dropatt=0.0).double().eval()
    h, memory = torch.randn(b, t, d, dtype=torch.float64), torch.randn(b, mem, d, dtype=torch.float64)
    r = sinusoid_table(relative_distances(mem + t, clamp_len=clamp), d).double()
    u, v = torch.randn(nh, e, dtype=torch.float64), torch.randn(nh, e, dtype=torch.float64)
    mask = causal_mask(t, mem + t, same_length=same_length, span=6)
    with attention_kernel(attn, "sdpa"):
        fast, _ = attn(h, mem_BMD=memory, mask_TK=mask, pos=(r, u, v))
    slow = naive_relative_attention(attn, h, memory, r, u, v, same_length=same_length, mem_len=6)
    assert_close(fast, slow, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", [RelPartialLearnableAttention, AbsoluteAttention])
def test_sdpa_kernel_gives_the_eager_outputs_and_gradients(monkeypatch, cls):
    """Outputs and every gradient (inputs, memory, u, v, weights) of the two kernels in float32, with weights large
    enough that a wrong bias or mask moves them far beyond the tolerance; and the fused path is the one taken."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    d, nh, e, t, b, mem = 32, 4, 8, 6, 2, 9
    attn = cls(d_model=d, n_head=nh, d_head=e, dropatt=0.0)
    for w in attn.parameters():
        torch.nn.init.normal_(w, 0.0, 0.5)
    h, memory = torch.randn(b, t, d, requires_grad=True), torch.randn(b, mem, d, requires_grad=True)
    r = sinusoid_table(relative_distances(mem + t), d)
    u, v = torch.randn(nh, e, requires_grad=True), torch.randn(nh, e, requires_grad=True)
    mask = causal_mask(t, mem + t, same_length=True, span=7)
    calls = []
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, f=F.scaled_dot_product_attention, **k: calls.append(1) or f(*a, **k))
    runs = {}
    for kernel in ("eager", "sdpa"):
        with attention_kernel(attn, kernel):
            out, _ = attn(h, mem_BMD=memory, mask_TK=mask, pos=(r, u, v))
        inputs = [h, memory, u, v] + list(attn.parameters())
        grads = torch.autograd.grad(out.square().sum(), inputs, allow_unused=True)
        runs[kernel] = [out] + [g for g in grads if g is not None]
        assert len(calls) == (kernel == "sdpa")
    for a, c in zip(runs["eager"], runs["sdpa"]):  # ‖difference‖ / ‖eager‖: float32 rounding is ~1e-7
        assert ((c - a).norm() / a.norm()).item() < 1e-5
    masked = runs["eager"][0].detach()
    with attention_kernel(attn, "sdpa"):  # not vacuous: without the mask the outputs differ far beyond the tolerance
        unmasked, _ = attn(h, mem_BMD=memory, mask_TK=torch.zeros_like(mask), pos=(r, u, v))
    assert ((unmasked - masked).norm() / masked.norm()).item() > 1e-2


def test_auto_kernel_is_eager_on_a_cpu_and_the_setting_is_the_models():
    """The kernel is each attention's setting, set on a model (for good, or for a block), never process-wide."""

    assert not uses_sdpa("auto", torch.device("cpu")) and uses_sdpa("auto", torch.device("cuda"))
    assert uses_sdpa("sdpa", torch.device("cpu")) and not uses_sdpa("eager", torch.device("cuda"))
    one, other = (nn.Sequential(RelPartialLearnableAttention(d_model=8, n_head=2, d_head=4, dropatt=0.0),
                                AbsoluteAttention(d_model=8, n_head=2, d_head=4, dropatt=0.0)) for _ in range(2))
    with attention_kernel(one, "sdpa"):
        assert [m.kernel for m in one] == ["sdpa", "sdpa"] and [m.kernel for m in other] == ["auto", "auto"]
    assert [m.kernel for m in one] == ["auto", "auto"]
    set_attention_kernel(other, "eager")
    assert [m.kernel for m in other] == ["eager", "eager"] and [m.kernel for m in one] == ["auto", "auto"]
    with pytest.raises(ValueError, match="auto, eager, sdpa"):
        set_attention_kernel(one, "flash")
    with pytest.raises(ValueError, match="auto, eager, sdpa"):
        with attention_kernel(one, "flash"):
            pass


@pytest.mark.parametrize("precision", ["32", "bf16"])
def test_relative_attention_unchanged_by_the_blocked_softmax(monkeypatch, precision):
    """The whole attention (outputs and every gradient), in float32 and under bf16 autocast, is the same with the
    blocked softmax as with the whole-tensor lines it replaces (dropatt 0, the configs' setting). On the CPU, the
    blocked softmax's device, whatever the test device."""
    with torch.device("cpu"):
        _relative_attention_unchanged_by_the_blocked_softmax(monkeypatch, precision)


def _relative_attention_unchanged_by_the_blocked_softmax(monkeypatch, precision):
    from repro.nn import blocked

    torch.manual_seed(0)
    attn = RelPartialLearnableAttention(d_model=16, n_head=2, d_head=8, dropatt=0.0)
    set_attention_kernel(attn, "eager")  # the blocked softmax's kernel, whatever the test device
    h, mem = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    r = sinusoid_table(relative_distances(8), 16)
    u, v = torch.randn(2, 8, requires_grad=True), torch.randn(2, 8, requires_grad=True)
    mask = causal_mask(5, 8)

    def run():
        attn.zero_grad(set_to_none=True)
        u.grad = v.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out, _ = attn(h, mem_BMD=mem, mask_TK=mask, pos=(r, u, v))
        out.float().square().sum().backward()
        return [out.detach(), u.grad, v.grad] + [p.grad for p in attn.parameters()]

    calls = []
    monkeypatch.setattr(blocked, "masked_softmax", lambda *a, f=blocked.masked_softmax: calls.append(1) or f(*a))
    fast = run()
    assert calls, "the blocked softmax was not the path taken"
    monkeypatch.setattr(blocked, "handles", lambda *a: False)  # the whole-tensor path
    plain = run()
    for a, b in zip(fast, plain):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [7, 1 << 18])
@pytest.mark.parametrize("shape", [(13, 5), (300, 4720), (1100, 204)])  # the small word and 41M char vocabularies
@pytest.mark.parametrize("upstream", ["weights", "mean"])
def test_blocked_cross_entropy_is_bit_identical(monkeypatch, dtype, block, shape, upstream):
    """`blocked.cross_entropy_float32` gives exactly the values and gradient of `F.cross_entropy(x.float(), y)`,
    with per-row upstream gradients and with the expanded one of a mean."""
    import torch.nn.functional as F

    from repro.nn import blocked

    if block == 7 and shape[0] > 13:
        block = 7 * shape[1]  # seven rows a block, not one
    monkeypatch.setattr(blocked, "BLOCK", block)
    n, v = shape
    g = torch.Generator(torch.get_default_device()).manual_seed(0)
    x0 = (torch.randn(n, v, generator=g) * 3).to(dtype)
    y = torch.randint(0, v, (n,), generator=g)
    up = torch.rand(n, generator=g)
    outs = []
    for f in (lambda x: F.cross_entropy(x.float(), y, reduction="none"), lambda x: blocked.cross_entropy_float32(x, y)):
        x = x0.clone().requires_grad_()
        loss = f(x)
        (loss.mean() if upstream == "mean" else loss).backward(None if upstream == "mean" else up)
        outs.append((loss, x.grad))
    assert outs[1][0].dtype == torch.float32 and outs[1][1].dtype == dtype
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def _scores_with_masked_keys(dtype, *, seed=0):
    g = torch.Generator(torch.get_default_device()).manual_seed(seed)
    scores = (torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64) * 6).to(dtype)
    masked = torch.rand(5, 7, generator=g) < 0.4
    masked[:, 2] = False  # every row keeps a key
    return scores.masked_fill(masked, float("-inf")), masked


def test_softmax_lse_values_and_gradient_in_float64():
    scores, masked = _scores_with_masked_keys(torch.float64)
    prob, lse = softmax_lse(scores)
    assert_close(prob, torch.softmax(scores, -1).float(), rtol=1e-6, atol=1e-7)  # float32 rounding
    assert_close(lse, torch.logsumexp(scores, -1).float(), rtol=1e-6, atol=0)
    # ∂/∂scores of any weighting of both outputs, against autograd through softmax and logsumexp (finite keys)
    x = scores.clone().requires_grad_()
    wp, wl = torch.randn(prob.shape, dtype=torch.float64), torch.randn(lse.shape, dtype=torch.float64)
    p_x, lse_x = softmax_lse(x)
    (g_ours,) = torch.autograd.grad((p_x.double() * wp).sum() + (lse_x.double() * wl).sum(), x)
    y = scores.clone().requires_grad_()
    (g_ref,) = torch.autograd.grad((torch.softmax(y, -1) * wp).sum() + (torch.logsumexp(y, -1) * wl).sum(), y)
    assert_close(g_ours[..., ~masked], g_ref[..., ~masked], rtol=1e-5, atol=1e-6)
    assert (g_ours[..., masked] == 0).all()


@pytest.mark.parametrize("which", ["prob", "lse"])
def test_softmax_lse_gradient_of_one_output(which):
    scores, masked = _scores_with_masked_keys(torch.float64, seed=1)
    x, y = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    ours = softmax_lse(x)[0 if which == "prob" else 1].double()
    ref = torch.softmax(y, -1) if which == "prob" else torch.logsumexp(y, -1)
    w = torch.randn(ref.shape, dtype=torch.float64)
    (g_ours,) = torch.autograd.grad((ours * w).sum(), x)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), y)
    assert_close(g_ours[..., ~masked], g_ref[..., ~masked], rtol=1e-5, atol=1e-6)


def test_softmax_lse_of_bf16_scores():
    """Reduced-precision scores: float32 outputs as softmax(dtype=float32) and logsumexp of the float32 scores,
    and a gradient in the scores' dtype."""
    scores, masked = _scores_with_masked_keys(torch.bfloat16, seed=2)
    x = scores.clone().requires_grad_()
    prob, lse = softmax_lse(x)
    assert prob.dtype == lse.dtype == torch.float32
    assert_close(prob, torch.softmax(scores, -1, dtype=torch.float32), rtol=0, atol=1e-7)
    assert_close(lse, torch.logsumexp(scores.float(), -1), rtol=1e-6, atol=0)
    (g,) = torch.autograd.grad(lse.sum() + prob[..., 0].sum(), x)
    y = scores.float().requires_grad_()
    (g_ref,) = torch.autograd.grad(torch.logsumexp(y, -1).sum() + torch.softmax(y, -1)[..., 0].sum(), y)
    assert g.dtype == torch.bfloat16
    assert_close(g.float()[..., ~masked], g_ref[..., ~masked], rtol=1e-2, atol=1e-3)
