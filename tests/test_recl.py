"""RECL (Transformer-XL Appendix C) on hand-computed loss tables; per-token losses at a given context length
against naive recomputation; `repro recl` end to end."""

import json
import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from papers.transformer_xl.model import TransformerXLConfig
from papers.transformer_xl.module import TransformerXLLM
from repro.context import ContextModel, recl, relative_gain, token_losses
from repro.lm import MemorySettings

# Two models, four tokens, three context lengths (losses in nats).
TABLE = {
    "A": {10: np.array([1.0, 2.0, 3.0, 0.5]), 20: np.array([0.8, 2.0, 2.0, 0.5]), 30: np.array([0.8, 0.99, 2.0, 0.5])},
    "B": {10: np.array([1.5, 1.0, 3.5, 0.2]), 20: np.array([1.5, 1.0, 3.0, 0.2]), 30: np.array([1.5, 1.0, 3.0, 0.2])},
}


def test_relative_gain_by_hand():
    # c = 10: baseline b = min(A, B) = [1.0, 1.0, 3.0, 0.2]; r = 0.5 keeps the 2 hardest tokens: t = 2 (3.0) and
    # t = 0 (1.0, the first of the tie). f(10, 10) = (3.0 + 1.0) / 2 = 2.0.
    # A at 20: min(b, l) on {2, 0} = (2.0, 0.8) → f = 1.4; g = (e^2 − e^1.4) / e^2 = 1 − e^−0.6.
    # B at 20: (3.0, 1.0) → f = 2.0, no gain.
    g = relative_gain(TABLE, short=10, long=20, r=0.5)
    assert g["A"] == pytest.approx(1 - math.exp(-0.6)) and g["B"] == pytest.approx(0.0)
    # r = 1: all tokens, f(10, 10) = mean b = 1.3; A at 20: mean(0.8, 1.0, 2.0, 0.2) = 1.0 → 1 − e^−0.3
    assert relative_gain(TABLE, short=10, long=20, r=1.0)["A"] == pytest.approx(1 - math.exp(-0.3))
    # 20 → 30: b = [0.8, 1.0, 2.0, 0.2]; the 2 hardest are t = 2, 1; f(20, 20) = 1.5; A at 30: (2.0, 0.99) → 1.495
    g = relative_gain(TABLE, short=20, long=30, r=0.5)
    assert g["A"] == pytest.approx(1 - math.exp(-0.005))


def test_recl_by_hand():
    out = recl(TABLE, r=0.5, threshold=0.01)
    # A gains 45% from 10 to 20, then 0.5% (< 1%) from 20 to 30: RECL 20. B never gains: RECL 10.
    assert out["A"]["recl"] == 20 and not out["A"]["censored"]
    assert out["B"]["recl"] == 10 and not out["B"]["censored"]
    # a threshold below A's last gain: the gain never falls under it, the RECL is "at least 30"
    out = recl(TABLE, r=0.5, threshold=0.001)
    assert out["A"]["recl"] == 30 and out["A"]["censored"]
    # the baseline is shared: adding a model that is better at short range lowers everyone's gains
    strong = TABLE | {"C": {c: np.array([0.1, 0.1, 0.1, 0.1]) for c in (10, 20, 30)}}
    assert recl(strong, r=0.5)["A"]["recl"] == 10


def test_recl_refuses_misaligned_tables():
    bad = {"A": TABLE["A"], "B": {c: v[:3] for c, v in TABLE["B"].items()}}
    with pytest.raises(ValueError, match="same tokens"):
        recl(bad, r=0.5)
    with pytest.raises(ValueError, match="two context"):
        recl({"A": {10: TABLE["A"][10]}}, r=0.5)


def test_model_spec_parsing():
    m = ContextModel.parse("txl=a.yaml,a.eval.yaml@ck/x.ckpt:window")
    assert m == ContextModel("txl", ("a.yaml", "a.eval.yaml"), "ck/x.ckpt", "window")
    assert ContextModel.parse("n=a.yaml@x.ckpt").mode == "auto"
    with pytest.raises(ValueError, match="NAME="):
        ContextModel.parse("a.yaml")


def _module(attention="relative", mem_len=4):
    cfg = TransformerXLConfig(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, n_token=30, dropout=0.0,
                              dropatt=0.0, attention=attention)
    return TransformerXLLM(model=cfg, memory=MemorySettings(mem_len=mem_len), n_token=30).eval()


def test_window_losses_equal_naive_recomputation():
    module = _module("absolute", mem_len=0)
    tokens = torch.randint(0, 30, (2 * 13,))
    c = 5
    ours = token_losses(module, tokens, context=c, mode="window", batch_size=2, tgt_len=4, stride=1)
    streams = tokens.view(2, 13)
    ref = []
    with torch.no_grad():
        for b in range(2):
            for t in range(12):  # predict streams[b, t + 1] from the c tokens that end at t
                ctx = streams[b, max(0, t - c + 1) : t + 1][None]
                h, _ = module.model(ctx, None, mem_len=0)
                ref.append(module.model.nll(h[:, -1:], streams[b, t + 1].view(1, 1)).item())
    assert_close(torch.tensor(ours), torch.tensor(ref, dtype=torch.float64), rtol=1e-4, atol=1e-4)


