"""Response generation and its scores for the ∞-former's grounded-dialogue test (Table 2 of Martins et al. 2022).

`GenerationSettings` (the model's `generation` argument), `respond` (nucleus-sample one response after its context,
with the memory filled by the context's earlier pieces) and `generate_and_score` (every test response, gathered
over DDP ranks, scored with F1 / ROUGE / METEOR and written as JSONL). They take the LightningModule
(`papers.infinity_former.gpt2.GPT2MemoryLM`, which keeps thin `respond` / `_generate_and_score` methods calling them)
as their first argument and read its `generation`, `model`, `device` and `trainer`.

Follows the official `document_grounded_generation/eval.py` (`sample_sequence`, the response loop, the text
cleaning and the metrics); our protocol differs where `GenerationSettings` says so, and each official behaviour is
an option the paper configs set (README "Evaluation protocol (Table 2)"): stopping at a speaker token, token types
while sampling, the trimmed reference, how the first token avoids the special tokens, the memory's reset before a
three-piece context's response. Unlike the official loop, every response draws from its own generator (seeded by
`generation.seed` and its index), so responses do not depend on the number of DDP ranks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from repro.generate_text import SamplingSettings, nucleus_mask, sample_token
from repro.io import atomic_write_text
from repro.metrics.text import corpus_scores, scores_by_act, wordnet
from repro.text.dialogue_synthetic import utterance_acts


@dataclass(frozen=True)
class GenerationSettings:
    """Dialogue decoding at test time (PAPERS.md §2): nucleus sampling, scored with F1 / ROUGE / METEOR.

    The last four fields choose between our protocol and the official `eval.py`'s (the paper configs set the
    official one; README "Evaluation protocol (Table 2)")."""

    enabled: bool = False
    top_p: float = 0.9
    temperature: float = 1.0
    max_tokens: int = 50
    seed: int = 0
    meteor: bool = True  # requires WordNet; the run stops with instructions when it is missing
    output: str | None = None  # JSONL of the generated responses (also logged to MLflow)
    # "split": lower-case + white space, what nltk 3.6.4 did to the official raw strings; "treebank": ours
    meteor_tokens: Literal["split", "treebank"] = "split"
    # False: the official `sample_sequence` stops only at <bos>/<eos>/<doc>/<pad>; a drawn speaker token is kept,
    # generation goes on (into the next turn), and the speaker tokens are removed from the text
    stop_at_speaker: bool = True
    # True: the official reference is the response's tokens but the last (`torch.cat(labels).tolist()[:-1]`);
    # its data has no end marker there, so a real token (mostly the final punctuation) is dropped
    trim_reference: bool = False
    # False: the official sampling loop runs the last piece and the drawn tokens without token-type ids (only the
    # earlier, memory-filling pieces get them); True: every position gets its type, as in training
    types_while_sampling: bool = True
    # how the first token avoids the special tokens (`min_length = 1`): "ban" removes them from its distribution;
    # "redraw" is the official loop: draw again while special, at most 10 times, and keep a special token after
    # that or when the nucleus holds it alone (a kept speaker token is stripped from the text, another one ends
    # the response empty)
    first_special: Literal["ban", "redraw"] = "ban"
    # True: the official `sample_sequence`'s memory: it passes `new_doc=True` at the first drawn token when its
    # context loop ended at i ≤ 1, which empties the long-term memory before it takes in the last context piece
    # fed; with three pieces the memory then holds only the second (the document's start is gone), with two it
    # holds the first (as ours), with more all of them (as ours). False: every earlier piece stays in memory
    official_memory_reset: bool = False

    def __post_init__(self):
        if self.first_special not in ("ban", "redraw"):
            raise ValueError(f"generation.first_special is 'ban' or 'redraw' (official), got {self.first_special!r}")
        if self.meteor_tokens not in ("split", "treebank"):
            raise ValueError(f"generation.meteor_tokens is 'split' (official) or 'treebank', "
                             f"got {self.meteor_tokens!r}")


@torch.no_grad()
def respond(lm, context: list[int], types: list[int], *, stop: set[int], generator: torch.Generator,
            block: int, responder_type: int, banned: set[int] | None = None) -> list[int]:
    """Nucleus-sample a response after `context` (ours ends with the responder's speaker token).

    As the official `sample_sequence`: the context is cut from the end into pieces, the last one leaving room
    for `max_tokens` new tokens; the earlier pieces go through the model in order to fill its memory (skipped
    for a model without memory: they cannot affect it), then each new token is drawn from the model run on
    the last piece plus the tokens drawn so far, with the memory as it was after the earlier pieces.
    Generation ends at a token of `stop` (not kept) or after `max_tokens`; the first token avoids `banned`
    (default: `stop`) as `generation.first_special` says (the official `min_length = 1` re-draws). Without
    `generation.types_while_sampling` the last piece and the drawn tokens get no token-type ids (official)."""
    from repro.text.dialogue import pieces_from_end  # heavy: Lightning

    g = lm.generation
    settings = SamplingSettings(top_p=g.top_p, temperature=g.temperature, max_tokens=g.max_tokens)
    dev = lm.device
    ids = torch.tensor(context, dtype=torch.long, device=dev)
    typ = torch.tensor(types, dtype=torch.long, device=dev)
    spans = pieces_from_end(len(context), block, last=max(1, block - g.max_tokens - 1))
    mems = None
    if lm.model.supports_memory:
        # sticky memories draw their sample points from torch's global generator: seed it from `generator`
        # for this response only, so that a response depends on its seed alone
        with torch.random.fork_rng(devices=[lm.device] if lm.device.type == "cuda" else []):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device)))
            for a, b in spans[:-1]:
                _, mems = lm.model(ids[None, a:b], mems, types=typ[None, a:b])
            if g.official_memory_reset and len(spans) == 3:
                mems = lm.model.forget(mems)  # the official new_doc: only the second piece stays (see the setting)
            mems = lm.model.absorb(mems)  # refit once, not at every drawn token
    a, b = spans[-1]

    def next_logits(generated: list[int]) -> torch.Tensor:
        extra = torch.tensor(generated, dtype=torch.long, device=dev)
        inp = torch.cat([ids[a:b], extra])[None]
        tt = None
        if g.types_while_sampling:
            tt = torch.cat([typ[a:b], torch.full_like(extra, responder_type)])[None]
        hidden, _ = lm.model(inp, mems, types=tt)
        return lm.model.logits(hidden[0, -1]).float()

    first_banned = stop if banned is None else banned
    out: list[int] = []
    for step in range(g.max_tokens):
        logits = next_logits(out)
        if step == 0 and g.first_special == "redraw":
            token = sample_token(logits, settings, generator)
            alone = int(nucleus_mask(logits.float() / g.temperature, g.top_p).sum()) == 1  # probs.max() == 1
            redraws = 0
            while token in first_banned and not alone and redraws < 10:
                token = sample_token(logits, settings, generator)
                redraws += 1
        else:
            token = sample_token(logits, settings, generator, banned=first_banned if step == 0 else ())
        if token in stop:
            break
        out.append(token)
    return out


def generate_and_score(lm) -> None:
    """Sample every response of the test split (`dm.response_examples("test")`; each rank takes every world-th),
    gather them on every rank, log `test/<metric>` and `test/responses`, keep the rows in `lm.generated` and write
    them to `generation.output` (rank 0)."""
    dm = lm.trainer.datamodule
    if not hasattr(dm, "response_examples"):
        raise ValueError("generation.enabled needs a dialogue data module (repro.text.dialogue)")
    if lm.generation.meteor:
        wordnet()  # stops here, with instructions, before any sampling when WordNet is missing
    tok = dm.tokenizer
    examples = dm.response_examples("test")
    rank, world = lm.trainer.global_rank, lm.trainer.world_size
    g = lm.generation
    special = {tok.id(t) for t in ("<bos>", "<eos>", "<doc>", "<speaker1>", "<speaker2>", "<pad>")}
    speakers = {tok.id("<speaker1>"), tok.id("<speaker2>")}
    # the official `sample_sequence` breaks on a special token other than the two speakers
    stop = special if g.stop_at_speaker else special - speakers
    rows = []
    for k in range(rank, len(examples), world):
        ex = examples[k]
        gen = torch.Generator().manual_seed(g.seed * 1_000_003 + k)  # per example: DDP-invariant
        out = lm.respond(ex.context, ex.context_types, stop=stop, banned=special, generator=gen,
                          block=dm.block_size, responder_type=ex.context_types[-1])
        # the official text drops the speaker tokens (`.replace('<speaker1>', '')...`)
        prediction = tok.decode([t for t in out if t not in speakers])
        reference = tok.decode(tok.encode(ex.reference)[:-1]) if g.trim_reference else ex.reference
        rows.append({"index": k, "conversation": ex.conversation, "turn": ex.turn,
                     "prediction": prediction, "reference": reference})
    if world > 1 and dist.is_available() and dist.is_initialized():
        parts: list = [None] * world
        dist.all_gather_object(parts, rows)
        rows = sorted((r for p in parts for r in p), key=lambda r: r["index"])
    lm.generated = rows
    scores = corpus_scores([r["prediction"] for r in rows], [r["reference"] for r in rows],
                           with_meteor=g.meteor, meteor_tokens=g.meteor_tokens)
    # a set whose utterances carry their dialogue act (the generated one) is also scored per act: the answers
    # that need the document apart from the templates (`test/<metric>_answer`, ..._answer_early, ...)
    acts = utterance_acts(dm.data_root(), "test")
    if acts:
        for r in rows:
            r["act"] = acts.get((r["conversation"], r["turn"]))
        scores.update(scores_by_act([r["prediction"] for r in rows], [r["reference"] for r in rows],
                                    [r["act"] for r in rows], with_meteor=g.meteor, meteor_tokens=g.meteor_tokens))
    for name, value in scores.items():
        lm.log(f"test/{name}", float(value), sync_dist=False)
    lm.log("test/responses", float(len(rows)), sync_dist=False)
    if rank == 0 and lm.generation.output:
        atomic_write_text(lm.generation.output, "".join(json.dumps(r) + "\n" for r in rows))
        lg = lm.logger
        if lg is not None and hasattr(lg, "run_id") and hasattr(lg.experiment, "log_artifact"):
            lg.experiment.log_artifact(lg.run_id, lm.generation.output)
