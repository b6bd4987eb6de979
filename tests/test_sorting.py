"""The sorting task: generator targets on hand-checked sequences, determinism and files, the segment contract,
the accuracy metric, and training/resume through the sorting module with the memory carried inside examples."""

import json

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from papers.infinity_former.module import SortingLM
from repro.data.sorting import (
    PAD,
    SEP,
    SortingDataModule,
    SortingSpec,
    SortSegments,
    build,
    drifting_sequence,
    lm_view,
    load,
    sort_by_frequency,
)
from repro.metrics.sorting import SortedTokenAccuracy

# --------------------------------------------------------------------------------------------- generator


def test_targets_on_hand_checked_sequences():
    # counts: 3 → 3, 1 → 2, 7 → 2 (1 occurs first), 0 → 1; then the 16 absent symbols in increasing order
    seq = [3, 1, 7, 3, 7, 1, 0, 3]
    assert sort_by_frequency(seq) == [3, 1, 7, 0, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    # a tie broken by first occurrence: 5 appears before 2
    assert sort_by_frequency([5, 2, 2, 5, 19])[:3] == [5, 2, 19]
    assert sort_by_frequency([19] * 4 + [0] * 4)[:3] == [19, 0, 1]
    assert sorted(sort_by_frequency([4, 4, 9])) == list(range(20))


def test_lm_view_scores_only_the_sorted_output():
    seqs = torch.tensor([[3, 1, 7, 3]], dtype=torch.uint8)
    srt = torch.tensor([sort_by_frequency([3, 1, 7, 3])], dtype=torch.uint8)
    inp, tgt = lm_view(seqs, srt)
    assert inp.shape == tgt.shape == (1, 4 + 20)
    assert inp[0, :5].tolist() == [3, 1, 7, 3, SEP] and inp[0, 5:].tolist() == srt[0, :19].tolist()
    assert tgt[0, :4].tolist() == [PAD] * 4 and tgt[0, 4:].tolist() == srt[0].tolist()


def test_drift_goes_from_p0_to_p1():
    """The first and last tenths of a long sequence follow p₀ and p₁ (same draws of p as the generator)."""
    rng = np.random.default_rng(5)
    seq = drifting_sequence(rng, 200_000)
    ref = np.random.default_rng(5)
    p0 = ref.integers(1, 10, 20).astype(float)
    p1 = ref.integers(1, 10, 20).astype(float)
    p0, p1 = p0 / p0.sum(), p1 / p1.sum()
    head = np.bincount(seq[:20_000], minlength=20) / 20_000
    tail = np.bincount(seq[-20_000:], minlength=20) / 20_000
    assert np.abs(head - (0.95 * p0 + 0.05 * p1)).max() < 0.01
    assert np.abs(tail - (0.05 * p0 + 0.95 * p1)).max() < 0.01


def test_generation_is_seeded_written_once_and_checked(tmp_path):
    spec = SortingSpec(length=50, n_train=6, n_valid=2, n_test=2, seed=3)
    folder = build(spec, tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["sizes"] == {"train": 6, "valid": 2, "test": 2} and set(meta["sha256"]) == {"train", "valid", "test"}
    data = load(spec, tmp_path)
    again = load(SortingSpec(length=50, n_train=6, n_valid=2, n_test=2, seed=3), tmp_path / "other")
    for split in ("train", "valid", "test"):
        assert torch.equal(data[split]["sequences"], again[split]["sequences"])
        for s, t in zip(data[split]["sequences"], data[split]["sorted"]):
            assert t.tolist() == sort_by_frequency(s.tolist())
    assert not torch.equal(data["valid"]["sequences"], data["test"]["sequences"])  # own stream per split
    assert not torch.equal(load(SortingSpec(50, 6, 2, 2, seed=4), tmp_path)["train"]["sequences"],
                           data["train"]["sequences"])
    (folder / "test.pt").write_bytes(b"broken")
    with pytest.raises(ValueError, match="checksum"):
        load(spec, tmp_path)


# ------------------------------------------------------------------------------------------------ batches


def test_segments_carry_within_examples_and_reset_between_them():
    inp = torch.arange(6 * 10).view(6, 10)
    tgt = inp + 1000
    segs = SortSegments(inp, tgt, batch_size=2, tgt_len=4, drop_last=True)
    out = list(segs)
    assert len(out) == len(segs) == 3 * 3  # 3 groups of 2 examples, 3 segments each (4 + 4 + 2)
    assert [(s.first, s.last) for s in out[:3]] == [(True, False), (False, False), (False, True)]
    assert torch.equal(torch.cat([s.input for s in out[:3]], 1), inp[:2])
    assert torch.equal(out[3].input, inp[2:4, :4]) and out[3].first
    # two DDP ranks split every group: together they see what one process sees
    r0 = list(SortSegments(inp, tgt, batch_size=2, tgt_len=4, rank=0, world_size=2))
    r1 = list(SortSegments(inp, tgt, batch_size=2, tgt_len=4, rank=1, world_size=2))
    for a, b, c in zip(out, r0, r1):
        assert torch.equal(torch.cat([b.input, c.input]), a.input) and (a.first, a.last) == (b.first, b.last)
    # resume after 4 segments continues with the fifth
    segs.load_state_dict({"consumed": 4, "geometry": [2, 4, 3, 3]})
    assert torch.equal(next(iter(segs)).input, out[4].input)
    with pytest.raises(ValueError, match="divides"):
        SortSegments(inp, tgt, batch_size=4, tgt_len=4, drop_last=False)


def test_accuracy_metric_counts_only_scored_positions():
    m = SortedTokenAccuracy(ignore_index=PAD)
    m.update(torch.tensor([[1, 2, 3, 4]]), torch.tensor([[PAD, 2, 0, 4]]))
    m.update(torch.tensor([[5]]), torch.tensor([[5]]))
    assert m.compute().item() == pytest.approx(3 / 4)


# ------------------------------------------------------------------------------------ training and resume

MODEL = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.1, dropatt=0.0, tie_weight=False)
LTM = dict(n_basis=16, n_samples=8, sampling="sticky", n_bins=4)


class Recorder(Callback):
    def __init__(self):
        self.losses, self.mem_at_save = {}, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch.last:
            self.losses[trainer.global_step] = float(trainer.callback_metrics["train/loss"])


class Killed(Exception):
    pass


class CrashAfter(Callback):
    """Dies right after a batch (as a job killed between two segments): the checkpoint taken then is the state a
    periodic checkpoint at that batch would hold."""

    def __init__(self, batch):
        self.batch = batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx >= self.batch:
            raise Killed


def _fit(tmp_path, data_root, *, crash_at=None, ckpt_path=None, every=None):
    L.seed_everything(11)
    dm = SortingDataModule(length=40, n_train=8, n_valid=2, n_test=2, batch_size=2, tgt_len=16, eval_batch_size=2,
                           data_dir=str(data_root))
    module = SortingLM(model=MODEL, backbone="infinity_former", ltm=LTM, memory={"mem_len": 8},
                       optim={"lr": 3e-3, "warmup_steps": 1}, n_token=dm.vocab_size)
    rec = Recorder()
    callbacks = [rec]
    if every:
        callbacks.append(ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=every, save_top_k=-1))
    if crash_at is not None:
        callbacks.append(CrashAfter(crash_at))
    trainer = L.Trainer(max_steps=4, logger=False, callbacks=callbacks, enable_progress_bar=False,
                        limit_val_batches=0, use_distributed_sampler=False, enable_model_summary=False,
                        accelerator="cpu", default_root_dir=tmp_path, enable_checkpointing=bool(every))
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    except Killed:
        assert crash_at is not None
    return rec.losses, module, trainer


