"""Pre-registered claims and their verdicts: what a profile's runs say about a paper's statement.

A claim compares two experiments of one profile over seeds, under a protocol fixed before any of its runs (the
`small` profile's `configs/<paper>/small/claims.yaml`, committed before the runs; the commit that added it is the
registration). The file names, per claim, the paper's statement, the two experiments, the seeds, the metric and
the test; this module only reads the run records and applies the test. Nothing here is tuned per claim.

Tests (the effect is oriented so that positive means "a is better than b", whether the metric is lower- or
higher-is-better; the interval is Welch's two-sided t interval at the file's `confidence`, default 0.95):

| test | holds: the interval lies | reversed: the interval lies | otherwise, at n seeds |
|---|---|---|---|
| `better` (a beats b) | above 0 | below 0 | not decided |
| `noninferior` (a matches b: a is worse by at most δ = `margin` × mean(b)) | above −δ | below −δ | not decided |

A claim with fewer than two seeds in either arm has no spread and is "not decided" (its values are still shown).
A claim one of whose runs did not learn (`repro.tables.did_not_learn`: its loss at the uniform level, or no better
than its first logged loss) is "not decided: an arm did not train", whatever its other seeds say.
This follows the usual practice for seed comparisons in deep learning (report mean ± sample standard deviation
over seeds and a t interval for the difference of means; e.g. Henderson et al., 2018, "Deep RL that matters");
the t interval's assumptions (roughly normal seed-to-seed noise) are stated, not tested, with three to five seeds.

    claims.yaml:
        confidence: 0.95
        claims:
          - id: lamemo_beats_txl
            source: "Table 3: LaMemo < Transformer-XL in bpc at equal memory"
            metric: test/bpc            # a key of the records' `metrics`
            stage: test                 # record stage (`<exp>.seed<N>.<stage>.json`)
            lower_is_better: true
            a: char_lamemo
            b: char_txl
            seeds: [1, 2, 3, 4, 5]
            test: better
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from repro.tables import Cell, Table

TESTS = ("better", "noninferior")
VERDICTS = ("holds", "reversed", "not decided")


@dataclass(frozen=True)
class Claim:
    id: str
    source: str  # the paper's statement and where it is made
    metric: str
    a: str
    b: str
    seeds: tuple[int, ...]
    test: str = "better"
    stage: str = "test"
    lower_is_better: bool = True
    margin: float = 0.0  # noninferior: relative to |mean(b)|
    note: str = ""


@dataclass
class Verdict:
    claim: Claim
    a: list[float]
    b: list[float]
    effect: float | None = None  # mean(a) better than mean(b) by this much (metric units; positive = a better)
    low: float | None = None
    high: float | None = None
    threshold: float = 0.0  # the interval's bound that decides (0 or −δ)
    verdict: str = "not decided"
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        if self.extra.get("did_not_train"):
            return "not decided: an arm did not train"
        if not self.a and not self.b:
            return "not run"
        n = min(len(self.a), len(self.b))
        return self.verdict if self.verdict != "not decided" else f"not decided at {n} seed{'s' if n != 1 else ''}"


def load_claims(path: str | Path) -> tuple[float, list[Claim]]:
    """(confidence, claims) of a claims file; one line naming the problem when it is malformed."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no claims file (the pre-registered protocol of this profile)")
    doc = yaml.safe_load(path.read_text()) or {}
    confidence = float(doc.get("confidence", 0.95))
    if not 0.5 < confidence < 1:
        raise ValueError(f"{path}: confidence {confidence} is not in (0.5, 1)")
    claims, seen = [], set()
    for i, raw in enumerate(doc.get("claims") or []):
        missing = [k for k in ("id", "source", "metric", "a", "b", "seeds") if k not in raw]
        if missing:
            raise ValueError(f"{path}: claim {i + 1} lacks {', '.join(missing)}")
        c = Claim(id=str(raw["id"]), source=str(raw["source"]), metric=str(raw["metric"]), a=str(raw["a"]),
                  b=str(raw["b"]), seeds=tuple(int(s) for s in raw["seeds"]), test=str(raw.get("test", "better")),
                  stage=str(raw.get("stage", "test")), lower_is_better=bool(raw.get("lower_is_better", True)),
                  margin=float(raw.get("margin", 0.0)), note=str(raw.get("note", "")))
        if c.test not in TESTS:
            raise ValueError(f"{path}: claim {c.id}: test {c.test!r} is not one of {', '.join(TESTS)}")
        if c.test == "noninferior" and c.margin <= 0:
            raise ValueError(f"{path}: claim {c.id}: a noninferior test needs margin > 0 (relative to mean(b))")
        if c.id in seen:
            raise ValueError(f"{path}: claim id {c.id} appears twice")
        seen.add(c.id)
        claims.append(c)
    return confidence, claims


def welch_interval(a: list[float], b: list[float], *, confidence: float) -> tuple[float, float, float]:
    """Mean(a) − mean(b) and its two-sided Welch t interval (Welch–Satterthwaite degrees of freedom)."""
    from scipy import stats  # heavy: SciPy

    ma, mb = statistics.fmean(a), statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = ma - mb
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff
    dof = (va + vb) ** 2 / ((va ** 2) / (len(a) - 1) + (vb ** 2) / (len(b) - 1))
    half = stats.t.ppf(0.5 + confidence / 2, dof) * se
    return diff, diff - half, diff + half


