"""A run that did not learn decides nothing (`repro.tables.did_not_learn`): a record whose loss ends at the uniform
level (ln of the symbols its data predict), or no better than its first logged loss, shows "did not learn" in every
table, never a number, and a claim with such a run in either arm is "not decided: an arm did not train"."""

import json
import math

from repro import claims
from repro.tables import Results, did_not_learn

SORT = {"corpus_meta": {"vocabulary": "20 symbols, separator 20, pad 21"}}


def _record(exp: str, loss: float, *, stage: str = "test", provenance=None) -> dict:
    return {"experiment": exp, "profile": "small", "stage": stage, "paper": "p",
            "metrics": {"test/loss": loss, "test/acc": 0.05, "test/tokens": 100.0},
            "provenance": {**(provenance or SORT), "steps": 10}}


def test_the_uniform_level_and_the_first_loss_decide(tmp_path):
    uniform = math.log(20)
    assert did_not_learn(_record("a", uniform)).startswith("loss 2.9957 at the uniform level ln 20")
    assert did_not_learn(_record("a", uniform * 0.995)) is not None  # within 1%
    assert did_not_learn(_record("a", uniform * 0.98)) is None
    curve = tmp_path / "c.csv"
    curve.write_text("step,split,loss,ppl,bpc\n100,train,4.10,60.3,5.9\n400,valid,3.20,24.5,4.6\n")
    lm = {"corpus": "embedded-char"}  # no vocabulary size: only the curve can tell
    assert did_not_learn(_record("b", 3.2, provenance=lm), curve) is None
    assert "no better than its first logged loss 4.1000" in did_not_learn(_record("b", 4.09, provenance=lm), curve)
    assert did_not_learn({**_record("a", uniform), "rehearsal": True}) is None  # two steps: plumbing


def test_a_table_shows_did_not_learn_and_a_claim_is_not_decided(tmp_path):
    runs = tmp_path / "p" / "runs" / "small" / "tasks"
    runs.mkdir(parents=True)
    for seed, (a, b) in enumerate([(1.0, 2.0), (1.1, 2.1), (math.log(20), 2.05)], start=1):
        for exp, loss in (("model_a", a), ("model_b", b)):
            (runs / f"{exp}.seed{seed}.test.json").write_text(json.dumps(_record(f"{exp}.seed{seed}", loss)))
    results = Results("p", root=tmp_path)
    cell = results.metric("small", "model_a.seed3", "test", "test/acc")
    assert cell.text() == "did not learn" and "uniform level" in cell.provenance
    assert results.metric("small", "model_a.seed1", "test", "test/acc").value == 0.05
    assert "test/loss" not in results.get("small", "model_a.seed3", "test")["metrics"]
    path = tmp_path / "claims.yaml"
    path.write_text("claims:\n  - {id: a_beats_b, source: s, metric: test/loss, a: model_a, b: model_b, "
                    "seeds: [1, 2, 3], stage: test}\n")
    (verdict,) = claims.verdicts(results, "small", path)
    assert verdict.text() == "not decided: an arm did not train" and "`model_a.seed3`" in verdict.reason
    # the same claim on the two seeds that learned holds: the untrained seed alone kept it undecided
    path.write_text(path.read_text().replace("[1, 2, 3]", "[1, 2]"))
    assert claims.verdicts(results, "small", path)[0].verdict == "holds"
    table = claims.table("c", "t", claims.verdicts(results, "small", path.parent / "claims.yaml"), profile="small")
    assert "did not learn" not in table.markdown()
