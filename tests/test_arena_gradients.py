"""The memory arena's contestants pass the same gradients as the papers' own models: with one mechanism, the same
weights and the same tokens, every parameter's gradient of a loss over five segments (each segment's outputs
weighed by fixed random numbers, plus the auxiliary losses) equals the paper model's, in float32. The forward
equivalences are in tests/test_arena.py; a mechanism that computes the right outputs but passes the wrong
gradient (a detach too many, a term left out of the graph) fails here."""

import pytest
import torch

from papers.arena.model import Arena
from papers.infinity_former.compressive import CompressiveConfig, CompressiveTransformer
from papers.infinity_former.ltm import LTMConfig
from papers.infinity_former.model import InfinityFormer
from papers.lamemo.model import LaMemo, LaMemoConfig
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig

from arena_models import SMALL, _copy, _run, _tokens


def _pair(name: str):
    """(the paper's model, the arena's contestant, the map from the paper's parameter names to the arena's)."""
    cfg = TransformerXLConfig(**SMALL)
    if name == "txl":
        return TransformerXL(cfg), Arena(cfg), lambda k: k
    if name == "compressive":
        return (CompressiveTransformer(cfg, CompressiveConfig(rate=2, cmem_len=6)),
                Arena(cfg, [{"name": "compressive", "rate": 2, "cmem_len": 6}]), lambda k: k)
    if name.startswith("ltm_"):
        opts = dict(n_basis=16, n_samples=8, sampling=name[4:], n_bins=4, kl_weight=0.1)
        return InfinityFormer(cfg, LTMConfig(**opts)), Arena(cfg, [{"name": "ltm", **opts}]), lambda k: k
    variant = name.split("_", 1)[1]
    return (LaMemo(cfg, LaMemoConfig(variant=variant)), Arena(cfg, [{"name": "look_ahead", "variant": variant}]),
            lambda k: k)


def _grads(model, rename=lambda k: k) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    outs, _, aux = _run(model, _tokens())
    probe = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(3))
    loss = sum((h * probe).sum() for h in outs) + sum(v for a in aux for v in a.values())
    loss.backward()
    return {rename(n): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["txl", "compressive", "ltm_linear", "ltm_sticky", "lamemo_disentangled",
                                  "lamemo_txl", "lamemo_full"])
def test_gradients_equal_the_papers_model(name):
    torch.manual_seed(0)
    ref, arena, rename = _pair(name)
    _copy(ref, arena, rename)
    theirs, ours = _grads(ref, rename), _grads(arena)
    assert theirs.keys() == ours.keys() and len(ours) > 10
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-5, msg=key)
    # the gradients are far from zero, the mechanism's own parameters' included: a mechanism cut out of the graph
    # would not pass by tolerance
    assert max(g.abs().max().item() for g in ours.values()) > 1e-2
    has_own = any(k.startswith("mechanisms.") for k, _ in arena.named_parameters())
    own = [g for k, g in ours.items() if k.startswith("mechanisms.")]
    assert not has_own or (own and max(g.abs().max().item() for g in own) > 1e-4)
