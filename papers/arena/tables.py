"""The memory arena's tables: per profile, one row per contestant — its memory mechanisms, size, training compute,
speed, memory and test loss, the loss at each evaluation memory length — and a figure of the test loss against the
training FLOPs per token with the Pareto front marked.

Follows `papers/lamemo/tables.py` (cells carry their records' provenance as footnotes; seeds are the experiments
`EXP.seedN` of `repro runs` specs `CONFIG@N`, shown as mean ± sample std with their count; a plot written by
`build` beside the tables) and `repro/tables.py` (`build(results) -> list[Table]`, written by `repro tables arena`).
Differs in where it writes: one folder per profile, `results/arena/<profile>/arena.md`, `.csv` and `pareto.png`
(the table is named `<profile>/arena`), since every profile has the same contestants. A profile whose configs are
named by corpus (the paper profile: `enwik8_NAME`, `wt103_NAME`) gets one table and one figure per corpus,
`arena_<corpus>.md` and `pareto_<corpus>.png`: bpc and perplexity do not share a column.

Run records, under `results/arena/runs/<profile>/<group>/` (`repro runs --paper arena … --tests train --after
papers.arena.measure`):
- `EXP.test.json`: `repro test` with the training config (the test loss at the training memory; `model.mechanisms`);
- `EXP.arena.json`: `papers.arena.measure` (parameters, FLOPs, tokens/s, peak memory, `loss_by_context`).
Contestants are the configs of `configs/arena/<profile>/` (a config that has not run shows "not run") and every
experiment with a record.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from repro import claims
from repro.io import atomic_path
from repro.tables import REHEARSAL, Cell, Results, Table, provenance, unlearned_cell

NAME = "arena"
CONFIGS = Path("configs/arena")
# the contestants in the order of the papers that introduced them; others follow by name
ORDER = ("vanilla", "txl", "compressive", "infinity", "infinity_sticky", "lamemo", "mgk", "lamemo_infinity",
         "mgk_lamemo")
# what each profile holds equal between the contestants
BUDGETS = {"tiny": "same backbone", "small": "same backbone", "paper": "same backbone"}
# the long-range probe: contestant NAME on the ∞-former's sorting task is the experiment `sort_NAME`
PROBE = "sort_"
# a contestant at Transformer-XL's FLOPs per token: configs NAME_eqflops.yaml and results/arena/budget/<profile>.json,
# written by `repro arena-budget` (papers/arena/budget.py)
EQFLOPS = "_eqflops"
SEED = re.compile(r"^(?P<base>.+)\.seed(?P<seed>\d+)$")


def split_seed(experiment: str) -> tuple[str, int | None]:
    """`char_txl.seed2` → (`char_txl`, 2); an experiment without seed → (itself, None)."""
    m = SEED.match(experiment)
    return (m["base"], int(m["seed"])) if m else (experiment, None)


# ----------------------------------------------------------------------------------------------- the records
@dataclass
class Contestant:
    """The records of one contestant in one profile, by seed (None: a run without seed)."""

    name: str
    arena: dict[int | None, dict]
    test: dict[int | None, dict]
    probe: dict[int | None, dict] | None = None  # test records of the sorting probe

    @property
    def seeds(self) -> int:
        return len(set(self.arena) | set(self.test))

    def model(self) -> dict:
        """The model summary of a record (`model` of a test record, else the arena record's fields)."""
        for rec in [*self.test.values(), *self.arena.values()]:
            if "model" in rec:
                return rec["model"]
            if "mechanisms" in rec:
                return {"mechanisms": rec["mechanisms"], "mem_len": rec.get("mem_len", 0), "eval": rec.get("eval")}
        return {}


def profiles(results: Results) -> list[str]:
    """The profiles that hold records of this paper."""
    return sorted({profile for profile, _, _ in results.records})


def _configs(profile: str, configs: Path) -> list[Path]:
    return [p for p in sorted((configs / profile).glob("*.yaml"))
            if ".eval." not in p.name and not p.stem.startswith(PROBE) and p.stem != "claims"]


def corpora(profile: str, configs: Path = CONFIGS) -> list[str]:
    """The name prefixes that split a profile into one table per corpus: `["enwik8_", "wt103_"]` where every
    contestant's config is named `<its corpus>_NAME` (the paper profile), else `[""]` (one table)."""
    found = set()
    for p in _configs(profile, configs):
        corpus = (yaml.safe_load(p.read_text()).get("data") or {}).get("init_args", {}).get("corpus")
        if not corpus or not p.stem.startswith(f"{corpus}_"):
            return [""]
        found.add(f"{corpus}_")
    return sorted(found) or [""]


def contestants(results: Results, profile: str, configs: Path = CONFIGS, prefix: str = "") -> list[Contestant]:
    """Every contestant of `profile` (whose name starts with `prefix`): the configs of `configs/<profile>/` and the
    experiments with records."""
    found: dict[str, Contestant] = {}
    for p in _configs(profile, configs):
        if p.stem.startswith(prefix):
            found[p.stem] = Contestant(p.stem, {}, {}, {})
    probes = []
    for (prof, exp, stage), rec in results.records.items():
        if prof != profile or stage not in ("arena", "test") or not exp.removeprefix(PROBE).startswith(prefix):
            continue
        base, seed = split_seed(exp)
        if base.startswith(PROBE):
            probes.append((base[len(PROBE):], seed, stage, rec))
            continue
        c = found.setdefault(base, Contestant(base, {}, {}, {}))
        getattr(c, stage)[seed] = rec
    for base, seed, stage, rec in probes:
        if stage == "test":
            found.setdefault(base, Contestant(base, {}, {}, {})).probe[seed] = rec
    rank = {name: i for i, name in enumerate(ORDER)}

    def key(c):
        base = c.name.removesuffix(EQFLOPS).removeprefix(prefix)
        return (c.name != c.name.removesuffix(EQFLOPS), rank.get(base, len(ORDER)), base)

    return sorted(found.values(), key=key)


def _mechanism(entry: dict) -> str:
    kw = {k: v for k, v in entry.items() if k not in ("name", "module")}
    name = entry.get("name")
    if name == "compressive":
        return f"compressed memory ({kw.get('cmem_len', '?')} slots, rate {kw.get('rate', '?')})"
    if name == "ltm":
        sticky = ", sticky" if kw.get("sampling") == "sticky" else ""
        return f"continuous long-term memory ({kw.get('n_basis', '?')} basis functions{sticky})"
    if name == "look_ahead":
        return f"look-ahead memory ({kw.get('variant', 'disentangled')})"
    return f"{name} ({', '.join(f'{k}={v}' for k, v in kw.items())})" if kw else str(name)


def describe_mechanisms(model: dict) -> str:
    """The memory of a contestant in words, from a record's `model` (`mechanisms`, `mem_len`, `eval`)."""
    if not model:
        return "—"
    mem = model.get("mem_len", 0)
    sliding = (model.get("eval") or {}).get("protocol") == "sliding"
    parts = [f"short memory {mem}" if mem else ("none (sliding-window evaluation)" if sliding else "none")]
    parts += [_mechanism(e) for e in model.get("mechanisms") or []]
    score = model.get("score")
    if score:
        parts.append(f"MGK keys ({score.get('n_components', 2)} components, half the heads)")
    return " + ".join(parts)


# -------------------------------------------------------------------------------------------------- cells
def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def arena_provenance(rec: dict) -> str:
    """The footnote of a number of `papers.arena.measure`."""
    p = rec.get("provenance", {})
    t = rec.get("timing", {})
    return ((REHEARSAL if rec.get("rehearsal") else "")
            + f"this repository, profile `{rec.get('profile')}`, `{rec.get('experiment')}` measured by "
            f"`papers.arena.measure` from checkpoint {p.get('checkpoint')}: FLOPs of one training step at full memory "
            f"(matrix products, forward and backward), tokens/s of {t.get('steps')} steps after {t.get('warmup')} "
            f"warm-up (training batch {t.get('train_batch')}, evaluation batch {t.get('eval_batch')}), "
            f"{rec.get('loss_by_context', [{}])[0].get('tokens', '?'):,} test tokens per evaluation memory; "
            f"{p.get('hardware')}, torch {p.get('torch')}, precision {p.get('precision')}")


def _seeded(recs: dict[int | None, dict], value, footnote) -> tuple[list[float], str]:
    """(the values over the seeds that have one, the footnote of the first, its experiment as `EXP.seed*`)."""
    vals, first = [], None
    for seed in sorted(recs, key=lambda s: -1 if s is None else s):
        v = value(recs[seed])
        if v is not None:
            vals.append(float(v))
            first = first or recs[seed]
    if first is None:
        return [], ""
    note = footnote(first)
    base, seed = split_seed(first.get("experiment", ""))
    if seed is not None and len(vals) > 1:
        note = note.replace(first["experiment"], f"{base}.seed*")
    return vals, note


def seed_cell(recs: dict[int | None, dict], value, footnote, fmt: str, *, seeds: int) -> Cell:
    """One number over seeds: the value of one run, or mean ± sample std, with (n=k) where fewer seeds have it
    than the row."""
    if any(r.get("did_not_learn") for r in recs.values()):  # a metric of a run that did not learn is never shown
        return unlearned_cell(list(recs.values()), of=len(recs))
    vals, note = _seeded(recs, value, footnote)
    if not vals:
        return Cell("not run", "ours")
    if len(vals) == 1 and seeds <= 1:
        return Cell(vals[0], "ours", note, fmt)
    mean, std = mean_std(vals)
    text = fmt.format(mean) + (f" ± {fmt.format(std)}" if len(vals) > 1 else "")
    return Cell(text + (f" (n={len(vals)})" if len(vals) != seeds else ""), "ours", note)


def _context(rec: dict, mem_len: int, key: str):
    return next((c[key] for c in rec.get("loss_by_context", []) if c["mem_len"] == mem_len), None)


def _metric(profile_level: str) -> tuple[str, str, str]:
    """(name, test record key, loss_by_context key) of the quality: bpc for characters, perplexity for words."""
    return ("bpc", "test/bpc", "bpc") if profile_level == "char" else ("perplexity", "test/ppl", "ppl")


def _level(cs: list[Contestant]) -> str:
    return next((r.get("level", "char") for c in cs for r in c.arena.values()), "char")


def budget_cell(results: Results, profile: str, name: str) -> Cell | str:
    """The budget of a row: the profile's (the same backbone), or, for NAME_eqflops, the lever and setting that
    bring it to Transformer-XL's FLOPs per token, from `repro arena-budget`'s record."""
    if not name.endswith(EQFLOPS):
        return BUDGETS.get(profile, "—")
    folder = results.root / NAME / "budget"
    path = folder / f"{profile}.json"
    if "_" in name and (folder / f"{profile}_{name.split('_')[0]}.json").is_file():  # paper: enwik8_NAME
        path = folder / f"{profile}_{name.split('_')[0]}.json"
    if not path.is_file():
        return "equal FLOPs (no budget record)"
    record = json.loads(path.read_text())
    entry = record["contestants"].get(name.removesuffix(EQFLOPS))
    if entry is None:
        return "equal FLOPs (not in the budget record)"
    setting = ", ".join(f"{k.split('.')[-1]} {entry['original'][k]} → {v}" for k, v in entry["setting"].items())
    band = "" if entry["within_band"] else f", outside ±{record['band']:.0%}"
    text = f"equal FLOPs ({entry['ratio']:.3f}× TXL{band}): {setting}"
    return Cell(text, "ours", f"`repro arena-budget {profile}` ({path.as_posix()}): {record['count']}")


# ------------------------------------------------------------------------------------------ Pareto and figure
def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (cost, loss) that no other point dominates (lower or equal in both, lower in one),
    in order of increasing cost."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((u <= x and v <= y) and (u < x or v < y) for j, (u, v) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i])


@dataclass(frozen=True)
class Point:
    name: str
    flops_per_token: float  # mean over seeds
    loss: float  # test bpc (perplexity for words), mean over seeds
    seeds: int
    front: bool = False


def pareto_points(results: Results, profile: str, configs: Path = CONFIGS, prefix: str = "") -> list[Point]:
    """One point per contestant with both a FLOP count and a test loss, the Pareto front marked."""
    cs = contestants(results, profile, configs, prefix)
    _, key, _ = _metric(_level(cs))
    raw = []
    for c in cs:
        flops = [r["train_flops_per_token"] for r in c.arena.values() if "train_flops_per_token" in r]
        loss = [r["metrics"][key] for r in c.test.values() if key in r.get("metrics", {})]
        if flops and loss:
            raw.append((c.name, statistics.fmean(flops), statistics.fmean(loss), c.seeds))
    front = set(pareto_front([(x, y) for _, x, y, _ in raw]))
    return [Point(n, x, y, s, i in front) for i, (n, x, y, s) in enumerate(raw)]


def _label(ax, fig, points: list[Point], size: float = 8) -> None:
    """Each point's name beside it, moved down in steps of one line until it overlaps no label placed before
    (contestants at equal FLOPs share an x; their labels would otherwise print over each other)."""
    ax.autoscale_view()
    px = fig.dpi / 72  # pixels per point
    placed: list[tuple[float, float, float, float]] = []
    for p in sorted(points, key=lambda p: (p.flops_per_token, -p.loss)):
        text = p.name + (f" (n={p.seeds})" if p.seeds > 1 else "")
        x, y = ax.transData.transform((p.flops_per_token / 1e6, p.loss))
        w, h = 0.55 * size * len(text) * px, 1.2 * size * px
        dy = 5.0
        for _ in range(40):
            box = (x + 4 * px, y + dy * px, x + 4 * px + w, y + dy * px + h)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
            dy -= 1.2 * size
        placed.append(box)
        moved = {"arrowprops": {"arrowstyle": "-", "lw": 0.5, "color": "tab:gray"}} if dy != 5.0 else {}
        ax.annotate(text, (p.flops_per_token / 1e6, p.loss), textcoords="offset points", xytext=(4, dy),
                    fontsize=size, **moved)


def plot_pareto(points: list[Point], out: Path, *, title: str, ylabel: str = "test bpc") -> Path | None:
    if not points:
        return None
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    rest = [p for p in points if not p.front]
    front = sorted((p for p in points if p.front), key=lambda p: p.flops_per_token)
    ax.scatter([p.flops_per_token / 1e6 for p in rest], [p.loss for p in rest], facecolors="none",
               edgecolors="tab:gray", label="dominated")
    ax.plot([p.flops_per_token / 1e6 for p in front], [p.loss for p in front], "o-", color="tab:red",
            drawstyle="steps-post", label="Pareto front (fewer FLOPs, lower loss)")
    _label(ax, fig, points)
    ax.set_xlabel("training MFLOP per token (matrix products, forward + backward, full memory)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()

    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------------------------- table
def context_lengths(cs: list[Contestant]) -> list[int]:
    return sorted({c["mem_len"] for x in cs for r in x.arena.values() for c in r.get("loss_by_context", [])})


def arena_table(results: Results, profile: str, configs: Path = CONFIGS, prefix: str = "") -> Table:
    cs = contestants(results, profile, configs, prefix)
    metric, key, ctx_key = _metric(_level(cs))
    lengths = context_lengths(cs)
    fmt = "{:.3f}" if metric == "bpc" else "{:.2f}"
    rows = []
    for c in cs:
        n = c.seeds

        def arena(value, f, c=c, n=n):
            return seed_cell(c.arena, value, arena_provenance, f, seeds=n)

        row = [c.name, describe_mechanisms(c.model()), budget_cell(results, profile, c.name),
               arena(lambda r: r.get("parameters"), "{:,.0f}"),
               arena(lambda r: r.get("train_flops_per_token") and r["train_flops_per_token"] / 1e6, "{:.3f}"),
               arena(lambda r: r.get("train_tokens_per_s"), "{:,.0f}"),
               arena(lambda r: r.get("eval_tokens_per_s"), "{:,.0f}"),
               arena(lambda r: r.get("train_forward_tensor_peak_mb"), "{:.1f}"),
               seed_cell(c.test, lambda r: r.get("metrics", {}).get(key), provenance, fmt, seeds=n)]
        row += [arena(lambda r, m=m: _context(r, m, ctx_key), fmt) for m in lengths]
        row.append(seed_cell(c.probe or {}, lambda r: r.get("metrics", {}).get("test/acc"), provenance, "{:.3f}",
                             seeds=len(c.probe or {})))
        row.append(str(n) if n else "—")
        rows.append(row)
    points = pareto_points(results, profile, configs, prefix)
    front = [p.name for p in sorted(points, key=lambda p: p.flops_per_token) if p.front]
    cols = ["contestant", "memory mechanisms", "budget", "parameters", "train MFLOP/token", "train tok/s", "eval tok/s",
            "peak memory (MB)", f"test {metric} (training memory)",
            *[f"{metric}, eval memory {m}" for m in lengths], "sorting accuracy, length 512", "seeds"]
    notes = [
        f"Budget: `{BUDGETS.get(profile, '—')}` — every contestant of the profile has the same backbone (layers, "
        "width, heads), segment, training memory, steps, batch and optimiser; the mechanisms add their own "
        "parameters (the parameters column counts them, each tied weight once).",
        "Train MFLOP/token: one training step (forward and backward of the NLL plus the mechanisms' auxiliary "
        "losses) at full memory, counted by `torch.utils.flop_counter` (matrix products only: not elementwise "
        "operations, softmax, normalisation, embedding lookups or the optimiser), divided by the step's tokens.",
        "Tokens/s: training steps (forward, backward, gradient clip, Adam) and evaluation steps of the test split, "
        "at the config's batch, segment and precision, after a warm-up; CPU timings on a machine shared with other "
        "jobs are noisy. Peak memory: the tensors one training forward pass at full memory creates (activations kept "
        "for the backward), not the process's resident size.",
        f"Test {metric} (training memory): `repro test` with the training config, the whole test split. "
        f"`{metric}, eval memory m`: the first test tokens (the footnote says how many) evaluated by the module's "
        "own evaluation path with Transformer-XL's short memory at m; the mechanisms' own memories keep their "
        "sizes. The memory-less contestant (sliding-window evaluation) is scored on windows of segment + m tokens.",
        "Sorting accuracy: the contestant (`sort_NAME` in configs/arena/<profile>/) trained and tested on the "
        "∞-former's sorting task at sequence length 512 (the share of the sorted output's tokens predicted "
        "correctly; `repro test` with its training config).",
        f"Mean ± sample std over seeds (`EXP.seedN`) where several ran; (n=k) where fewer seeds have a number than "
        f"the row. `pareto.png` plots the test {metric} against the training FLOPs per token"
        + (f"; on the Pareto front (fewer FLOPs, lower {metric}): {', '.join(front)}." if front else "."),
    ]
    corpus = prefix.rstrip("_")
    return Table(f"{profile}/arena" + (f"_{corpus}" if corpus else ""),
                 f"Memory arena, {profile} profile{f', {corpus}' if corpus else ''}: the contestants with the same "
                 "backbone, and at Transformer-XL's FLOPs per token (`_eqflops`)", cols, rows, notes)


CLAIMS_SMALL = CONFIGS / "small" / "claims.yaml"


def claims_table(results: Results) -> Table:
    """The small profile's pre-registered claims (configs/arena/small/claims.yaml), decided by `repro.claims`."""
    found = claims.verdicts(results, "small", CLAIMS_SMALL)
    return claims.table("claims_small", "Memory arena — pre-registered claims of the small profile", found,
                        profile="small")


def build(results: Results) -> list[Table]:
    tables = [claims_table(results)] if CLAIMS_SMALL.is_file() else []
    for profile in profiles(results):
        for prefix in corpora(profile):
            corpus = prefix.rstrip("_")
            tables.append(arena_table(results, profile, prefix=prefix))
            metric, _, _ = _metric(_level(contestants(results, profile, prefix=prefix)))
            plot_pareto(pareto_points(results, profile, prefix=prefix),
                        results.root / NAME / profile / (f"pareto_{corpus}.png" if corpus else "pareto.png"),
                        title=f"Memory arena, {profile} profile{f', {corpus}' if corpus else ''}: test {metric} "
                              "against training compute", ylabel=f"test {metric}")
    return tables
