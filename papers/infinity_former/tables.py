"""The ∞-former's sorting figures as tables and plots, ours beside the paper's qualitative statements.

Figure 3 of the paper prints no numbers (PAPERS.md §2: read them off the figure; none are quoted here), so the
paper column states what the paper says, and ours are the test accuracies of our runs:
- `fig3_left`: sorting accuracy vs sequence length for Transformer-XL, the compressive transformer, the ∞-former
  and the ∞-former with sticky memories (paper lengths 4000/8000/16000; small 128/256/512; tiny 256/512/1024);
- `fig3_right`: accuracy and regression error vs the number of basis functions at the middle length;
- `context_cost`: the cost-vs-context benchmark (`repro bench-context`), time and memory per segment;
- `table1`: perplexity of GPT-2 small fine-tuned on WikiText-103 and PG-19, plain, with a compressed memory and
  with the continuous LTM (linear and sticky); the tiny stand-in is a small random GPT-2 on the embedded corpus;
- `table2`: grounded dialogue on CMU-DoG (tiny: the generated dialogue set): perplexity, F1, ROUGE-1, ROUGE-L,
  METEOR, plus the ROUGE recall that the official script computed in place of the F-measure.
- `claims_small`: the small profile's pre-registered claims (`configs/infinity_former/small/claims.yaml`) decided
  by `repro.claims` from the seed records: Figure 3 left as the per-seed drop in accuracy from the shortest to the
  longest length, sticky memories at the longest length, Figure 3 right as N = 32 against N = 8.
- `deviations`: every place where we differ from the paper and the authors' code, with the reason, the measured
  effect and the test that pins it, from `papers/infinity_former/deviations.yaml` (the README embeds it).
Small-profile cells are means ± sample standard deviation over the seeds run (`<experiment>.seed<N>` records).
Plots (PNG) are written beside the tables.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from repro import claims
from repro.io import atomic_path
from repro.tables import Cell, Results, Table, bench_provenance, paper_cell, provenance, unlearned_cell

PAPER = "infinity_former"
PROFILES = ("tiny", "small", "paper")
# the small profile's pre-registered protocol; its runs are `<experiment>.seed<N>`
CLAIMS_SMALL = Path(__file__).resolve().parents[2] / "configs" / PAPER / "small" / "claims.yaml"
SEEDS = range(1, 10)  # seed records looked for in the small profile
MODELS = [("txl", "Transformer-XL"), ("compressive", "Compressive transformer"), ("infty", "∞-former"),
          ("infty_sticky", "∞-former (sticky memories)")]
# the small profile's registration 2 (claims.yaml): the ∞-former with 32 update samples (a fading memory)
MODELS_SMALL_2 = [("infty_m32", "∞-former, 32 samples (registration 2)"),
                  ("infty_sticky_m32", "∞-former (sticky), 32 samples (registration 2)")]
LENGTHS = {"paper": (4000, 8000, 16000), "small": (128, 256, 512), "tiny": (256, 512, 1024)}
BASIS = {"paper": (256, 512, 1024, 2048), "small": (8, 16, 32, 64), "tiny": (16, 32, 64, 128)}
DEFAULT_N = {"paper": 1024, "small": 32, "tiny": 64}
PAPER_LEFT = ("Paper (Fig. 3 left, no numbers printed): Transformer-XL is slightly better than the compressive "
              "transformer and the ∞-former at 4,000; its accuracy degrades rapidly as the length grows; the "
              "∞-former's decrease is the least significant.")
PAPER_RIGHT = ("Paper (Fig. 3 right, length 8,000): accuracy is negatively correlated with the regression error, "
               "which falls as the number of basis functions grows; with many basis functions the error plateaus "
               "and the accuracy starts to drop.")


def seed_values(results: Results, profile: str, exp: str, key: str, stage: str = "test") -> dict[int, float]:
    """{seed: value} of the `<exp>.seed<N>` records that hold `key`."""
    out = {}
    for s in SEEDS:
        rec = results.get(profile, f"{exp}.seed{s}", stage)
        if rec is not None and key in rec.get("metrics", {}):
            out[s] = float(rec["metrics"][key])
    return out


def seeds_cell(results: Results, profile: str, exp: str, key: str, *, fmt: str = "{:.3f}",
               stage: str = "test") -> Cell:
    """The mean over the seeds run (value, for verdict lines and plots) shown as mean ± sd (n); 'not run'."""
    unlearned = [r for s in SEEDS if (r := results.get(profile, f"{exp}.seed{s}", stage)) is not None
                 and r.get("did_not_learn")]
    if unlearned:  # a metric of a run that did not learn is never shown
        ran = [s for s in SEEDS if results.get(profile, f"{exp}.seed{s}", stage) is not None]
        return unlearned_cell(unlearned, of=len(ran))
    values = seed_values(results, profile, exp, key, stage)
    if not values:
        return Cell("not run", "ours")
    first = results.get(profile, f"{exp}.seed{min(values)}", stage)
    mean = statistics.fmean(values.values())
    spread = f" ± {fmt.format(statistics.stdev(values.values()))}" if len(values) > 1 else ""
    prov = provenance(first) + f" (seeds {', '.join(map(str, sorted(values)))}: same settings)"
    return SeedCell(mean, "ours", prov, fmt, text_=f"{fmt.format(mean)}{spread} (n = {len(values)})")


class SeedCell(Cell):
    """A numeric cell (its value is the mean) whose text is mean ± sd (n)."""

    def __init__(self, value, source, provenance_, fmt, *, text_: str):
        super().__init__(value, source, provenance_, fmt)
        self.text_ = text_

    def text(self) -> str:
        return self.text_


def _metric(results: Results, profile: str, exp: str, key: str, *, fmt: str = "{:.2f}") -> Cell:
    """A record's metric; in the small profile the mean over the seed records."""
    if profile == "small":
        return seeds_cell(results, profile, exp, key, fmt=fmt)
    return results.metric(profile, exp, "test", key, fmt=fmt)


