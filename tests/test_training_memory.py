"""What a training step keeps in memory beside the model (paper-size rehearsal stages peaked at 17-23 GB on
a 24 GB machine): Adam's multi-tensor update in bounded parameter groups (`repro.lm.bounded_groups`), against one
group, bit for bit; the last update's gradients freed before the next forward (`repro.lm.SegmentLM`), against
Lightning's timing, bit for bit."""

import pytest
import torch
from lightning.pytorch import Callback

from repro.lm import bounded_groups


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64),
                               torch.nn.LayerNorm(64), torch.nn.Linear(64, 512))


def test_groups_keep_the_order_and_the_bound():
    params = list(_model().parameters())
    groups = bounded_groups(params, 70_000)
    assert [p for g in groups for p in g["params"]] == params
    for g in groups:
        size = sum(p.numel() * p.element_size() for p in g["params"])
        assert size <= 70_000 or len(g["params"]) == 1
    assert bounded_groups(params, 1 << 30) == params  # a small model: one group, as before


def test_bounded_groups_give_the_one_groups_numbers_bit_for_bit():
    """Adam (foreach) over bounded groups against one group: three steps with gradient clipping, the same weights
    and moments bit for bit."""
    results = []
    for max_bytes in (1 << 30, 40_000):
        model = _model()
        opt = torch.optim.Adam(bounded_groups(model.parameters(), max_bytes), lr=1e-2, foreach=True)
        torch.manual_seed(1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 64)).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
        results.append(([p.detach().clone() for p in model.parameters()],
                         [opt.state[p]["exp_avg_sq"].clone() for p in model.parameters()]))
    (w1, v1), (w2, v2) = results
    assert all(torch.equal(a, b) for a, b in zip(w1 + v1, w2 + v2))


def test_the_update_temporary_stays_within_a_group():
    """The largest temporary the update allocates at once (the tensors of one out-of-place multi-tensor call: √v̂)
    is a group's (or its one larger parameter's), not the whole model's."""
    from torch.overrides import TorchFunctionMode

    class ForeachResults(TorchFunctionMode):
        largest = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if name.startswith("_foreach_") and not name.endswith("_") and isinstance(out, (list, tuple)):
                self.largest = max(self.largest, sum(t.numel() * t.element_size() for t in out))
            return out

    largest = {}
    for max_bytes in (1 << 30, 70_000):
        model = _model()
        opt = torch.optim.Adam(bounded_groups(model.parameters(), max_bytes), lr=1e-2, foreach=True)
        for _ in range(2):  # the moments exist from the first step on
            model(torch.randn(8, 64)).sum().backward()
            with ForeachResults() as seen:
                opt.step()
        largest[max_bytes] = seen.largest
    sizes = [p.numel() * 4 for p in _model().parameters()]
    assert largest[1 << 30] == sum(sizes) and largest[70_000] <= max(70_000, *sizes) < sum(sizes)


class _GradsAtForward(Callback):
    """Whether any parameter holds a gradient when each training step's forward begins."""

    def __init__(self):
        self.seen = []

    def setup(self, trainer, pl_module, stage):
        original = pl_module.training_step

        def step(batch, batch_idx):
            self.seen.append(any(p.grad is not None for p in pl_module.parameters()))
            return original(batch, batch_idx)

        pl_module.training_step = step


def _fit(accumulate: int, *, free_early: bool = True):
    import lightning as L

    from papers.transformer_xl.model import TransformerXLConfig
    from papers.transformer_xl.module import TransformerXLLM
    from repro.data.lm import LMDataModule

    L.seed_everything(7)
    dm = LMDataModule("embedded-char", batch_size=4, tgt_len=16)
    cfg = TransformerXLConfig(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.2, dropatt=0.1)
    module = TransformerXLLM(cfg, memory={"mem_len": 16}, optim={"lr": 3e-3, "warmup_steps": 2}, n_token=dm.vocab_size)
    if not free_early:  # Lightning's own timing only
        module.on_train_batch_start = lambda batch, batch_idx: None
    probe = _GradsAtForward()
    trainer = L.Trainer(max_steps=4, logger=False, callbacks=[probe], enable_progress_bar=False, limit_val_batches=0,
                        gradient_clip_val=0.25, enable_model_summary=False, accelerator="cpu",
                        accumulate_grad_batches=accumulate, enable_checkpointing=False)
    trainer.fit(module, datamodule=dm)
    return probe.seen, [p.detach().clone() for p in module.parameters()]


@pytest.mark.slow
def test_gradients_are_freed_before_the_forward_with_the_same_numbers():
    """No gradient of the last update sits beside a step's forward (Lightning frees them only before the backward);
    under gradient accumulation the accumulating batches keep theirs; the weights after 4 updates are the same as
    with Lightning's timing alone, bit for bit."""
    seen, weights = _fit(1)
    assert seen == [False] * 4
    seen, weights2 = _fit(2)
    assert seen == [False, True] * 4
    _, lightning_only = _fit(2, free_early=False)
    assert all(torch.equal(a, b) for a, b in zip(weights2, lightning_only))
