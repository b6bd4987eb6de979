"""The small models and the segment loop that the arena's equivalence tests share (tests/test_arena.py, forward;
tests/test_arena_gradients.py, gradients): weights ten times the backbone's default spread, five segments."""

import torch
from torch import nn

# weights ten times the backbone's default spread: a mis-wired mechanism moves the outputs by far more than 1e-5
SMALL = dict(n_layer=3, d_model=32, n_head=4, d_head=8, d_inner=64, n_token=50, dropout=0.0, init_std=0.2)
SEGMENTS, T, MEM = 5, 6, 8


def _tokens(seed=0):
    return torch.randint(0, 50, (SEGMENTS, 2, T), generator=torch.Generator().manual_seed(seed))


def _copy(src: nn.Module, dst: nn.Module, rename=lambda k: k) -> None:
    state = {rename(k): v for k, v in src.state_dict().items()}
    missing, unexpected = dst.load_state_dict(state, strict=False)
    assert not unexpected and not missing, (missing, unexpected)


def _run(model, tokens, *, train=True, mem_len=MEM, **kw):
    model.train(train)
    torch.manual_seed(1)  # sticky memories sample their positions
    mems, outs, aux = None, [], []
    for seg in tokens:
        h, mems = model(seg, mems, mem_len=mem_len, **kw)
        outs.append(h)
        aux.append(model.aux_losses() if hasattr(model, "aux_losses") else {})
    return outs, mems, aux


