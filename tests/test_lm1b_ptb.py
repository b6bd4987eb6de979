"""One Billion Word and Penn Treebank preparation on small archives in the real layouts (nothing downloaded)."""

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from repro.data import corpora, sources
from repro.data.corpora import load_corpus


def _tgz(path: Path, members: dict[str, str], *, prefix: str = "") -> None:
    with tarfile.open(path, "w:gz") as tf:
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


TRAIN_SHARDS = {
    "news.en-00001-of-00100": "the cat sat .\na dog ran .\n",
    "news.en-00002-of-00100": "the dog sat .\nzyzzyva rare word .\n",
}
VALID = "a cat ran .\n"
TEST = "the cat ran .\nthe unseen token .\n"
# the vocabulary file's format: symbol and count per line, boundary and unknown symbols first
VOCAB = "<S> 0\n</S> 0\n<UNK> 0\nthe 10\n. 8\ncat 5\ndog 4\nsat 3\nran 3\na 2\n"


def _lm1b_raw(raw: Path) -> None:
    raw.mkdir(parents=True)
    members = {f"{sources.LM1B_TRAIN_DIR}/{n}": t for n, t in TRAIN_SHARDS.items()}
    members[f"{sources.LM1B_HELDOUT_DIR}/{sources.LM1B_TEST_SHARD}"] = TEST
    members[f"{sources.LM1B_HELDOUT_DIR}/{sources.LM1B_VALID_SHARD}"] = VALID
    members[f"{sources.LM1B_HELDOUT_DIR}/news.en.heldout-00002-of-00050"] = "not used .\n"
    _tgz(raw / sources.LM1B_URLS[0].rsplit("/", 1)[1], members)
    (raw / "1b_word_vocab.txt").write_text(VOCAB)


def test_lm1b_vocabulary_boundaries_and_splits(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "PUBLISHED", {})  # a miniature under the real name: not the published tarball
    _lm1b_raw(tmp_path / "raw" / "lm1b")
    corpus = load_corpus("lm1b", tmp_path)
    v = corpus.vocab
    assert v.symbols[:4] == ("<S>", "</S>", "<UNK>", "the") and len(v) == 10  # file order, nothing added

    def dec(split):
        return " ".join(v.decode(corpus.splits[split].tolist()))

    # held-out shards in file order, one <S> between sentences and at both ends, unknown words → <UNK>
    assert dec("test") == "<S> the cat ran . <S> the <UNK> <UNK> . <S>"
    assert dec("valid") == "<S> a cat ran . <S>"  # shard 00001, not the test shard
    # train: the four sentences of both shards, each once, in a shuffled order
    train = dec("train")
    assert train.startswith("<S> ") and train.endswith(" <S>")
    sents = sorted(s.strip() for s in train.split("<S>") if s.strip())
    assert sents == sorted(["the cat sat .", "a dog ran .", "the dog sat .", "<UNK> <UNK> <UNK> ."])
    assert "not used" not in train and corpus.meta["valid"] != corpus.meta["test"]
    # the shuffle is a fixed draw: the same files build the same stream
    again = corpora.lm1b_splits(sorted((tmp_path / "raw/lm1b/extracted" / sources.LM1B_TRAIN_DIR).glob("news.en-*")),
                                tmp_path / "raw/lm1b/extracted" / sources.LM1B_HELDOUT_DIR / sources.LM1B_VALID_SHARD,
                                tmp_path / "raw/lm1b/extracted" / sources.LM1B_HELDOUT_DIR / sources.LM1B_TEST_SHARD, v)
    np.testing.assert_array_equal(again["train"], corpus.splits["train"].numpy())


def test_lm1b_shuffles_sentences_and_shards():
    from repro.data.vocab import Vocab

    v = Vocab(("<S>", "</S>", "<UNK>", *[f"w{i}" for i in range(40)]))
    shards = []
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for k in range(2):
            p = Path(d) / f"news.en-0000{k + 1}-of-00100"
            p.write_text("".join(f"w{20 * k + i}\n" for i in range(20)))
            shards.append(p)
        out = corpora.lm1b_splits(shards, shards[0], shards[1], v, seed=3)["train"]
    words = [s for s in v.decode(out.tolist()) if s != "<S>"]
    assert sorted(words) == sorted(f"w{i}" for i in range(40))
    assert words != [f"w{i}" for i in range(40)]  # not file order


def test_lm1b_vocabulary_file_must_have_boundary_and_unknown(tmp_path):
    (tmp_path / "v.txt").write_text("the 3\ncat 1\n")
    with pytest.raises(ValueError, match="<S>"):
        corpora.lm1b_vocab(tmp_path / "v.txt")


