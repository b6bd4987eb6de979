"""The paper profile's rehearsal (`repro rehearse`, repro/rehearsal.py): its overrides cap training and shrink data,
but leave every paper model at its paper size and every protocol as configured, the dialogue test's generation
length aside (capped); its records are labelled."""

from pathlib import Path

import pytest
import yaml

from repro.cli.commands import describe_built
from repro.cli.rehearsal import merged_params
from repro.cli.rehearsal_configs import REHEARSAL_CONFIGS, config_overrides
from repro.cli.runs import runs_steps
from repro.tables import Cell, Table, provenance

from test_configs import PAPER_TRAINING, check_row

ROOT = Path(__file__).resolve().parent.parent
PAPER_CONFIGS = PAPER_TRAINING  # every paper config that trains (tests/test_configs.py leaves their rows to this file)
PROTOCOL_KEYS = ("tgt_len", "eval_tgt_len", "block_size", "max_len", "length")


def _flat(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("config", PAPER_CONFIGS)
def test_rehearsal_keeps_the_paper_model_and_protocol(config, monkeypatch):
    from repro.cli.cli import build

    monkeypatch.chdir(ROOT)
    extra = config_overrides(config)[1::2]
    plain, rehearsed = build([config], meta=True), build([config, *extra], meta=True)
    check_row(config, describe_built(config, plain))  # what tests/test_configs.py checks of every other config

    def n(cli):
        return sum(p.numel() for p in cli.model.parameters())

    assert n(rehearsed) == n(plain) > 0
    # the model's settings and every protocol length are untouched; only trainer caps and data sizes change, and
    # the dialogue test's generation length (test_the_dialogue_rehearsal_caps_only_the_generation_length)
    r, p = _flat(rehearsed.config["model"]), _flat(plain.config["model"])
    changed = {k for k in r | p if r.get(k) != p.get(k)}
    assert changed <= ({"init_args.generation.max_tokens"} if "Dialogue" in config_overrides(config)[-1] else set())
    for key in PROTOCOL_KEYS:
        assert rehearsed.config["data"]["init_args"].get(key) == plain.config["data"]["init_args"].get(key)
    # two batches of one epoch; the schedule's horizon (max_steps) stays the paper's
    t = rehearsed.config["trainer"]
    whole_epoch = "Sorting" in config_overrides(config)[-1] or "Dialogue" in config_overrides(config)[-1]
    assert t["limit_train_batches"] == (1.0 if whole_epoch else 2) and t["max_epochs"] == 1
    assert rehearsed.config["run"]["rehearsal"] is True
    assert t["max_steps"] == plain.config["trainer"]["max_steps"]


@pytest.mark.parametrize("config", [c for c in PAPER_CONFIGS if "/gpt2_dog_" in c])
def test_the_dialogue_rehearsal_caps_only_the_generation_length(config, monkeypatch):
    """Each drawn token runs the paper-size model over a whole context piece: the rehearsal's test draws a few
    short replies (4 of at most 8 tokens, the paper's 50), scored as the paper's; every other generation setting
    is the paper's."""
    from dataclasses import asdict, replace

    from repro.cli.cli import build

    monkeypatch.chdir(ROOT)
    test = [config, config.replace(".yaml", ".eval.yaml")]
    plain, rehearsed = build(test, meta=True), build([*test, *config_overrides(config)[1::2]], meta=True)
    paper, capped = plain.model.generation, rehearsed.model.generation
    assert paper.enabled and paper.max_tokens == 50 and capped.max_tokens == 8
    assert asdict(capped) == asdict(replace(paper, max_tokens=8))
    assert rehearsed.datamodule.max_responses == 4 and plain.datamodule.max_responses is None


def test_every_rehearsal_override_names_a_data_module_of_the_paper_configs():
    used = {yaml.safe_load(Path(ROOT, c).read_text())["data"]["class_path"].rsplit(".", 1)[-1] for c in PAPER_CONFIGS}
    files = {p.stem for p in (ROOT / REHEARSAL_CONFIGS).glob("*.yaml")} - {"trainer", "sliding"}
    assert files <= used, f"override files for no config's data module: {files - used}"


def test_sliding_window_evaluations_get_their_own_caps(monkeypatch):
    """MGK's WikiText-103 test and the vanilla model's validation and test slide a window per token: the rehearsal
    gives them one evaluation batch (sliding.yaml); memory models keep the trainer's few batches."""
    monkeypatch.chdir(ROOT)
    sliding = str(REHEARSAL_CONFIGS / "sliding.yaml")
    assert sliding in config_overrides("configs/mgk/paper/wt103_mgk4.yaml")  # through its .eval.yaml
    assert sliding in config_overrides("configs/transformer_xl/paper/ablation_vanilla.yaml")
    assert sliding not in config_overrides("configs/transformer_xl/paper/wt103_base.yaml")


def test_runs_compose_the_rehearsal_after_each_config(monkeypatch):
    monkeypatch.chdir(ROOT)
    steps = runs_steps("transformer_xl", "paper", "lm", ["wt103_base"], rehearsal=True)
    fit, test = steps[0][0], steps[1][0]
    assert fit[:6] == ["fit", "-c", "configs/transformer_xl/paper/wt103_base.yaml",
                       "-c", "configs/rehearsal/trainer.yaml", "-c"] and fit[6].endswith("LMDataModule.yaml")
    # the test step: the config, its evaluation protocol, then the caps (which change no protocol length)
    assert test[2:8:2] == ["configs/transformer_xl/paper/wt103_base.yaml",
                           "configs/transformer_xl/paper/wt103_base.eval.yaml", "configs/rehearsal/trainer.yaml"]
    assert "configs/rehearsal/trainer.yaml" not in runs_steps("transformer_xl", "paper", "lm", ["wt103_base"])[0][0]


def test_rehearsal_params_name_existing_paper_configs():
    params = merged_params(ROOT)
    assert params["profile"] == "paper" and params["rehearsal"] is True
    specs = []

    def collect(v):
        if isinstance(v, dict):
            for x in v.values():
                collect(x)
        elif isinstance(v, str) and not v.replace(",", "").isdigit():
            specs.extend(v.split())

    for paper in ("transformer_xl", "mgk", "lamemo", "infinity_former", "arena"):
        collect(params[paper].get("runs", {}) | {k: v for k, v in params[paper].items()
                                                  if k in ("lra", "sorting", "gpt2", "gpt2_dog")})
        for spec in [s for s in specs if s]:
            name = spec.split("+")[0].split("@")[0]
            assert (ROOT / "configs" / paper / "paper" / f"{name}.yaml").exists(), (paper, spec)
        specs.clear()


def test_rehearsal_cells_are_labelled():
    rec = {"profile": "paper", "experiment": "wt103_base", "stage": "test", "rehearsal": True,
           "provenance": {"steps": 2, "hardware": "cpu", "precision": "32-true"}}
    md = Table("t", "t", ["a"], [[Cell(31.5, "ours", provenance(rec))]]).markdown()
    assert "| rehearsal 31.50 [1] |" in md and "REHEARSAL of the paper profile" in md
    rec["rehearsal"] = False
    assert "rehearsal" not in Table("t", "t", ["a"], [[Cell(31.5, "ours", provenance(rec))]]).markdown()
