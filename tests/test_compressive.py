"""The compressive transformer baseline (Rae et al. 2019) against hand computations and naive references."""

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.testing import assert_close

from papers.infinity_former.compressive import (
    Compression,
    CompressiveConfig,
    CompressiveTransformer,
    split_overflow,
)
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.data.lm import LMSegments
from repro.lm import SegmentLM

SMALL = dict(n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=16, n_token=11, dropout=0.0, dropatt=0.0)


def _segments(tokens, t):
    return [tokens[:, s : s + t] for s in range(0, tokens.shape[1], t)]


# ------------------------------------------------------------------------------------------ Transformer-XL equality
def test_without_compressed_memory_it_is_transformer_xl_weight_for_weight():
    cfg = TransformerXLConfig(**{**SMALL, "dropout": 0.2, "dropatt": 0.1})
    torch.manual_seed(3)
    txl = TransformerXL(cfg)
    torch.manual_seed(3)
    ours = CompressiveTransformer(cfg, CompressiveConfig(cmem_len=0))
    a, b = txl.state_dict(), ours.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    tokens = torch.randint(0, 11, (2, 18))
    mt = mc = None
    for seg in _segments(tokens, 6):  # training mode: the dropout draws must match too
        torch.manual_seed(11)
        ht, mt = txl(seg, mt, mem_len=5)
        torch.manual_seed(11)
        hc, mc = ours(seg, mc, mem_len=5)
        assert_close(hc, ht, rtol=0, atol=0)
        assert len(mc) == 4
        for x, y in zip(mc[:2], mt):
            assert torch.equal(x, y)
        assert all(x.shape == (2, 0, 8) for x in mc[2:])
        assert ours.aux_losses() == {}
    assert_close(ours.nll(hc, seg), txl.nll(ht, seg))


def test_identity_compression_equals_transformer_xl_with_the_summed_memory():
    """c = 1 with mean pooling moves evicted states unchanged: [cmem; mem] is then Transformer-XL's memory of
    mem_len + cmem_len states, which checks the attention over the concatenation and its relative positions."""
    cfg = TransformerXLConfig(**SMALL)
    torch.manual_seed(0)
    txl = TransformerXL(cfg).eval()
    ours = CompressiveTransformer(cfg, CompressiveConfig(rate=1, cmem_len=4, compression="mean_pool")).eval()
    ours.load_state_dict(txl.state_dict())
    tokens = torch.randint(0, 11, (2, 25))
    for same_length, clamp in [(False, -1), (True, 6)]:
        mt = mc = None
        with torch.no_grad():
            for seg in _segments(tokens, 5):
                ht, mt = txl(seg, mt, mem_len=7, same_length=same_length, clamp_len=clamp)
                hc, mc = ours(seg, mc, mem_len=3, same_length=same_length, clamp_len=clamp)
                assert_close(hc, ht, rtol=1e-5, atol=1e-5)
                for i in range(2):
                    assert_close(torch.cat([mc[2 + i], mc[i]], 1), mt[i])
    assert mc[2].shape[1] == 4 and mc[0].shape[1] == 3


# ------------------------------------------------------------------------------------------------- compression
def test_conv_compression_matches_a_hand_computation():
    f = Compression(d_model=2, rate=3, kind="conv")
    with torch.no_grad():
        # weight[out, in, k]
        f.conv.weight.copy_(torch.tensor([[[1.0, 0.0, -1.0], [0.5, 0.5, 0.5]],
                                          [[0.0, 2.0, 0.0], [1.0, -1.0, 1.0]]]))
        f.conv.bias.copy_(torch.tensor([0.25, -1.0]))
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [9.0, 10.0], [11.0, 12.0]]])  # (1, 6, 2)
    # group 1: states (1,2), (3,4), (5,6)
    #   out0 = 0.25 + (1·1 + 0·3 − 1·5) + 0.5·(2 + 4 + 6) = 0.25 − 4 + 6 = 2.25
    #   out1 = −1 + (2·3) + (2 − 4 + 6) = −1 + 6 + 4 = 9
    # group 2: states (7,8), (9,10), (11,12)
    #   out0 = 0.25 + (7 − 11) + 0.5·(8 + 10 + 12) = 0.25 − 4 + 15 = 11.25
    #   out1 = −1 + 2·9 + (8 − 10 + 12) = −1 + 18 + 10 = 27
    assert_close(f(x), torch.tensor([[[2.25, 9.0], [11.25, 27.0]]]))
    with pytest.raises(ValueError, match="whole groups"):
        f(x[:, :5])


