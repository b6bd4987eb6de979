"""The ∞-former's small profile: `configs/infinity_former/small/claims.yaml` loads and names experiments
and seeds that params.small.yaml's run lists train (a drop claim also needs the same model at the shortest length);
the tables build when no small record exists ("not run"); and the claims are decided from
seed records written as `repro runs` writes them (`<exp>.seed<N>`), the accuracy drop computed per seed.
"""

import json
import re
from pathlib import Path

import yaml

from repro.claims import load_claims
from repro.tables import Results

from conftest import params_specs

ROOT = Path(__file__).resolve().parent.parent
CLAIMS = ROOT / "configs" / "infinity_former" / "small" / "claims.yaml"


_specs = params_specs


def _trained() -> set[tuple[str, int]]:
    """(experiment, seed) pairs that params.small.yaml trains for the ∞-former (every spec is seeded)."""
    params = yaml.safe_load((ROOT / "params.small.yaml").read_text())
    assert params["profile"] == "small"
    section = params["infinity_former"]
    out = set()
    for spec in _specs({k: section[k] for k in ("sorting", "gpt2", "gpt2_dog")}):
        m = re.fullmatch(r"([\w.-]+?)@(\d+)", spec)
        assert m, f"{spec}: small runs are seeded (the tables read <exp>.seed<N>)"
        assert (ROOT / "configs" / "infinity_former" / "small" / f"{m.group(1)}.yaml").exists(), spec
        out.add((m.group(1), int(m.group(2))))
    return out


def test_claims_name_trained_experiments():
    from papers.infinity_former.tables import DROP, LENGTHS

    confidence, claims = load_claims(CLAIMS)
    assert 0.5 < confidence < 1 and claims
    trained = _trained()
    for c in claims:
        assert len(c.seeds) >= 3, f"{c.id}: a comparison of means needs >= 3 seeds"
        for exp in (c.a, c.b):
            needed = [exp]
            if c.metric == DROP:  # the same model at the shortest length, same seeds
                needed.append(re.sub(r"^sort_\d+_", f"sort_{LENGTHS['small'][0]}_", exp))
            for e in needed:
                missing = [s for s in c.seeds if (e, s) not in trained]
                assert not missing, f"{c.id}: {e} seeds {missing} are not in params.small.yaml"


def _record(root: Path, exp: str, seed: int, metrics: dict, group: str = "tasks") -> None:
    folder = root / "infinity_former" / "runs" / "small" / group
    folder.mkdir(parents=True, exist_ok=True)
    rec = {"paper": "infinity_former", "experiment": f"{exp}.seed{seed}", "profile": "small", "stage": "test",
           "metrics": metrics, "provenance": {"steps": 1500}}
    (folder / f"{exp}.seed{seed}.test.json").write_text(json.dumps(rec))


def test_tables_build_without_small_records(tmp_path):
    from papers.infinity_former import tables

    built = {t.name: t for t in tables.build(Results("infinity_former", root=tmp_path))}
    md = built["claims_small"].markdown()
    assert "not run" in md and "holds" not in md
    assert "| ∞-former | small | not run | not run | not run |" in built["fig3_left"].markdown()
    assert (tmp_path / "infinity_former" / "fig3_left_small.png").exists()
    assert (tmp_path / "infinity_former" / "fig3_right_small.png").exists()