@pytest.mark.slow
def test_memory_survives_checkpoint_and_resume(tmp_path):
    """A checkpoint taken in the middle of an example holds the LTM; resuming from it continues the example with
    that memory and reproduces the uninterrupted run's losses."""
    data = tmp_path / "data"
    straight, _, _ = _fit(tmp_path / "a", data)
    assert sorted(straight) == [1, 2, 3, 4]
    # each group of 2 examples is 4 segments (60 tokens: 16, 16, 16, 12), one optimiser step per group; the
    # checkpoint is taken by hand in the middle of the third group
    _, module, trainer = _fit(tmp_path / "b", data, crash_at=9)  # killed in the third group, after 2 of its 4 segments
    assert module._mems["train"][4].shape == (2, 16, 16)  # the LTM's coefficients (layer 0) exist
    mid = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(mid)
    state = torch.load(mid, weights_only=True)
    mem = state["repro"]["train_memory"]
    assert len(mem) == 8 and mem[4].shape == (2, 16, 16) and mem[6].shape == (2, 4)
    resumed, module2, _ = _fit(tmp_path / "c", data, ckpt_path=mid)
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-5), step


@pytest.mark.slow
def test_evaluation_reports_accuracy_and_regression_error(tmp_path):
    _, module, trainer = _fit(tmp_path, tmp_path / "data")
    out = trainer.test(module, datamodule=trainer.datamodule, verbose=False)[0]
    assert 0.0 <= out["test/acc"] <= 1.0 and out["test/tokens"] == 2 * 20
    assert out["test/regression_error"] >= 0


