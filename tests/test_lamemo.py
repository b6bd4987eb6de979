"""LaMemo against independent references: the union-softmax identity, a naive per-position reference of the
refreshed memory, no leakage, Transformer-XL equivalence with look-ahead off, checkpoint/resume of the memory and
its normalisers, DDP, configs."""

import json
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.testing import assert_close

from papers.lamemo.model import LaMemo, LaMemoConfig, interpolate, look_ahead_window, window_position_scores
from papers.lamemo.module import LaMemoLM
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.data.lm import LMDataModule
from repro.nn.attention import sinusoid_table

D, H, E, V = 16, 2, 8, 23


def _cfg(n_layer=1, **kw):
    return TransformerXLConfig(n_layer=n_layer, d_model=D, n_head=H, d_head=E, d_inner=32, n_token=V,
                               dropout=0.0, dropatt=0.0, **kw)


def _randomise(model, scale=0.3):
    """Weights far from their small initial values, so that every term (and every bug) shows in the outputs."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return model


# ------------------------------------------------------------------------------------------ interpolation identity
def test_interpolation_equals_one_softmax_over_the_union_of_key_sets():
    g = torch.Generator().manual_seed(1)
    s1, s2, s3 = (torch.randn(3, 2, n, generator=g) * 4 for n in (5, 7, 2))
    v1, v2, v3 = (torch.randn(3, 2, n, 6, generator=g) for n in (5, 7, 2))

    def part(s, v):
        return (torch.softmax(s, -1)[..., None] * v).sum(-2), torch.logsumexp(s, -1)

    vec, lse = interpolate(*part(s1, v1), *part(s2, v2))
    vec, lse = interpolate(vec, lse, *part(s3, v3))  # a third refresh: still one softmax over everything
    s, v = torch.cat([s1, s2, s3], -1), torch.cat([v1, v2, v3], -2)
    w = s.exp() / s.exp().sum(-1, keepdim=True)  # the naive softmax, written out
    assert_close(vec, (w[..., None] * v).sum(-2), rtol=1e-5, atol=1e-6)
    assert_close(lse, s.exp().sum(-1).log(), rtol=1e-5, atol=1e-5)


def test_interpolation_is_stable_for_large_normalisers():
    vec, lse = interpolate(torch.ones(1, 2), torch.tensor([900.0]), torch.zeros(1, 2), torch.tensor([-900.0]))
    assert torch.isfinite(vec).all() and torch.allclose(vec, torch.ones(1, 2)) and lse.item() == pytest.approx(900.0)


# --------------------------------------------------------------------- naive reference of the refreshed memory
class Naive:
    """Scores of one layer-0 query/key pair from the weights, by the paper's formulas (no shift tricks)."""

    def __init__(self, model: LaMemo, x_PD: torch.Tensor):
        att = model.layers[0].attn
        he = H * E
        w = att.qkv_net.weight.detach()
        self.q = (x_PD @ w[:he].T).view(-1, H, E)
        self.k = (x_PD @ w[he:2 * he].T).view(-1, H, E)
        self.v = (x_PD @ w[2 * he:].T).view(-1, H, E)
        self.wr = att.r_net.weight.detach()
        self.m = model
        self.variant = model.lamemo.variant

        self._r: dict[int, torch.Tensor] = {}

    def r(self, d: int) -> torch.Tensor:
        if d not in self._r:
            self._r[d] = (sinusoid_table(torch.tensor([d]), D) @ self.wr.T).view(H, E)
        return self._r[d]

    def score(self, p: int, j: int, *, look_ahead: bool) -> torch.Tensor:
        m = self.m
        u, v = m.r_w_bias.detach(), m.r_r_bias.detach()
        if look_ahead:  # a memory row p refreshed by key j
            if self.variant == "txl":
                r = self.r(p - j)  # Transformer-XL's encoding of a negative distance, its bias v
            else:
                r, v = self.r(abs(j - p)), m.r_r_bias_future.detach()
                if self.variant == "disentangled_v2":
                    u = m.r_w_bias_future.detach()
        else:
            r = self.r(p - j)
        q = self.q[p]
        return (((q + u) * self.k[j]).sum(-1) + ((q + v) * r).sum(-1)) / math.sqrt(E)

    def attend(self, pairs):
        s = torch.stack([x[0] for x in pairs], -1)  # (H, n)
        vals = torch.stack([self.v[j] for _, j in pairs], 1)  # (H, n, E)
        w = torch.softmax(s, -1)
        return (w[..., None] * vals).sum(1), torch.logsumexp(s, -1)