def test_pooling_compressions_by_hand():
    x = torch.tensor([[[1.0, -2.0], [4.0, 0.0], [-3.0, 5.0], [2.0, 2.0]]])  # (1, 4, 2), c = 2
    assert_close(Compression(d_model=2, rate=2, kind="max_pool")(x), torch.tensor([[[4.0, 0.0], [2.0, 5.0]]]))
    assert_close(Compression(d_model=2, rate=2, kind="mean_pool")(x), torch.tensor([[[2.5, -1.0], [-0.5, 3.5]]]))


def test_eviction_takes_whole_groups_and_keeps_the_remainder():
    short = torch.arange(6.0).view(1, 6, 1)
    new = torch.arange(6.0, 10.0).view(1, 4, 1)
    kept, old = split_overflow(short, new, mem_len=5, rate=2)  # overflow 5 → evict 4, keep 6
    assert old.flatten().tolist() == [0, 1, 2, 3] and kept.flatten().tolist() == [4, 5, 6, 7, 8, 9]
    kept, old = split_overflow(short[:, :2], new, mem_len=5, rate=2)  # no overflow
    assert old.shape[1] == 0 and kept.flatten().tolist() == [0, 1, 6, 7, 8, 9]


# ----------------------------------------------------------------------------------------- memory bookkeeping
def _naive_compress(kind, f, group_cD):
    if kind == "max_pool":
        return group_cD.max(0).values
    if kind == "mean_pool":
        return group_cD.mean(0)
    w, bias = f.conv.weight, f.conv.bias  # (D_out, D_in, c)
    return bias + sum(w[:, :, j] @ group_cD[j] for j in range(group_cD.shape[0]))


