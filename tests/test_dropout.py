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