@pytest.mark.parametrize("variant,t,mem_len", [("disentangled", 4, 6), ("disentangled", 4, 4), ("disentangled", 4, 3),
                                                ("disentangled", 3, 8), ("txl", 4, 6), ("disentangled_v2", 3, 5)])
def test_refreshed_memory_is_attention_over_every_key_up_to_the_current_step(variant, t, mem_len):
    """After segment s, the carried vector of memory position p is softmax attention over every key from the
    first it saw (when it was computed as a current token) to the first token of segment s — the union of its
    causal keys and all its look-ahead keys — and the carried normaliser is that softmax's log-normaliser."""
    torch.manual_seed(3)
    model = _randomise(LaMemo(_cfg(1), LaMemoConfig(variant=variant))).eval()
    tokens = torch.randint(0, V, (1, 4 * t))
    x_PD = model.word_emb(tokens)[0].detach()
    ref = Naive(model, x_PD)
    first_key = {}
    mems = None
    with torch.no_grad():
        for s in range(4):
            a = s * t
            m = mems[0].shape[1] if mems else 0
            for p in range(a, a + t):
                first_key[p] = a - m
            _, mems = model(tokens[:, a:a + t], mems, mem_len=mem_len)
            kept = range(max(0, a + t - mem_len), a + t)
            for row, p in enumerate(kept):
                # current rows: up to themselves; memory rows: up to this segment's first token
                last = p if p >= a else a
                pairs = [(ref.score(p, j, look_ahead=j > p), j) for j in range(first_key[p], last + 1)]
                vec, lse = ref.attend(pairs)
                assert_close(mems[1][0, row], vec, rtol=1e-4, atol=1e-5, msg=f"segment {s}, position {p}")
                assert_close(mems[2][0, row], lse, rtol=1e-4, atol=1e-5, msg=f"segment {s}, position {p}")


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("m,t,first", [(6, 6, 0), (4, 7, 0), (9, 2, 0), (20, 3, 0), (20, 3, 5), (13, 4, 13 - 4)])
def test_window_position_scores_equal_the_gathered_position_vectors(m, t, first, full):
    """Blocked product-and-pick against the definition: row i's score for window key w is its query times the
    table's position vector at index_MW[i, w] (every row, every key, also where the mask will hide it)."""
    g = torch.Generator().manual_seed(m * 100 + t * 10 + first)
    n = m + t + m if full else m
    q = torch.randn(2, H, m - first, E, generator=g, dtype=torch.float64)
    r = torch.randn(H, E, n, generator=g, dtype=torch.float64)
    _, index, _ = look_ahead_window(m, t, full=full)
    ours = window_position_scores(q, r, index, m=m, t=t, first=first, full=full)
    r_MWHE = r.permute(2, 0, 1)[index[first:]]  # (M − first, W, H, E)
    assert_close(ours, torch.einsum("bhme,mwhe->bhmw", q, r_MWHE), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["disentangled", "full"])
