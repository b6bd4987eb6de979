"""Parity of our CMU-DoG evaluation protocol (∞-former Table 2) with the official `eval.py`, on fixtures written by
`make_dialogue_protocol.py` from deep-spin/infinite-former (official functions run under nltk 3.6.4 and ignite
0.4.7). Each test also breaks the protocol (our own options: Treebank METEOR tokens, ≥ 2 previous utterances, the
preceding-utterances context, the untrimmed reference, stopping at speaker tokens, the per-token perplexity) and
checks that the result then leaves the official one by far more than the tolerance.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from repro.metrics import text as T
from repro.text import cmudog
from repro.text import dialogue as D
from tests.parity.common import HERE, TOLERANCE, load_fixture

FIX = HERE / "dialogue_protocol"


# ----------------------------------------------------------------------------------------------------- metrics
def test_f1_rouge_meteor_equal_the_official_functions():
    t, meta = load_fixture(FIX / "metrics.pt")
    assert meta["nltk"] == "3.6.4"
    pairs = list(zip(meta["hypotheses"], meta["references"]))
    f1 = torch.tensor([T.unigram_f1(h, r) for h, r in pairs], dtype=torch.float64)
    rouge = [T.rouge(h, r) for h, r in pairs]
    meteor = torch.tensor([T.meteor(h, r) for h, r in pairs], dtype=torch.float64)  # tokens="split"
    torch.testing.assert_close(f1, t["output.f1"], atol=1e-12, rtol=0)
    # the official `compute_rouge_score(prediction, reference)[...][0]` is the recall against the reference
    torch.testing.assert_close(torch.tensor([s["rouge1_recall"] for s in rouge], dtype=torch.float64),
                               t["output.rouge1_0"], atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.tensor([s["rougeL_recall"] for s in rouge], dtype=torch.float64),
                               t["output.rougeL_0"], atol=1e-12, rtol=0)
    # today's nltk on lower-cased white-space tokens = nltk 3.6.4 on the official raw strings
    torch.testing.assert_close(meteor, t["output.meteor"], atol=1e-12, rtol=0)

    treebank = torch.tensor([T.meteor(h, r, tokens="treebank") for h, r in pairs], dtype=torch.float64)
    assert (treebank - t["output.meteor"]).abs().max() > 100 * TOLERANCE
    assert abs(treebank.mean() - t["output.meteor"].mean()) > 100 * TOLERANCE


# --------------------------------------------------------------------------------------------------- responses
class _Tok:
    """Token ids written as numbers: the fixture's conversations are token ids already."""

    def __init__(self, special: dict[str, int]):
        self.special = special

    def encode(self, text: str) -> list[int]:
        return [int(x) for x in text.split()]

    def id(self, name: str) -> int:
        return self.special[name]


