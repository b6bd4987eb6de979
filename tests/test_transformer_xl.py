"""Transformer-XL: segment recurrence, adaptive softmax, tying, initialisation and parameter counts; the warm-up and
the paper-scale ablation configs of its deviation table, and the table itself (every row names a test that exists)."""

import ast
import csv
import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.lm import OptimConfig
from repro.memory import empty_memory, update_memory
from repro.nn.adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=32, n_token=50, dropout=0.0, dropatt=0.0)


def test_two_segments_with_memory_equal_one_full_context_pass():
    model = TransformerXL(TransformerXLConfig(**SMALL)).eval()
    tokens = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        full, _ = model(tokens, None, mem_len=0)
        h1, mems = model(tokens[:, :6], None, mem_len=6)
        h2, _ = model(tokens[:, 6:], mems, mem_len=6)
    assert_close(h1, full[:, :6], rtol=1e-5, atol=1e-5)
    assert_close(h2, full[:, 6:], rtol=1e-5, atol=1e-5)


def test_three_segments_with_long_memory_equal_full_context():
    model = TransformerXL(TransformerXLConfig(**SMALL)).eval()
    tokens = torch.randint(0, 50, (1, 15))
    with torch.no_grad():
        full, _ = model(tokens, None, mem_len=0)
        mems, outs = None, []
        for s in range(3):
            h, mems = model(tokens[:, 5 * s : 5 * s + 5], mems, mem_len=100)
            outs.append(h)
    assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("same_length,clamp", [(False, -1), (True, 5)])
def test_key_value_memory_gives_the_same_outputs_as_hidden_state_memory(same_length, clamp):
    model = TransformerXL(TransformerXLConfig(**SMALL)).eval()
    tokens = torch.randint(0, 50, (2, 20))
    a = b = None
    with torch.no_grad():
        for s in range(5):
            seg = tokens[:, 4 * s : 4 * s + 4]
            ha, a = model(seg, a, mem_len=7, same_length=same_length, clamp_len=clamp)
            hb, b = model(seg, b, mem_len=7, same_length=same_length, clamp_len=clamp, kv_memory=True)
            assert_close(ha, hb, rtol=1e-5, atol=1e-5)
    assert b[0].shape == (2, 2, 2, 7, 8)  # (k|v, B, H, mem_len, E)
    with pytest.raises(ValueError, match="for evaluation"):
        model.train()(tokens[:, :4], None, mem_len=4, kv_memory=True)


def test_memory_is_truncated_detached_and_starts_empty():
    a = torch.randn(2, 3, 4, requires_grad=True)
    mem = update_memory(empty_memory(1, batch=2, d_model=4), [a * 2], mem_len=2)
    assert mem[0].shape == (2, 2, 4) and not mem[0].requires_grad
    assert_close(mem[0], (a * 2)[:, 1:].detach())
    mem = update_memory(mem, [torch.ones(2, 1, 4)], mem_len=2)
    assert_close(mem[0][:, 0], (a * 2)[:, 2].detach())
    assert update_memory(mem, [torch.ones(2, 1, 4)], mem_len=0)[0].shape == (2, 0, 4)


def test_first_segment_memory_is_empty_not_zeros():
    """An empty first memory must differ from a memory of zeros (which the keys would attend to)."""
    model = TransformerXL(TransformerXLConfig(**SMALL)).eval()
    tokens = torch.randint(0, 50, (1, 5))
    zeros = [torch.zeros(1, 4, 16) for _ in range(3)]
    with torch.no_grad():
        h_empty, _ = model(tokens, None, mem_len=4)
        h_zero, _ = model(tokens, zeros, mem_len=4)
    assert not torch.allclose(h_empty, h_zero)


def test_adaptive_softmax_without_cutoffs_equals_full_softmax():
    crit = ProjectedAdaptiveLogSoftmax(n_token=30, d_embed=8, d_proj=12)
    torch.nn.init.normal_(crit.out_proj_0)
    hidden, target = torch.randn(7, 12), torch.randint(0, 30, (7,))
    logits = (hidden @ crit.out_proj_0) @ crit.out_layers[0].weight.T + crit.out_layers[0].bias
    expect = -torch.log_softmax(logits, -1).gather(1, target[:, None]).squeeze(1)
    assert_close(crit(hidden, target), expect)