@pytest.mark.slow
def test_bench_compare_times_the_models_in_turns():
    """`repro bench --compare`: every model once per round, in the given order, each row relative to the round's
    first model (its own tokens/s over the first's)."""
    from repro.cli.bench import compare

    a, b = "configs/infinity_former/tiny/sort_256_txl.yaml", "configs/infinity_former/tiny/sort_256_infty.yaml"
    rows = compare([[a], [b]], mode="eval", rounds=2, steps=1, warmup=0, batch_size=1, precision="32",
                   overrides=["--data.init_args.n_train", "8", "--data.init_args.n_valid", "4",
                              "--data.init_args.n_test", "4"])
    assert [(r["round"], r["config"]) for r in rows] == [(1, [a]), (1, [b]), (2, [a]), (2, [b])]
    for first, second in (rows[:2], rows[2:]):
        assert first["relative"] == 1.0
        assert second["relative"] == round(second["tokens_per_s"] / first["tokens_per_s"], 3)
        assert second["mode"] == "eval" and second["parameters"] > first["parameters"]


@pytest.mark.slow
@pytest.mark.parametrize("official", [False, True])
def test_official_optimiser_steps_after_every_segment(tmp_path, official):
    """`step_every_segment` reproduces `sorting/train.py` under its torch 1.9: `optimizer.step()` after every
    segment, the gradients zeroed (not None) at each group's start, so Adam skips the first group's memory-only
    segment (no gradient yet) and steps on zero gradients after those of every later group. Sequences of 28 + 20
    tokens in segments of 24 (the sorted output wholly in the second, as at the official lengths), 4 groups: Adam's
    step count is 1 + 3 × 2 = 7 (official) or 4 (one step per group); Lightning counts 4 steps either way. After
    the first group the official run moves the weights during the memory-only segments, the default does not."""
    L.seed_everything(11)
    dm = SortingDataModule(length=28, n_train=8, n_valid=2, n_test=2, batch_size=2, tgt_len=24, eval_batch_size=2,
                           data_dir=str(tmp_path / "data"))
    module = SortingLM(model=MODEL, backbone="infinity_former", ltm=LTM, memory={"mem_len": 8},
                       optim={"lr": 3e-3, "warmup_steps": 1}, n_token=dm.vocab_size, step_every_segment=official)
    moved = []

    class Watch(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.before = pl_module.model.layers[0].ff.net[0].weight.detach().clone()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if not batch.last and trainer.global_step >= 1:  # a memory-only segment of a later group
                moved.append(not torch.equal(self.before, pl_module.model.layers[0].ff.net[0].weight))

    trainer = L.Trainer(max_steps=4, logger=False, callbacks=[Watch()], enable_progress_bar=False,
                        limit_val_batches=0, use_distributed_sampler=False, enable_model_summary=False,
                        accelerator="cpu", default_root_dir=tmp_path, enable_checkpointing=False)
    trainer.fit(module, datamodule=dm)
    opt = trainer.optimizers[0]
    steps = {int(state["step"]) for state in opt.state.values()}
    assert trainer.global_step == 4
    assert steps == ({7} if official else {4})
    assert moved and all(moved) == official and any(moved) == official


def _sorting_trainer(tmp_path, callbacks=(), *, max_steps=4):
    return L.Trainer(max_steps=max_steps, logger=False, callbacks=list(callbacks), enable_progress_bar=False,
                     limit_val_batches=0, use_distributed_sampler=False, enable_model_summary=False,
                     accelerator="cpu", default_root_dir=tmp_path, enable_checkpointing=False)


def test_learning_rate_follows_the_cosine_at_every_update(tmp_path):
    """The official loop steps its cosine scheduler every 240 updates (a staircase); ours follows the cosine at every
    update (README, deviations): after update k the rate is lr · factor(k), warm-up included."""
    L.seed_everything(11)
    dm = SortingDataModule(length=28, n_train=16, n_valid=2, n_test=2, batch_size=2, tgt_len=24, eval_batch_size=2,
                           data_dir=str(tmp_path / "data"))
    module = SortingLM(model=MODEL, backbone="transformer_xl", memory={"mem_len": 8},
                       optim={"lr": 1e-3, "warmup_steps": 2}, n_token=dm.vocab_size)
    rates = []

    class Rate(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch.last:
                rates.append(trainer.optimizers[0].param_groups[0]["lr"])

    _sorting_trainer(tmp_path, [Rate()], max_steps=6).fit(module, datamodule=dm)
    assert rates == pytest.approx([1e-3 * module.optim.factor(k, 6) for k in range(1, 7)])
    assert len(set(rates)) == 6  # a new rate after every update


def test_a_split_sorted_output_gives_gradients_from_both_segments(tmp_path):
    """Sequences of 28 symbols + 20 sorted outputs in segments of 16: the output falls 4 tokens in the second
    segment and 16 in the third. The official loop back-propagates the last segment only; ours back-propagates the
    scored part of the second too, before the group's single update (README, deviations)."""
    L.seed_everything(11)
    dm = SortingDataModule(length=28, n_train=8, n_valid=2, n_test=2, batch_size=2, tgt_len=16, eval_batch_size=2,
                           data_dir=str(tmp_path / "data"))
    module = SortingLM(model=MODEL, backbone="infinity_former", ltm=LTM, memory={"mem_len": 8},
                       optim={"lr": 3e-3, "warmup_steps": 1}, n_token=dm.vocab_size)
    seen = []

    class Grads(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            grads = [p.grad.clone() for p in pl_module.parameters() if p.grad is not None]
            seen.append((int((batch.target != PAD).sum()), grads))

    _sorting_trainer(tmp_path, [Grads()], max_steps=1).fit(module, datamodule=dm)
    assert [n for n, _ in seen] == [0, 2 * 4, 2 * 16]
    assert seen[0][1] == []  # the memory-only segment runs without gradients
    middle, last = seen[1][1], seen[2][1]
    assert middle and any(g.abs().sum() > 0 for g in middle)  # the output's first 4 tokens gave a gradient ...
    assert len(last) >= len(middle) and any(not torch.equal(a, b) for a, b in zip(middle, last))  # ... then more


def test_evaluation_batch_size_does_not_change_the_numbers(tmp_path):
    """The official code evaluates one sequence at a time; ours `eval_batch_size` at once, each with its own memory
    (README, deviations): the same test numbers with batches of 1 and 2 (a linear LTM: no random draws;
    the weights as initialised)."""
    data = tmp_path / "data"
    L.seed_everything(11)

    def datamodule(eval_batch_size):
        return SortingDataModule(length=40, n_train=8, n_valid=2, n_test=4, batch_size=2, tgt_len=16,
                                 eval_batch_size=eval_batch_size, data_dir=str(data))

    module = SortingLM(model=MODEL, backbone="infinity_former", ltm={"n_basis": 16, "n_samples": 8},
                       memory={"mem_len": 8}, n_token=datamodule(2).vocab_size)
    trainer = _sorting_trainer(tmp_path)
    one, two = (trainer.test(module, datamodule=datamodule(b), verbose=False)[0] for b in (1, 2))
    assert one["test/tokens"] == two["test/tokens"] == 4 * 20
    for key in ("test/loss", "test/acc", "test/regression_error"):
        assert one[key] == pytest.approx(two[key], rel=1e-5, abs=1e-7), key
