"""`repro generate`: a continuation of a prompt file from a trained checkpoint (Transformer-XL, Appendix E).

The sampling loop (top-k, memory carried from one token to the next, a sliding window for models without memory)
and the text ⇄ ids conversion are library code in `repro.generate`; this module reads the command line, loads the
model from its config files and checkpoint (`repro.cli.cli.load_module`) and writes the text.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from repro.generate import decode, encode_prompt, generate
from repro.io import atomic_write_text


def main(args) -> None:
    """`repro generate -c CONFIG [-c EVAL] --ckpt_path CKPT --prompt FILE [--length N --top_k 40 --seed S]`."""
    from repro.cli.cli import load_module  # heavy: Lightning

    if args.threads:
        torch.set_num_threads(args.threads)
    module, dm = load_module(args.config, args.ckpt_path)
    dm.setup("test")
    corpus = dm.corpus
    text = Path(args.prompt).read_text(encoding="utf-8")
    ids = encode_prompt(text, corpus.vocab, corpus.level)
    if not ids:
        raise ValueError(f"the prompt {args.prompt} holds no token")
    gen = torch.Generator().manual_seed(args.seed)
    lengths = module.eval_memory
    mem_len = args.mem_len if args.mem_len is not None else lengths.mem_len
    window = module.eval_protocol.window if module.eval_protocol.kind == "sliding" else None
    new = generate(module.model, torch.tensor([ids]), steps=args.length, mem_len=mem_len,
                   clamp_len=lengths.clamp_len, window=args.window or window, segment=dm.eval_tgt_len,
                   top_k=args.top_k, temperature=args.temperature, greedy=args.greedy, generator=gen)
    out = decode(new[0].tolist(), corpus.vocab, corpus.level)
    if args.output:  # the text goes to the file; the terminal gets one line
        atomic_write_text(args.output, out)
        print(f"repro generate: {args.length} tokens in {args.output}", flush=True)
    else:
        sys.stdout.write(out + ("" if out.endswith("\n") else "\n"))
