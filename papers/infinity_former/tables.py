"""The ∞-former's sorting figures as tables and plots, ours beside the paper's qualitative statements.

Figure 3 of the paper prints no numbers (PAPERS.md §2: read them off the figure; none are quoted here), so the
paper column states what the paper says, and ours are the test accuracies of our runs:
- `fig3_left`: sorting accuracy vs sequence length for Transformer-XL, the compressive transformer, the ∞-former
  and the ∞-former with sticky memories (paper lengths 4000/8000/16000; tiny 256/512/1024);
- `fig3_right`: accuracy and regression error vs the number of basis functions at the middle length;
- `context_cost`: the cost-vs-context benchmark (`repro bench-context`), time and memory per segment.
Plots (PNG) are written beside the tables.
"""

from __future__ import annotations

from pathlib import Path

from repro.tables import Cell, Results, Table

PAPER = "infinity_former"
MODELS = [("txl", "Transformer-XL"), ("compressive", "Compressive transformer"), ("infty", "∞-former"),
          ("infty_sticky", "∞-former (sticky memories)")]
LENGTHS = {"paper": (4000, 8000, 16000), "tiny": (256, 512, 1024)}
BASIS = {"paper": (256, 512, 1024, 2048), "tiny": (16, 32, 64, 128)}
DEFAULT_N = {"paper": 1024, "tiny": 64}
PAPER_LEFT = ("Paper (Fig. 3 left, no numbers printed): Transformer-XL is slightly better than the compressive "
              "transformer and the ∞-former at 4,000; its accuracy degrades rapidly as the length grows; the "
              "∞-former's decrease is the least significant.")
PAPER_RIGHT = ("Paper (Fig. 3 right, length 8,000): accuracy is negatively correlated with the regression error, "
               "which falls as the number of basis functions grows; with many basis functions the error plateaus "
               "and the accuracy starts to drop.")


def _acc(results: Results, profile: str, exp: str) -> Cell:
    cell = results.metric(profile, exp, "test", "test/acc", fmt="{:.3f}")
    return cell


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
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    return (f"Ours: Transformer-XL best at {short}: {yes(txl_best)}; drop from {short} to {long_} — Transformer-XL "
            f"{drops['txl']:+.3f}, compressive {drops['compressive']:+.3f}, ∞-former {drops['infty']:+.3f}; "
            f"Transformer-XL degrades fastest: {yes(txl_fastest)}; ∞-former degrades least: {yes(infty_least)}.")


def fig3_left(results: Results) -> tuple[Table, dict]:
    rows, data = [], {}
    for profile in ("tiny", "paper"):
        for key, label in MODELS:
            cells = [_acc(results, profile, f"sort_{L}_{key}") for L in LENGTHS[profile]]
            data.setdefault(profile, {})[key] = {L: _value(c) for L, c in zip(LENGTHS[profile], cells)}
            rows.append([label, profile, *cells])
    notes = [PAPER_LEFT]
    for profile in ("tiny", "paper"):
        notes.append(f"**{profile}** — {verdict_left(data[profile], LENGTHS[profile])}")
    notes.append("Columns are the three lengths of each profile: paper 4000 / 8000 / 16000, tiny 256 / 512 / 1024 "
                 "(every length divided by 16, see papers/infinity_former/README.md). Accuracy = token accuracy "
                 "on the 20 sorted output symbols of the test split, one seed per cell.")
    table = Table("fig3_left", "Sorting accuracy vs sequence length (Fig. 3 left)",
                  ["model", "profile", "short", "middle", "long"], rows, notes)
    return table, data


