"""The mirror's Hugging Face Hub repositories (`repro.ops.mirror`): the model `gpt2` (a `save_pretrained`
checkpoint of random weights and a real byte-level BPE tokenizer of GPT-2's 50,257 symbols) and the dataset
`emozilla/pg19` (parquet shards and a dataset card whose `configs` name them), written in the cache layout
(`repro.ops.mirror.layout.hub_repo`) that the server answers the Hub's API from.

The checkpoint has the paper's shapes by default (12 layers, 768 wide, 1,024 positions: the paper configs build
the model from these shapes and copy the checkpoint in), or small ones (`GPT2_SHAPES["small"]`, for tests). The
tokenizer's merges are trained on the mirror's text, then completed with further valid merges up to GPT-2's size.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

from tokenizers import (
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)

from repro.ops.mirror.layout import hub_repo
from repro.ops.mirror.text import Words

GPT2_REPO, PG19_REPO = "gpt2", "emozilla/pg19"
GPT2_VOCAB = 50257
GPT2_SHAPES = {"paper": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024},
               "small": {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 1024}}


def gpt2_tokenizer(texts: list[str]):
    """A byte-level BPE with GPT-2's layout and size: 256 byte symbols, merges trained on `texts`, further valid
    merges (a trained symbol + a byte symbol) up to 50,256 symbols, then `<|endoftext|>` = 50256."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    trained = sorted(vocab, key=vocab.get)
    for a in trained:
        for b in alphabet:
            if len(vocab) >= GPT2_VOCAB - 1:
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append((a, b))
    out = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    out.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    out.post_processor = processors.ByteLevel(trim_offsets=False)
    out.decoder = decoders.ByteLevel()
    out.add_special_tokens(["<|endoftext|>"])
    assert out.get_vocab_size(with_added_tokens=True) == GPT2_VOCAB
    return out


def build_gpt2(root: Path, texts: list[str], size: str, info: dict) -> None:
    import torch  # heavy: torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast  # heavy: transformers

    tmp = root / "tmp-gpt2"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = GPT2TokenizerFast(tokenizer_object=gpt2_tokenizer(texts), bos_token="<|endoftext|>",
                                  eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    tokenizer.model_max_length = 1024
    tokenizer.save_pretrained(tmp)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=GPT2_VOCAB, **GPT2_SHAPES[size]))
    model.save_pretrained(tmp)
    files = {p.relative_to(tmp).as_posix(): p for p in tmp.rglob("*") if p.is_file()}
    rev = hub_repo(root, "model", GPT2_REPO, files)
    shutil.rmtree(tmp)
    info["gpt2"] = {"revision": rev, "size": size, "parameters": sum(p.numel() for p in model.parameters()),
                    "files": sorted(files)}


def build_pg19(root: Path, words: Words, info: dict) -> None:
    import pyarrow as pa  # heavy: pyarrow
    import pyarrow.parquet as pq  # heavy: pyarrow

    books = {"train": 4, "validation": 2, "test": 2}
    files: dict[str, bytes] = {}
    info["pg19"] = {}
    n = 0
    for split, count in books.items():
        rows = {"short_book_title": [], "publication_date": [], "url": [], "text": []}
        for _ in range(count):
            title = " ".join(words.sentence(2, 4)).title()
            paras = ["\n".join(" ".join(words.sentence(6, 14)).capitalize() + "." for _ in range(4))
                     for _ in range(60)]
            rows["short_book_title"].append(title)
            rows["publication_date"].append(1850 + n)
            rows["url"].append(f"http://www.gutenberg.org/ebooks/{10000 + n}")
            rows["text"].append(f"{title.upper()}\n\n\n" + "\n\n".join(paras) + "\n")
            n += 1
        table = pa.table({"short_book_title": pa.array(rows["short_book_title"], pa.string()),
                          "publication_date": pa.array(rows["publication_date"], pa.int32()),
                          "url": pa.array(rows["url"], pa.string()), "text": pa.array(rows["text"], pa.string())})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        files[f"data/{split}-00000-of-00001.parquet"] = buf.getvalue()
        info["pg19"][split] = {"books": count, "first_title": rows["short_book_title"][0],
                               "chars": [len(t) for t in rows["text"]]}
    card = ["---", "dataset_info:", "  features:"]
    card += [f"  - name: {c}\n    dtype: {t}"
             for c, t in (("short_book_title", "string"), ("publication_date", "int32"), ("url", "string"),
                          ("text", "string"))]
    sizes = {s: len(files[f"data/{s}-00000-of-00001.parquet"]) for s in books}
    card += ["  splits:"] + [f"  - name: {s}\n    num_bytes: {sizes[s]}\n    num_examples: {c}"
                             for s, c in books.items()]
    card += ["configs:", "- config_name: default", "  data_files:"]
    card += [f"  - split: {s}\n    path: data/{s}-*" for s in books]
    card += ["---", "", "# PG-19 (miniature mirror copy of emozilla/pg19)", ""]
    files["README.md"] = "\n".join(card).encode()
    info["pg19"]["revision"] = hub_repo(root, "dataset", PG19_REPO, files)