def _acc(results: Results, profile: str, exp: str) -> Cell:
    return _metric(results, profile, exp, "test/acc", fmt="{:.3f}")


def _value(cell: Cell) -> float | None:
    return cell.value if isinstance(cell.value, float) else None


def verdict_left(acc: dict[str, dict[int, float | None]], lengths: tuple[int, ...]) -> str:
    """Our runs against the paper's three statements, each checked on the numbers (or 'not run')."""
    short, long_ = lengths[0], lengths[-1]
    need = ["txl", "compressive", "infty"]
    if any(acc[m].get(L) is None for m in need for L in (short, long_)):
        return "Our runs do not cover every model at the shortest and longest length yet: no verdict."
    txl_best = acc["txl"][short] >= max(acc["compressive"][short], acc["infty"][short])
    drops = {m: acc[m][short] - acc[m][long_] for m in need}
    txl_fastest = drops["txl"] >= max(drops["compressive"], drops["infty"])
    infty_least = drops["infty"] <= min(drops["txl"], drops["compressive"])

    def yes(b):
        return "yes" if b else "no"

    return (f"Ours: Transformer-XL best at {short}: {yes(txl_best)}; drop from {short} to {long_} — Transformer-XL "
            f"{drops['txl']:+.3f}, compressive {drops['compressive']:+.3f}, ∞-former {drops['infty']:+.3f}; "
            f"Transformer-XL degrades fastest: {yes(txl_fastest)}; ∞-former degrades least: {yes(infty_least)}.")