@pytest.mark.parametrize("kind,mem_len,c", [("conv", 7, 3), ("max_pool", 7, 3), ("mean_pool", 7, 3), ("conv", 2, 2)])
def test_compressed_memory_holds_the_compressions_of_the_evicted_states_in_order(kind, mem_len, c):
    """T = 5, mem_len = 7, c = 3: overflows of 3, 5, 7, … are not all multiples of c (the partial case);
    mem_len = 2 < T: part of the current segment is evicted at once."""
    t, cmem_len = 5, 4
    model = CompressiveTransformer(TransformerXLConfig(**SMALL),
                                   CompressiveConfig(rate=c, cmem_len=cmem_len, compression=kind)).eval()
    seen = {i: [] for i in range(2)}  # each layer's inputs and the memory handed to it
    handed = {i: [] for i in range(2)}
    for i, layer in enumerate(model.layers):
        def hook(mod, args, kwargs, i=i):
            seen[i].append(args[0].detach().clone())
            handed[i].append(kwargs["mem_BMD"].detach().clone())
        layer.register_forward_pre_hook(hook, with_kwargs=True)
    tokens = torch.randint(0, 11, (2, 40))
    mems = None
    with torch.no_grad():
        for seg in _segments(tokens, t):
            prev = mems
            _, mems = model(seg, mems, mem_len=mem_len)
            for i in range(2):
                stream = torch.cat(seen[i], 1)  # (B, N, D): all inputs of layer i so far
                n = stream.shape[1]
                evicted = c * max(0, (n - mem_len) // c)
                assert_close(mems[i], stream[:, evicted:], rtol=0, atol=0)
                assert mems[i].shape[1] <= mem_len + c - 1
                f = model.compressors[i]
                slots = [torch.stack([_naive_compress(kind, f, stream[bb, g * c : (g + 1) * c])
                                      for bb in range(2)]) for g in range(evicted // c)]
                want = torch.stack(slots[-cmem_len:], 1) if slots else stream[:, :0]
                assert_close(mems[2 + i], want, rtol=1e-5, atol=1e-6)
                # the layer attended over [compressed memory; memory] of the previous step
                if prev is not None:
                    assert_close(handed[i][-1], torch.cat([prev[2 + i], prev[i]], 1), rtol=0, atol=0)
    assert mems[2].shape[1] == cmem_len  # 40 tokens: the compressed memory has filled and is FIFO-truncated


# ------------------------------------------------------------------------------------------ reconstruction loss
def _naive_recon(model, i, h, old):
    """Σ over heads/queries/channels of (attn(h, old) − attn(h, f(old)))² / count, with loops over heads."""
    att = model.layers[i].attn
    w = att.qkv_net.weight
    he = att.n_head * att.d_head
    wq, wk, wv = w[:he], w[he : 2 * he], w[2 * he :]
    new = model.compressors[i](old)
    if model.cfg.pre_lnorm:  # the layer sees LayerNorm-ed queries and memories
        h, old, new = (model.layers[i].attn_norm(x) for x in (h, old, new))
    diffs = []
    for hd in range(att.n_head):
        sl = slice(hd * att.d_head, (hd + 1) * att.d_head)
        q = h @ wq[sl].T
        outs = []
        for m in (old, new):
            p = torch.softmax(q @ (m @ wk[sl].T).transpose(1, 2) / math.sqrt(att.d_head), -1)
            outs.append(p @ (m @ wv[sl].T))
        diffs.append(outs[1] - outs[0])
    return torch.stack(diffs).pow(2).mean()


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_reconstruction_loss_matches_the_formula_and_trains_only_the_compression(pre_lnorm):
    cfg = TransformerXLConfig(**SMALL, pre_lnorm=pre_lnorm)
    model = CompressiveTransformer(cfg, CompressiveConfig(rate=2, cmem_len=3, recon_weight=0.5)).train()
    tokens = torch.randint(0, 11, (2, 12))
    s1, s2 = tokens[:, :6], tokens[:, 6:]
    h1, mems = model(s1, None, mem_len=6)
    assert set(model.aux_losses()) == {"attn_recon"}  # nothing evicted yet: a zero touching the conv weights
    assert model.aux_losses()["attn_recon"].item() == 0.0
    inputs = []
    hooks = [layer.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach())) for layer in model.layers]
    h2, _ = model(s2, mems, mem_len=6)
    for hk in hooks:
        hk.remove()
    aux = model.aux_losses()["attn_recon"]
    with torch.no_grad():
        want = 0.5 * sum(_naive_recon(model, i, inputs[i], mems[i]) for i in range(2))
    assert_close(aux, want, rtol=1e-5, atol=1e-7)
    assert aux.item() > 0

    model.zero_grad()
    aux.backward(retain_graph=True)
    comp_names = {n for n, _ in model.named_parameters() if ".compressors." in n}
    for name, p in model.named_parameters():
        if name in comp_names:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None or not p.grad.any(), name
    # and the task loss never reaches the compression network (the compressed memory is detached)
    model.zero_grad()
    model.nll(h2, s2).mean().backward()
    for name, p in model.named_parameters():
        if name in comp_names:
            assert p.grad is None or not p.grad.any(), name


def test_no_auxiliary_loss_without_gradients_or_trainable_compression():
    cfg = TransformerXLConfig(**SMALL)
    model = CompressiveTransformer(cfg, CompressiveConfig(rate=2, cmem_len=3))
    tokens = torch.randint(0, 11, (1, 12))
    with torch.no_grad():
        _, mems = model(tokens[:, :6], None, mem_len=4)
        model(tokens[:, 6:], mems, mem_len=4)
    assert model.aux_losses() == {}
    pooled = CompressiveTransformer(cfg, CompressiveConfig(rate=2, cmem_len=3, compression="max_pool"))
    _, mems = pooled(tokens[:, :6], None, mem_len=4)
    pooled(tokens[:, 6:], mems, mem_len=4)
    assert pooled.aux_losses() == {}


# ---------------------------------------------------------------------------------------------------- causality
def test_perturbing_a_future_token_changes_no_earlier_output():
    model = CompressiveTransformer(TransformerXLConfig(**SMALL), CompressiveConfig(rate=2, cmem_len=3)).eval()
    tokens = torch.randint(0, 11, (2, 30))
    changed = tokens.clone()
    changed[:, 17] = (tokens[:, 17] + 1) % 11

    def run(tok):
        mems, outs = None, []
        with torch.no_grad():
            for seg in _segments(tok, 5):
                h, mems = model(seg, mems, mem_len=4)
                outs.append(h)
        return torch.cat(outs, 1)

    a, b = run(tokens), run(changed)
    assert_close(a[:, :17], b[:, :17], rtol=0, atol=0)
    assert not torch.allclose(a[:, 17], b[:, 17])
    assert not torch.allclose(a[:, 25:], b[:, 25:])  # and it travels on through the (compressed) memory


# -------------------------------------------------------------------------------------------------------- errors
def test_bad_inputs_are_refused_with_a_reason():
    cfg = TransformerXLConfig(**SMALL)
    model = CompressiveTransformer(cfg, CompressiveConfig(cmem_len=2)).eval()
    tokens = torch.randint(0, 11, (1, 4))
    assert model.supports_memory and not model.supports_kv_memory
    with torch.no_grad(), pytest.raises(ValueError, match="kv_memory=False"):
        model(tokens, None, mem_len=4, kv_memory=True)
    with torch.no_grad(), pytest.raises(ValueError, match="expects 4 = 2 \\+ 2 × 1 tensors"):
        model(tokens, [torch.zeros(1, 0, 8)] * 2, mem_len=4)
    with pytest.raises(ValueError, match="relative"):
        CompressiveTransformer(TransformerXLConfig(**SMALL, attention="absolute"), CompressiveConfig())
    for bad, msg in [({"rate": 0}, "rate"), ({"cmem_len": -1}, "cmem_len"), ({"compression": "lstm"}, "conv"),
                     ({"recon_weight": -1.0}, "recon_weight")]:
        with pytest.raises(ValueError, match=msg):
            CompressiveConfig(**bad)


# -------------------------------------------------------------------------------------------- through SegmentLM
class _CompressiveLM(SegmentLM):
    def __init__(self, cfg, comp, **kw):
        self.cfg, self.comp = cfg, comp
        super().__init__(n_token=cfg.n_token, eval_memory=None, eval_protocol={}, **kw)

    def build_model(self):
        return CompressiveTransformer(self.cfg, self.comp)

    def extra_loss(self):
        return self.model.aux_losses()


class _Totals(Callback):
    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        nll = trainer.callback_metrics["train/loss"]
        aux = trainer.callback_metrics.get("train/attn_recon")
        self.steps.append((float(outputs["loss"]), float(nll), None if aux is None else float(aux)))


def test_training_steps_through_segment_lm_add_the_reconstruction_loss_and_keep_the_memory(tmp_path):
    L.seed_everything(1)
    cfg = TransformerXLConfig(**{**SMALL, "dropout": 0.1})
    module = _CompressiveLM(cfg, CompressiveConfig(rate=2, cmem_len=4, recon_weight=10.0),
                            memory={"mem_len": 6}, optim={"lr": 1e-2, "schedule": "constant"})
    conv0 = module.model.compressors[0].conv.weight.detach().clone()
    stream = torch.randint(0, 11, (4 * 60 + 1,))
    data = LMSegments(stream, batch_size=4, tgt_len=6)
    totals = _Totals()
    trainer = L.Trainer(max_steps=6, logger=False, callbacks=[totals], enable_progress_bar=False,
                        enable_checkpointing=False, limit_val_batches=0, use_distributed_sampler=False,
                        enable_model_summary=False, accelerator="cpu", gradient_clip_val=0.25)
    trainer.fit(module, train_dataloaders=data)
    assert len(totals.steps) == 6
    total, nll, aux = totals.steps[-1]
    assert aux is not None and aux > 0 and total == pytest.approx(nll + aux, rel=1e-5)
    # only the reconstruction loss reaches the conv: it moved, so the auxiliary term was in the optimised loss
    assert not torch.equal(module.model.compressors[0].conv.weight.detach(), conv0)
    mems = module._mems["train"]
    assert len(mems) == 4 and mems[0].shape == (4, 6, 8) and mems[2].shape == (4, 4, 8)

    # the memory (short and compressed) goes through a checkpoint and back
    ckpt = {}
    module.on_save_checkpoint(ckpt)
    fresh = _CompressiveLM(cfg, CompressiveConfig(rate=2, cmem_len=4), memory={"mem_len": 6},
                           optim={"schedule": "constant"})
    fresh.on_load_checkpoint(ckpt)
    for x, y in zip(fresh._mems["train"], mems):
        assert torch.equal(x, y)
