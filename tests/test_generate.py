"""Generation: memory-carrying decoding equals full-context recomputation; top-k sampling; `repro generate`."""

import pytest
import torch

from papers.mgk.model import MGKLM, MGKConfig
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.generate import decode, encode_prompt, generate, sample_top_k

SMALL = dict(n_layer=3, d_model=32, n_head=2, d_head=16, d_inner=64, n_token=60, dropout=0.1, dropatt=0.1,
             cutoffs=(20, 40))


class HiddenStateMemoryXL(TransformerXL):
    """The same model, carrying layer inputs as memory instead of keys and values."""

    supports_kv_memory = False


def _full_context_greedy(model, prompt, steps, window=None):
    """The reference: recompute the whole sequence (or its last `window` tokens) for every new token."""
    seq = prompt
    with torch.no_grad():
        for _ in range(steps):
            ctx = seq[:, -window:] if window else seq
            hidden, _ = model(ctx, None, mem_len=0)
            nxt = model.log_prob(hidden)[:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
    return seq[:, prompt.shape[1]:]


@pytest.mark.slow
@pytest.mark.parametrize("cls", [TransformerXL, HiddenStateMemoryXL])
def test_memory_carrying_greedy_generation_equals_full_context_recomputation(cls):
    torch.manual_seed(3)
    model = cls(TransformerXLConfig(**SMALL))
    model.train()  # generate() must switch dropout off, and restore the mode afterwards
    prompt = torch.randint(0, 60, (2, 11))
    steps = 25
    # the prompt read in segments of 4 with memory, then one token per step: memory long enough for everything
    ours = generate(model, prompt, steps=steps, mem_len=64, segment=4, greedy=True)
    assert model.training
    model.eval()
    ref = _full_context_greedy(model, prompt, steps)
    assert torch.equal(ours, ref)


@pytest.mark.slow
def test_window_model_generation_recomputes_the_last_window():
    torch.manual_seed(4)
    cfg = TransformerXLConfig(**(SMALL | {"attention": "absolute"}))
    model = MGKLM(cfg, MGKConfig(attention="mgk")).eval()
    prompt = torch.randint(0, 60, (1, 9))
    ours = generate(model, prompt, steps=12, mem_len=0, window=6, greedy=True)
    assert torch.equal(ours, _full_context_greedy(model, prompt, 12, window=6))
    # without a window: everything so far
    full = generate(model, prompt, steps=12, mem_len=0, greedy=True)
    assert torch.equal(full, _full_context_greedy(model, prompt, 12))


def test_top_k_sampling_stays_in_the_top_k_follows_the_renormalised_distribution_and_is_seeded():
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(1, 50), -1)
    k, n = 5, 20000
    rows = logp.expand(n, 50)
    draws = sample_top_k(rows, k=k, generator=torch.Generator().manual_seed(7))
    top = set(logp[0].topk(k).indices.tolist())
    assert set(draws.tolist()) == top  # never outside the top k, and every one of them drawn
    expected = torch.softmax(logp[0][sorted(top)], -1)
    freq = torch.tensor([(draws == t).float().mean().item() for t in sorted(top)])
    assert torch.allclose(freq, expected, atol=0.015)
    again = sample_top_k(rows, k=k, generator=torch.Generator().manual_seed(7))
    other = sample_top_k(rows, k=k, generator=torch.Generator().manual_seed(8))
    assert torch.equal(draws, again) and not torch.equal(draws, other)
    # a low temperature concentrates on the most probable token; k = 1 is greedy
    cold = sample_top_k(rows[:100], k=k, temperature=1e-3, generator=torch.Generator().manual_seed(1))
    assert (cold == logp[0].argmax()).all()
    assert (sample_top_k(rows[:100], k=1) == logp[0].argmax()).all()
    with pytest.raises(ValueError, match="temperature"):
        sample_top_k(rows, k=k, temperature=0.0)


def test_sampled_generation_with_memory_is_seeded():
    model = TransformerXL(TransformerXLConfig(**SMALL))
    prompt = torch.randint(0, 60, (1, 5))
    a = generate(model, prompt, steps=30, mem_len=8, generator=torch.Generator().manual_seed(1))
    b = generate(model, prompt, steps=30, mem_len=8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == (1, 30)


def test_prompt_encoding_word_and_char():
    from repro.data.vocab import Vocab

    words = Vocab(("<eos>", "<unk>", "the", "cat"))
    ids = encode_prompt("the cat\nthe dog\n", words, "word")
    assert ids == [2, 3, 0, 2, 1, 0]
    assert decode(ids, words, "word") == "the cat\nthe <unk>\n"
    chars = Vocab(tuple(str(b) for b in b"abc "))
    assert encode_prompt("cab", chars, "char") == [2, 0, 1]
    with pytest.raises(ValueError, match="byte"):
        encode_prompt("z", chars, "char")


@pytest.mark.slow
def test_repro_generate_command(tmp_path, root, monkeypatch, capsys):
    from repro.cli import commands
    from repro.cli.cli import build

    monkeypatch.chdir(root)
    cfg = "configs/transformer_xl/tiny/wt103_base.yaml"
    module = build([cfg]).model
    ckpt = tmp_path / "m.ckpt"
    torch.save({"state_dict": module.state_dict(), "repro": {"n_token": module.n_token}}, ckpt)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The function returns a list .\n")
    outs = []
    for seed in (5, 5, 6):
        out = tmp_path / f"out{len(outs)}.txt"
        commands.main(["generate", "-c", cfg, "--ckpt_path", str(ckpt), "--prompt", str(prompt), "--length", "12",
                       "--seed", str(seed), "--output", str(out), "--threads", "1"])
        outs.append(out.read_text())
    assert outs[0] == outs[1] and outs[0] != outs[2]
    assert len(outs[0].split()) >= 1