def fig3_left(results: Results) -> tuple[Table, dict]:
    rows, data = [], {}
    for profile in PROFILES:
        for key, label in MODELS + (MODELS_SMALL_2 if profile == "small" else []):
            cells = [_acc(results, profile, f"sort_{L}_{key}") for L in LENGTHS[profile]]
            data.setdefault(profile, {})[key] = {L: _value(c) for L, c in zip(LENGTHS[profile], cells)}
            rows.append([label, profile, *cells])
    notes = [PAPER_LEFT]
    for profile in PROFILES:
        notes.append(f"**{profile}** — {verdict_left(data[profile], LENGTHS[profile])}")
        if profile == "small":
            second = dict(data[profile], infty=data[profile]["infty_m32"])
            notes.append(f"**small, registration 2** (∞-former with 32 update samples) — "
                         f"{verdict_left(second, LENGTHS[profile])}")
    notes.append("Columns are the three lengths of each profile: paper 4000 / 8000 / 16000, small 128 / 256 / 512 "
                 "(divided by 32), tiny 256 / 512 / 1024 (divided by 16), see papers/infinity_former/README.md. "
                 "Accuracy = token accuracy on the 20 sorted output symbols of the test split; tiny and paper one "
                 "seed per cell, small the mean ± sd over its seeds (the verdict line above compares means; the "
                 "decided claims are in `claims_small.md`).")
    table = Table("fig3_left", "Sorting accuracy vs sequence length (Fig. 3 left)",
                  ["model", "profile", "short", "middle", "long"], rows, notes)
    return table, data


def fig3_right(results: Results) -> tuple[Table, dict]:
    rows, data = [], {}
    for profile in PROFILES:
        L = LENGTHS[profile][1]
        for n in BASIS[profile]:
            exp = f"sort_{L}_infty" if n == DEFAULT_N[profile] else f"sort_{L}_infty_n{n}"
            acc = _acc(results, profile, exp)
            err = _metric(results, profile, exp, "test/regression_error", fmt="{:.4f}")
            data.setdefault(profile, []).append((n, _value(acc), _value(err)))
            rows.append([profile, f"{L}", f"{n}", acc, err])
    notes = [PAPER_RIGHT,
             "Regression error (ours): relative squared error ‖X − Fᵀ B‖² / ‖X‖² of each LTM fit at the fitted "
             "positions (old samples and new vectors), averaged over the test split's updates and layers. The "
             "paper does not define its 'regression mean error'; its numbers are not comparable to ours."]
    return Table("fig3_right", "Accuracy and regression error vs number of basis functions (Fig. 3 right)",
                 ["profile", "length", "N", "accuracy", "regression error"], rows, notes), data


def context_cost(results: Results) -> tuple[Table | None, list[dict]]:
    rows_in = [{**r, "profile": profile} for profile in PROFILES
               for r in results.load_json_lines(f"runs/{profile}/bench_context.jsonl")]
    if not rows_in:
        return None, []
    rows = [[r["model"], r["profile"], f"{r['context']:,}",
             Cell(r["ms_per_segment"], "ours", bench_provenance(r, r.get("device", "")), "{:.1f}"),
             Cell(r["memory_state_mb"], "ours", bench_provenance(r, r.get("device", "")), "{:.2f}"),
             Cell(r.get("peak_mb"), "ours", bench_provenance(r, r.get("device", "")), "{:.1f}")] for r in rows_in]
    notes = ["`repro bench-context` (repro/bench_context.py): one segment's forward pass (evaluation, no gradient) "
             "after `context` tokens. Transformer-XL attends to all of them (memory = context); the ∞-former keeps "
             "an STM of fixed length and a continuous LTM of N basis functions that the whole context was folded "
             "into, so its time and memory per segment stay flat. memory state = the carried memory's size; peak = "
             "the peak of the tensors one segment's forward pass creates (attention scores and activations, counted "
             "by `repro.ops.memtrack.TensorPeak` on any device)."]
    return Table("context_cost", "Cost per segment vs context length", ["model", "profile", "context (tokens)",
                 "ms / segment", "memory state (MB)", "peak (MB)"], rows, notes), rows_in


