"""Model selection as the authors' training scripts do it (`--run.select METRIC:min|max`): the checkpoint of the
best validation becomes `--run.checkpoint`, which `repro test` then scores; the final state stays in `A.last.ckpt`;
a resumed fit keeps the selection it had made. Also: a fit under DDP writes whole checkpoints (every rank used to
replace the file with its own empty temporary file).

Selecting the *highest* validation loss makes the choice fall on the first validation, far from the final step, so
that a selection that silently kept the final weights fails."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch

TINY = "configs/transformer_xl/tiny/enwik8_12l.yaml"
SMALL = ["--model.init_args.model.n_layer", "2", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.n_head", "2", "--model.init_args.model.d_head", "16",
         "--model.init_args.model.d_inner", "64", "--model.init_args.memory.mem_len", "16",
         "--model.init_args.optim.warmup_steps", "2", "--data.init_args.batch_size", "4",
         "--data.init_args.tgt_len", "16", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "3",
         "--trainer.log_every_n_steps", "1", "--trainer.precision", "32-true", "--run.tracking", "none"]


def _cli(args, cwd):
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _ckpt(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _valid_losses(csv_path):
    with open(csv_path) as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f) if r["split"] == "valid"}


@pytest.mark.slow
def test_the_best_validation_is_tested_and_the_final_state_kept(root, tmp_path):
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "6", "--run.select", "val/loss:max",
                "--run.checkpoint", str(tmp_path / "a.ckpt"), "--run.curves", str(tmp_path / "a.csv"),
                "--run.record", str(tmp_path / "fit.json")], root)
    assert fit.returncode == 0, fit.stderr[-3000:]
    losses = _valid_losses(tmp_path / "a.csv")
    assert sorted(losses) == [2, 4, 6]
    worst = max(losses, key=losses.get)
    assert worst == 2  # the loss falls: the first validation has the highest
    best, last = _ckpt(tmp_path / "a.ckpt"), _ckpt(tmp_path / "a.last.ckpt")
    assert best["global_step"] == worst and last["global_step"] == 6
    assert not (tmp_path / "a.best.ckpt").exists()
    w = next(k for k in best["state_dict"] if k.endswith("qkv_net.weight"))
    assert not torch.equal(best["state_dict"][w], last["state_dict"][w])
    record = json.loads((tmp_path / "fit.json").read_text())
    sel = record["provenance"]["selected"]
    assert (sel["metric"], sel["mode"], sel["step"]) == ("val/loss", "max", 2)
    assert abs(sel["value"] - losses[2]) < 1e-5
    assert "selected step 2" in fit.stdout
    test = _cli(["test", "-c", TINY, *SMALL, "--ckpt_path", str(tmp_path / "a.ckpt"), "--trainer.limit_test_batches",
                 "2", "--run.record", str(tmp_path / "test.json")], root)
    assert test.returncode == 0, test.stderr[-3000:]
    assert json.loads((tmp_path / "test.json").read_text())["provenance"]["steps"] == 2

    # resumed with more steps: the restored selection (the loss of step 2) is not beaten by the later, lower losses
    more = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "8", "--run.select", "val/loss:max",
                 "--run.checkpoint", str(tmp_path / "a.ckpt"), "--run.resume", "true"], root)
    assert more.returncode == 0, more.stderr[-3000:]
    assert "resuming from" in more.stdout
    assert _ckpt(tmp_path / "a.ckpt")["global_step"] == 2 and _ckpt(tmp_path / "a.last.ckpt")["global_step"] == 8


@pytest.mark.slow
def test_min_selects_the_lowest_validation(root, tmp_path):
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "4", "--run.select", "val/loss:min",
                "--run.checkpoint", str(tmp_path / "a.ckpt"), "--run.curves", str(tmp_path / "a.csv")], root)
    assert fit.returncode == 0, fit.stderr[-3000:]
    losses = _valid_losses(tmp_path / "a.csv")
    assert _ckpt(tmp_path / "a.ckpt")["global_step"] == min(losses, key=losses.get)


@pytest.mark.slow
def test_ddp_fit_writes_whole_checkpoints(root, tmp_path):
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "4", "--trainer.accelerator", "cpu",
                "--trainer.devices", "2", "--trainer.strategy", "ddp", "--run.select", "val/loss:max",
                "--run.checkpoint", str(tmp_path / "a.ckpt"), "--run.last_every_steps", "1"], root)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert _ckpt(tmp_path / "a.ckpt")["global_step"] == 2  # was an empty file
    assert _ckpt(tmp_path / "a.last.ckpt")["global_step"] == 4
