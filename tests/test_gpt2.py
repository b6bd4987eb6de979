"""GPT-2 with the memory hook: plain GPT-2 is `transformers`' GPT-2 exactly, the hook adds the memory's output where
the official code does (after c_proj, before the residual), reads the right queries and block inputs, carries the
memory across blocks; the ∞-former LTM behind the hook; fine-tuning, dialogue generation and resumption through
Lightning."""

import json
import math

import lightning as L
import pytest
import torch
from torch.testing import assert_close

from papers.infinity_former.adapters import build_layer_memory
from papers.infinity_former.gpt2 import GPT2MemoryLM, GPT2Settings, GPT2WithMemory
from papers.infinity_former.hooks import LayerMemory, MemoryHook
from repro.text import cmudog, dialogue_tiny
from repro.text import dialogue as D
from repro.text.tokenizer import TextTokenizer, TokenizerSpec, train_bpe

SMALL = GPT2Settings(n_layer=2, n_embd=32, n_head=2, n_positions=32, dropout=0.0)
V = 64


def _model(kind="none", **args):
    torch.manual_seed(0)
    return GPT2WithMemory(SMALL, MemoryHook(kind=kind, args=args), V).eval()


def test_plain_gpt2_is_transformers_gpt2():
    m = _model()
    x = torch.randint(0, V, (2, 20))
    types = torch.randint(0, V, (2, 20))
    h, mems = m(x, None, types=types)
    assert mems is None and not m.supports_memory
    assert_close(m.logits(h), m.lm(input_ids=x, token_type_ids=types).logits)
    nll = m.nll(h, x)
    ref = torch.nn.functional.cross_entropy(m.logits(h).reshape(-1, V), x.reshape(-1), reduction="none")
    assert_close(nll, ref.view(2, 20))
    tgt = x.clone()
    tgt[:, :5] = -100
    assert (m.nll(h, tgt)[:, :5] == 0).all()


class ConstantMemory(LayerMemory):
    """Adds a fixed vector c (after one update), records what it was given."""

    def __init__(self, d):
        super().__init__()
        self.c = torch.nn.Parameter(torch.randn(d))
        self.seen_x, self.seen_q = [], []

    def empty(self, batch, like):
        return {"n": torch.zeros(batch, dtype=torch.long, device=like.device)}

    def write(self, state, x):
        self.seen_x.append(x)
        return {"n": state["n"] + x.shape[1]}

    def read(self, q, state):
        self.seen_q.append(q)
        return None if int(state["n"][0]) == 0 else self.c.expand(q.shape[0], q.shape[2], -1)


def test_hook_adds_after_c_proj_before_the_residual_and_sees_queries_and_block_inputs(monkeypatch):
    import papers.infinity_former.gpt2 as G

    mems_made = {}

    def factory(hook, d_model, n_head, layer):
        mems_made[layer] = ConstantMemory(d_model)
        return mems_made[layer]

    monkeypatch.setattr(G, "build_layer_memory", factory)
    torch.manual_seed(0)
    m = GPT2WithMemory(SMALL, MemoryHook(kind="window", layers=(1,)), V).eval()
    assert m.layers == (1,) and list(mems_made) == [1]
    mem = mems_made[1]
    x1, x2 = torch.randint(0, V, (2, 12)), torch.randint(0, V, (2, 12))
    h1, mems = m(x1, None)
    # first block: empty memory, plain GPT-2
    assert_close(m.logits(h1), m.lm(input_ids=x1).logits)
    h2, mems = m(x2, mems)
    # the memory absorbed the input of block 1 of the previous block (before ln_1), as the official Block.mem
    ref1 = m.lm(input_ids=x1, output_hidden_states=True).hidden_states
    assert_close(mem.seen_x[0], ref1[1])
    # reference: GPT-2 run by hand with c added to layer 1's attention output
    tr = m.lm.transformer
    pos = torch.arange(12)
    h = tr.wte(x2) + tr.wpe(pos)
    for i, block in enumerate(tr.h):
        inner = block.attn.inner if i == 1 else block.attn
        a_in = block.ln_1(h)
        a = inner(a_in)[0]
        if i == 1:
            q = inner.c_attn(a_in)[..., :32].view(2, 12, 2, 16).transpose(1, 2)
            assert_close(mem.seen_q[-1], q)  # GPT-2's own queries, split into heads
            a = a + mem.c
        h = h + a
        h = h + block.mlp(block.ln_2(h))
    assert_close(h2, tr.ln_f(h))
    assert all(not t.requires_grad for t in mems)  # carried memory is detached