def test_memory_losses_with_a_long_context_equal_one_full_pass():
    module = _module("relative", mem_len=4)
    tokens = torch.randint(0, 30, (2 * 17,))
    ours = token_losses(module, tokens, context=64, mode="memory", batch_size=2, tgt_len=5)
    streams = tokens.view(2, 17)
    with torch.no_grad():
        h, _ = module.model(streams[:, :-1], None, mem_len=0)
        ref = module.model.nll(h, streams[:, 1:]).reshape(-1).double()
    assert_close(torch.tensor(ours), ref, rtol=1e-4, atol=1e-4)
    # a short context differs (same_length: every query sees exactly 3 positions)
    short = token_losses(module, tokens, context=3, mode="memory", batch_size=2, tgt_len=5)
    assert not np.allclose(short, ours)


@pytest.mark.slow
def test_repro_recl_command(tmp_path, root, monkeypatch, capsys):
    from repro.cli import commands
    from repro.cli.cli import build

    monkeypatch.chdir(root)
    specs = []
    for name in ("wt103_base", "ablation_norec_relative"):
        cfg = f"configs/transformer_xl/tiny/{name}.yaml"
        module = build([cfg]).model
        ckpt = tmp_path / f"{name}.ckpt"
        torch.save({"state_dict": module.state_dict(), "repro": {"n_token": module.n_token}}, ckpt)
        specs += ["--model", f"{name}={cfg}@{ckpt}"]
    out = tmp_path / "recl.json"
    commands.main(["recl", *specs, "--contexts", "8,16,32", "--max-tokens", "400", "--threads", "1",
                   "--output", str(out), "--plot", str(tmp_path / "recl.png")])
    rec = json.loads(out.read_text())
    assert rec["models"]["wt103_base"]["mode"] == "memory"
    assert rec["models"]["ablation_norec_relative"]["mode"] == "window"
    assert set(rec["recl"]) == {"0.1", "0.5", "1.0"} and rec["tokens"] == 390  # 10 streams of 39 targets
    assert rec["recl"]["0.1"]["wt103_base"]["recl"] in (8, 16, 32)
    assert (tmp_path / "recl.png").stat().st_size > 0
    # the terminal: one line for people (the JSON went to the file)
    out_lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("repro recl:")]
    assert len(out_lines) == 1 and "RECL at r = 0.1 / 0.5 / 1.0: wt103_base " in out_lines[0], out_lines
    assert str(out) in out_lines[0] and "390 tokens" in out_lines[0]


def _family(name):
    """A small random model of each paper, through its own LightningModule."""
    from papers.infinity_former.module import InfinityFormerLM
    from papers.lamemo.module import LaMemoLM
    from papers.mgk.module import MGKLanguageModel

    base = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, n_token=30, dropout=0.0, dropatt=0.0)
    if name == "lamemo":
        return LaMemoLM(model=base, memory=MemorySettings(mem_len=4), n_token=30).eval(), "memory"
    if name == "infinity_former":
        return InfinityFormerLM(model=base, backbone="infinity_former", ltm={"n_basis": 8, "n_samples": 4},
                                memory=MemorySettings(mem_len=4), n_token=30).eval(), "memory"
    return MGKLanguageModel(model={**base, "attention": "absolute"}, mgk={"attention": "mgk", "n_components": 2},
                            n_token=30).eval(), "window"


@pytest.mark.parametrize("family", ["lamemo", "infinity_former", "mgk"])
def test_token_losses_work_for_every_paper_model(family):
    torch.manual_seed(0)
    module, mode = _family(family)
    with torch.no_grad():
        for p in module.parameters():  # away from the initialisation's near-uniform predictions
            p.add_(0.3 * torch.randn_like(p))
    tokens = torch.randint(0, 30, (2 * 17,))
    losses = {c: token_losses(module, tokens, context=c, mode=mode, batch_size=2, tgt_len=4, stride=1)
              for c in (2, 8)}
    assert all(v.shape == (2 * 16,) and np.isfinite(v).all() for v in losses.values())
    assert not np.allclose(losses[2], losses[8])  # the context offered changes the predictions
    streams = tokens.view(2, 17)
    if mode == "memory":  # the first segment has no memory: one plain forward pass of its 4 tokens
        with torch.no_grad():
            h, _ = module.model(streams[:, :4], None, mem_len=8)
            ref = module.model.nll(h, streams[:, 1:5]).double()
        assert_close(torch.tensor(losses[8]).view(2, 16)[:, :4], ref, rtol=1e-4, atol=1e-4)
    if family == "infinity_former":  # a short-term memory longer than the stream: nothing ever reaches the
        # long-term memory, so every token sees all before it, as in one pass over the whole stream
        full = token_losses(module, tokens, context=64, mode=mode, batch_size=2, tgt_len=4)
        with torch.no_grad():
            h, _ = module.model(streams[:, :-1], None, mem_len=0)
            ref = module.model.nll(h, streams[:, 1:]).reshape(-1).double()
        assert_close(torch.tensor(full), ref, rtol=1e-4, atol=1e-4)
    if mode == "window":  # a window model: each token from exactly the c tokens before it, recomputed naively
        ref = []
        with torch.no_grad():
            for b in range(2):
                for t in range(16):
                    ctx = streams[b, max(0, t - 8 + 1) : t + 1][None]
                    h, _ = module.model(ctx, None, mem_len=0)
                    ref.append(module.model.nll(h[:, -1:], streams[b, t + 1].view(1, 1)).item())
        assert_close(torch.tensor(losses[8]), torch.tensor(ref, dtype=torch.float64), rtol=1e-4, atol=1e-4)
