"""`repro.nn.dropout` against the definition of inverted dropout and against `nn.Dropout`'s interface."""

import pytest
import torch

from repro.nn.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drops_with_probability_p_and_scales_the_rest(p):
    x = torch.full((400_000,), 3.0)
    y = dropout(x, p, True)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / x.numel()) ** 0.5  # five standard errors
    assert torch.allclose(y[y != 0], torch.tensor(3.0 / (1 - p)))


def test_gradient_is_the_mask_scaled():
    x = torch.randn(1000, requires_grad=True)
    y = dropout(x, 0.3, True)
    y.backward(torch.ones_like(y))
    kept = y.detach() != 0
    assert torch.allclose(x.grad[kept], torch.tensor(1 / 0.7))
    assert torch.all(x.grad[~kept] == 0)


def test_identity_in_evaluation_and_at_zero_without_a_draw():
    x = torch.randn(50)
    module = Dropout(0.2).eval()
    assert module(x) is x or torch.equal(module(x), x)
    state = torch.get_rng_state()
    assert torch.equal(dropout(x, 0.0, True), x)
    assert torch.equal(torch.get_rng_state(), state)  # p = 0 draws nothing, as torch's dropout


def test_seeded_draws_repeat_and_bf16_keeps_its_dtype():
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    torch.manual_seed(7)
    a = Dropout(0.25).train()(x)
    torch.manual_seed(7)
    b = Dropout(0.25).train()(x)
    assert torch.equal(a, b) and a.dtype == torch.bfloat16


def test_is_an_nn_dropout():
    module = Dropout(0.1)
    assert isinstance(module, torch.nn.Dropout) and module.p == 0.1 and "p=0.1" in repr(module)


def _float_mask_dropout(x, p):
    """The form the one-byte mask replaced: a float mask of x's size kept by the product's backward."""
    keep = (torch.empty(x.shape, dtype=torch.int32).random_() >= round(p * 2**31)).to(x.dtype).mul_(1 / (1 - p))
    return x * keep


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_bool_mask_gives_the_float_masks_numbers_bit_for_bit(dtype):
    x = torch.randn(33, 70, dtype=dtype)
    g = torch.randn(33, 70, dtype=dtype)
    outs = []
    for fn in (lambda t: dropout(t, 0.3, True), lambda t: _float_mask_dropout(t, 0.3)):
        torch.manual_seed(3)
        leaf = x.clone().requires_grad_()
        y = fn(leaf)
        y.backward(g)
        outs.append((y.detach(), leaf.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def _saved_bytes(fn) -> dict:
    """Bytes the autograd graph of `fn()` keeps, by dtype (each storage once)."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = (t.dtype, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    by = {}
    for dtype, n in seen.values():
        by[dtype] = by.get(dtype, 0) + n
    return out, by


def test_dropout_keeps_one_byte_a_unit():
    x = torch.randn(64, 256, requires_grad=True)
    _, saved = _saved_bytes(lambda: dropout(x, 0.1, True))
    assert saved == {torch.bool: x.numel()}


@pytest.mark.parametrize("autocast", [False, True])
def test_dropout_matmul_equals_dropout_then_product(autocast):
    """`dropout_matmul` against `Dropout(p)(prob).to(v.dtype) @ v`: the same draws, outputs and gradients (of the
    scores through the softmax, and of v), in float32 and under bf16 autocast (v in bf16)."""
    from repro.nn.dropout import dropout_matmul

    scores = torch.randn(2, 3, 17, 40)
    v = torch.randn(2, 3, 40, 8, dtype=torch.bfloat16 if autocast else torch.float32)
    g = torch.randn(2, 3, 17, 8, dtype=v.dtype)
    module = Dropout(0.2).train()
    outs = []
    for fused in (True, False):
        torch.manual_seed(11)
        s, vv = scores.clone().requires_grad_(), v.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            prob = torch.softmax(s, dim=-1, dtype=torch.float32)
            out = dropout_matmul(prob, vv, module) if fused else module(prob).to(vv.dtype) @ vv
        out.backward(g)
        outs.append((out.detach(), s.grad, vv.grad))
    for a, b in zip(*outs):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_dropout_matmul_keeps_the_probabilities_and_a_bool_mask():
    """What the attention's backward keeps: the softmax's probabilities (one storage for both nodes), v and a bool
    mask, where the unfused form also keeps the dropped probabilities (and kept a float mask before the bool one)."""
    from repro.nn.dropout import dropout_matmul

    scores = torch.randn(2, 4, 64, 128, requires_grad=True)
    v = torch.randn(2, 4, 128, 16, requires_grad=True)
    module = Dropout(0.1).train()
    n = scores.numel()
    _, fused = _saved_bytes(lambda: dropout_matmul(torch.softmax(scores, -1, dtype=torch.float32), v, module))
    _, unfused = _saved_bytes(lambda: module(torch.softmax(scores, -1, dtype=torch.float32)) @ v)
    assert fused == {torch.float32: 4 * (n + v.numel()), torch.bool: n}
    assert unfused == {torch.float32: 4 * (2 * n + v.numel()), torch.bool: n}