def test_the_memory_output_gets_its_own_dropout_mask(monkeypatch):
    """The official attention drops out c_proj(a) + Z with one mask; here `transformers`' attention, unmodified,
    drops out c_proj(a) inside, and the memory's Z gets its own call of the same residual dropout (README,
    deviations)."""
    import papers.infinity_former.gpt2 as G

    monkeypatch.setattr(G, "build_layer_memory", lambda hook, d_model, n_head, layer: ConstantMemory(d_model))
    torch.manual_seed(0)
    m = GPT2WithMemory(SMALL, MemoryHook(kind="window", layers=(1,)), V).eval()
    attn = m.lm.transformer.h[1].attn
    seen = []

    class Record(torch.nn.Module):
        def forward(self, x):
            seen.append(x.detach().clone())
            return x

    attn.inner.resid_dropout = Record()
    x1, x2 = torch.randint(0, V, (2, 12)), torch.randint(0, V, (2, 12))
    _, mems = m(x1, None)
    assert len(seen) == 1  # an empty memory: GPT-2's own dropout of c_proj(a) only
    seen.clear()
    m(x2, mems)
    assert len(seen) == 2  # c_proj(a) inside transformers, then Z alone
    assert_close(seen[1], attn.memory.c.detach().expand_as(seen[1]))


def test_window_memory_carries_information_across_blocks():
    m = _model("window", mem_len=16)
    x1, x1b, x2 = (torch.randint(0, V, (1, 12)) for _ in range(3))
    _, mems = m(x1, None)
    _, mems_b = m(x1b, None)
    base, _ = m(x2, mems)
    # output projection starts at zero: a pretrained model is unchanged by the new memory
    assert_close(base, m(x2, None)[0])
    for mem in m.memories.values():
        torch.nn.init.normal_(mem.out.weight, std=0.5)
    a, _ = m(x2, mems)
    b, _ = m(x2, mems_b)
    assert (a - b).abs().max() > 1e-3  # block 2 now depends on what block 1 said
    plain = _model("none")
    pa, _ = plain(x2, None)
    assert_close(pa, plain(x2, None)[0])
    # gradient reaches the memory's parameters
    m.train()
    h, _ = m(x2, mems)
    h.pow(2).mean().backward()
    assert all(mm.kv.weight.grad is not None and mm.kv.weight.grad.abs().sum() > 0 for mm in m.memories.values())


LTM_ARGS = {"ltm": {"n_basis": 16, "widths": [0.05, 0.1], "n_samples": 16, "sampling": "sticky", "n_bins": 8,
                    "kl_weight": 1e-3}, "threshold": 40}


def test_ltm_behind_the_hook_threshold_sticky_state_and_gradients():
    m = _model("ltm", **LTM_ARGS)
    m.train()
    x = torch.randint(0, V, (2, 16))
    mems, counts = None, []
    for _ in range(5):
        h, mems = m(x, mems)
        counts.append(mems[2].tolist())
    # 16 tokens per block; at ≥ 40 absorbed tokens the memory is emptied before the next update (official threshold)
    assert counts == [[0, 0], [16, 16], [32, 32], [48, 48], [16, 16]]
    coef, hist = mems[0], mems[1]
    assert coef.shape == (2, 16, 32) and hist.shape == (2, 8)  # N basis coefficients; sticky histogram of K bins
    assert (hist >= 0).all() and (hist.sum(-1) > 0).all()  # attention mass per bin (the next update's sampler)
    loss = m.nll(h, x).mean() + m.aux_losses()["ltm_kl"]
    loss.backward()
    ltm = m.memories["0"].ltm
    assert ltm.gate.weight.grad.abs().sum() > 0 and ltm.mu_net.weight.grad.abs().sum() > 0
    assert float(m.aux_losses()["ltm_kl"].detach()) > 0  # λ_KL · KL
    # generation absorbs the pending block once and reuses the memory: the same outputs
    m.eval()
    with torch.no_grad():
        torch.manual_seed(1)  # sticky sample points are random: the same draws for both
        absorbed = m(x, m.absorb(mems))[0]
        torch.manual_seed(1)
        assert_close(absorbed, m(x, mems)[0])


