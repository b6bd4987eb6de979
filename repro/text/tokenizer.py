"""Byte-level BPE tokenizers: GPT-2's own (paper profile) or one trained here on the embedded corpus (tiny).

Both are `tokenizers.Tokenizer` objects with the same pre-tokenizer and decoder (GPT-2's byte-level scheme), so the
rest of the code runs one path:

- `TokenizerSpec(kind="pretrained", name="gpt2")`: the tokenizer of the pretrained checkpoint, read from the
  Hugging Face hub (`tokenizer.json` of `gpt2`; needs network once, then the hub cache);
- `TokenizerSpec(kind="bpe", vocab_size=N)`: a byte-level BPE trained with `tokenizers` on the training split of the
  embedded corpus (`repro.data.embedded`), cached as `<data>/cache/tokenizers/<name>.json` (atomic write);
- `TokenizerSpec(kind="file", name=PATH)`: a saved `tokenizers` JSON file (tests, or a tokenizer of one's own).

The dialogue experiments add the official scripts' special tokens (`SPECIAL_TOKENS`: <bos>, <eos>, <doc>,
<speaker1>, <speaker2>, <pad>) after the base vocabulary, as `add_special_tokens` did there; the model's embedding
matrix is resized to `len(tokenizer)`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from repro.config import coerce
from repro.data.embedded import split_text
from repro.data.hf_hub import HUB_HELP, hub_offline
from repro.data.root import data_dir
from repro.io import atomic_write_text

SPECIAL_TOKENS = ("<bos>", "<eos>", "<doc>", "<speaker1>", "<speaker2>", "<pad>")
# base vocabularies of the pretrained tokenizers, to describe a config without the network (checked on loading)
PRETRAINED_SIZES = {"gpt2": 50257}


@dataclass(frozen=True)
class TokenizerSpec:
    kind: Literal["pretrained", "bpe", "file"] = "bpe"
    name: str = "gpt2"  # pretrained: hub repository of the tokenizer; file: path of a `tokenizers` JSON file
    vocab_size: int = 1024  # bpe: size of the trained vocabulary (before the special tokens)
    special_tokens: bool = True  # add SPECIAL_TOKENS (dialogue); LM fine-tuning keeps GPT-2's vocabulary as is

    def __post_init__(self):
        if self.kind not in ("pretrained", "bpe", "file"):
            raise ValueError(f"tokenizer kind is 'pretrained', 'bpe' or 'file', got {self.kind!r}")
        if self.kind == "bpe" and self.vocab_size < 300:
            raise ValueError(f"a byte-level BPE needs ≥ 300 symbols (256 bytes + merges), got {self.vocab_size}")


class TextTokenizer:
    """A `tokenizers.Tokenizer` with the project's special tokens and a digest of its vocabulary."""

    def __init__(self, tok, spec: TokenizerSpec):
        self.tok, self.spec = tok, spec
        if spec.special_tokens:
            tok.add_special_tokens(list(SPECIAL_TOKENS))
        self.special = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS if tok.token_to_id(t) is not None}
        vocab = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        self.digest = hashlib.sha256("\n".join(k for k, _ in vocab).encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def id(self, token: str) -> int:
        if token not in self.special:
            raise KeyError(f"{token!r} is not a special token of this tokenizer (special_tokens: false?)")
        return self.special[token]


def expected_size(spec: TokenizerSpec) -> int | None:
    """The tokenizer's size (special tokens included) when it is known without loading it, else None."""
    if spec.kind == "pretrained" and spec.name in PRETRAINED_SIZES:
        return PRETRAINED_SIZES[spec.name] + (len(SPECIAL_TOKENS) if spec.special_tokens else 0)
    return None


def vocab_size(spec: TokenizerSpec, data_root: str | os.PathLike | None = None) -> int:
    known = expected_size(spec)
    return known if known is not None else len(load_tokenizer(spec, data_root))


def _byte_level(tok):
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(texts, vocab_size: int):
    """A GPT-2-style byte-level BPE trained on `texts` (an iterable of strings)."""
    tok = _byte_level(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(spec: TokenizerSpec | dict, data_root: str | os.PathLike | None = None) -> TextTokenizer:
    spec = coerce(TokenizerSpec, spec)
    if spec.kind == "file":
        if not Path(spec.name).is_file():
            raise ValueError(f"tokenizer file {spec.name!r} does not exist (a `tokenizers` JSON, Tokenizer.save)")
        return TextTokenizer(Tokenizer.from_file(spec.name), spec)
    if spec.kind == "pretrained":
        offline = hub_offline()
        try:
            if offline:
                # optional: huggingface_hub (a dependency of transformers, not ours)
                from huggingface_hub import hf_hub_download

                tok = Tokenizer.from_file(hf_hub_download(spec.name, "tokenizer.json", local_files_only=True))
            else:
                tok = Tokenizer.from_pretrained(spec.name)
        except Exception as err:  # no network, no cache
            why = "the hub is unreachable and the cache lacks it" if offline else type(err).__name__
            raise ValueError(f"this config needs the pretrained tokenizer {spec.name!r} (tokenizer.json) from the "
                             f"Hugging Face hub ({why}): {HUB_HELP}") from err
        out = TextTokenizer(tok, spec)
        if expected_size(spec) not in (None, len(out)):
            raise ValueError(f"the {spec.name!r} tokenizer has {len(out)} symbols, {expected_size(spec)} were expected")
        return out

    text = split_text()["train"]
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = Path(data_dir(data_root)) / "cache" / "tokenizers" / f"bpe{spec.vocab_size}-embedded-{digest}.json"
    if path.exists():
        tok = Tokenizer.from_file(str(path))
    else:
        tok = train_bpe((line for line in text.splitlines(keepends=True)), spec.vocab_size)
        atomic_write_text(path, tok.to_str())
    return TextTokenizer(tok, spec)
