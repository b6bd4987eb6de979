"""repro.claims: Welch intervals against scipy's own Welch test, verdict rules, one-line errors of the claims file."""

import pytest
from scipy import stats

from repro.claims import Claim, decide, load_claims, welch_interval


def test_welch_interval_matches_scipy_ttest():
    a, b = [3.1, 2.9, 3.4, 3.0], [3.6, 3.9, 3.5]
    diff, low, high = welch_interval(a, b, confidence=0.95)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(sum(a) / 4 - sum(b) / 3)
    assert (low, high) == pytest.approx((ref.low, ref.high), rel=1e-9)


def claim(**kw):
    base = dict(id="c", source="s", metric="test/ppl", a="x", b="y", seeds=(1, 2, 3))
    return Claim(**{**base, **kw})


def test_better_holds_reversed_undecided():
    low_is_good = claim()
    assert decide(low_is_good, [10.0, 10.1, 9.9], [12.0, 12.2, 11.9]).verdict == "holds"
    assert decide(low_is_good, [12.0, 12.2, 11.9], [10.0, 10.1, 9.9]).verdict == "reversed"
    v = decide(low_is_good, [10.0, 12.0, 11.0], [11.0, 10.0, 12.5])
    assert v.verdict == "not decided" and v.text() == "not decided at 3 seeds"
    # higher-is-better metrics (accuracy) flip the orientation
    assert decide(claim(lower_is_better=False), [0.9, 0.91, 0.92], [0.5, 0.52, 0.51]).verdict == "holds"


def test_noninferior_margin():
    c = claim(test="noninferior", margin=0.05)
    # a is 2% worse than b (ppl 102 vs 100), tight spread: within the 5% margin
    assert decide(c, [102.0, 102.2, 101.9], [100.0, 100.1, 99.9]).verdict == "holds"
    # 10% worse: beyond the margin
    assert decide(c, [110.0, 110.2, 109.9], [100.0, 100.1, 99.9]).verdict == "reversed"


def test_single_seed_is_not_decided_and_no_run_says_so():
    v = decide(claim(seeds=(1,)), [1.0], [2.0])
    assert v.verdict == "not decided" and "no spread" in v.reason and v.text() == "not decided at 1 seed"
    assert decide(claim(), [], []).text() == "not run"


def test_claims_file_errors(tmp_path):
    p = tmp_path / "claims.yaml"
    p.write_text("claims:\n  - {id: a, source: s, metric: m, a: x, b: y, seeds: [1, 2], test: best}\n")
    with pytest.raises(ValueError, match="test 'best' is not one of"):
        load_claims(p)
    p.write_text("claims:\n  - {id: a, source: s, metric: m, a: x, seeds: [1]}\n")
    with pytest.raises(ValueError, match="lacks b"):
        load_claims(p)
    p.write_text("claims:\n  - {id: a, source: s, metric: m, a: x, b: y, seeds: [1], test: noninferior}\n")
    with pytest.raises(ValueError, match="margin > 0"):
        load_claims(p)
    p.write_text("confidence: 0.9\nclaims:\n  - {id: a, source: s, metric: m, a: x, b: y, seeds: [1, 2]}\n")
    conf, claims = load_claims(p)
    assert conf == 0.9 and claims[0].seeds == (1, 2) and claims[0].test == "better"
