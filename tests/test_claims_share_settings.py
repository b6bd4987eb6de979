"""The small profile's pre-registered comparisons differ in their mechanism and in nothing else.

Each claim of `configs/<paper>/small/claims.yaml` compares two experiments, and the registration says that the two
share every hyper-parameter (optimiser, steps, batch, data, seeds, model size) apart from what the paper compares.
Here both configs, with their test configs, are parsed as `repro fit` parses them (`tests/parity/common.py`,
`parsed_config`), and every setting in which they differ must belong to the compared mechanism, listed below per
paper with the reason. A learning rate, a step count, a dropout or a corpus that differs between the two models of
a claim fails the test, as does a claim whose experiment has no config.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.parity.common import parsed_config

ROOT = Path(__file__).resolve().parent.parent
PAPERS = ("transformer_xl", "lamemo", "mgk", "infinity_former")

# what each paper's claims compare: setting prefixes allowed to differ between the two models of a claim
MECHANISM = {
    # Table 6: the attention's positions (relative / absolute); recurrence (memory or none), and with it the
    # evaluation of a model without memory, which scores every token from a sliding window of its attention length
    "transformer_xl": ("model.attention", "model.memory.mem_len", "model.eval_memory.", "model.eval_protocol.",
                       "data.eval_tgt_len"),
    # the look-ahead memory: LaMemo's module against Transformer-XL's (its `look_ahead: false` twin)
    "lamemo": ("model.class_path", "model.lamemo."),
    # the attention, and the head count where the paper compares MGK-4 with softmax-8
    "mgk": ("model.mgk.attention", "model.n_head"),
    # the memory (backbone, its LTM or compressed memory and their sizes at equal budget; basis functions; sticky
    # sampling), for the dialogue the memory hook and whether the document is given; each run's output file
    "infinity_former": ("model.backbone", "model.ltm", "model.compressive", "model.memory.mem_len",
                        "model.memory_hook.", "data.with_document", "model.generation.output"),
}
NAMES = ("config", "run.experiment")  # what every experiment has of its own


def claims(paper: str) -> list[tuple[str, str, str]]:
    registered = yaml.safe_load((ROOT / "configs" / paper / "small" / "claims.yaml").read_text())["claims"]
    return [(c["id"], c["a"], c["b"]) for c in registered]


def configs(paper: str, experiment: str) -> list[str]:
    base = Path("configs") / paper / "small" / f"{experiment}.yaml"
    assert (ROOT / base).exists(), f"claim names {experiment}, which has no config {base}"
    test = base.with_name(f"{experiment}.eval.yaml")
    return [str(base)] + ([str(test)] if (ROOT / test).exists() else [])


PAIRS = sorted({(paper, a, b) for paper in PAPERS for _, a, b in claims(paper)})


@pytest.mark.parametrize("paper,a,b", PAIRS, ids=[f"{p}:{a}-{b}" for p, a, b in PAIRS])
def test_the_two_models_of_a_claim_differ_only_in_the_mechanism(paper, a, b):
    oa, ob = parsed_config(*configs(paper, a)), parsed_config(*configs(paper, b))
    differ = sorted(k for k in set(oa) | set(ob) if k not in NAMES and oa.get(k, "<absent>") != ob.get(k, "<absent>"))
    assert differ, f"{a} and {b} are the same experiment"
    outside = [f"{k}: {oa.get(k, '<absent>')!r} against {ob.get(k, '<absent>')!r}" for k in differ
               if not k.startswith(MECHANISM[paper])]
    assert outside == []


def test_a_difference_outside_the_mechanism_is_caught():
    oa = parsed_config(*configs("lamemo", "char_lamemo"))
    ob = dict(parsed_config(*configs("lamemo", "char_txl")), **{"model.optim.lr": oa["model.optim.lr"] * 2})
    differ = [k for k in set(oa) | set(ob) if k not in NAMES and oa.get(k) != ob.get(k)]
    assert [k for k in differ if not k.startswith(MECHANISM["lamemo"])] == ["model.optim.lr"]
