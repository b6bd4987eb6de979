"""LaMemo's tables: WikiText-103, enwik8 and text8 (paper column + ours), the tiny-profile comparison with
Transformer-XL over seeds, attention utilisation (table and plot) and cost (`repro bench`).

Paper numbers: the LaMemo paper's tables could not be read when this was written (../shared/TABLES-lamemo-mgk.md).
A second search found only the openings of stored copies (ar5iv 2204.07341, paper-listing and review
pages: title, authors, abstract), never the tables; ../shared/seeds holds only a Chinese summary of the method.
Enter them in `PAPER` below (test perplexity / bpc, parameters, with the table each comes from) and the tables show
them. Until then the paper column says "not transcribed". Nothing here is ever filled with a number of ours.

Run records (written by the DVC stages, see papers/lamemo/README.md):
- `runs/<profile>/<exp>.seed<N>.test.json`: test under LaMemo's protocol (training lengths, no same_length);
- `runs/<profile>/<exp>.seed<N>.txl_protocol.test.json`: test under Transformer-XL's (longer memory, same_length);
- `runs/<profile>/<exp>.seed<N>.utilisation.json`: `python -m papers.lamemo.utilisation`;
- `runs/<profile>/bench*.jsonl`: `repro bench` lines, train and eval, for both models at equal lengths.
The paper profile runs one seed (`seed1`); the small profile five (`configs/lamemo/small/claims.yaml`: its
pre-registered claims, decided by `repro.claims` in `claims_small.md`).

`deviations.md` is rendered from `papers/lamemo/deviations.yaml`: every difference from the paper and the authors'
code, with its reason, its measured effect and the test that pins it.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from papers.transformer_xl.tables import PAPER_PARAMS as TXL_PARAMS
from repro import claims
from repro.cli.commands import describe_configs
from repro.io import atomic_path
from repro.tables import Cell, Results, Table, bench_provenance, provenance

NAME = "lamemo"
SEEDS = (1, 2, 3)
SMALL_SEEDS = (1, 2, 3, 4, 5)
PROFILES = ("tiny", "small", "paper")
CLAIMS_SMALL = Path("configs/lamemo/small/claims.yaml")
DEVIATIONS = Path(__file__).with_name("deviations.yaml")
DEVIATION_FIELDS = ("deviation", "reference", "ours", "why", "effect", "test")
DEVIATIONS_NOTE = ("Rendered from `papers/lamemo/deviations.yaml`. Effects cite a test's assertion, the parity "
                   "fixtures (tests/parity/lamemo/) or CHANGELOG.md, which keeps each measurement with its machine "
                   "and date. Settings rows are the expected differences of "
                   "`tests/parity/test_settings_parity.py::test_lamemo_paper_config_equals_its_script`, which "
                   "compares every paper config with its released script flag by flag.")
NOT_TRANSCRIBED = "not transcribed"

# The paper's numbers, keyed by our experiment names: {"wt103_lamemo": {"test": <test ppl>, "params": <count>}, …}.
# Empty: the paper could not be read here. Type them in from the PDF (Tables 1-2 of arXiv 2204.07341).
PAPER: dict[str, dict[str, float]] = {}
PAPER_PARAMS = {exp: v["params"] for exp, v in PAPER.items() if "params" in v}  # read by `repro describe`

# Tiny experiments standing in for each paper table (the tiny profile has one character-level corpus).
DATASETS = {
    "wt103": ("WikiText-103", "test perplexity", "test/ppl", "word", "{:.2f}"),
    "enwik8": ("enwik8", "test bpc", "test/bpc", "char", "{:.3f}"),
    "text8": ("text8", "test bpc", "test/bpc", "char", "{:.3f}"),
}
MODELS = (("txl", "Transformer-XL (same memory)"), ("lamemo", "LaMemo"))
PROTOCOLS = (("", "LaMemo protocol"), (".txl_protocol", "Transformer-XL protocol"))


def seed_values(results: Results, profile: str, exp: str, key: str, suffix: str = "", seeds=SEEDS):
    """(values over the seeds that ran, their records)."""
    vals, recs = [], []
    for s in seeds:
        rec = results.get(profile, f"{exp}.seed{s}{suffix}", "test")
        if rec and key in rec.get("metrics", {}):
            vals.append(rec["metrics"][key])
            recs.append(rec)
    return vals, recs


def _mean_std(vals: list[float]) -> tuple[float, float]:
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def seeds_of(profile: str) -> tuple[int, ...]:
    return SMALL_SEEDS if profile == "small" else SEEDS


def seed_cell(results: Results, profile: str, exp: str, key: str, fmt: str, suffix: str = "") -> Cell:
    vals, recs = seed_values(results, profile, exp, key, suffix, seeds=seeds_of(profile))
    if not vals:
        return Cell("not run", "ours")
    mean, std = _mean_std(vals)
    text = (fmt.format(mean) + (" ± " + fmt.format(std) if len(vals) > 1 else "")) + f" (n={len(vals)})"
    prov = provenance(recs[0]).replace(recs[0].get("experiment", ""), f"{exp}.seed*{suffix}")
    return Cell(text, "ours", prov)


def dataset_table(results: Results, ds: str) -> Table:
    title, metric, key, tiny, fmt = DATASETS[ds]
    rows = []
    for kind, label in MODELS:
        exp = f"{ds}_{kind}"
        paper = PAPER.get(exp, {})
        row = [label, Cell(fmt.format(paper["test"]), "paper") if "test" in paper else Cell(NOT_TRANSCRIBED)]
        for suffix, _ in PROTOCOLS:
            row.append(seed_cell(results, "tiny", f"{tiny}_{kind}", key, fmt, suffix))
        for suffix, _ in PROTOCOLS:
            row.append(seed_cell(results, "small", f"{tiny}_{kind}", key, fmt, suffix))
        for suffix, _ in PROTOCOLS:
            row.append(seed_cell(results, "paper", exp, key, fmt, suffix))
        rows.append(row)
    cols = ["model", f"paper ({metric})"] + [f"ours: tiny `{tiny}_*`, {p}" for _, p in PROTOCOLS] + \
           [f"ours: small `{tiny}_*`, {p}" for _, p in PROTOCOLS] + [f"ours: paper profile, {p}" for _, p in PROTOCOLS]
    notes = [
        "Paper column: the LaMemo paper's numbers are not transcribed yet (enter them in papers/lamemo/tables.py).",
        "LaMemo protocol: the training segment and memory lengths, no clamp, no same_length (the official eval "
        "scripts). Transformer-XL protocol: shorter segments, a longer memory, clamped distances, same_length.",
        f"Tiny: 3 layers of width 128 on `embedded-{tiny}`, 300 steps of 16 × 32 tokens, memory 32, "
        "mean ± sample std over seeds; see `tiny_comparison.md` for whether the difference exceeds the noise.",
        "Small: the tiny character-level models trained for 3,000 steps, five seeds (no word-level small run); "
        "`claims_small.md` decides the comparison.",
    ]
    if ds == "text8":
        notes.append("The tiny profile has one character-level experiment (`char_*`): the same numbers as the "
                     "enwik8 table, not a separate text8 run.")
    return Table(ds, f"{title} — {metric}", cols, rows, notes)


def comparison(results: Results) -> Table:
    rows, verdicts = [], []
    for tiny, key, fmt, unit in (("char", "test/bpc", "{:.3f}", "bpc"), ("word", "test/ppl", "{:.2f}", "ppl")):
        for suffix, proto in PROTOCOLS:
            t_vals, _ = seed_values(results, "tiny", f"{tiny}_txl", key, suffix)
            l_vals, _ = seed_values(results, "tiny", f"{tiny}_lamemo", key, suffix)
            label = f"`embedded-{tiny}` ({unit}), {proto}"
            if not t_vals or not l_vals:
                rows.append([label, Cell("not run", "ours"), Cell("not run", "ours"), "—", "—"])
                continue
            (mt, st), (ml, sl) = _mean_std(t_vals), _mean_std(l_vals)
            diff = ml - mt
            exceeds = len(t_vals) > 1 and len(l_vals) > 1 and abs(diff) > st + sl
            better = "lower (better)" if diff < 0 else "higher (worse)"
            verdict = (f"LaMemo is {better} by {abs(diff):{fmt[2:-1]}}, "
                       + ("which exceeds the seed spread" if exceeds else "within the seed spread"))
            per_seed = ", ".join(fmt.format(v) for v in l_vals) + " vs " + ", ".join(fmt.format(v) for v in t_vals)
            rows.append([label, Cell(f"{fmt.format(mt)} ± {fmt.format(st)}", "ours"),
                         Cell(f"{fmt.format(ml)} ± {fmt.format(sl)}", "ours"),
                         Cell(f"{diff:+{fmt[2:-1]}}"), Cell(verdict)])
            verdicts.append(f"- {label}: {verdict} (seeds {', '.join(map(str, SEEDS))}; LaMemo {per_seed} TXL).")
    notes = ["Equal memory (32), segment length (32), steps (300), batch, optimiser and seeds; the only difference "
             "is the look-ahead memory (and its one extra bias of H × E = 128 parameters).",
             "The difference 'exceeds the seed spread' when |mean LaMemo − mean Transformer-XL| is larger than the "
             "sum of the two sample standard deviations over seeds; otherwise the tiny profile cannot tell the "
             "models apart. The paper's claim (lower perplexity/bpc at equal memory) is about 150k–250k-step runs of "
             "16- and 12-layer models; 300 steps of a 3-layer model test the mechanism, not the paper's numbers.",
             *verdicts]
    return Table("tiny_comparison", "Tiny profile: LaMemo against Transformer-XL at equal memory and steps "
                 "(mean ± std over seeds)",
                 ["corpus, protocol", "Transformer-XL", "LaMemo", "Δ (LaMemo − TXL)", "verdict"], rows, notes)


def _utilisation(results: Results, tiny: str, kind: str, profile: str = "tiny") -> list[dict]:
    out = []
    for s in seeds_of(profile):
        rec = results.get(profile, f"{tiny}_{kind}.seed{s}", "utilisation")
        if rec:
            out.append(rec["utilisation"])
    return out


def far_mass(u: dict) -> float:
    """Mean attention per key at distances of one segment or more (d ≥ tgt_len: the oldest memory positions)."""
    d = u["mass_by_distance"][u["tgt_len"]:]
    return sum(d) / max(1, len(d))


def utilisation_table(results: Results) -> Table:
    rows, verdicts = [], []
    for profile, tiny in (("tiny", "char"), ("tiny", "word"), ("small", "char")):
        for kind, label in MODELS:
            us = _utilisation(results, tiny, kind, profile)
            if not us:
                rows.append([profile, f"`embedded-{tiny}`", label, Cell("not run", "ours"), "—", "—"])
                continue
            m, s = _mean_std([u["memory_mass"] for u in us])
            fm, fs = _mean_std([far_mass(u) for u in us])
            layers = [statistics.fmean(col) for col in zip(*(u["memory_mass_per_layer"] for u in us))]
            if kind == "lamemo" and profile == "tiny":
                base = _utilisation(results, tiny, "txl")
                if base:
                    bm, bs = _mean_std([u["memory_mass"] for u in base])
                    exceeds = len(us) > 1 and len(base) > 1 and abs(m - bm) > s + bs
                    verdicts.append(f"- tiny, `embedded-{tiny}`: LaMemo puts {m:.3f} of its attention on the memory, "
                                    f"Transformer-XL {bm:.3f}: a difference of {m - bm:+.3f}, "
                                    + ("which exceeds the seed spread." if exceeds else "within the seed spread."))
            rows.append([profile, f"`embedded-{tiny}`", label, Cell(f"{m:.3f} ± {s:.3f} (n={len(us)})", "ours"),
                         Cell(f"{fm:.4f} ± {fs:.4f}", "ours"), ", ".join(f"{x:.3f}" for x in layers)])
    verdicts.append("- small, `embedded-char`: decided over five seeds in `claims_small.md` (Welch t intervals).")
    return Table("utilisation", "Attention utilisation of the memory (tiny and small profiles, trained checkpoints)",
                 ["profile", "corpus", "model", "attention mass on memory (mean over queries)",
                  "mean attention per key at distance ≥ one segment", "mass on memory per layer (1 → L)"],
                 rows, ["Validation split, LaMemo protocol (memory 32, segments 32), segments with a full memory; "
                        "mean ± std over seeds. `utilisation_tiny.png` plots the attention per key against the "
                        "distance. A Transformer-XL checkpoint is analysed through LaMemo with look-ahead off, "
                        "which is the same model weight for weight. The paper's claim: LaMemo's memory is attended "
                        "more, also at long distances. A difference 'exceeds the seed spread' when it is larger than "
                        "the sum of the two standard deviations over seeds.", *verdicts])


def plot_utilisation(results: Results, out: Path) -> Path | None:
    data = {(tiny, kind): _utilisation(results, tiny, kind) for tiny in ("char", "word") for kind, _ in MODELS}
    if not any(data.values()):
        return None
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, tiny in zip(axes, ("char", "word")):
        for kind, label in MODELS:
            us = data[(tiny, kind)]
            if not us:
                continue
            n = min(len(u["mass_by_distance"]) for u in us)
            mean = [statistics.fmean(u["mass_by_distance"][d] for u in us) for d in range(n)]
            ax.plot(range(n), mean, label=f"{label} (n={len(us)})")
            ax.axvline(us[0]["tgt_len"], color="grey", lw=0.5, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("distance to the key (tokens); dotted: one segment")
        ax.set_ylabel("mean attention per key")
        ax.set_title(f"embedded-{tiny}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()

    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return out


def cost_table(results: Results) -> Table:
    rows = []
    for profile in PROFILES:
        lines = [r for f in sorted((results.root / NAME / "runs" / profile).glob("bench*.jsonl"))
                 for r in results.load_json_lines(f"runs/{profile}/{f.name}")]
        by = {}
        for r in lines:
            name = " + ".join([Path(r["config"][0]).stem, *(Path(c).name for c in r["config"][1:])])
            by[(name, r["mode"])] = r
        for (name, mode), r in sorted(by.items()):
            prov = bench_provenance(r, f"this repository, `repro bench --mode {mode}` on {', '.join(r['config'])}: "
                    f"{r['parameters']:,} parameters, {r['device']}, precision {r['precision']}, "
                    f"batch {r['batch_size']} × {r['tgt_len']} tokens, memory {r['memory']['mem_len']}, "
                    f"median of {r['steps']} steps after {r['warmup']} warm-up")
            base = by.get((name.replace("_lamemo", "_txl"), mode)) if "_lamemo" in name else None
            ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}× TXL" if base else "—"
            rows.append([profile, name, mode, Cell(r["tokens_per_s"], "ours", prov, "{:,.0f}"),
                         Cell(r["peak_memory_mb"], "ours", prov, "{:,.0f}"), ratio])
    if not rows:
        rows.append(["—", "—", "—", Cell("not run", "ours"), Cell("not run", "ours"), "—"])
    return Table("cost", "Cost of look-ahead memory: tokens/s and peak memory at equal lengths (`repro bench`)",
                 ["profile", "config", "mode", "tokens/s", "peak memory (MB)", "speed relative to TXL"], rows,
                 ["Train: forward, backward, clipping and an Adam step per segment with the training memory. Eval: "
                  "forward with the evaluation memory after a first pass that fills it (LaMemo's protocol, or "
                  "Transformer-XL's for rows with `.eval.yaml`); "
                  "Transformer-XL evaluates with its key/value memory, LaMemo cannot (its memory is refreshed every "
                  "segment). CPU timings on a machine shared with other jobs are noisy. On the CPU the peak memory "
                  "is the process's peak resident size (Python and data "
                  "included), so small differences are not the models'."])


def params_table(rows: list[dict]) -> Table:
    base = {"wt103": "wt103_base", "enwik8": "enwik8_12l", "text8": "enwik8_12l"}
    out = []
    for r in rows:
        ds = r["experiment"].split("_")[0]
        txl = TXL_PARAMS[base[ds]]
        paper = PAPER_PARAMS.get(r["experiment"])
        out.append([r["experiment"], Cell(f"{r['parameters'] / 1e6:.2f}M", "ours"),
                    Cell(f"{paper / 1e6:.0f}M" if paper else NOT_TRANSCRIBED),
                    Cell(f"{txl / 1e6:.0f}M (Transformer-XL paper, {base[ds]})")])
    return Table("params", "Parameter counts of the paper configs (`repro describe`)",
                 ["experiment", "ours", "LaMemo paper", "base model"], out,
                 ["LaMemo adds one (heads × head width) future position bias to Transformer-XL's base models."])


def deviations_table(path: Path = DEVIATIONS) -> Table:
    """One row per entry of `deviations.yaml`, its fields in `DEVIATION_FIELDS` order (an entry missing a field or
    with one more, or a value with a '|', is refused)."""
    rows = []
    for i, entry in enumerate(yaml.safe_load(path.read_text())):
        if set(entry) != set(DEVIATION_FIELDS):
            raise ValueError(f"{path}: entry {i + 1} ({entry.get('deviation', '?')}) has the fields {sorted(entry)}, "
                             f"not {list(DEVIATION_FIELDS)}")
        if any("|" in str(v) for v in entry.values()):
            raise ValueError(f"{path}: entry {i + 1} ({entry['deviation']}) has a '|', "
                             "which would split its table cell")
        rows.append([str(entry[f]) for f in DEVIATION_FIELDS[:-1]] + [f"`{entry['test']}`"])
    return Table("deviations", "LaMemo — deviations from the paper and the authors' code",
                 ["deviation", "paper / authors' code", "ours", "why", "measured effect", "test"], rows,
                 [DEVIATIONS_NOTE])


def build(results: Results) -> list[Table]:
    cfgs = sorted(str(p) for p in Path("configs/lamemo/paper").glob("*.yaml") if ".eval." not in p.name)
    tables = [dataset_table(results, ds) for ds in DATASETS]
    tables += [comparison(results), utilisation_table(results), cost_table(results),
               params_table(describe_configs(cfgs))]
    tables.append(claims_table(results))
    tables.append(deviations_table())
    plot_utilisation(results, results.root / NAME / "utilisation_tiny.png")
    return tables


def claim_values(results: Results, profile: str):
    """`repro.claims` values for this paper's claims: a record field (`stage: test`), the same under Transformer-XL's
    protocol (`stage: txl_protocol.test`: records `<exp>.seed<N>.txl_protocol`), or a statistic of the utilisation
    analysis (`stage: utilisation`: `memory_mass`, or `far_mass` as in the utilisation table)."""
    def arm(claim, exp: str) -> list[float]:
        out = []
        for s in claim.seeds:
            if claim.stage == "utilisation":
                rec = results.get(profile, f"{exp}.seed{s}", "utilisation")
                if rec is not None:
                    u = rec["utilisation"]
                    out.append(far_mass(u) if claim.metric == "far_mass" else float(u[claim.metric]))
                continue
            suffix, _, stage = claim.stage.rpartition(".")
            rec = results.get(profile, f"{exp}.seed{s}" + (f".{suffix}" if suffix else ""), stage)
            if rec is not None and claim.metric in rec.get("metrics", {}):
                out.append(float(rec["metrics"][claim.metric]))
        return out

    return lambda claim: (arm(claim, claim.a), arm(claim, claim.b))


def claims_table(results: Results) -> Table:
    found = claims.verdicts(results, "small", CLAIMS_SMALL, values=claim_values(results, "small"))
    return claims.table("claims_small", "LaMemo — pre-registered claims of the small profile", found, profile="small")
