"""Vocabularies, the embedded corpus and ordered LM streams against the reference's rules."""

from collections import Counter

import pytest
import torch

from repro.data import embedded
from repro.data.corpora import enwik8_splits, load_corpus, text8_splits, vocab_size
from repro.data.lm import LMDataModule, LMSegments
from repro.data.vocab import EOS, char_vocab, encode_chars, encode_words, word_vocab


def test_word_vocab_follows_the_reference_recipe():
    train = ["b a c", "a b", "d a"]
    vocab = word_vocab(train)
    # <eos> first; then Counter.most_common order: a(3), b(2), then c, d (1 each, first occurrence first)
    assert vocab.symbols == (EOS, "a", "b", "c", "d")
    ref = [EOS] + [s for s, _ in Counter(w for line in train for w in line.split()).most_common()]
    assert list(vocab.symbols) == ref
    ids = encode_words(["a b", "", "d"], vocab)
    assert ids.tolist() == [1, 2, 0, 0, 4, 0]  # <eos> per line, an empty line gives <eos> alone


def test_word_vocab_counts_train_only():
    vocab = word_vocab(["x y"])
    with pytest.raises(KeyError, match="not in the training vocabulary"):
        encode_words(["z"], vocab)


def test_char_vocab_counts_all_splits_by_frequency_then_first_occurrence():
    vocab = char_vocab([b"abca", b"zz", b"b"])
    # counts: a2 b2 c1 z2 → a, b, z (count 2, first occurrence order), then c
    assert vocab.symbols == ("97", "98", "122", "99")
    assert encode_chars(b"zab", vocab).tolist() == [2, 0, 1]