def _split(flat: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    return [x.tolist() for x in torch.split(flat, lengths.tolist())]


@pytest.fixture(scope="module")
def responses():
    t, meta = load_fixture(FIX / "responses.pt")
    gpt2_special = json.loads(meta["special"])
    # GPT-2's special ids (50257-50262) renamed to the ids right after the fixture's words, so that the sampled
    # distributions are 46 long, not 50,263 (a bijection: the protocol sees the same tokens)
    words = t["input.next_token_words"].numel()
    rename = {old: words + k for k, old in enumerate(gpt2_special.values())}
    for name, x in list(t.items()):
        if x.dtype == torch.long and not name.endswith(("_lengths", "_count", "pieces")):
            t[name] = x.cpu().apply_(lambda v: rename.get(v, v)).to(x.device)  # apply_ runs on CPU tensors only
    special = {name: rename[i] for name, i in gpt2_special.items()}
    tok = _Tok(special)
    convs, encs = [], []
    for i in range(meta["conversations"]):
        doc, *utts = _split(t[f"input.conversation.{i}"], t[f"input.conversation_lengths.{i}"])
        # the official alternates <speaker2>/<speaker1> by position; ours follows the user: give the users so
        speakers = [2 if k % 2 == 0 else 1 for k in range(len(utts))]
        conv = cmudog.Conversation(str(i), " ".join(map(str, doc)), [" ".join(map(str, u)) for u in utts], speakers)
        convs.append(conv)
        encs.append(D.encode_conversation(conv, tok))
    official = {name: _split(t[f"output.{name}"], t[f"output.{name}_lengths"])
                for name in ("context", "context_types", "reference", "generated")}
    official["pieces"] = _split(t["output.pieces"], t["output.pieces_count"])
    return SimpleNamespace(t=t, meta=meta, tok=tok, convs=convs, encs=encs, official=official, special=special)


def test_scored_responses_their_context_and_pieces_are_the_official(responses):
    r, m = responses, responses.meta
    # the official `--min_history 2` (`i >= min_length`) keeps responses with ≥ 3 previous utterances
    ex = D.response_examples(r.convs, r.encs, min_history=m["min_history"] + 1, context="official")
    assert len(ex) == len(r.official["context"])
    assert [e.context for e in ex] == r.official["context"]
    assert [e.context_types for e in ex] == r.official["context_types"]
    # DoGDataset_: pieces from the end, the last leaving max_length + 1 positions free
    last = m["max_len"] - m["max_length"] - 1
    assert [[b - a for a, b in D.pieces_from_end(len(e.context), m["max_len"], last=last)] for e in ex] \
        == r.official["pieces"]
    # the reference: the response's tokens but the last (`torch.cat(labels).tolist()[:-1]`)
    assert [r.tok.encode(e.reference)[:-1] for e in ex] == r.official["reference"]

    # our own protocol gives other responses, contexts and references
    assert len(D.response_examples(r.convs, r.encs, min_history=m["min_history"])) != len(ex)
    ours = D.response_examples(r.convs, r.encs, min_history=m["min_history"] + 1, context="preceding")
    assert [e.turn for e in ours] == [e.turn for e in ex]
    assert all(a.context != b.context for a, b in zip(ours, ex))
    assert [r.tok.encode(e.reference) for e in ex] != r.official["reference"]


class _TableModel:
    """The fixture's next-token table as a model: `hidden` carries the next token of each position; `logits`
    makes it one-hot, so that nucleus sampling is deterministic (as the official run's stand-in model)."""

    supports_memory = True

    def __init__(self, words: torch.Tensor, special: dict[str, int], special_next: torch.Tensor):
        self.next = {i: int(v) for i, v in enumerate(words)}
        self.next.update({tok_id: int(v) for tok_id, v in zip(special.values(), special_next)})
        self.vocab = max(special.values()) + 1
        self.typed: list[bool] = []

    def __call__(self, ids_BT, mems, *, types=None):
        self.typed.append(types is not None)
        return torch.tensor([[[float(self.next[int(x)])] for x in ids_BT[0]]]), mems

    def absorb(self, mems):
        return mems

    def logits(self, hidden_D):
        out = torch.full((self.vocab,), -1e4)
        out[int(hidden_D[0])] = 0.0
        return out


def _respond(r, example, **settings):
    from papers.infinity_former.dialogue_generation import GenerationSettings, respond

    g = GenerationSettings(max_tokens=r.meta["max_length"], **settings)
    model = _TableModel(r.t["input.next_token_words"], r.special, r.t["input.next_token_special"])
    stub = SimpleNamespace(generation=g, device=torch.device("cpu"), model=model)
    special = set(r.special.values())
    speakers = {r.special["<speaker1>"], r.special["<speaker2>"]}
    # the sets `dialogue_generation.generate_and_score` builds
    stop = special if g.stop_at_speaker else special - speakers
    out = respond(stub, example.context, example.context_types, stop=stop, banned=special,
                  generator=torch.Generator().manual_seed(0), block=r.meta["max_len"],
                  responder_type=example.context_types[-1])
    return out, model.typed


def test_generation_goes_on_past_speaker_tokens_as_the_official(responses):
    r, m = responses, responses.meta
    ex = D.response_examples(r.convs, r.encs, min_history=m["min_history"] + 1, context="official")
    official_settings = dict(stop_at_speaker=False, types_while_sampling=False, first_special="redraw")
    speakers = {r.special["<speaker1>"], r.special["<speaker2>"]}
    assert any(t in speakers for out in r.official["generated"] for t in out)  # the fixture exercises it
    differs = 0
    for e, official, pieces, typed in zip(ex, r.official["generated"], r.official["pieces"],
                                          r.t["output.typed_sampling"].tolist()):
        out, calls = _respond(r, e, **official_settings)
        assert out == official
        # the memory-filling pieces get token types, the sampling calls none (the official `sample_sequence`)
        assert calls[: len(pieces) - 1] == [True] * (len(pieces) - 1)
        assert any(calls[len(pieces) - 1 :]) == typed is False
        ours, _ = _respond(r, e, stop_at_speaker=True, types_while_sampling=False, first_special="redraw")
        differs += ours != official
    assert differs > 0  # stopping at a speaker token (ours) changes responses of this fixture


# -------------------------------------------------------------------------------------------------- perplexity
def test_perplexity_average_is_the_official_ignite_loss():
    t, meta = load_fixture(FIX / "perplexity.pt")
    acc = T.ConversationNLL(meta["max_len"])
    a = 0
    per_token_sum, per_token_n = 0.0, 0
    for length, positions in zip(t["output.lengths"].tolist(), t["output.positions"].tolist()):
        nll, scored = t["output.nll"][a : a + positions], t["output.scored"][a : a + positions]
        a += positions
        # ignite's `Loss` multiplies each conversation's mean by `len(y)`: all its label positions
        assert T.official_label_positions(length, meta["max_len"]) == positions
        acc.add(nll_sum=float(nll[scored].sum()), scored=int(scored.sum()), positions=length - 1)
        acc.close()
        per_token_sum, per_token_n = per_token_sum + float(nll[scored].sum()), per_token_n + int(scored.sum())
    weighted, weight, conversations = acc.totals()
    assert conversations == len(t["output.lengths"]) and a == t["output.nll"].numel()
    official = float(t["output.average_nll"])
    # the official cross-entropy ran in float32
    assert T.official_mean_nll(weighted, weight) == pytest.approx(official, abs=1e-6, rel=0)
    # our per-token average is another number
    assert abs(per_token_sum / per_token_n - official) > 100 * TOLERANCE


def test_eval_step_weights_each_conversation_by_the_official_label_positions():
    """`GPT2MemoryLM._eval_step` over our pieces (targets across the cuts) gives every conversation the weight the
    official `DoGDataset` + `inference` pass to ignite: L − ceil(L / block) for L tokens."""
    from papers.infinity_former.gpt2 import GPT2MemoryLM
    from repro.metrics.lm import TokenNLL

    block = 8
    lengths, scored_every = [30, 9, 17], 3
    encs = [D.Encoded(ids=list(range(n)), types=[0] * n, scored=[i % scored_every == 0 for i in range(n)],
                      starts=[], spans=[]) for n in lengths]
    chunks = [c for e in encs for c in D.conversation_chunks(e, block, train=False)]
    stub = SimpleNamespace(trainer=SimpleNamespace(datamodule=SimpleNamespace(block_size=block)),
                           settings=SimpleNamespace(n_positions=1024), nll_metrics={"test": TokenNLL()})
    # a stand-in NLL: 1 + the target id / 10, on the scored positions
    stub._run = lambda split, batch: ((1 + batch.target.clamp(min=0) / 10).float(), batch.target != D.IGNORE)
    for chunk in chunks:
        GPT2MemoryLM._eval_step(stub, "test", chunk)
    weighted, weight, conversations = stub.__dict__["_conversation_nll"].totals()
    expected_w, expected_sum = 0, 0.0
    for e, n in zip(encs, lengths):
        targets = [t for t, s in zip(e.ids[1:], e.scored[1:]) if s]
        positions = n - -(-n // block)
        expected_w += positions
        expected_sum += positions * sum(1 + t / 10 for t in targets) / len(targets)
    assert (weight, conversations) == (expected_w, len(lengths))
    assert weighted == pytest.approx(expected_sum, rel=1e-6)
    per_token = float(stub.nll_metrics["test"].compute()["mean_nll"])
    assert abs(weighted / weight - per_token) > 100 * TOLERANCE  # the two averages differ on this example