def test_pretrained_weights_are_copied_in_with_new_token_rows_and_memories(tmp_path, capfd):
    """The paper path (`pretrained: gpt2`) with a checkpoint saved here: same logits on the base vocabulary; the
    library's "Loading weights" progress bar stays off the terminal."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    src = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                     bos_token_id=None, eos_token_id=None)).eval()
    src.save_pretrained(tmp_path / "ckpt")
    settings = GPT2Settings(pretrained=str(tmp_path / "ckpt"), dropout=0.0)
    m = GPT2WithMemory(settings, MemoryHook(kind="window", layers=(1,), args={"mem_len": 8}), V + 6).eval()
    capfd.readouterr()
    m.load_pretrained()
    assert "Loading weights" not in capfd.readouterr().err
    x = torch.randint(0, V, (1, 12))
    h, mems = m(x, None)
    assert_close(m.logits(h)[..., :V], src(input_ids=x).logits)
    h2, _ = m(x, mems)  # the new memory's output projection starts at zero: still the pretrained model
    assert_close(m.logits(h2)[..., :V], src(input_ids=x).logits)
    with pytest.raises(ValueError, match="unknown"):
        GPT2WithMemory(GPT2Settings(pretrained=str(tmp_path / "nothing")), MemoryHook(), V)


def test_memory_layers_must_exist():
    with pytest.raises(ValueError, match="memory layers"):
        GPT2WithMemory(SMALL, MemoryHook(kind="window", layers=(5,)), V)
    with pytest.raises(ValueError, match="cmem_len > 0"):
        build_layer_memory(MemoryHook(kind="compressive", args={"cmem_len": 0}), 32, 2, 0)


# ------------------------------------------------------------------------------------------ compressive
COMP_ARGS = {"cmem_len": 4, "rate": 3}


def _layer_call(m, layer, h_BTD, state, **kw):
    """Layer `layer`'s wrapped attention run on `h_BTD` (already ln_1-ed) with the memory `state`."""
    rt = m._runtime
    rt.states = {layer: state}
    try:
        return m.lm.transformer.h[layer].attn(h_BTD, **kw)
    finally:
        rt.states = {}


def test_compressive_attention_with_an_empty_memory_is_transformers_attention():
    m = _model("compressive", **COMP_ARGS)
    mem = m.memories["1"]
    attn = m.lm.transformer.h[1].attn
    h = torch.randn(2, 9, 32)
    empty = mem.empty(2, torch.empty(0))
    out = _layer_call(m, 1, h, empty)
    assert isinstance(out, tuple) and len(out) == 2
    ref = attn.inner(h)
    assert_close(out[0], ref[0], atol=1e-6, rtol=1e-6)
    # transformers' eager path (which passes its additive causal mask) gives the same
    m.lm.config._attn_implementation = "eager"
    x = torch.randint(0, V, (2, 9))
    h_eager, _ = m(x, None)
    m.lm.config._attn_implementation = "sdpa"
    assert_close(h_eager, m(x, None)[0], atol=1e-6, rtol=1e-6)
    assert_close(h_eager, m.lm.transformer(input_ids=x).last_hidden_state, atol=1e-6, rtol=1e-6)


def _naive_memory_attention(attn, ln, h_BTD, cmem_BCD, bias_HN):
    """Softmax over [slots; causal block] written out with loops over batch, head and query."""
    inner = attn.inner
    d, nh, hd = inner.embed_dim, inner.num_heads, inner.head_dim
    w, b = inner.c_attn.weight, inner.c_attn.bias
    qkv = h_BTD @ w + b
    mem_kv = ln(cmem_BCD) @ w[:, d:] + b[d:]
    n_slots, cap = cmem_BCD.shape[1], bias_HN.shape[1]
    out = torch.zeros_like(h_BTD)
    for bi in range(h_BTD.shape[0]):
        for hi in range(nh):
            sl = slice(hi * hd, (hi + 1) * hd)
            for i in range(h_BTD.shape[1]):
                q = qkv[bi, i, sl]
                keys, vals, extra = [], [], []
                for j in range(n_slots):  # slot j of C, oldest first; the newest slot has bias column cap - 1
                    keys.append(mem_kv[bi, j, :d][sl])
                    vals.append(mem_kv[bi, j, d:][sl])
                    extra.append(bias_HN[hi, cap - n_slots + j])
                for s in range(i + 1):
                    keys.append(qkv[bi, s, d:2 * d][sl])
                    vals.append(qkv[bi, s, 2 * d:][sl])
                    extra.append(torch.tensor(0.0))
                scores = torch.stack([q @ k / math.sqrt(hd) + e for k, e in zip(keys, extra)])
                p = torch.softmax(scores, 0)
                out[bi, i, sl] = sum(pj * v for pj, v in zip(p, vals))
    return inner.c_proj(out)