def _plots(left: dict, right: dict, cost: list[dict], root: Path) -> None:
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    def save(fig, name):
        with atomic_path(root / PAPER / name) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        plt.close(fig)

    for profile, per_model in left.items():
        # the tiny and small plots are pipeline outputs: written (empty) before their runs exist
        if profile == "paper" and not any(v is not None for m in per_model.values() for v in m.values()):
            continue
        fig, ax = plt.subplots(figsize=(5, 3.4))
        for key, label in MODELS:
            pts = [(L, a) for L, a in per_model.get(key, {}).items() if a is not None]
            if pts:
                ax.plot(*zip(*pts), "o-", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(LENGTHS[profile], [str(x) for x in LENGTHS[profile]])
        ax.set_xlabel("sequence length")
        ax.set_ylabel("test accuracy (sorted tokens)")
        ax.set_title(f"Sorting, {profile} profile (ours)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        save(fig, f"fig3_left_{profile}.png")
    for profile, pts in right.items():
        pts = [p for p in pts if p[1] is not None]
        if not pts and profile == "paper":
            continue
        fig, ax = plt.subplots(figsize=(5, 3.4))
        ns, accs, errs = zip(*pts) if pts else ((), (), ())
        ax.plot(ns, accs, "o-", color="C0", label="accuracy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("basis functions N")
        ax.set_ylabel("accuracy", color="C0")
        if any(e is not None for e in errs):
            ax2 = ax.twinx()
            ax2.plot([n for n, e in zip(ns, errs) if e is not None], [e for e in errs if e is not None], "s--",
                     color="C3")
            ax2.set_ylabel("regression error", color="C3")
        if not pts:
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"Basis functions, {profile} profile (ours)")
        fig.tight_layout()
        save(fig, f"fig3_right_{profile}.png")
    if cost:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
        for model, profile in sorted({(r["model"], r["profile"]) for r in cost}):
            rs = sorted((r for r in cost if (r["model"], r["profile"]) == (model, profile)), key=lambda r: r["context"])
            model = f"{model} ({profile})"
            axes[0].plot([r["context"] for r in rs], [r["ms_per_segment"] for r in rs], "o-", label=model)
            axes[1].plot([r["context"] for r in rs], [r["memory_state_mb"] for r in rs], "o-", label=model)
            peaks = [(r["context"], r["peak_mb"]) for r in rs if r.get("peak_mb") is not None]
            if peaks:
                axes[2].plot(*zip(*peaks), "o-", label=model)
        for ax, ylabel in zip(axes, ("ms per segment", "carried memory (MB)", "peak of the segment's tensors (MB)")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
        fig.suptitle("Cost per segment as the context grows (ours)")
        fig.tight_layout()
        save(fig, "context_cost.png")


# ----------------------------------------------------------------------------------------- GPT-2 (Tables 1-2)
GPT2_MODELS = [("gpt2", "GPT-2"), ("compressive", "Compressive"), ("inftyformer", "∞-former"),
               ("inftyformer_sticky", "∞-former (sticky memories)")]
DIALOGUE_MODELS = [("nodoc", "GPT-2 w/o doc"), *GPT2_MODELS]
# Martins et al. 2022, Table 1 (perplexity; GPT-2 small fine-tuned): (WikiText-103, PG-19)
PAPER_TABLE1 = {"gpt2": (16.85, 33.44), "compressive": (16.87, 33.09), "inftyformer": (16.64, 32.61),
                "inftyformer_sticky": (16.61, 32.48)}
# Martins et al. 2022, Table 2 (CMU-DoG): PPL, F1, ROUGE-1, ROUGE-L, METEOR
PAPER_TABLE2 = {"nodoc": (19.43, 7.82, 12.18, 10.17, 6.10), "gpt2": (18.53, 8.64, 14.61, 12.03, 7.15),
                "compressive": (18.02, 8.78, 14.74, 12.14, 7.29), "inftyformer": (18.02, 8.92, 15.28, 12.51, 7.52),
                "inftyformer_sticky": (18.04, 9.01, 15.37, 12.56, 7.55)}
# PPL: the official average (eval.py's ignite `Loss`: each conversation's mean NLL weighted by all its label
# positions, document and speaker positions included), the quantity behind the paper's column; "per-token PPL":
# ours, Σ NLL / scored tokens (repro.metrics.text.ConversationNLL, repro.metrics.lm.TokenNLL)
DIALOGUE_METRICS = [("test/ppl_official", "PPL"), ("test/ppl", "per-token PPL"), ("test/f1", "F1"),
                    ("test/rouge1", "ROUGE-1"), ("test/rougeL", "ROUGE-L"), ("test/meteor", "METEOR"),
                    ("test/rouge1_recall", "ROUGE-1 recall"), ("test/rougeL_recall", "ROUGE-L recall"),
                    # the generated sets (tiny, small) mark each utterance's dialogue act: answers scored apart from
                    # the template questions (repro/text/dialogue_synthetic.py); CMU-DoG has no such marks
                    ("test/f1_answer", "F1 (answers)"), ("test/rougeL_answer", "ROUGE-L (answers)"),
                    ("test/meteor_answer", "METEOR (answers)"), ("test/f1_answer_early", "F1 (early-fact answers)"),
                    ("test/f1_answer_late", "F1 (late-fact answers)"), ("test/f1_question", "F1 (questions)")]
N_SCORED = 6  # the columns the claims check: the two perplexities (lower is better), F1, ROUGE-1/L, METEOR
PAPER_TABLE1_TEXT = ("Paper (§4.2): the ∞-former improves perplexity on both WikiText-103 and PG-19, more on PG-19; "
                     "the compressive memory improves only slightly, on PG-19.")
PAPER_TABLE2_TEXT = ("Paper (§4.3): keeping the document in memory (∞-former, compressive) improves every metric over "
                     "GPT-2; the compressive and the ∞-former reach about the same perplexity, the ∞-former better "
                     "F1 / ROUGE / METEOR; sticky memories slightly better still.")


def _better(a: float | None, b: float | None, *, lower: bool) -> str:
    if a is None or b is None:
        return "not run"
    return "yes" if (a < b if lower else a > b) else "no"


def table1(results: Results) -> Table:
    rows, tiny = [], {}
    for key, label in GPT2_MODELS:
        wt, pg = PAPER_TABLE1[key]
        ours_wt = results.metric("paper", f"gpt2_wt103_{key}", "test", "test/ppl")
        ours_pg = results.metric("paper", f"gpt2_pg19_{key}", "test", "test/ppl")
        ours_tiny = results.metric("tiny", f"gpt2_lm_{key}", "test", "test/ppl")
        ours_small = _metric(results, "small", f"gpt2_lm_{key}", "test/ppl")
        tiny[key] = _value(ours_tiny)
        rows.append([label, paper_cell(wt), paper_cell(pg), ours_wt, ours_pg, ours_tiny, ours_small])
    verdict = (f"**tiny** (one seed each; no seed spread measured, so small differences may be noise) — ∞-former "
               f"below GPT-2: {_better(tiny['inftyformer'], tiny['gpt2'], lower=True)}; sticky below GPT-2: "
               f"{_better(tiny['inftyformer_sticky'], tiny['gpt2'], lower=True)}; ∞-former below compressive: "
               f"{_better(tiny['inftyformer'], tiny['compressive'], lower=True)}; compressive below GPT-2: "
               f"{_better(tiny['compressive'], tiny['gpt2'], lower=True)}.")
    notes = [PAPER_TABLE1_TEXT, verdict,
             "Paper columns: Martins et al. 2022, Table 1 (ACL 2022 version). Ours, paper profile: "
             "`configs/infinity_former/paper/gpt2_{wt103,pg19}_*.yaml` (pretrained `gpt2`, blocks of 512 fed in "
             "order, batch 1). Tiny: a 2-layer random GPT-2 of width 64 with a locally trained 1,024-symbol BPE on "
             "the embedded corpus in ordered blocks of 64 tokens — a stand-in that exercises the same code, not "
             "WikiText-103 or PG-19; its perplexities are on another scale and not comparable to the paper's. "
             "Small: the same tiny stand-in run once (Table 1 is not a claim of the small profile)."]
    return Table("table1", "GPT-2 fine-tuned with memories: test perplexity (Table 1)",
                 ["model", "paper: WikiText-103", "paper: PG-19", "ours: WikiText-103 (paper profile)",
                  "ours: PG-19 (paper profile)", "ours: tiny (embedded corpus)", "ours: small (embedded corpus)"],
                 rows, notes)


def table2(results: Results) -> Table:
    rows, tiny = [], {}
    for key, label in DIALOGUE_MODELS:
        ppl, *scores = PAPER_TABLE2[key]
        rows.append([label, "paper", paper_cell(ppl), "—", *(paper_cell(v) for v in scores),
                     *("—" for _ in DIALOGUE_METRICS[len(scores) + 2:])])
        for profile in ("paper", "small", "tiny"):
            cells = [_metric(results, profile, f"gpt2_dog_{key}", m) for m, _ in DIALOGUE_METRICS]
            if profile == "tiny":
                tiny[key] = [_value(c) for c in cells]
            rows.append([label, f"ours ({profile})", *cells])

    def claim(name: str, i: int, a: str, b: str, lower: bool) -> str:
        return f"{name} {_better(tiny[a][i], tiny[b][i], lower=lower)}"

    checks, answer_checks = [], []
    answers = [i for i, (m, _) in enumerate(DIALOGUE_METRICS) if m.endswith("_answer")]
    for a, b in (("gpt2", "nodoc"), ("compressive", "gpt2"), ("inftyformer", "gpt2"), ("inftyformer", "compressive"),
                 ("inftyformer_sticky", "inftyformer")):
        parts = [claim(n, i, a, b, lower=(i < 2)) for i, (_, n) in enumerate(DIALOGUE_METRICS[:N_SCORED])]
        checks.append(f"{dict(DIALOGUE_MODELS)[a]} better than {dict(DIALOGUE_MODELS)[b]}: " + ", ".join(parts))
        parts = [claim(DIALOGUE_METRICS[i][1], i, a, b, lower=False) for i in answers]
        answer_checks.append(f"{dict(DIALOGUE_MODELS)[a]} better than {dict(DIALOGUE_MODELS)[b]}: "
                             + ", ".join(parts))
    notes = [PAPER_TABLE2_TEXT,
             "**tiny** (one seed each, one sample per response; no spread measured) — all responses: "
             + "; ".join(checks) + ". Answers only (the turns that need the document): " + "; ".join(answer_checks)
             + ".",
             "Paper rows: Martins et al. 2022, Table 2 (ACL 2022 version). Protocol of the official "
             "`document_grounded_generation/eval.py` (README \"Evaluation protocol (Table 2)\"): PPL = its "
             "average, each conversation's mean NLL over the response tokens weighted by all the conversation's "
             "label positions (document and speaker positions included: ignite `Loss`); ours beside it is the "
             "per-token PPL (Σ NLL / response tokens). F1 (SQuAD normalisation), ROUGE-1/ROUGE-L F-measure with "
             "stemming and METEOR (nltk, WordNet 3.0, lower-cased white-space tokens as nltk 3.6.4 made of the "
             "official raw strings) in percent, means over the test responses with ≥ 3 previous utterances, "
             "against the reference without its last token, generated by nucleus sampling (top-p 0.9, "
             "temperature 1, ≤ 50 tokens, seeded, not stopping at speaker tokens; paper profile: from the context "
             "eval.py built, the conversation but its last utterance). The official script swapped the arguments "
             "of its ROUGE call, "
             "so the quantity behind the paper's ROUGE columns is the recall of the generated response against the "
             "reference: we report that recall in the last two columns and the F-measure under ROUGE-1/ROUGE-L.",
             "Tiny and small: the project's generated grounded-dialogue set (`repro/text/dialogue_synthetic.py`): each "
             "conversation asks for an early fact of its document (out of the 64-token window when asked) and a late "
             "one (inside it); the answers are the values alone, scored apart from the template questions (the "
             "`(answers)` / `(questions)` columns; per fact: early / late). A 2-layer random GPT-2 of width 64, "
             "pieces of 64 tokens, one update per conversation; the paper profile's protocol except the context "
             "(each response after the utterances before it), responses ending at a speaker token (≤ 10 tokens) "
             "and token types kept while sampling. Tiny: 400 conversations, one seed; small: 3,000 conversations, "
             "mean ± sd over seeds (claims decided in `claims_small.md`). The generated responses are in "
             "`results/infinity_former/generations/<profile>/` (small: the last seed's)."]
    return Table("table2", "Document-grounded dialogue, CMU-DoG (Table 2)",
                 ["model", "source", *(n for _, n in DIALOGUE_METRICS)], rows, notes)


# --------------------------------------------------------------------------------- the small profile's claims
DROP = "test/acc drop"  # claims.yaml metric: accuracy at the shortest length minus accuracy at this experiment's


def claim_values(results: Results, claim: claims.Claim) -> tuple[list[float], list[float]]:
    """Per-seed values of a claim's two arms. `test/acc drop`: for each seed, the test accuracy of the same model
    at the profile's shortest length minus its accuracy at the claim's experiment (`sort_<L>_<model>`), so that
    each model is compared with itself (its seed-to-seed level cancels); other metrics: the record field."""
    if claim.metric != DROP:
        return claims.values_from_records(results, "small", claim)
    short = LENGTHS["small"][0]

    def drops(exp: str) -> list[float]:
        length, model = exp.split("_", 2)[1:]
        at_long = seed_values(results, "small", exp, "test/acc", claim.stage)
        at_short = seed_values(results, "small", f"sort_{short}_{model}", "test/acc", claim.stage)
        return [at_short[s] - at_long[s] for s in claim.seeds if s in at_long and s in at_short]

    return drops(claim.a), drops(claim.b)


def claims_small(results: Results) -> Table:
    verdicts = claims.verdicts(results, "small", CLAIMS_SMALL, values=lambda c: claim_values(results, c))
    table = claims.table("claims_small", "What the small profile shows: pre-registered claims (sorting, dialogue)",
                         verdicts, profile="small")
    table.notes.append(f"`{DROP}`: per seed, the model's test accuracy at length {LENGTHS['small'][0]} minus its "
                       "accuracy at the longer length named (lower is better: the model degrades less).")
    return table


# ------------------------------------------------------------------------------------------------- deviations
DEVIATIONS = Path(__file__).resolve().parent / "deviations.yaml"
DEVIATION_FIELDS = {"deviation": "deviation", "reference": "paper / authors' code", "ours": "ours", "why": "why",
                    "effect": "measured effect", "test": "test that pins it"}


def load_deviations(path: Path = DEVIATIONS) -> list[dict[str, str | list[str]]]:
    """The rows of `deviations.yaml`, each with exactly the fields of `DEVIATION_FIELDS` (`test`: one id or a list)."""
    rows = yaml.safe_load(path.read_text())
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a list of deviations, one mapping each")
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict) or set(row) != set(DEVIATION_FIELDS):
            got = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{path}: deviation {i} has the fields {got}; each needs exactly "
                             f"{sorted(DEVIATION_FIELDS)}")
        tests = row["test"] if isinstance(row["test"], list) else [row["test"]]
        if not all(isinstance(row[k], str) and row[k].strip() for k in DEVIATION_FIELDS if k != "test") or \
                not tests or not all(isinstance(t, str) and "::" in t for t in tests):
            raise ValueError(f"{path}: deviation {i} ({row.get('deviation')!r}) has an empty field or a test that is "
                             "not tests/<file>.py::<test>")
    return rows


def deviations(path: Path = DEVIATIONS) -> Table:
    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    rows = []
    for row in load_deviations(path):
        tests = row["test"] if isinstance(row["test"], list) else [row["test"]]
        rows.append([*(cell(row[k]) for k in DEVIATION_FIELDS if k != "test"), ", ".join(f"`{t}`" for t in tests)])
    notes = [(f"{len(rows)} deviations, from `papers/infinity_former/deviations.yaml` "
              "(`repro tables infinity_former`). An effect is a measured number with where it was measured "
              "(a committed table, a test's assertion, or an entry of `CHANGELOG.md` named in quotes), "
              "or \"not measured\".")]
    return Table("deviations", "∞-former — deviations from the paper and the authors' code",
                 list(DEVIATION_FIELDS.values()), rows, notes)


def build(results: Results) -> list[Table]:
    left_table, left = fig3_left(results)
    right_table, right = fig3_right(results)
    cost_table, cost = context_cost(results)
    _plots(left, right, cost, results.root)
    tables = [left_table, right_table, table1(results), table2(results), claims_small(results)]
    if cost_table is not None:
        tables.append(cost_table)
    return [*tables, deviations()]