@pytest.mark.parametrize("t,mem_len", [(4, 4), (3, 7), (5, 3)])
def test_skipped_last_layer_work_changes_no_output_memory_or_gradient(monkeypatch, variant, t, mem_len):
    """The last layer neither feeds its memory rows forward nor refreshes rows the next memory drops: outputs,
    memories and gradients equal those of the forward that does all of it (3 layers, 4 segments)."""
    import papers.lamemo.model as lamemo_model

    torch.manual_seed(5)
    model = _randomise(LaMemo(_cfg(3), LaMemoConfig(variant=variant))).train()
    tokens = torch.randint(0, V, (2, 4 * t))

    def run():
        mems, outs = None, []
        for s in range(4):
            h, mems = model(tokens[:, s * t:(s + 1) * t], mems, mem_len=mem_len)
            outs.append(h)
        model.zero_grad()
        torch.stack(outs).pow(2).sum().backward()
        return outs, mems, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    skipped = run()
    full_layer = lamemo_model.layer_look_ahead

    def every_row(*args, first=0, memory_output=True, **kwargs):
        """All memory rows refreshed and fed forward; the rows asked for handed back."""
        h, mem, vec_mem, lse_mem, vec_cur, lse_cur = full_layer(*args, first=0, memory_output=True, **kwargs)
        if vec_mem is not None:
            vec_mem, lse_mem = vec_mem[:, first:], lse_mem[:, first:]
        return h, mem, vec_mem, lse_mem, vec_cur, lse_cur

    monkeypatch.setattr(lamemo_model, "layer_look_ahead", every_row)
    everything = run()
    for ours, ref in zip(skipped, everything):
        assert len(ours) == len(ref)
        for a, b in zip(ours, ref):
            assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_full_look_ahead_attends_the_whole_window_on_both_sides():
    """The reference's attn_type 33: memory rows attend to every key of the window (positions that arrived since
    the previous segment's first token), left or right, all with the future position bias."""
    torch.manual_seed(4)
    t = mem_len = 4
    model = _randomise(LaMemo(_cfg(1), LaMemoConfig(variant="full"))).eval()
    tokens = torch.randint(0, V, (1, 3 * t))
    ref = Naive(model, model.word_emb(tokens)[0].detach())
    seen: dict[int, list] = {}
    mems = None
    with torch.no_grad():
        for s in range(3):
            a = s * t
            m = mems[0].shape[1] if mems else 0
            for p in range(a - m, a):
                seen[p] += [(ref.score(p, j, look_ahead=True), j) for j in range(max(a - t + 1, a - m), a + 1)]
            for p in range(a, a + t):
                seen[p] = [(ref.score(p, j, look_ahead=False), j) for j in range(a - m, p + 1)]
            _, mems = model(tokens[:, a:a + t], mems, mem_len=mem_len)
            for row, p in enumerate(range(a + t - mems[0].shape[1], a + t)):
                vec, lse = ref.attend(seen[p])
                assert_close(mems[1][0, row], vec, rtol=1e-4, atol=1e-5)
                assert_close(mems[2][0, row], lse, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------- no leakage
def _hidden_stream(model, tokens, t, mem_len, mems=None, start=0):
    """Outputs of the segments from `start` on, and the memory at the start of every segment."""
    outs, at = [], {}
    for a in range(start, tokens.shape[1], t):
        at[a] = mems
        h, mems = model(tokens[:, a:a + t], mems, mem_len=mem_len)
        outs.append(h)
    return torch.cat(outs, 1), at


@pytest.mark.parametrize("variant", ["disentangled", "full"])
def test_no_prediction_sees_a_later_token(variant):
    torch.manual_seed(5)
    t, mem_len = 4, 6
    model = _randomise(LaMemo(_cfg(3), LaMemoConfig(variant=variant))).eval()
    tokens = torch.randint(0, V, (1, 4 * t))
    with torch.no_grad():
        base, mems_at = _hidden_stream(model, tokens, t, mem_len)
        for p in [*range(t, 2 * t), 2 * t + 1, 3 * t]:  # a whole segment, and the first/second of later ones
            other = tokens.clone()
            other[0, p] = (other[0, p] + 1) % V
            start = p - p % t  # earlier segments cannot change; run from p's segment with the memory it had
            out, _ = _hidden_stream(model, other, t, mem_len, mems_at[start], start)
            assert_close(out[:, : p - start], base[:, start:p], rtol=0, atol=1e-6,
                         msg=f"a change at {p} moved an earlier output")
            assert not torch.allclose(out[:, p - start], base[:, p], atol=1e-3)  # power: p itself moves
            if p % t == 0:  # power: the rest of the segment sees p
                assert not torch.allclose(out[:, p - start + 1 : t], base[:, p + 1 : start + t], atol=1e-3)


# ----------------------------------------------------------------------------------- Transformer-XL equivalence
@pytest.mark.parametrize("lengths", [dict(mem_len=6), dict(mem_len=10, clamp_len=3, same_length=True)])
def test_look_ahead_off_is_the_harness_transformer_xl_weight_for_weight(lengths):
    torch.manual_seed(6)
    txl = _randomise(TransformerXL(_cfg(3))).eval()
    lam = LaMemo(_cfg(3), LaMemoConfig(look_ahead=False)).eval()
    lam.load_state_dict(txl.state_dict(), strict=True)  # the same parameter names, nothing more
    tokens = torch.randint(0, V, (2, 20))
    m_a = m_b = None
    with torch.no_grad():
        for a in range(0, 20, 5):
            h_a, m_a = txl(tokens[:, a:a + 5], m_a, **lengths)
            h_b, m_b = lam(tokens[:, a:a + 5], m_b, **lengths)
            assert_close(h_b, h_a, rtol=1e-6, atol=1e-6)
            assert_close(lam.nll(h_b, tokens[:, a:a + 5]), txl.nll(h_a, tokens[:, a:a + 5]))
            for x, y in zip(m_b, m_a):
                assert_close(x, y)


def test_first_segment_with_look_ahead_is_transformer_xl_and_the_second_is_not():
    """Without memory there is nothing to look ahead from; from the second segment on, the refresh matters."""
    torch.manual_seed(7)
    txl = _randomise(TransformerXL(_cfg(2))).eval()
    lam = _randomise(LaMemo(_cfg(2))).eval()
    missing, unexpected = lam.load_state_dict(txl.state_dict(), strict=False)
    assert missing == ["mechanisms.0.r_r_bias_future"] and not unexpected
    tokens = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        h_a, m_a = txl(tokens[:, :5], None, mem_len=5)
        h_b, m_b = lam(tokens[:, :5], None, mem_len=5)
        assert_close(h_b, h_a, rtol=1e-6, atol=1e-6)
        h_a, _ = txl(tokens[:, 5:], m_a, mem_len=5)
        h_b, _ = lam(tokens[:, 5:], m_b, mem_len=5)
        assert not torch.allclose(h_a, h_b, atol=1e-3)


def test_bad_memory_and_settings_are_refused():
    lam = LaMemo(_cfg(2))
    with pytest.raises(ValueError, match="1 \\+ 2 × 2 tensors"):
        lam(torch.zeros(1, 3, dtype=torch.long), [torch.zeros(1, 2, D)] * 2, mem_len=4)
    with pytest.raises(ValueError, match="no key/value"):
        lam(torch.zeros(1, 3, dtype=torch.long), None, mem_len=4, kv_memory=True)
    with pytest.raises(ValueError, match="relative attention"):
        LaMemo(_cfg(1, attention="absolute"))
    with pytest.raises(ValueError, match="variant"):
        LaMemoConfig(variant="future")


# -------------------------------------------------------------------------------------- checkpoint and resume
class LossRecorder(Callback):
    """Losses by step, and the carried memory after step 6 (the first step after a resume from step 5)."""

    def __init__(self):
        self.losses, self.memory = {}, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses[trainer.global_step] = float(outputs["loss"])
        if trainer.global_step == 6:
            self.memory = [m.clone() for m in pl_module._mems["train"]]


class Killed(Exception):
    pass


class CrashAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step:
            raise Killed


def _run(tmp_path, *, crash_at=None, ckpt_path=None):
    L.seed_everything(7)
    dm = LMDataModule("embedded-char", batch_size=4, tgt_len=8)
    cfg = TransformerXLConfig(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.2, dropatt=0.1)
    module = LaMemoLM(cfg, memory={"mem_len": 12}, optim={"lr": 3e-3, "warmup_steps": 2}, n_token=dm.vocab_size)
    rec = LossRecorder()
    callbacks = [rec, ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_top_k=-1)]
    if crash_at:
        callbacks.append(CrashAt(crash_at))
    trainer = L.Trainer(max_steps=10, logger=False, callbacks=callbacks, enable_progress_bar=False,
                        limit_val_batches=0, use_distributed_sampler=False, gradient_clip_val=0.25,
                        enable_model_summary=False, accelerator="cpu")
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    except Killed:
        assert crash_at
    return rec, module