def fig3_right(results: Results) -> tuple[Table, dict]:
    rows, data = [], {}
    for profile in ("tiny", "paper"):
        L = LENGTHS[profile][1]
        for n in BASIS[profile]:
            exp = f"sort_{L}_infty" if n == DEFAULT_N[profile] else f"sort_{L}_infty_n{n}"
            acc = _acc(results, profile, exp)
            err = results.metric(profile, exp, "test", "test/regression_error", fmt="{:.4f}")
            data.setdefault(profile, []).append((n, _value(acc), _value(err)))
            rows.append([profile, f"{L}", f"{n}", acc, err])
    notes = [PAPER_RIGHT,
             "Regression error (ours): relative squared error ‖X − Fᵀ B‖² / ‖X‖² of each LTM fit at the fitted "
             "positions (old samples and new vectors), averaged over the test split's updates and layers. The "
             "paper does not define its 'regression mean error'; its numbers are not comparable to ours."]
    return Table("fig3_right", "Accuracy and regression error vs number of basis functions (Fig. 3 right)",
                 ["profile", "length", "N", "accuracy", "regression error"], rows, notes), data


def context_cost(results: Results) -> tuple[Table | None, list[dict]]:
    rows_in = [r for profile in ("tiny", "paper") for r in results.load_json_lines(f"runs/{profile}/bench_context.jsonl")]
    if not rows_in:
        return None, []
    rows = [[r["model"], f"{r['context']:,}", Cell(r["ms_per_segment"], "ours", r.get("device", ""), "{:.1f}"),
             Cell(r["memory_state_mb"], "ours", r.get("device", ""), "{:.2f}"),
             Cell(r.get("peak_mb"), "ours", r.get("device", ""), "{:.1f}")] for r in rows_in]
    notes = ["`repro bench-context` (repro/bench_context.py): one segment's forward pass (evaluation, no gradient) "
             "after `context` tokens. Transformer-XL attends to all of them (memory = context); the ∞-former keeps "
             "an STM of fixed length and a continuous LTM of N basis functions that the whole context was folded "
             "into, so its time and memory per segment stay flat. memory state = the carried memory's size; peak = "
             "the CUDA allocator's peak on a GPU, the process's peak RSS growth on a CPU."]
    return Table("context_cost", "Cost per segment vs context length", ["model", "context (tokens)",
                 "ms / segment", "memory state (MB)", "peak (MB)"], rows, notes), rows_in


def _plots(left: dict, right: dict, cost: list[dict], root: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.io import atomic_path

    def save(fig, name):
        with atomic_path(root / PAPER / name) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        plt.close(fig)

    for profile, per_model in left.items():
        if not any(v is not None for m in per_model.values() for v in m.values()):
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
        ax.legend(fontsize=7)
        fig.tight_layout()
        save(fig, f"fig3_left_{profile}.png")
    for profile, pts in right.items():
        pts = [p for p in pts if p[1] is not None]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.4))
        ns, accs, errs = zip(*pts)
        ax.plot(ns, accs, "o-", color="C0", label="accuracy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("basis functions N")
        ax.set_ylabel("accuracy", color="C0")
        if any(e is not None for e in errs):
            ax2 = ax.twinx()
            ax2.plot([n for n, e in zip(ns, errs) if e is not None], [e for e in errs if e is not None], "s--",
                     color="C3")
            ax2.set_ylabel("regression error", color="C3")
        ax.set_title(f"Basis functions, {profile} profile (ours)")
        fig.tight_layout()
        save(fig, f"fig3_right_{profile}.png")
    if cost:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
        for model in sorted({r["model"] for r in cost}):
            rs = sorted((r for r in cost if r["model"] == model), key=lambda r: r["context"])
            axes[0].plot([r["context"] for r in rs], [r["ms_per_segment"] for r in rs], "o-", label=model)
            axes[1].plot([r["context"] for r in rs], [r["memory_state_mb"] for r in rs], "o-", label=model)
        for ax, ylabel in zip(axes, ("ms per segment", "carried memory (MB)")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("Cost per segment as the context grows (ours)")
        fig.tight_layout()
        save(fig, "context_cost.png")


def build(results: Results) -> list[Table]:
    left_table, left = fig3_left(results)
    right_table, right = fig3_right(results)
    cost_table, cost = context_cost(results)
    _plots(left, right, cost, results.root)
    tables = [left_table, right_table]
    if cost_table is not None:
        tables.append(cost_table)
    return tables
