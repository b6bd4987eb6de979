"""The memory probes (`papers.arena.probes`): every scored answer is what the evidence says, checked by reading the
evidence back independently; the evidence sits at least `distance` tokens before its question and nothing between
them is a key or a value; builds are deterministic, checked and refused on mismatch; served as the sorting task is."""

import numpy as np
import pytest
import torch

from papers.arena import probes
from papers.arena.probes import ProbeDataModule, ProbeSpec


@pytest.mark.parametrize("distance", [0, 5, 300])
def test_mqar_answers_are_the_values_of_the_queried_keys(distance):
    spec = ProbeSpec("mqar", distance, n_pairs=6, n_keys=20, n_values=10, n_filler=4)
    rng = np.random.default_rng(0)
    for _ in range(20):
        tokens, scored = probes.example(spec, rng)
        assert len(tokens) == spec.length and tokens[2 * 6 + distance] == spec.sep
        pairs = {int(k): int(v) for k, v in tokens[: 12].reshape(6, 2)}
        assert len(pairs) == 6 and all(k < 20 and 20 <= v < 30 for k, v in pairs.items())
        filler = tokens[12:12 + distance]
        assert ((filler >= 30) & (filler < 34)).all()
        question = tokens[12 + distance + 1:]
        assert sorted(int(k) for k in question[0::2]) == sorted(pairs)
        for pos in np.flatnonzero(scored):
            assert pairs[int(tokens[pos - 1])] == int(tokens[pos])  # the value of the key just asked
            assert pos - 1 - (2 * 6 - 1) >= distance  # every pair lies at least `distance` tokens back


def test_passkey_asks_for_the_whole_span_after_the_filler():
    spec = ProbeSpec("passkey", 40, n_pairs=5, n_values=10, n_filler=3)
    tokens, scored = probes.example(spec, np.random.default_rng(1))
    assert len(tokens) == spec.length == 5 + 40 + 1 + 5
    assert (tokens[46:] == tokens[:5]).all() and scored.sum() == 5 and scored[46:].all()


def test_the_lm_view_scores_only_the_answers():
    spec = ProbeSpec("mqar", 3, n_pairs=2, n_keys=4, n_values=4, n_filler=2)
    data = probes.generate_split(spec, 3, np.random.default_rng(2))
    inp, tgt = probes.lm_view(spec, data["tokens"], data["scored"])
    assert inp.shape == tgt.shape == (3, spec.length - 1)
    answered = tgt != spec.pad
    assert answered.sum() == 3 * 2
    assert torch.equal(tgt[answered], data["tokens"][:, 1:][answered])


def test_builds_are_deterministic_checked_and_refused_on_mismatch(tmp_path):
    spec = ProbeSpec("mqar", 10, n_train=8, n_valid=4, n_test=4)
    a = probes.load(spec, tmp_path / "a")
    b = probes.load(spec, tmp_path / "b")
    assert all(torch.equal(a[s]["tokens"], b[s]["tokens"]) for s in probes.SPLITS)
    assert not torch.equal(a["train"]["tokens"][:4], a["valid"]["tokens"])  # each split its own stream
    folder = probes.build(spec, tmp_path / "a")
    meta = (folder / "meta.json").read_text()
    (folder / "meta.json").write_text(meta.replace('"seed": 0', '"seed": 1'))
    with pytest.raises(ValueError) as err:
        probes.build(spec, tmp_path / "a")
    assert "holds another probe" in str(err.value) and "\n" not in str(err.value)


def test_the_data_module_serves_groups_with_the_question_last(tmp_path):
    dm = ProbeDataModule("mqar", 50, n_pairs=4, n_train=8, n_valid=4, n_test=4, batch_size=4, eval_batch_size=4,
                         tgt_len=16, data_dir=str(tmp_path))
    dm.prepare_data()
    segs = list(dm.test_dataloader())
    per_example = -(-(dm.spec.length - 1) // 16)
    assert len(segs) == per_example and segs[0].first and segs[-1].last
    scored = [int((s.target != dm.spec.pad).sum()) for s in segs]
    assert sum(scored) == 4 * 4 and scored[-1] > 0 and scored[0] == 0
    assert dm.vocab_size == dm.spec.n_token == 64 + 64 + 16 + 2


def test_a_bad_spec_is_one_line():
    with pytest.raises(ValueError, match="probe kind is one of"):
        ProbeSpec("copy", 4)
    with pytest.raises(ValueError, match="distinct keys"):
        ProbeSpec("mqar", 4, n_pairs=10, n_keys=5)