@pytest.mark.slow
def test_memory_states_and_normalisers_survive_checkpoint_and_resume(tmp_path):
    straight, _ = _run(tmp_path / "a")
    _run(tmp_path / "b", crash_at=7)  # checkpoint at step 5, killed during step 8
    ckpt = tmp_path / "b" / "epoch=0-step=5.ckpt"
    mem = torch.load(ckpt, weights_only=True)["repro"]["train_memory"]
    assert [tuple(m.shape) for m in mem] == [(4, 12, 32), (4, 12, 2, 16), (4, 12, 2), (4, 12, 2, 16), (4, 12, 2)]
    assert mem[2].dtype == torch.float32 and torch.isfinite(mem[2]).all() and mem[2].abs().sum() > 0
    resumed, _ = _run(tmp_path / "c", ckpt_path=ckpt)
    assert sorted(resumed.losses) == list(range(6, 11))
    for step in range(6, 11):
        assert resumed.losses[step] == pytest.approx(straight.losses[step], rel=1e-6), step
    for a, b in zip(resumed.memory, straight.memory):  # states and normalisers after the first resumed step
        assert_close(a, b, rtol=1e-6, atol=1e-6)
    # the test has power: resuming with the normalisers reset gives other normalisers after the refresh
    state = torch.load(ckpt, weights_only=True)
    for i in (2, 4):
        state["repro"]["train_memory"][i].zero_()
    torch.save(state, tmp_path / "nonorm.ckpt")
    other, _ = _run(tmp_path / "d", ckpt_path=tmp_path / "nonorm.ckpt")
    assert not torch.allclose(other.memory[2], straight.memory[2], atol=0.1)


