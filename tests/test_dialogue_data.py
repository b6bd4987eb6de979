"""CMU-DoG loading on files built here in its exact layout, the official input layout, pieces, the tiny generated
set, the rank split of the pieces, and seeded nucleus sampling."""

import json
from collections import Counter

import pytest
import torch

from repro.generate_text import SamplingSettings, nucleus_mask, sample_response, sample_token
from repro.text import cmudog, dialogue_tiny
from repro.text import dialogue as D
from repro.text.tokenizer import TextTokenizer, TokenizerSpec, train_bpe


@pytest.fixture(scope="module")
def tok():
    texts = ["the cat sat on the mat. where does Alma live? Alma lives in Oslo. hi there, did you like it?"] * 5
    return TextTokenizer(train_bpe(texts, 300), TokenizerSpec(vocab_size=300))


def _doc(idx, key="wikiDocumentIdx", name="Jaws"):
    return {
        "0": {"cast": ["Roy Scheider as Brody", "Robert Shaw as Quint"], "critical_response": ["scary", "fun"],
              "director": "Steven Spielberg", "genre": "thriller", "introduction": "A shark film.",
              "movieName": name, "rating": ["IMDB 8.0/10"], "year": "1975"},
        "1": "A beach party takes place.", "2": "The mayor says the beach is safe.", "3": "They hunt the shark.",
        key: idx,
    }


def _conv(idx, key="wikiDocumentIdx"):
    hist = [
        {"docIdx": 0, "text": "Hey there!", "uid": "user2", "utcTimestamp": "2018-03-01T00:11:35.166Z"},
        {"docIdx": 0, "text": "Did you see Jaws?", "uid": "user2", "utcTimestamp": "2018-03-01T00:11:58.270Z"},
        {"docIdx": 0, "text": "Yes, a great film.", "uid": "user1", "utcTimestamp": "2018-03-01T00:12:31.151Z"},
        {"docIdx": 1, "text": "   ", "uid": "user1", "utcTimestamp": "2018-03-01T00:12:40.000Z"},
        {"docIdx": 1, "text": "Who directed it?", "uid": "user2", "utcTimestamp": "2018-03-01T00:13:00.000Z"},
        {"docIdx": 1, "text": "Steven Spielberg.", "uid": "user1", "utcTimestamp": "2018-03-01T00:13:30.000Z"},
    ]
    return {"date": "2018-03-01T00:11:05.970Z", "history": hist, "rating": 2, "status": 1,
            "uid1LogInTime": "2018-03-01T00:11:05.970Z", "user1_id": "USR1906", "user2_id": "USR3118",
            "uid1response": {"feedback": None, "response": [1, 2], "type": "finish"},
            "whoSawDoc": ["user1", "user2"], key: idx}


def _write(root, *, conv_key="wikiDocumentIdx", doc_key="wikiDocumentIdx"):
    (root / "WikiData").mkdir(parents=True)
    (root / "WikiData" / "Jaws.json").write_text(json.dumps(_doc(2, doc_key)))
    (root / "WikiData" / "Frozen.json").write_text(json.dumps(_doc(0, doc_key, name="Frozen")))
    for split in cmudog.SPLITS:
        (root / "Conversations" / split).mkdir(parents=True)
        (root / "Conversations" / split / "00a8fb.json").write_text(json.dumps(_conv(2, conv_key)))
        (root / "Conversations" / split / "01b9ff.json").write_text(json.dumps(_conv(0, conv_key)))
    return root


@pytest.mark.parametrize("conv_key, doc_key", [("wikiDocumentIdx", "wikiDocumentIdx"), ("docLinkIdx", "index")])
def test_cmu_dog_loader_reads_both_index_spellings(tmp_path, conv_key, doc_key):
    convs = cmudog.read_cmu_dog(_write(tmp_path, conv_key=conv_key, doc_key=doc_key), "test")
    assert [c.name for c in convs] == ["00a8fb", "01b9ff"]
    c = convs[0]
    assert c.document.splitlines()[:4] == ["movieName: Jaws", "year: 1975", "director: Steven Spielberg",
                                           "genre: thriller"]
    assert "cast: Roy Scheider as Brody; Robert Shaw as Quint" in c.document
    assert c.document.splitlines()[-3:] == ["A beach party takes place.", "The mayor says the beach is safe.",
                                            "They hunt the shark."]
    assert "movieName: Frozen" in convs[1].document
    # consecutive messages of user2 joined, the blank message dropped, then user1 / user2 / user1
    assert c.utterances == ["Hey there! Did you see Jaws?", "Yes, a great film.", "Who directed it?",
                            "Steven Spielberg."]
    assert c.speakers == [2, 1, 2, 1]


