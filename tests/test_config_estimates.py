"""Every config that a rehearsal step fits, built on the meta device and set against the step's record
(`repro.cli.estimate`): a config whose parameters, estimated peak memory or checkpoint grew more than 10% above the
estimate recorded with the step's measured peak fails here by name, with both numbers, before any machine runs out of
memory and without a rehearsal. The check itself is shown failing on a config made larger in the test."""

import json
from pathlib import Path

import pytest

from repro.cli import estimate, rehearsal_record
from repro.cli.cli import build
from repro.cli.rehearsal import fit_steps
from repro.cli.rehearsal_plan import DDP_RUNS, merged_params

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/transformer_xl/paper/ptb.yaml"


def _summary() -> dict:
    return json.loads((ROOT / rehearsal_record.SUMMARY).read_text())


@pytest.mark.slow
def test_no_config_grew_past_its_rehearsals_record(monkeypatch):
    monkeypatch.chdir(ROOT)
    summary = _summary()
    steps = {s["stage"]: s for s in summary["stages"] if s.get("configs")}
    names = [s for s in steps if not s.startswith("ddp:")]
    ddp = [(p, c) for p, c in DDP_RUNS if f"ddp:{p}/{c}" in steps]
    now = {step: estimate.estimates_of(lines) for step, lines in fit_steps(ROOT, merged_params(ROOT), names,
                                                                           ddp).items()}
    assert sum(len(v) for v in now.values()) >= 90  # every paper's configs and the arena's
    grew = estimate.failures(list(steps.values()), now)
    assert not grew, ("configs grew past their last rehearsal (`repro rehearse --stale` records them anew):\n"
                      + "\n".join(grew))


def test_a_config_grown_past_its_record_fails_by_name_with_both_numbers(monkeypatch):
    monkeypatch.chdir(ROOT)
    cli = build([CONFIG], meta=True)
    then = estimate.estimate(cli.model, cli.datamodule)
    wider = build([CONFIG], ["--model.init_args.model.d_inner", "4000"], meta=True)
    now = estimate.estimate(wider.model, wider.datamodule)
    step = {"stage": "txl_run@ptb", "peak_rss_mb": 1165, "configs": {CONFIG: then}}
    assert estimate.failures([step], {"txl_run@ptb": {CONFIG: then}}) == []
    lines = estimate.failures([step], {"txl_run@ptb": {CONFIG: now}})
    assert len(lines) == 3 and all(line.startswith(f"{CONFIG}: ") for line in lines)
    peak = next(line for line in lines if "estimated peak" in line)
    assert f"{now['peak_bytes'] / 2**30:.2f} GiB against {then['peak_bytes'] / 2**30:.2f} GiB" in peak
    assert f"{1165 * now['peak_bytes'] / then['peak_bytes'] / 1024:.1f} GiB" in peak
    params = next(line for line in lines if "parameters" in line)
    assert f"{now['parameters']:,} parameters against {then['parameters']:,}" in params


def test_the_estimate_counts_the_training_state_and_grows_with_batch_and_memory(monkeypatch):
    """The state: weights, gradients and Adam's two moments of every trained parameter, counted here from the
    model; the activations grow with the batch and the memory the config names."""
    monkeypatch.chdir(ROOT)
    cli = build([CONFIG], meta=True)
    est = estimate.estimate(cli.model, cli.datamodule)
    trained = sum(p.numel() for p in cli.model.parameters() if p.requires_grad)
    assert est["parameters"] == sum(p.numel() for p in cli.model.parameters())
    assert est["peak_bytes"] > 16 * trained
    batch = cli.datamodule.batch_size
    doubled = build([CONFIG], ["--data.init_args.batch_size", str(2 * batch)], meta=True)
    assert estimate.estimate(doubled.model, doubled.datamodule)["peak_bytes"] > est["peak_bytes"]