def test_ptb_lowercases_adds_eos_and_counts_all_splits(tmp_path):
    raw = tmp_path / "raw" / "ptb"
    raw.mkdir(parents=True)
    # Mikolov's files: a leading space on every line, <unk> already in the text; the archive names start with ./
    _tgz(raw / "simple-examples.tgz", {
        "simple-examples/data/ptb.train.txt": " the cat <unk> \n the dog \n",
        "simple-examples/data/ptb.valid.txt": " a Cat \n",
        "simple-examples/data/ptb.test.txt": " the bird \n",
        "simple-examples/data/ptb.char.train.txt": "t h e\n",
    }, prefix="./")
    corpus = load_corpus("ptb", tmp_path)
    v = corpus.vocab
    # <eos> first, then by decreasing count over all three splits (the reference counts train, valid and test)
    assert v.symbols[0] == "<eos>" and v.symbols[1] == "the" and set(v.symbols) == {
        "<eos>", "the", "cat", "<unk>", "dog", "a", "bird"}
    assert " ".join(v.decode(corpus.splits["train"].tolist())) == "the cat <unk> <eos> the dog <eos>"
    assert " ".join(v.decode(corpus.splits["valid"].tolist())) == "a cat <eos>"
    assert " ".join(v.decode(corpus.splits["test"].tolist())) == "the bird <eos>"
    # a second build finds the cache; a second extraction finds the stamp
    assert load_corpus("ptb", tmp_path).vocab == v
    assert sources.ptb_files(raw)["test"].read_text() == " the bird \n"


def test_ptb_archive_without_the_word_files_is_refused(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    _tgz(raw / "simple-examples.tgz", {"simple-examples/README": "x"})
    with pytest.raises(ValueError, match="simple-examples"):
        sources.ptb_files(raw)


@pytest.mark.parametrize("experiment,within", [("lm1b_large", 0.06), ("ptb", 0.01)])
def test_paper_parameter_counts(experiment, within, root, monkeypatch):
    from repro.cli.commands import describe_configs

    monkeypatch.chdir(root)
    row = describe_configs([f"configs/transformer_xl/paper/{experiment}.yaml"])[0]
    assert abs(row["ratio_to_paper"] - 1) < within, row


def test_lm1b_base_parameters_tied_as_the_script_untied_as_the_paper(root, monkeypatch):
    """The official base script (tied softmax) builds 357.8M; the paper's 0.46B matches the untied model."""
    from repro.cli.cli import build

    monkeypatch.chdir(root)
    cfg = ["configs/transformer_xl/paper/lm1b_base.yaml"]
    tied = sum(p.numel() for p in build(cfg, meta=True).model.parameters())
    untied = sum(p.numel() for p in build(cfg, ["--model.init_args.model.tie_weight", "false"], meta=True)
                 .model.parameters())
    assert tied == 357_812_082
    assert abs(untied / 0.46e9 - 1) < 0.02


def _official_vocab_count(path: Path) -> list[str]:
    """The reference's rule (`utils/vocabulary.py` `_build_from_file`), written out as the test's reference:
    iterate the file, first field of `line.strip().split()`, add it if new."""
    symbols: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            symb = line.strip().split()[0]
            if symb not in symbols:
                symbols.append(symb)
    return symbols


def test_lm1b_vocabulary_counts_symbols_as_the_reference(tmp_path):
    """A miniature `1b_word_vocab.txt` in the real format (`word count` per line, `<S>`, `</S>`, `<UNK>` first,
    nothing else added by the reference for lm1b): a word made of a no-break space, which Python's `split()`
    removes, leaves its count as the first field, already a word ("3"), so the reference's vocabulary has one
    symbol fewer than the file has lines; a word holding U+2028 is one line for the reference (cut at it by
    `split()`), two for `str.splitlines`. The count follows the reference either way."""
    path = tmp_path / "1b_word_vocab.txt"
    path.write_text("<S> 0\n</S> 30301028\n<UNK> 0\nthe 41\n, 39\n3 9\n\u00a0 3\nzyx\u2028y 2\n", encoding="utf-8")
    v = corpora.lm1b_vocab(path)
    assert list(v.symbols) == _official_vocab_count(path) == ["<S>", "</S>", "<UNK>", "the", ",", "3", "zyx"]
    assert len(v) == 7 and len(corpora._file_lines(path)) == 8
    # sentences: one per file line, words as the reference splits them, a blank line an empty sentence
    shard = tmp_path / "shard"
    shard.write_text("the 3\u2028zyx ,\n\nthe\n", encoding="utf-8")
    ids = corpora.encode_sentences(corpora._file_lines(shard), v)
    assert v.decode(ids.tolist()) == ["<S>", "the", "3", "zyx", ",", "<S>", "<S>", "the", "<S>"]