def test_cmu_dog_loader_errors(tmp_path):
    with pytest.raises(ValueError, match="WikiData"):
        cmudog.read_cmu_dog(tmp_path, "train")
    root = _write(tmp_path / "a")
    bad = _conv(2)
    del bad["wikiDocumentIdx"]
    (root / "Conversations" / "train" / "02.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="no document index .*docLinkIdx"):
        cmudog.read_cmu_dog(root, "train")
    (root / "Conversations" / "train" / "02.json").write_text(json.dumps(_conv(7)))
    with pytest.raises(ValueError, match="document 7"):
        cmudog.read_cmu_dog(root, "train")
    with pytest.raises(ValueError, match="split is one of"):
        cmudog.read_cmu_dog(root, "dev")


def test_official_layout_and_losses(tmp_path, tok):
    conv = cmudog.read_cmu_dog(_write(tmp_path), "valid")[0]
    enc = D.encode_conversation(conv, tok)
    doc, eos, s1, s2 = (tok.id(t) for t in ("<doc>", "<eos>", "<speaker1>", "<speaker2>"))
    body = tok.encode(conv.document)
    assert enc.ids[: len(body) + 2] == [doc, *body, eos]
    pos = len(body) + 2
    for text, s in zip(conv.utterances, conv.speakers):
        spk = s1 if s == 1 else s2
        words = tok.encode(text)
        assert enc.ids[pos : pos + 1 + len(words)] == [spk, *words]
        assert enc.types[pos : pos + 1 + len(words)] == [spk] * (1 + len(words))
        assert enc.scored[pos : pos + 1 + len(words)] == [False] + [True] * len(words)
        pos += 1 + len(words)
    assert pos == len(enc.ids)
    assert enc.types[: len(body) + 2] == [doc] * (len(body) + 2)
    # the "w/o doc" baseline starts at the first speaker token
    assert D.encode_conversation(conv, tok, with_document=False).ids == enc.ids[len(body) + 2 :]
    assert D.encode_conversation(conv, tok, doc_max_tokens=3).ids[:5] == [doc, *body[:3], eos]


def test_pieces_cut_from_the_end_and_targets_across_cuts(tmp_path, tok):
    assert D.pieces_from_end(10, 4) == [(0, 2), (2, 6), (6, 10)]
    assert D.pieces_from_end(10, 4, last=3) == [(0, 3), (3, 7), (7, 10)]
    assert D.pieces_from_end(4, 4) == [(0, 4)]
    conv = cmudog.read_cmu_dog(_write(tmp_path), "train")[0]
    enc = D.encode_conversation(conv, tok)
    for train in (True, False):
        chunks = D.conversation_chunks(enc, 16, train=train)
        assert [c.reset for c in chunks] == [True] + [False] * (len(chunks) - 1)
        assert all(c.input.shape[1] == 16 for c in chunks[1:]) and chunks[0].input.shape[1] <= 16
        inp = torch.cat([c.input for c in chunks], 1)[0].tolist()
        tgt = torch.cat([c.target for c in chunks], 1)[0].tolist()
        assert inp == enc.ids[:-1]
        if train:  # every token predicted, the document too
            assert tgt == enc.ids[1:]
        else:  # only utterance words
            assert tgt == [t if s else D.IGNORE for t, s in zip(enc.ids[1:], enc.scored[1:])]
            assert sum(t != D.IGNORE for t in tgt) == sum(len(tok.encode(u)) for u in conv.utterances)


def test_response_examples_need_two_previous_utterances(tmp_path, tok):
    convs = cmudog.read_cmu_dog(_write(tmp_path), "test")
    encs = [D.encode_conversation(c, tok) for c in convs]
    ex = D.response_examples(convs, encs, min_history=2)
    assert [(e.conversation, e.turn) for e in ex] == [("00a8fb", 2), ("00a8fb", 3), ("01b9ff", 2), ("01b9ff", 3)]
    e = ex[0]
    assert e.reference == "Who directed it?"
    assert e.context == encs[0].ids[: encs[0].starts[2] + 1]
    assert e.context[-1] == tok.id("<speaker2>")  # ends with the responder's speaker token
    assert len(D.response_examples(convs, encs, min_history=2, limit=3)) == 3


def test_official_response_context_is_the_aliased_whole_conversation(tmp_path, tok):
    """The official `build_input_from_segments_` keeps extending one list: every response of a conversation gets
    the document, the first speaker token and the words of all utterances but the last."""
    convs = cmudog.read_cmu_dog(_write(tmp_path), "test")
    encs = [D.encode_conversation(c, tok) for c in convs]
    ex = D.response_examples(convs, encs, min_history=3, context="official")
    assert [(e.conversation, e.turn) for e in ex] == [("00a8fb", 3), ("01b9ff", 3)]  # ≥ 3 previous utterances
    enc, conv = encs[0], convs[0]
    doc = enc.ids[: enc.starts[0]]
    words = [t for u in conv.utterances[:-1] for t in tok.encode(u)]
    assert ex[0].context == [*doc, enc.ids[enc.starts[0]], *words]
    assert ex[0].context_types == [*enc.types[: enc.starts[0] + 1],
                                   *[enc.types[a] for a, b in enc.spans[:-1] for _ in range(b - a)]]
    assert ex[0].reference == conv.utterances[3]
    two = D.response_examples(convs, encs, min_history=2, context="official")
    assert two[0].context == two[1].context == ex[0].context  # one context for every response
    with pytest.raises(ValueError, match="response context is one of"):
        D.response_examples(convs, encs, context="whole")


def test_tiny_set_is_cmu_dog_layout_and_grounded(tmp_path):
    conversations = {"train": 4, "valid": 2, "test": 2}
    root = dialogue_tiny.generate_tiny_dog(tmp_path, n_docs=3, conversations=conversations, seed=1)
    again = dialogue_tiny.generate_tiny_dog(tmp_path / "again", n_docs=3, conversations=conversations, seed=1)
    assert (root / "WikiData" / "village_00.json").read_text() == (again / "WikiData" / "village_00.json").read_text()
    convs = cmudog.read_cmu_dog(root, "train")
    assert len(convs) == 4
    for c in convs:
        facts = c.document.splitlines()[-3]  # section "1" (sections 1-3 are the last three lines): the facts
        answers = c.utterances[3::2]
        assert len(answers) == 4
        for a in answers:  # every answer is a sentence of its document's early facts
            assert a in facts
        assert c.speakers == [1, 2] * (len(c.utterances) // 2)


def test_pieces_split_across_ranks(tmp_path, tok):
    root = dialogue_tiny.generate_tiny_dog(tmp_path, n_docs=2, conversations={"train": 5, "valid": 3, "test": 3})
    convs = cmudog.read_cmu_dog(root, "valid")
    encs = [D.encode_conversation(c, tok) for c in convs]
    one = list(D.DialogueChunks(encs, 32, train=False))
    ranks = [list(D.DialogueChunks(encs, 32, train=False, rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])  # padded to the same number of steps

    def scored(chunks):
        return sorted(t for c in chunks for t in c.target[0].tolist() if t != D.IGNORE)

    assert scored(ranks[0] + ranks[1]) == scored(one)  # every scored token once, none twice
    tr = [D.DialogueChunks(encs, 32, train=True, rank=r, world_size=2, seed=3) for r in range(2)]
    n = len(tr[0])  # the epoch's length, known before it starts (it changes with the epoch's shuffle)
    assert len(tr[1]) == n and len(list(tr[0])) == len(list(tr[1])) == n
    # training order changes with the epoch, deterministically
    a = D.DialogueChunks(encs, 32, train=True, seed=3)
    first, second = [c.input.sum().item() for c in a], [c.input.sum().item() for c in a]
    b = D.DialogueChunks(encs, 32, train=True, seed=3)
    assert [c.input.sum().item() for c in b] == first and sorted(first) == sorted(second)


# --------------------------------------------------------------------------------------------- sampling
def test_nucleus_is_the_smallest_set_reaching_top_p():
    logits = torch.log(torch.tensor([0.05, 0.5, 0.15, 0.3]))
    assert nucleus_mask(logits, 0.9).tolist() == [False, True, True, True]  # 0.5 + 0.3 + 0.15 ≥ 0.9
    assert nucleus_mask(logits, 0.8).tolist() == [False, True, False, True]  # 0.5 + 0.3 reaches 0.8
    assert nucleus_mask(logits, 0.4).tolist() == [False, True, False, False]  # the top token alone
    assert nucleus_mask(logits, 1.0).tolist() == [True] * 4


def test_sampling_never_leaves_the_nucleus_and_is_seeded():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    settings = SamplingSettings(top_p=0.9)
    g = torch.Generator().manual_seed(0)
    draws = [sample_token(probs.log(), settings, g) for _ in range(3000)]
    counts = Counter(draws)
    assert 0 not in counts  # outside the nucleus: never drawn
    for k, p in {1: 0.5, 2: 0.15, 3: 0.3}.items():  # renormalised over the nucleus (0.95)
        assert counts[k] / 3000 == pytest.approx(p / 0.95, abs=0.03)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert [sample_token(probs.log(), settings, g1) for _ in range(50)] == \
        [sample_token(probs.log(), settings, g2) for _ in range(50)]


def test_sample_response_stops_and_caps_length():
    vocab = 6
    stop = {5}

    def always_stop_likely(generated):
        logits = torch.full((vocab,), -10.0)
        logits[5] = 10.0  # the stop token dominates …
        logits[2] = 0.0
        return logits

    g = torch.Generator().manual_seed(0)
    out = sample_response(always_stop_likely, SamplingSettings(top_p=0.9, max_tokens=50), g, stop)
    assert out == [2]  # … but the first token is never a stop token; the second step stops

    def never(generated):
        return torch.zeros(vocab)

    out = sample_response(never, SamplingSettings(top_p=1.0, max_tokens=7), g, set())
    assert len(out) == 7
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(top_p=0.0)


# ----------------------------------------------------------------------------------- LM document streams
def test_wikitext_documents_split_at_top_level_headings():
    from repro.text.streams import split_wikitext_documents

    text = " = Alpha = \n\n Alpha is a letter . \n\n = = History = = \n\n Old . \n = Beta = \n\n Beta too . \n"
    docs = split_wikitext_documents(text)
    assert docs == [" = Alpha = \n\n Alpha is a letter . \n\n = = History = = \n\n Old . \n",
                    " = Beta = \n\n Beta too . \n"]
    assert "".join(docs) == text


def test_text_streams_are_documents_in_order_served_in_blocks(tmp_path, tok, monkeypatch):
    from repro.text import streams as S

    docs = {"train": ["the cat sat. ", "on the mat. " * 20], "valid": ["hi there. " * 10], "test": ["Alma. " * 10]}
    monkeypatch.setattr(S, "embedded_documents", lambda split: docs[split])
    path = tmp_path / "tok.json"
    tok.tok.save(str(path))
    spec = TokenizerSpec(kind="file", name=str(path), special_tokens=False)
    dm = S.TextStreamDataModule(source="embedded", tokenizer=spec, block_size=8, batch_size=2, eval_batch_size=1,
                                data_dir=str(tmp_path / "data"))
    dm.setup()
    want = [t for d in docs["train"] for t in tok.encode(d)]
    assert dm.streams["train"].tolist() == want  # documents concatenated in order
    segs = list(dm.train_dataloader())
    n = len(want) // 2
    assert torch.cat([s.input for s in segs], 1)[0].tolist() == want[: n - 1]  # stream 0, in order, blocks of 8
    assert torch.cat([s.target for s in segs], 1)[1].tolist() == want[n + 1 : 2 * n]
    assert all(s.input.shape[1] <= 8 for s in segs)
    assert dm.corpus.meta["documents"] == {"train": 2, "valid": 1, "test": 1}
    again = S.TextStreamDataModule(source="embedded", tokenizer=spec, block_size=8, data_dir=str(tmp_path / "data"))
    monkeypatch.setattr(S, "embedded_documents", lambda split: 1 / 0)  # the cache is used, nothing rebuilt
    again.setup()
    assert again.streams["train"].tolist() == want


def test_two_builders_of_the_tiny_set_at_once_leave_one_complete_set(tmp_path):
    """Workers of one `repro runs` group may ask for the generated set together: the lock makes one build it."""
    import threading

    from repro.text.dialogue_tiny import tiny_dog_root

    settings = {"n_docs": 3, "conversations": {"train": 4, "valid": 2, "test": 2}}
    roots, errors = [], []

    def build():
        try:
            roots.append(tiny_dog_root(tmp_path, **settings))
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(roots)) == 1
    root = roots[0]
    assert (root / "complete.json").exists()
    splits = sorted(p.parent.name for p in (root / "Conversations").glob("*/*.json"))
    assert splits == ["test"] * 2 + ["train"] * 4 + ["valid"] * 2


def test_line_breaks_drop_is_run_clm_through_the_datasets_text_loader(tmp_path, tok, monkeypatch):
    """`line_breaks: drop` (the ∞-former paper configs): the official `run_clm.py` copy reads a `.txt` file with
    `datasets`' `text` loader (no `keep_linebreaks`: one example per line, without its break) and tokenises each
    line alone, then concatenates. Reference: `datasets.load_dataset("text", ...)` itself on a WikiText-style file
    and the same tokenizer per example. `keep` (documents whole, with their newlines) gives another stream."""
    import datasets

    from repro.text import streams as S

    text = (" = Alpha = \n \n Alpha is a letter , and a sound . \n \n = = History = = \n \n Old text here . \n"
            " = Beta = \n \n Beta too , said the cat . \n")
    path = tmp_path / "train.txt"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rows = datasets.load_dataset("text", data_files={"train": str(path)}, split="train",
                                 cache_dir=str(tmp_path / "hf"))
    want = [t for line in rows["text"] for t in tok.encode(line)]
    docs = S.split_wikitext_documents(text)
    assert S.encode_documents(docs, tok, "drop") == want
    assert S.encode_documents(docs, tok, "keep") != want
    assert S.encode_documents(docs, tok, "keep") == [t for d in docs for t in tok.encode(d)]
    with pytest.raises(ValueError, match=r"line_breaks is keep \| drop"):
        S.TextStreamDataModule(source="embedded", line_breaks="strip")