@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_softmax_with_cutoffs_normalises_and_scores_targets(div_val):
    crit = ProjectedAdaptiveLogSoftmax(n_token=40, d_embed=8, d_proj=8, cutoffs=(10, 25), div_val=div_val)
    for p in crit.parameters():
        torch.nn.init.normal_(p, 0, 0.5)
    hidden = torch.randn(64, 8)
    logp = crit.log_prob(hidden)
    assert_close(torch.logsumexp(logp, -1), torch.zeros(64), atol=1e-5, rtol=0)
    target = torch.arange(64) % 40  # every cluster
    assert_close(crit(hidden, target), -logp.gather(1, target[:, None]).squeeze(1), atol=1e-5, rtol=1e-5)


def test_adaptive_softmax_by_hand():
    """Two-level factorisation written out: p(w) = p_head(cluster) · p_cluster(w)."""
    crit = ProjectedAdaptiveLogSoftmax(n_token=6, d_embed=4, d_proj=4, cutoffs=(3,), div_val=1)
    for p in crit.parameters():
        torch.nn.init.normal_(p)
    h = torch.randn(1, 4)
    w, b = crit.out_layers[0].weight, crit.out_layers[0].bias
    head = torch.cat([h @ w[:3].T + b[:3], h @ crit.cluster_weight.T + crit.cluster_bias], -1).log_softmax(-1)
    tail = (h @ w[3:].T + b[3:]).log_softmax(-1)
    expect = torch.cat([head[:, :3], head[:, 3:4] + tail], -1)
    assert_close(crit.log_prob(h), expect)


def test_adaptive_embedding_scales_and_projects():
    emb = AdaptiveEmbedding(n_token=20, d_embed=8, d_proj=6, cutoffs=(5, 12), div_val=2)
    for p in emb.parameters():
        torch.nn.init.normal_(p)
    tok = torch.tensor([[0, 7, 19]])
    out = emb(tok)
    expect = torch.stack([
        emb.emb_projs[0] @ emb.emb_layers[0].weight[0],
        emb.emb_projs[1] @ emb.emb_layers[1].weight[7 - 5],
        emb.emb_projs[2] @ emb.emb_layers[2].weight[19 - 12],
    ]) * math.sqrt(6)
    assert_close(out[0], expect)


def test_tying_shares_embedding_and_projection_tensors():
    cfg = TransformerXLConfig(**{**SMALL, "n_token": 40}, cutoffs=(10, 20), div_val=2, tie_projs=(False, True, True))
    model = TransformerXL(cfg)
    for out, emb in zip(model.crit.out_layers, model.word_emb.emb_layers):
        assert out.weight is emb.weight
    assert model.crit.out_projs[0] is not model.word_emb.emb_projs[0]
    assert model.crit.out_projs[1] is model.word_emb.emb_projs[1]
    assert model.crit.out_projs[2] is model.word_emb.emb_projs[2]