def test_claims_are_decided_from_seed_records(tmp_path):
    from papers.infinity_former import tables

    # Transformer-XL drops 0.20 from 128 to 512, the ∞-former 0.02, the compressive 0.10 (small seed noise)
    acc = {"txl": (0.40, 0.20), "infty": (0.30, 0.28), "compressive": (0.32, 0.22), "infty_sticky": (None, 0.31)}
    for seed, eps in ((1, 0.0), (2, 0.004), (3, -0.003)):
        for model, (short, long_) in acc.items():
            if short is not None:
                _record(tmp_path, f"sort_128_{model}", seed, {"test/acc": short + eps})
            _record(tmp_path, f"sort_512_{model}", seed, {"test/acc": long_ - eps})
        _record(tmp_path, "sort_256_infty", seed, {"test/acc": 0.3 + eps, "test/regression_error": 0.1 + eps / 10})
        _record(tmp_path, "sort_256_infty_n8", seed, {"test/acc": 0.25 + eps, "test/regression_error": 0.3})
    results = Results("infinity_former", root=tmp_path)
    verdicts = {v.claim.id: v for v in tables.claims.verdicts(results, "small", tables.CLAIMS_SMALL,
                                                              values=lambda c: tables.claim_values(results, c))}
    txl = verdicts["txl_degrades_faster_than_infty"]
    assert [round(x, 6) for x in txl.a] == [0.02, 0.028, 0.014]  # per seed: acc(128) − acc(512)
    assert [round(x, 6) for x in txl.b] == [0.2, 0.208, 0.194]
    assert txl.verdict == "holds"
    assert verdicts["infty_degrades_less_than_compressive"].verdict == "holds"
    assert verdicts["txl_degrades_faster_than_compressive"].verdict == "holds"
    assert verdicts["sticky_helps_at_longest"].verdict == "holds"  # 0.31 against 0.28
    assert verdicts["more_basis_functions_lower_regression_error"].verdict == "holds"
    assert verdicts["more_basis_functions_higher_accuracy"].verdict == "holds"
    left = tables.fig3_left(results)[0].markdown()
    assert "0.300 ± 0.004 (n = 3)" in left  # ∞-former at 128: mean ± sd over the three seeds
    md = tables.claims_small(results).markdown()
    assert "holds" in md and "test/acc drop" in md


def test_answers_are_scored_apart_from_questions():
    from repro.metrics.text import scores_by_act

    preds = ["Oslo.", "where is the key?", "attic.", "hello."]
    refs = ["Oslo", "where is the key", "cellar", "hello"]
    out = scores_by_act(preds, refs, ["answer_early", "question", "answer_late", None], with_meteor=False)
    assert out["f1_answer"] == 50.0 and out["responses_answer"] == 2.0  # answer_early and answer_late together
    assert out["f1_answer_early"] == 100.0 and out["f1_answer_late"] == 0.0 and out["f1_question"] == 100.0
    assert not any(k.endswith("_None") or k.endswith("_") for k in out)  # unmarked responses (CMU-DoG) left out


def test_generated_dialogue_answers_need_the_document(tmp_path):
    """The early fact opens the document, the late fact closes it, the answers are the values alone, every
    conversation has its own document, and the acts line up with the reader's utterances."""
    from repro.text import dialogue_synthetic as T
    from repro.text.cmudog import read_cmu_dog

    root = T.generate_tiny_dog(tmp_path / "set", conversations={"train": 6, "valid": 2, "test": 3}, seed=1)
    convs = read_cmu_dog(root, "test")
    acts = T.utterance_acts(root, "test")
    assert len(convs) == 3 and len({c.document for c in convs}) == 3
    for conv in convs:
        kinds = [acts[(conv.name, i)] for i in range(len(conv.utterances))]
        assert kinds[:2] == ["greeting", "greeting"] and sorted(kinds[2:]) == sorted(
            ["question", "question", "answer_early", "answer_late"])
        early = conv.utterances[kinds.index("answer_early")].rstrip(".")
        late = conv.utterances[kinds.index("answer_late")].rstrip(".")
        assert early in T.CITIES and late in T.PLACES
        lines = conv.document.splitlines()
        assert early in lines[1] and late in lines[-1]  # first fact after the title; last sentence of the document
        assert all(early not in line and late not in line for line in lines[2:-1])  # the filler says nothing


def test_generated_dialogue_refuses_another_format(tmp_path):
    import pytest

    from repro.text import dialogue_synthetic as T

    with pytest.raises(ValueError, match="format 1 is not this generator's"):
        T.generate_tiny_dog(tmp_path, format=1)
