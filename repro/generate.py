"""Text generation from any language model of the repository (the library of `repro generate`, `repro.cli.generate`).

Transformer-XL, Appendix E: continuations of thousands of tokens sampled with top-k sampling (k = 40), the model
carrying its memory from one step to the next (each new token is one segment of length 1; its keys and values join
the memory, and nothing is recomputed). Models without memory (no recurrence, MGK, the vanilla model) recompute
the window of the last `window` tokens for every new token, as their sliding-window evaluation does.

With a memory at least as long as the prompt and the continuation together, and dropout off, the memory-carrying
loop computes exactly what a full-context recomputation at every step computes (tested token for token, greedy).
With a shorter memory the model sees, at every layer, the last `mem_len` positions, as in its evaluation.
"""

from __future__ import annotations

import torch

UNK_SYMBOLS = ("<unk>", "<UNK>")
LINE_END_SYMBOLS = ("<eos>", "<S>")


def sample_top_k(logp_BV: torch.Tensor, *, k: int, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row (B,), drawn from the renormalised distribution of the k most probable tokens, after
    dividing the log-probabilities by `temperature`. k ≤ 0 (or ≥ V) samples from the whole distribution."""
    if temperature <= 0:
        raise ValueError(f"the temperature must be positive (use greedy decoding for 0), got {temperature}")
    v = logp_BV.shape[-1]
    if 0 < k < v:
        top_BK, idx_BK = logp_BV.float().topk(k, dim=-1)
    else:
        top_BK, idx_BK = logp_BV.float(), None
    probs_BK = torch.softmax(top_BK / temperature, dim=-1)
    choice_B1 = torch.multinomial(probs_BK, 1, generator=generator)
    return (idx_BK.gather(-1, choice_B1) if idx_BK is not None else choice_B1).squeeze(-1)


@torch.no_grad()
def generate(model: torch.nn.Module, prompt_BT: torch.Tensor, *, steps: int, mem_len: int, clamp_len: int = -1,
             window: int | None = None, segment: int = 64, top_k: int = 40, temperature: float = 1.0,
             greedy: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
    """`steps` new tokens (B, steps) after `prompt_BT`.

    Args:
        model: a backbone with `forward(tokens, mems, *, mem_len, clamp_len, same_length)` and `log_prob(hidden)`.
        mem_len: memory per layer (models with memory); the prompt is read in segments of `segment` tokens.
        window: attention length of a model without memory (default: everything so far).
        top_k, temperature, greedy: the sampling rule (greedy: argmax).
    """
    if prompt_BT.ndim != 2 or prompt_BT.shape[1] == 0:
        raise ValueError("the prompt must hold at least one token")
    if steps <= 0:
        return prompt_BT.new_zeros(prompt_BT.shape[0], 0)
    was_training = model.training
    model.eval()

    def pick(logp_BV):
        return logp_BV.argmax(-1) if greedy else sample_top_k(logp_BV, k=top_k, temperature=temperature,
                                                               generator=generator)

    out = []
    try:
        if getattr(model, "supports_memory", False) and mem_len > 0:
            kv = {"kv_memory": True} if getattr(model, "supports_kv_memory", False) else {}
            mems = None
            for i in range(0, prompt_BT.shape[1], segment):
                hidden, mems = model(prompt_BT[:, i : i + segment], mems, mem_len=mem_len, clamp_len=clamp_len, **kv)
            for _ in range(steps):
                tok_B = pick(model.log_prob(hidden[:, -1:])[:, 0])
                out.append(tok_B)
                hidden, mems = model(tok_B[:, None], mems, mem_len=mem_len, clamp_len=clamp_len, **kv)
        else:
            seq = prompt_BT
            for _ in range(steps):
                ctx = seq[:, -window:] if window else seq
                hidden, _ = model(ctx, None, mem_len=0, clamp_len=clamp_len)
                tok_B = pick(model.log_prob(hidden[:, -1:])[:, 0])
                out.append(tok_B)
                seq = torch.cat([seq, tok_B[:, None]], dim=1)
    finally:
        model.train(was_training)
    return torch.stack(out, dim=1)


# ----------------------------------------------------------------------------------------------- text ⇄ ids
def encode_prompt(text: str, vocab, level: str) -> list[int]:
    """Word level: whitespace tokens, a line-end symbol after every line (as the corpus was built), unknown words
    mapped to the corpus's unknown symbol. Character level: the UTF-8 bytes."""
    index = vocab.index
    if level == "char":
        ids = []
        for b in text.encode("utf-8"):
            if str(b) not in index:
                raise ValueError(f"the prompt has byte {b} ({chr(b)!r}), which the corpus's alphabet lacks")
            ids.append(index[str(b)])
        return ids
    unk = next((index[s] for s in UNK_SYMBOLS if s in index), None)
    eol = next((index[s] for s in LINE_END_SYMBOLS if s in index), None)
    ids = []
    for line in text.splitlines():
        for w in line.split():
            if w in index:
                ids.append(index[w])
            elif unk is not None:
                ids.append(unk)
            else:
                raise ValueError(f"the prompt's word {w!r} is not in the vocabulary, which has no unknown symbol")
        if eol is not None:
            ids.append(eol)
    return ids


def decode(ids: list[int], vocab, level: str) -> str:
    if level == "char":
        return bytes(int(vocab.symbols[i]) for i in ids).decode("utf-8", errors="replace")
    words = [vocab.symbols[i] for i in ids]
    return " ".join("\n" if w in LINE_END_SYMBOLS else w for w in words).replace(" \n ", "\n").replace(" \n", "\n")