def test_official_initialisation_statistics():
    torch.manual_seed(0)
    cfg = TransformerXLConfig(n_layer=2, d_model=256, n_head=4, d_head=64, d_inner=1024, n_token=3000,
                              cutoffs=(1000,), div_val=2)
    model = TransformerXL(cfg)
    qkv = model.layers[0].attn.qkv_net.weight
    assert abs(qkv.std().item() - 0.02) < 0.001 and abs(qkv.mean().item()) < 0.001
    assert abs(model.word_emb.emb_projs[0].std().item() - 0.01) < 0.0005
    ln = model.layers[0].attn_norm.weight
    assert abs(ln.mean().item() - 1.0) < 0.01 and abs(ln.std().item() - 0.02) < 0.005
    assert model.layers[0].ff.net[0].bias.abs().max() == 0
    assert abs(model.r_w_bias.std().item() - 0.02) < 0.005


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_attention_output_dropout_can_be_off_as_in_the_infinity_former_sorting_code(pre_lnorm):
    """`attn_out_dropout: false` (the ∞-former's sorting attention: o_net(vec) added to the residual undropped):
    in training, a layer equals the residual of the undropped attention with only the feed-forward's dropout drawn
    (same seed); with the default (the reference Transformer-XL's `self.drop(attn_out)`) it does not."""
    def run(attn_out_dropout):
        torch.manual_seed(0)
        cfg = TransformerXLConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, n_token=11, dropout=0.5,
                                  pre_lnorm=pre_lnorm, attn_out_dropout=attn_out_dropout)
        layer = TransformerXL(cfg).layers[0].train()
        h = torch.randn(2, 5, 16)
        mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
        pos = (torch.randn(5, 16), torch.randn(2, 8), torch.randn(2, 8))
        torch.manual_seed(1)
        out, _ = layer(h, mem_BMD=None, mask_TK=mask, pos=pos)
        torch.manual_seed(1)
        if pre_lnorm:
            a, _ = layer.attn(layer.attn_norm(h), mem_BMD=None, mask_TK=mask, pos=pos)
            mid = h + a
            expect = mid + layer.ff(layer.ff_norm(mid))
        else:
            a, _ = layer.attn(h, mem_BMD=None, mask_TK=mask, pos=pos)
            mid = layer.attn_norm(h + a)
            expect = layer.ff_norm(mid + layer.ff(mid))
        return out, expect

    out, expect = run(False)
    assert_close(out, expect)
    out, expect = run(True)
    assert (out - expect).abs().max() > 1e-2  # far beyond assert_close's tolerance


def test_warm_up_rises_from_the_first_update():
    """Update s (from 0) runs at lr·(s+1)/warmup, then the cosine over max_steps: the first update is the smallest.
    train.py's first update runs at the full rate and update s (from 1) at lr·s/warmup (the deviation table)."""
    optim = OptimConfig(lr=1.0, warmup_steps=4, schedule="cosine")
    assert [optim.factor(s, 100) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert optim.factor(4, 100) == pytest.approx(0.5 * (1 + math.cos(math.pi * 4 / 100)))
    assert OptimConfig(lr=1.0, warmup_steps=0).factor(0, 100) == 1.0  # no warm-up: the full rate from the start


def test_paper_ablations_are_the_standard_model_less_one_component():
    """Table 6 at paper scale: each ablation config is `wt103_base` (151M) with only its component removed — the
    memory, then also the relative positions, then also the memory protocol at evaluation (sliding windows)."""
    from tests.parity.common import parsed_config

    def differences(name):
        base = parsed_config("configs/transformer_xl/paper/wt103_base.yaml")
        other = parsed_config(f"configs/transformer_xl/paper/{name}.yaml")
        return {k: (base.get(k), other.get(k)) for k in base.keys() | other.keys()
                if k not in ("config", "run.experiment") and base.get(k) != other.get(k)}

    no_memory = {"model.memory.mem_len": (150, 0), "model.eval_memory.mem_len": (150, 0)}
    assert differences("ablation_norec_relative") == no_memory
    absolute = no_memory | {"model.attention": ("relative", "absolute")}
    assert differences("ablation_norec_absolute") == absolute
    assert differences("ablation_vanilla") == absolute | {"model.eval_protocol.kind": ("memory", "sliding"),
                                                         "model.eval_protocol.window": (0, 150)}


def _test_functions(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_deviation_names_an_existing_test():
    from papers.transformer_xl.tables import load_deviations

    entries = load_deviations()
    assert len(entries) >= 20
    for entry in entries:
        path, sep, name = entry["test"].partition("::")
        assert sep and path.startswith("tests/") and (ROOT / path).is_file(), f"{entry['deviation']}: {entry['test']}"
        assert name in _test_functions(ROOT / path), f"{entry['deviation']}: {entry['test']} is no test function"


def test_the_committed_deviation_table_is_current(monkeypatch):
    """results/transformer_xl/deviations.md is what deviations.yaml gives (with the committed parameter counts):
    run `repro tables transformer_xl` after editing the file."""
    from papers.transformer_xl.tables import deviations_table

    monkeypatch.chdir(ROOT)
    rows = csv.DictReader(Path("results/transformer_xl/params.csv").read_text().splitlines())
    params = {r["experiment"]: r for r in rows}
    table = deviations_table(params)
    assert Path("results/transformer_xl/deviations.md").read_text() == table.markdown()
    assert "{params:" not in table.markdown()