def test_compressive_attention_with_a_memory_equals_a_naive_reference():
    m = _model("compressive", **COMP_ARGS)
    mem = m.memories["0"]
    with torch.no_grad():
        mem.pos_bias.normal_(std=1.0)
    block = m.lm.transformer.h[0]
    h = torch.randn(2, 5, 32)
    for n_slots in (1, 3, 4):
        cmem = torch.randn(2, n_slots, 32)
        state = {"cmem": cmem, "rest": torch.zeros(2, 0, 32)}
        out, probs = _layer_call(m, 0, h, state)
        ref = _naive_memory_attention(block.attn, block.ln_1, h, cmem, mem.pos_bias)
        assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert probs.shape == (2, 2, 5, n_slots + 5)
    # the memory matters: other slots, other output
    other = {"cmem": torch.randn(2, 4, 32), "rest": torch.zeros(2, 0, 32)}
    assert (_layer_call(m, 0, h, other)[0] - out).abs().max() > 1e-3


def test_compressive_fifo_and_leftovers_against_a_naive_recomputation():
    m = _model("compressive", **COMP_ARGS)  # rate 3, 4 slots
    conv = {l: m.memories[str(l)].compress.conv for l in (0, 1)}
    mems, inputs = None, {0: [], 1: []}
    for t in (5, 7, 2, 1, 9, 4, 6):
        x = torch.randint(0, V, (2, t))
        _, mems = m(x, mems)
        cmem = {0: mems[0], 1: mems[3]}
        rest = {0: mems[1], 1: mems[4]}
        for l in (0, 1):
            stream = torch.cat(inputs[l], 1) if inputs[l] else torch.zeros(2, 0, 32)
            n_groups = stream.shape[1] // 3
            slots = [torch.einsum("dek,bke->bd", conv[l].weight, stream[:, 3 * g : 3 * g + 3]) + conv[l].bias
                     for g in range(n_groups)]  # slot g = Σ_k W[:, :, k] x_{3g+k} + b
            want = torch.stack(slots[-4:], 1) if slots else torch.zeros(2, 0, 32)
            assert_close(cmem[l], want, atol=1e-5, rtol=1e-5)
            assert_close(rest[l], stream[:, 3 * n_groups :])  # the < c newest inputs wait, uncompressed
            inputs[l].append(mems[2 if l == 0 else 5])  # this block's layer input, compressed at the next block
    assert mems[0].shape[1] == 4 and not any(t.requires_grad for t in mems)
    # generation: absorbing the pending block once gives what the next forward pass would do
    x = torch.randint(0, V, (2, 4))
    assert_close(m(x, m.absorb(mems))[0], m(x, mems)[0])


def test_reconstruction_loss_trains_only_the_compression_and_the_lm_loss_the_bias():
    m = _model("compressive", **COMP_ARGS, recon_weight=0.5)
    m.train()
    x = torch.randint(0, V, (2, 6))
    _, mems = m(x, None)
    first = m.aux_losses()["attn_recon"]
    assert float(first) == 0.0  # nothing compressed yet: a zero that still reaches the conv (DDP)
    first.backward()
    assert all(p.grad is not None for p in m.memories.parameters())
    m.zero_grad(set_to_none=True)
    rt = m._runtime
    rt.record_queries = True
    h, _ = m(x, mems)
    rt.record_queries = False
    loss = m.aux_losses()["attn_recon"]
    # independent value: Σ_layers 0.5 · mean((attn(q, ln_1(old)) − attn(q, ln_1(f_c(old))))²)
    ref = 0.0
    for l in (0, 1):
        block = m.lm.transformer.h[l]
        w, b = block.attn.inner.c_attn.weight, block.attn.inner.c_attn.bias
        old = mems[2 if l == 0 else 5]
        new = m.memories[str(l)].compress(old)
        q = rt.queries[l]

        def att(mm):
            kv = block.ln_1(mm) @ w[:, 32:] + b[32:]
            k, v = (z.view(2, -1, 2, 16).transpose(1, 2) for z in kv.split(32, -1))
            return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v

        ref = ref + 0.5 * (att(new) - att(old)).pow(2).mean()
    assert_close(loss, ref.detach(), atol=1e-6, rtol=1e-5)
    loss.backward(retain_graph=True)
    for name, p in m.named_parameters():
        got = p.grad is not None and bool(p.grad.abs().sum() > 0)
        assert got == ("compress.conv" in name), name  # only f_c learns from the reconstruction
    m.zero_grad(set_to_none=True)
    m.nll(h, x).mean().backward()
    for l in (0, 1):
        mem = m.memories[str(l)]
        assert mem.compress.conv.weight.grad is None  # the slots are detached: the LM loss does not train f_c
        assert mem.pos_bias.grad.abs().sum() > 0  # … it trains the positional bias