def decide(claim: Claim, a: list[float], b: list[float], *, confidence: float = 0.95) -> Verdict:
    """The claim's verdict from the values of its two arms (one value per seed)."""
    v = Verdict(claim, list(a), list(b))
    if len(a) < 2 or len(b) < 2:
        v.reason = ("no run of either model yet" if not a and not b
                    else f"{len(a)} and {len(b)} seeds: no spread to decide with")
        return v
    diff, low, high = welch_interval(a, b, confidence=confidence)
    sign = -1.0 if claim.lower_is_better else 1.0  # orient: positive = a better
    v.effect, v.low, v.high = sign * diff, *sorted((sign * low, sign * high))
    v.threshold = -claim.margin * abs(statistics.fmean(b)) if claim.test == "noninferior" else 0.0
    if v.low > v.threshold:
        v.verdict = "holds"
    elif v.high < v.threshold:
        v.verdict = "reversed"
    pct = f"{confidence:.0%}"
    v.reason = (f"effect {v.effect:+.4g} ({pct} interval {v.low:+.4g} … {v.high:+.4g}) against "
                f"{'0' if claim.test == 'better' else f'−δ = {v.threshold:+.4g}'}")
    return v


def values_from_records(results, profile: str, claim: Claim) -> tuple[list[float], list[float]]:
    """Per-seed metric values of the claim's two arms from `repro.tables.Results` (records `<exp>.seed<N>`)."""
    def arm(exp: str) -> list[float]:
        out = []
        for s in claim.seeds:
            rec = results.get(profile, f"{exp}.seed{s}", claim.stage)
            if rec is not None and claim.metric in rec.get("metrics", {}):
                out.append(float(rec["metrics"][claim.metric]))
        return out

    return arm(claim.a), arm(claim.b)


def verdicts(results, profile: str, path: str | Path,
             values: Callable[[Claim], tuple[list[float], list[float]]] | None = None) -> list[Verdict]:
    """Every claim of a claims file decided from the records of `profile` (or a paper's own `values(claim)` for
    claims whose metric is not a record field, e.g. RECL)."""
    confidence, claims = load_claims(path)
    out = []
    for c in claims:
        a, b = (values or (lambda c: values_from_records(results, profile, c)))(c)
        untrained = did_not_train(results, profile, c)
        if untrained:  # a run that did not learn decides nothing, whatever the other seeds say
            out.append(Verdict(c, a, b, reason=f"{', '.join(untrained)} did not learn "
                                               "(`repro.tables.did_not_learn`)", extra={"did_not_train": untrained}))
            continue
        out.append(decide(c, a, b, confidence=confidence))
    return out


def did_not_train(results, profile: str, claim: Claim) -> list[str]:
    """The runs of the claim's two arms (`<exp>.seed<N>`, its stage) whose records say they did not learn."""
    return [f"`{exp}.seed{s}`" for exp in (claim.a, claim.b) for s in claim.seeds
            if (rec := results.get(profile, f"{exp}.seed{s}", claim.stage)) is not None and rec.get("did_not_learn")]


def _mean_sd(x: list[float]) -> str:
    if not x:
        return "not run"
    if len(x) == 1:
        return f"{x[0]:.4g} (n = 1)"
    return f"{statistics.fmean(x):.4g} ± {statistics.stdev(x):.2g} (n = {len(x)})"


def table(name: str, title: str, results_of: list[Verdict], *, profile: str):
    """The verdicts as a `repro.tables.Table`: per claim the paper's statement, both arms (mean ± sample standard
    deviation over seeds), the effect with its interval, and the verdict computed from them."""
    rows = []
    noted = any(v.claim.note for v in results_of)
    for v in results_of:
        c = v.claim
        arms = [f"`{exp}` " + (f"did not learn ({n} of {len(c.seeds)} seeds)" if (n := sum(
            name.startswith(f"`{exp}.seed") for name in v.extra.get("did_not_train", []))) else _mean_sd(vals))
            for exp, vals in ((c.a, v.a), (c.b, v.b))]
        rows.append([c.id, c.source, *arms, c.metric,
                     v.reason or "—", *([c.note or "—"] if noted else []), Cell(v.text(), "ours")])
    notes = [f"Profile `{profile}`; protocol pre-registered in `configs/<paper>/{profile}/claims.yaml`: the commit "
             "that added a claim precedes the runs it registers, except where its note names an arm reused from "
             "an earlier registration or a rerun of the same seeds. Effect: positive means the first model is "
             "better; interval: Welch's t at the file's confidence; `noninferior`: the first model is worse by at "
             "most δ = margin × mean of the second. Values are mean ± sample standard deviation over seeds."]
    columns = ["claim", "paper's statement", "model", "against", "metric", "effect",
               *(["registration and run"] if noted else []), "verdict"]
    return Table(name, title, columns, rows, notes)