TINY = "configs/lamemo/tiny/char_lamemo.yaml"


@pytest.mark.slow
def test_two_ddp_processes_give_the_evaluation_nll_of_one(root, tmp_path):
    import os
    import subprocess
    import sys

    def cli(args):
        return subprocess.run([sys.executable, "-m", "repro", *args], cwd=root, capture_output=True, text=True,
                              timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    common = ["validate", "-c", TINY, "--run.tracking", "none", "--run.untrained", "true",
              "--trainer.precision", "32-true", "--trainer.limit_val_batches", "6", "--trainer.accelerator", "cpu"]
    one = cli([*common, "--run.record", str(tmp_path / "one.json")])
    assert one.returncode == 0, one.stderr[-3000:]
    two = cli([*common, "--trainer.devices", "2", "--trainer.strategy", "ddp",
               "--run.record", str(tmp_path / "two.json")])
    assert two.returncode == 0, two.stderr[-3000:]
    a = json.loads((tmp_path / "one.json").read_text())["metrics"]
    b = json.loads((tmp_path / "two.json").read_text())["metrics"]
    assert a["val/tokens"] == b["val/tokens"] == 10 * 6 * 32
    assert b["val/loss"] == pytest.approx(a["val/loss"], rel=1e-5)


@pytest.mark.slow
def test_ddp_fit_takes_steps_although_the_first_segment_leaves_the_refresh_unused(root, tmp_path):
    """The rehearsal's 2-process fit of the paper's enwik8 LaMemo stopped at step 1: with the memory still empty
    the look-ahead refresh uses none of its parameters, and plain DDP refuses a step that leaves parameters
    without gradients. LaMemoLM asks for DDP's search for unused parameters (the official code's apex DDP
    tolerates them)."""
    import os
    import subprocess
    import sys

    args = ["fit", "-c", TINY, "--run.tracking", "none", "--trainer.accelerator", "cpu", "--trainer.devices", "2",
            "--trainer.strategy", "ddp", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1",
            "--trainer.val_check_interval", "3", "--run.record", str(tmp_path / "fit.json")]
    done = subprocess.run([sys.executable, "-m", "repro", *args], cwd=root, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    rec = json.loads((tmp_path / "fit.json").read_text())
    assert rec["provenance"]["devices"] == 2 and rec["provenance"]["steps"] == 3


# ------------------------------------------------------------------------------------------------------ configs
def test_paper_configs_match_the_base_models_in_size(root, monkeypatch):
    """The LaMemo paper trains Transformer-XL's base models with look-ahead memory: 151M (WikiText-103) and 41M
    (enwik8; text8 has a smaller vocabulary) parameters in the Transformer-XL paper. LaMemo adds one (H, E) bias."""
    from papers.transformer_xl.tables import PAPER_PARAMS as TXL_PARAMS
    from repro.cli.commands import describe_configs

    monkeypatch.chdir(root)
    for ds, txl_exp in [("wt103", "wt103_base"), ("enwik8", "enwik8_12l"), ("text8", "enwik8_12l")]:
        lam, txl = describe_configs([f"configs/lamemo/paper/{ds}_lamemo.yaml", f"configs/lamemo/paper/{ds}_txl.yaml"])
        assert lam["parameters"] - txl["parameters"] == (10 * 41 if ds == "wt103" else 8 * 64)
        assert abs(lam["parameters"] / TXL_PARAMS[txl_exp] - 1) < 0.01, lam
        assert lam["lamemo"] == {"look_ahead": True, "variant": "disentangled"}


@pytest.mark.parametrize("h, e", [(10, 41), (8, 64)])  # the WikiText-103 and enwik8/text8 paper shapes
def test_look_ahead_biases_start_xavier_uniform_and_u_v_normal_as_the_reference(h, e):
    """The reference draws u, v, v₊ (and u₊) Xavier-uniform in `_create_params`, then its `weights_init` redraws u
    and v only, as N(0, init_std) (train_ddp.py's `TransformerLM` branch): v₊ and u₊ keep U(±√(6/(H+E)))."""
    torch.manual_seed(0)
    cfg = TransformerXLConfig(n_layer=1, d_model=h * e, n_head=h, d_head=e, d_inner=16, n_token=V)
    m = LaMemo(cfg, LaMemoConfig(variant="disentangled_v2"))
    bound = math.sqrt(6 / (h + e))
    for p in (m.r_r_bias_future, m.r_w_bias_future):
        assert p.shape == (h, e) and p.abs().max() <= bound and p.abs().max() > 0.95 * bound
        assert abs(p.std().item() / (bound / math.sqrt(3)) - 1) < 0.15  # the uniform's standard deviation
    for p in (m.r_w_bias, m.r_r_bias):
        assert abs(p.std().item() / cfg.init_std - 1) < 0.15 and p.abs().max() < 6 * cfg.init_std


def test_parameters_stand_in_the_references_order():
    """The reference's model holds u, v and the look-ahead biases itself (`_create_params`), and PyTorch lists a
    module's own parameters before its submodules': u, v, v₊, u₊, then the embedding, the layers and the softmax.
    Gradient clipping sums the parameters' norms in this order, so that the order decides a run's last bits."""
    cfg = TransformerXLConfig(n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=16, n_token=V)
    names = [n for n, _ in LaMemo(cfg, LaMemoConfig(variant="disentangled_v2")).named_parameters()]
    assert names[:4] == ["r_w_bias", "r_r_bias", "mechanisms.0.r_r_bias_future", "mechanisms.0.r_w_bias_future"]
    backbone = [n for n, _ in TransformerXL(cfg).named_parameters()]
    assert names[4:] == backbone[2:] and backbone[:2] == ["r_w_bias", "r_r_bias"]


def test_tiny_configs_pair_lamemo_with_its_baseline(root, monkeypatch):
    from repro.cli.commands import describe_configs

    monkeypatch.chdir(root)
    for ds in ("char", "word"):
        lam, txl = describe_configs([f"configs/lamemo/tiny/{ds}_lamemo.yaml", f"configs/lamemo/tiny/{ds}_txl.yaml"])
        assert lam["model_class"] == "papers.lamemo.model.LaMemo"
        assert txl["model_class"] == "papers.transformer_xl.model.TransformerXL"
        assert lam["mem_len"] == txl["mem_len"] and lam["parameters"] - txl["parameters"] == 4 * 32
        for row in describe_configs([f"configs/lamemo/tiny/{ds}_lamemo.eval.yaml"]):
            assert row["eval"]["same_length"] and row["eval"]["mem_len"] > lam["mem_len"]


def test_only_the_paper_training_configs_roll_their_streams(root):
    """`--roll` (in every released training script) is set in the six paper training configs; the tiny and small
    configs keep the protocol they were registered with, without it (a row of papers/lamemo/deviations.yaml)."""
    import yaml

    configs = [p for p in sorted((root / "configs/lamemo").glob("*/*.yaml")) if p.name != "claims.yaml"
               and ".eval." not in p.name]
    assert sum(p.parent.name == "paper" for p in configs) == 6
    for path in configs:
        roll = yaml.safe_load(path.read_text())["data"]["init_args"].get("roll", False)
        assert roll == (path.parent.name == "paper"), path


# ------------------------------------------------------------------------------------------------- deviations
def test_every_deviation_names_a_test_that_exists(root):
    """Each row of papers/lamemo/deviations.yaml (the README's deviations table) is pinned by a test: its id names a
    file under tests/ and a test function defined at its top level; its effect is a measured number or says that
    it is not measured."""
    import ast

    import yaml

    from papers.lamemo.tables import DEVIATIONS

    rows = yaml.safe_load(DEVIATIONS.read_text())
    assert rows
    for row in rows:
        path, _, name = row["test"].partition("::")
        assert path.startswith("tests/") and (root / path).is_file(), f"{row['deviation']}: no file {path}"
        defined = {n.name for n in ast.parse((root / path).read_text()).body if isinstance(n, ast.FunctionDef)}
        assert name.startswith("test_") and name in defined, f"{row['deviation']}: {row['test']} does not exist"
        effect = row["effect"]
        assert effect.startswith("not measured") or any(c.isdigit() for c in effect), f"{row['deviation']}: {effect}"


def test_the_deviations_table_is_rendered_from_the_yaml(root):
    from papers.lamemo.tables import deviations_table

    table = deviations_table()
    assert (root / "results/lamemo/deviations.md").read_text() == table.markdown(), \
        "results/lamemo/deviations.md differs from papers/lamemo/deviations.yaml: run `repro tables lamemo`"


# ------------------------------------------------------------------------------------------------- utilisation
def test_attention_mass_by_distance_by_hand():
    from papers.lamemo.utilisation import mass_by_distance, memory_share

    # one memory key, two queries: query 0 sits at key 1 (sees keys 0, 1), query 1 at key 2 (sees keys 0, 1, 2)
    prob = torch.tensor([[[[0.25, 0.75, 0.0], [0.5, 0.3, 0.2]]]])
    sums, counts = mass_by_distance(prob)
    assert sums.tolist() == pytest.approx([0.75 + 0.2, 0.25 + 0.3, 0.5])  # distance 0, 1, 2
    assert counts.tolist() == [2, 2, 1]
    assert memory_share(prob) == pytest.approx((0.25 + 0.5) / 2)