# ------------------------------------------------------------------------------------------- Lightning
@pytest.fixture(scope="module")
def dog(tmp_path_factory):
    root = dialogue_tiny.generate_tiny_dog(tmp_path_factory.mktemp("dog"), n_docs=2, people=2, filler=2, questions=2,
                               conversations={"train": 4, "valid": 1, "test": 2}, seed=0)
    texts = [c.document + " " + " ".join(c.utterances) for c in cmudog.read_cmu_dog(root, "train")]
    tok = TextTokenizer(train_bpe(texts * 3, 320), TokenizerSpec(vocab_size=320))
    return root, tok


def _dm(dog, **kw):
    root, tok = dog
    kw.setdefault("max_responses", 3)
    dm = D.DialogueDataModule(source="tiny", root=str(root), block_size=32, **kw)
    dm.tok = tok
    return dm


def _fit(dm, kind, steps, tmp_path=None, **trainer_kw):
    L.seed_everything(3)
    args = {"window": {"mem_len": 32}, "ltm": LTM_ARGS, "compressive": COMP_ARGS}.get(kind, {})
    module = GPT2MemoryLM(model={"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 32, "dropout": 0.0},
                          memory_hook={"kind": kind, "args": args}, optim={"lr": 3e-3},
                          generation={"enabled": True, "max_tokens": 4, "meteor": False,
                                      "output": str(tmp_path / "responses.jsonl") if tmp_path else None},
                          n_token=dm.vocab_size)
    ckpt_path = trainer_kw.pop("ckpt_path", None)
    checkpointing = any(type(c).__name__ == "ModelCheckpoint" for c in trainer_kw.get("callbacks", []))
    trainer = L.Trainer(max_steps=steps, logger=False, enable_progress_bar=False,
                        enable_checkpointing=checkpointing, enable_model_summary=False,
                        accelerator="cpu", use_distributed_sampler=False, limit_val_batches=0, **trainer_kw)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, trainer


@pytest.mark.slow
def test_dialogue_finetune_test_and_generation(dog, tmp_path):
    dm = _dm(dog, max_responses=2)
    module, trainer = _fit(dm, "ltm", 3, tmp_path)
    assert int(module.tokens_seen) > 0
    out = trainer.test(module, datamodule=dm, verbose=False)[0]
    # test perplexity: utterance words only, every one of them once
    n_words = sum(len(dm.tokenizer.encode(u)) for c in dm.convs["test"] for u in c.utterances)
    assert out["test/tokens"] == n_words
    assert math.isfinite(out["test/ppl"]) and out["test/responses"] == 2
    for key in ("test/f1", "test/rouge1", "test/rougeL", "test/rouge1_recall", "test/rougeL_recall"):
        assert 0 <= out[key] <= 100
    rows = [json.loads(line) for line in (tmp_path / "responses.jsonl").read_text().splitlines()]
    assert [r["turn"] for r in rows] == [2, 3] and all(r["reference"] for r in rows)
    # seeded: the same responses again
    first = [r["prediction"] for r in module.generated]
    trainer.test(module, datamodule=dm, verbose=False)
    assert [r["prediction"] for r in module.generated] == first


def _window_responder(dog, max_tokens):
    """A dialogue model with a window memory whose output weights are large enough for the memory to show."""
    dm = _dm(dog)
    dm.setup()
    torch.manual_seed(0)
    module = GPT2MemoryLM(model=SMALL.__dict__, memory_hook={"kind": "window", "args": {"mem_len": 1024}},
                          generation={"max_tokens": max_tokens}, n_token=dm.vocab_size)
    for mem in module.model.memories.values():
        torch.nn.init.normal_(mem.out.weight, std=0.5)
    return dm, module.eval()


def test_respond_reads_the_memory_of_the_earlier_pieces(dog):
    dm, module = _window_responder(dog, 4)
    ex = dm.response_examples()[0]
    assert len(ex.context) > 2 * 32  # the context spans several pieces
    stop = {dm.tokenizer.id("<eos>")}
    seen = []
    logits = module.model.logits
    module.model.logits = lambda h: seen.append(logits(h)) or seen[-1]  # records each step's next-token logits

    def run(context, seed):
        seen.clear()
        out = module.respond(context, ex.context_types, stop=stop, generator=torch.Generator().manual_seed(seed),
                             block=32, responder_type=ex.context[-1])
        return out, seen[0]

    (a, la), (b, _) = run(ex.context, 1), run(ex.context, 1)
    assert a == b and len(a) <= 4  # seeded, at most max_tokens
    # changing only the first piece (long out of the window, remembered) changes the next-token distribution …
    other = list(ex.context)
    other[1:6] = [7, 8, 9, 10, 11]
    assert (run(other, 1)[1] - la).abs().max() > 1e-4
    # … and a model without memory never sees it
    module.model.supports_memory = False
    assert_close(run(other, 1)[1], run(ex.context, 1)[1])


class LossRecorder(L.Callback):
    def __init__(self):
        self.losses = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses[trainer.global_step] = float(outputs["loss"])


class StopAt(L.Callback):
    """Ends the run after `step` optimiser steps (the schedule still spans max_steps, as in an interrupted run)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def test_resume_restores_the_dialogue_memory_and_position(dog, tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    straight = LossRecorder()
    _fit(_dm(dog), "window", 5, callbacks=[straight])
    _fit(_dm(dog), "window", 5, callbacks=[StopAt(3), ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3,
                                                                        save_top_k=-1)])
    ckpt = tmp_path / "epoch=0-step=3.ckpt"
    state = torch.load(ckpt, weights_only=True)
    mem = state["repro"]["train_memory"]
    assert mem is not None and len(mem) == 4 and mem[0].shape[0] == 1  # (window, pending) per layer, batch 1
    resumed = LossRecorder()
    _fit(_dm(dog), "window", 5, callbacks=[resumed], ckpt_path=str(ckpt))
    assert sorted(resumed.losses) == [4, 5]
    for step in (4, 5):
        assert resumed.losses[step] == pytest.approx(straight.losses[step], rel=1e-5), step


def test_resume_restores_the_compressed_memory(dog, tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    straight = LossRecorder()
    _fit(_dm(dog), "compressive", 5, callbacks=[straight])
    _fit(_dm(dog), "compressive", 5, callbacks=[StopAt(3), ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3,
                                                                             save_top_k=-1)])
    mem = torch.load(tmp_path / "epoch=0-step=3.ckpt", weights_only=True)["repro"]["train_memory"]
    assert len(mem) == 6 and mem[0].shape[0] == 1 and mem[0].shape[1] > 0  # (cmem, rest, pending) per layer
    resumed = LossRecorder()
    _fit(_dm(dog), "compressive", 5, callbacks=[resumed], ckpt_path=str(tmp_path / "epoch=0-step=3.ckpt"))
    assert sorted(resumed.losses) == [4, 5]
    for step in (4, 5):
        assert resumed.losses[step] == pytest.approx(straight.losses[step], rel=1e-5), step


@pytest.mark.slow
def test_compressive_dialogue_config_fits_and_tests_through_the_cli(dog, root, tmp_path, monkeypatch):
    from repro.cli.entry import main

    monkeypatch.chdir(root)
    data, tok = dog
    tok.tok.save(str(tmp_path / "tok.json"))
    cfg = "configs/infinity_former/tiny/gpt2_dog_compressive.yaml"
    small = ["--data.init_args.root", str(data), "--data.init_args.tokenizer",
             f"{{kind: file, name: {tmp_path / 'tok.json'}}}", "--data.init_args.block_size", "32",
             "--data.init_args.max_responses", "2",
             "--model.init_args.model", "{pretrained: null, n_layer: 2, n_embd: 32, n_head: 2, n_positions: 32, "
             "dropout: 0.0}", "--run.tracking", "none", "--trainer.accelerator", "cpu"]
    ckpt = tmp_path / "c.ckpt"
    main(["fit", "-c", cfg, *small, "--trainer.max_steps", "3", "--trainer.limit_val_batches", "2",
          "--run.checkpoint", str(ckpt), "--run.record", str(tmp_path / "fit.json")])
    assert json.loads((tmp_path / "fit.json").read_text())["provenance"]["steps"] == 3
    out = tmp_path / "gen.jsonl"
    main(["test", "-c", cfg, "-c", cfg.replace(".yaml", ".eval.yaml"), *small, "--ckpt_path", str(ckpt),
          "--model.init_args.generation", f"{{enabled: true, max_tokens: 4, meteor: false, output: {out}}}",
          "--run.record", str(tmp_path / "test.json")])
    metrics = json.loads((tmp_path / "test.json").read_text())["metrics"]
    assert math.isfinite(metrics["test/ppl"]) and metrics["test/responses"] == 2
    assert len(out.read_text().splitlines()) == 2


# ------------------------------------------------------------------------------- official GPT-2 details
def test_memory_stores_ln1_of_the_block_input_as_the_dialogue_code(monkeypatch):
    """`stores: ln_1` (official document_grounded_generation `Block.mem = self.ln_1(hidden_states.detach())`): the
    LTM absorbs ln_1 of the detached block input, and ln_1's parameters learn through the memory; `block_input`
    (official finetune_gpt2) absorbs the block input itself."""
    from papers.infinity_former.adapters import LTMLayerMemory

    seen = []
    write = LTMLayerMemory.write
    monkeypatch.setattr(LTMLayerMemory, "write", lambda self, st, x: (seen.append(x), write(self, st, x))[1])
    x = torch.randint(0, V, (1, 16))
    for stores in ("block_input", "ln_1"):
        torch.manual_seed(0)
        m = GPT2WithMemory(SMALL, MemoryHook(kind="ltm", args={"ltm": {"n_basis": 16, "n_samples": 8}},
                                             stores=stores), V).train()
        with torch.no_grad():
            m.lm.transformer.h[1].ln_1.weight.normal_(1.0, 0.3)
        _, mems = m(x, None)
        block_input = mems[7]  # layer 1's pending block input (per layer: coef, hist, count, pending)
        seen.clear()
        m(x, mems)
        ln = m.lm.transformer.h[1].ln_1
        assert_close(seen[1], ln(block_input) if stores == "ln_1" else block_input)
        assert seen[1].requires_grad == (stores == "ln_1")  # ln_1's gain and bias learn through the memory
    with pytest.raises(ValueError, match="stores"):
        MemoryHook(kind="compressive", stores="ln_1")


@pytest.mark.slow
def test_one_optimiser_step_per_conversation_as_the_official_loop(dog):
    """`optim.step_per: conversation` equals the official dialogue loop written out here: per piece, backward of
    (mean NLL + λ_KL·KL) and clip_grad_norm_(1.0) of the accumulated gradient; one AdamW step (and one schedule
    step) per conversation."""
    from papers.infinity_former.gpt2 import FinetuneOptim

    steps = 2
    dm = _dm(dog)
    L.seed_everything(3)
    kw = dict(model={"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 32, "dropout": 0.0},
              memory_hook={"kind": "ltm", "args": {"ltm": {"n_basis": 16, "n_samples": 8, "kl_weight": 1e-2}},
                           "stores": "ln_1"},
              optim={"lr": 3e-3, "step_per": "conversation", "clip": 1.0}, n_token=dm.vocab_size)
    module = GPT2MemoryLM(**kw)
    ref = GPT2MemoryLM(**kw)
    ref.model = ref.build_model()
    module.model = module.build_model()
    ref.model.load_state_dict(module.model.state_dict())
    trainer = L.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, accelerator="cpu", use_distributed_sampler=False,
                        limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == steps

    dm2 = _dm(dog)
    dm2.setup("fit")
    o = FinetuneOptim(lr=3e-3, step_per="conversation", clip=1.0)
    opt = torch.optim.AdamW(ref.model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: o.factor(s, steps))
    ref.model.train()
    mems, done, started = None, 0, False
    for batch in dm2.train_dataloader():
        if batch.reset:
            if started:
                opt.step(), opt.zero_grad(), sched.step()
                done += 1
                if done == steps:
                    break
            mems, started = None, True
        hidden, mems = ref.model(batch.input, mems, types=batch.types)
        nll = ref.model.nll(hidden, batch.target)
        mask = batch.target != -100
        aux = ref.model.aux_losses()  # none on a conversation's first piece (empty memory)
        loss = nll.sum() / mask.sum().clamp(min=1) + (sum(aux.values()) if aux else 0.0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.model.parameters(), 1.0)
    assert done == steps
    for (name, a), b in zip(module.model.state_dict().items(), ref.model.state_dict().values()):
        assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow
def test_memory_parameters_get_their_own_rate_and_the_decay_spans_one_epoch(dog):
    """`optim.lr_memory` (the official run_clm Trainer's `learning_rate_ltm`): the memory's parameters, and only
    they, in an AdamW group at that rate without weight decay; GPT-2's biases and LayerNorm parameters in one
    without weight decay (the Trainer's `decay_parameters`); with no `max_steps` the linear decay spans
    the `max_epochs` epochs of training batches (the Trainer's `num_train_epochs`), reaching 0 at their end."""
    dm = _dm(dog)
    L.seed_everything(3)
    module = GPT2MemoryLM(model={"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 32, "dropout": 0.0},
                          memory_hook={"kind": "ltm", "args": LTM_ARGS},
                          optim={"lr": 1e-3, "lr_memory": 5e-3, "weight_decay": 0.1}, n_token=dm.vocab_size)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, accelerator="cpu", use_distributed_sampler=False,
                        limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    n_batches = sum(1 for _ in dm.train_dataloader())
    assert n_batches > 2 and trainer.global_step == n_batches
    opt = trainer.optimizers[0]
    memory = {n for n, _ in module.named_parameters() if ".attn.memory." in n}
    by_id = {id(p): n for n, p in module.named_parameters()}
    decay, no_decay, mem = opt.param_groups
    assert {by_id[id(p)] for p in mem["params"]} == memory and memory
    # the Trainer's weight decay: GPT-2's weights, not its biases or LayerNorm parameters (ln_1, ln_2, ln_f)
    norms_and_biases = {n for n in by_id.values() if n not in memory and (".ln_" in n or n.endswith("bias"))}
    assert {by_id[id(p)] for p in no_decay["params"]} == norms_and_biases and norms_and_biases
    assert {by_id[id(p)] for p in decay["params"]} == set(by_id.values()) - memory - norms_and_biases
    assert all(by_id[id(p)].endswith("weight") and ".ln_" not in by_id[id(p)] for p in decay["params"])
    assert [(g["initial_lr"], g["weight_decay"]) for g in (decay, no_decay, mem)] == [(1e-3, 0.1), (1e-3, 0.0),
                                                                                     (5e-3, 0.0)]
    sched = trainer.lr_scheduler_configs[0].scheduler
    assert sched.lr_lambdas[0](0) == 1.0 and sched.lr_lambdas[0](n_batches - 1) == pytest.approx(1 / n_batches)
    assert sched.get_last_lr() == [0.0, 0.0, 0.0]  # decayed to 0 at the end of the epoch


def test_official_memory_reset_keeps_only_the_second_of_three_pieces(dog):
    """`generation.official_memory_reset` (the official `sample_sequence` passes `new_doc=True` at its first drawn
    token when its context loop ended at i ≤ 1): with three context pieces the memory holds the second piece alone
    (its states as computed with the first in memory); with two or four pieces nothing changes."""
    from papers.infinity_former.dialogue_generation import GenerationSettings
    from repro.text.dialogue import pieces_from_end

    dm, module = _window_responder(dog, 1)
    ex = max(dm.response_examples(), key=lambda e: len(e.context))
    assert len(ex.context) >= 100
    stop = {dm.tokenizer.id("<eos>")}
    seen = []
    logits = module.model.logits
    module.model.logits = lambda h: seen.append(logits(h)) or seen[-1]

    def first_logits(n, reset):
        module.generation = GenerationSettings(max_tokens=1, official_memory_reset=reset)
        seen.clear()
        module.respond(ex.context[-n:], ex.context_types[-n:], stop=stop, generator=torch.Generator().manual_seed(0),
                       block=32, responder_type=ex.context[-1])
        return seen[0]

    for n, pieces in ((50, 2), (80, 3), (100, 4)):
        assert len(pieces_from_end(n, 32, last=30)) == pieces
    assert_close(first_logits(50, True), first_logits(50, False))
    assert_close(first_logits(100, True), first_logits(100, False))
    reset = first_logits(80, True)
    assert (reset - first_logits(80, False)).abs().max() > 1e-3
    # by hand: the first piece fills the memory, the second runs with it; then a window holding only the second
    # piece's block inputs (the window memory keeps what it is given) serves the last piece
    m = module.model
    ids = torch.tensor(ex.context[-80:])[None]
    typ = torch.tensor(ex.context_types[-80:])[None]
    with torch.no_grad():
        _, m0 = m(ids[:, :18], None, types=typ[:, :18])
        _, m1 = m(ids[:, 18:50], m0, types=typ[:, 18:50])
        _, pending = m._unflatten(m1)
        only_second = m._flatten({l: {"x": m._memory_input(l, pending[l])} for l in m.layers},
                                 {l: pending[l][:, :0] for l in m.layers})
        h, _ = m(ids[:, 50:], only_second, types=typ[:, 50:])
    assert_close(reset, logits(h[0, -1]).float())


def test_a_per_conversation_schedule_needs_max_steps(dog):
    """One optimiser step per conversation: Lightning's epoch length counts pieces, so the decay's horizon must be
    given in conversations (`trainer.max_steps`); without it the fit stops at once, saying so."""
    dm = _dm(dog)
    module = GPT2MemoryLM(model={"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32, "dropout": 0.0},
                          memory_hook={"kind": "ltm", "args": LTM_ARGS},
                          optim={"lr": 1e-3, "step_per": "conversation", "clip": 1.0}, n_token=dm.vocab_size)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, accelerator="cpu", use_distributed_sampler=False,
                        limit_val_batches=0)
    with pytest.raises(ValueError, match="set --trainer.max_steps"):
        trainer.fit(module, datamodule=dm)