def test_enwik8_and_text8_splits_follow_the_prep_scripts():
    data = bytes(range(256)) * (100_000_000 // 256) + bytes(100_000_000 % 256)
    parts = enwik8_splits(data)
    assert [len(parts[s]) for s in ("train", "valid", "test")] == [90_000_000, 5_000_000, 5_000_000]
    assert parts["valid"] == data[90_000_000:95_000_000]
    t8 = b" ab" + b"c" * 10_999_997
    parts = text8_splits(t8)
    assert parts["test"] == t8[-5_000_000:] and len(parts["valid"]) == 5_000_000
    assert parts["train"] == t8[: len(t8) - 10_000_000].strip()


def test_embedded_corpus_is_deterministic_and_split_90_5_5():
    a, b = embedded.split_text(), embedded.split_text()
    assert a == b
    total = sum(len(v) for v in a.values())
    assert abs(len(a["train"]) / total - 0.90) < 0.01 and abs(len(a["test"]) / total - 0.05) < 0.01
    assert a["valid"] not in a["train"]


def test_embedded_word_corpus_closes_its_vocabulary():
    splits = embedded.word_splits()
    counts = Counter(t for line in splits["train"] for t in line.split())
    assert min(c for t, c in counts.items() if t != "<unk>") >= embedded.WIKITEXT_MIN_COUNT
    vocab = word_vocab(splits["train"])
    for s in ("valid", "test"):
        encode_words(splits[s], vocab)  # no unknown word


def test_embedded_corpora_build_and_cache():
    corpus = load_corpus("embedded-char")
    assert corpus.level == "char" and corpus.splits["train"].dtype == torch.int32
    text = embedded.char_splits()["valid"]
    ids = corpus.splits["valid"].numpy()
    assert bytes(int(corpus.vocab.symbols[i]) for i in ids[:200]) == text[:200]
    assert vocab_size("embedded-char") == len(corpus.vocab)
    t8 = load_corpus("embedded-text8")
    assert set(t8.vocab.symbols) <= {str(c) for c in b" abcdefghijklmnopqrstuvwxyz"}


def test_a_cache_of_an_earlier_builder_revision_is_rebuilt(tmp_path, monkeypatch):
    """A corpus whose builder changed (`CorpusSpec.revision`: WikiText-103 and PTB read their lines as the reference
    since revision 2) rebuilds a cache made before; a current cache is reused."""
    import dataclasses
    import json

    from repro.data import corpora

    folder = corpora.build("embedded-char", tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    assert "revision" not in meta  # revision 1: the caches of unchanged builders are byte-identical
    (folder / "meta.json").write_text(json.dumps(meta | {"marker": 1}))
    corpora.build("embedded-char", tmp_path)
    assert json.loads((folder / "meta.json").read_text()).get("marker") == 1  # reused
    monkeypatch.setitem(corpora.REGISTRY, "embedded-char",
                        dataclasses.replace(corpora.REGISTRY["embedded-char"], revision=2))
    corpora.build("embedded-char", tmp_path)
    rebuilt = json.loads((folder / "meta.json").read_text())
    assert rebuilt["revision"] == 2 and "marker" not in rebuilt
    assert corpora.REGISTRY["wt103"].revision == corpora.REGISTRY["ptb"].revision == 2


def test_paper_corpus_vocab_size_known_before_download(tmp_path):
    assert vocab_size("wt103", tmp_path) == 267_735
    assert vocab_size("text8", tmp_path) == 27


def test_streams_are_contiguous_and_ordered():
    tokens = torch.arange(103, dtype=torch.int32)
    segs = LMSegments(tokens, batch_size=4, tgt_len=7)
    n = 103 // 4  # 25 tokens per stream, the tail of 3 is dropped (as the reference does)
    seen = [[] for _ in range(4)]
    for seg in segs:
        assert (seg.target == seg.input + 1).all()
        for b in range(4):
            seen[b] += seg.input[b].tolist()
    for b in range(4):
        assert seen[b] == list(range(b * n, b * n + n - 1))
    assert len(segs) == len(range(0, n - 1, 7))


def test_ranks_take_disjoint_contiguous_slices_of_the_streams():
    tokens = torch.arange(400, dtype=torch.int32)
    one = list(LMSegments(tokens, batch_size=4, tgt_len=8))
    r0 = list(LMSegments(tokens, batch_size=4, tgt_len=8, rank=0, world_size=2))
    r1 = list(LMSegments(tokens, batch_size=4, tgt_len=8, rank=1, world_size=2))
    for full, a, b in zip(one, r0, r1):
        assert torch.equal(torch.cat([a.input, b.input]), full.input)
    assert not set(r0[0].input.flatten().tolist()) & set(r1[0].input.flatten().tolist())


def test_stream_state_resumes_at_the_next_segment():
    tokens = torch.arange(200, dtype=torch.int32)
    segs = LMSegments(tokens, batch_size=2, tgt_len=10)
    it = iter(segs)
    for _ in range(3):
        next(it)
    state = segs.state_dict()
    fresh = LMSegments(tokens, batch_size=2, tgt_len=10)
    fresh.load_state_dict(state)
    assert torch.equal(next(iter(fresh)).input, next(it).input)
    assert len(list(fresh)) == len(segs)  # the next pass starts from the beginning again
    with pytest.raises(ValueError, match="resume with the same data settings"):
        LMSegments(tokens, batch_size=4, tgt_len=10).load_state_dict(state)


def test_impossible_lengths_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="must be positive"):
        LMDataModule("embedded-char", batch_size=4, tgt_len=-1)
    with pytest.raises(ValueError, match="multiple of 3"):
        LMSegments(torch.arange(100), batch_size=4, tgt_len=5, world_size=3)
    with pytest.raises(ValueError, match="unknown corpus"):
        LMDataModule("wikitext-9", batch_size=4, tgt_len=5)


def test_corrupt_cache_is_reported_with_what_to_do(tmp_path):
    load_corpus("embedded-text8", tmp_path)
    tokens = tmp_path / "cache" / "embedded-text8" / "tokens.pt"
    tokens.write_bytes(tokens.read_bytes()[:100])
    with pytest.raises(RuntimeError, match="delete it and run the command again"):
        load_corpus("embedded-text8", tmp_path)


def _passes(segs, n):
    """The inputs (and last targets) of `n` passes, each pass as one (B, N-1) tensor per stream row."""
    out = []
    for _ in range(n):
        parts = list(segs)
        out.append((torch.cat([p.input for p in parts], 1), torch.cat([p.target for p in parts], 1)))
    return out


def test_roll_rotates_every_stream_at_every_pass_as_lamemo_roll():
    """LaMemo's `--roll` (`LMOrderedIterator.roll`, called before every epoch): each stream becomes
    cat(row[shift:], row[:shift]) for its own random shift; here one draw per pass, as absolute rotations."""
    tokens = torch.arange(403, dtype=torch.int32)
    plain = LMSegments(tokens, batch_size=4, tgt_len=7)
    rolled = LMSegments(tokens, batch_size=4, tgt_len=7, roll_seed=5)
    streams = plain.streams.long()
    seen = set()
    for p, (x, y) in enumerate(_passes(rolled, 3)):
        shift = rolled.shifts(p)
        seen.add(tuple(shift.tolist()))
        for b in range(4):
            row = torch.cat([streams[b, shift[b]:], streams[b, :shift[b]]])
            assert torch.equal(x[b], row[:-1]) and torch.equal(y[b], row[1:])
    assert len(seen) == 3  # a new rotation every pass
    assert torch.equal(_passes(plain, 1)[0][0], streams[:, :-1])  # without a seed: unrotated
    assert len(list(rolled)) == len(plain)


def test_roll_is_the_same_on_any_number_of_ranks_and_after_a_resume():
    tokens = torch.arange(800, dtype=torch.int32)
    one = LMSegments(tokens, batch_size=4, tgt_len=8, roll_seed=3)
    halves = [LMSegments(tokens, batch_size=4, tgt_len=8, roll_seed=3, rank=r, world_size=2) for r in (0, 1)]
    for _ in range(2):  # two passes
        for full, a, b in zip(one, *halves):
            assert torch.equal(torch.cat([a.input, b.input]), full.input)
    # interrupted in the second pass, resumed from its state: the same segments as without the interruption
    ref = LMSegments(tokens, batch_size=4, tgt_len=8, roll_seed=3)
    expected = [s.input for _ in range(3) for s in ref]
    run = LMSegments(tokens, batch_size=4, tgt_len=8, roll_seed=3)
    got = [s.input for s in run]
    it = iter(run)
    got += [next(it).input for _ in range(4)]
    resumed = LMSegments(tokens, batch_size=4, tgt_len=8, roll_seed=3)
    resumed.load_state_dict(run.state_dict())
    got += [s.input for s in resumed] + [s.input for s in resumed]
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_roll_applies_to_training_streams_only_with_the_run_seed():
    torch.manual_seed(17)
    dm = LMDataModule("embedded-char", batch_size=4, tgt_len=16, roll=True)
    train, valid = dm.segments("train"), dm.segments("valid")
    assert train.roll_seed == 17 and valid.roll_seed is None
    rolled = LMDataModule("embedded-char", batch_size=4, tgt_len=16, roll=True, roll_seed=2)
    assert rolled.segments("train").roll_seed == 2
    assert LMDataModule("embedded-char", batch_size=4, tgt_len=16).segments("train").roll_seed is None


def test_vocab_index_is_built_once():
    """The symbol → id map is computed once per vocabulary (One Billion Word's 793k symbols: 0.36 s a call, and its
    data build called it once per training shard)."""
    vocab = char_vocab([b"abca"])
    assert vocab.index is vocab.index and vocab.index == {s: i for i, s in enumerate(vocab.symbols)}
    assert vocab == char_vocab([b"abca"]) and "index" not in repr(vocab)
