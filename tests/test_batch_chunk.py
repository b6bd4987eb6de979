"""`repro fit --run.batch_chunk N` (the authors' `--batch_chunk`): each training batch's streams in N chunks, each
with its own slice of the memory, forward and backward one after the other, the gradients accumulated within the
step. Checked against the unchunked fit of the same config and seed: the same per-step training losses, validation
losses and final weights (float32), for Transformer-XL and for a model with an auxiliary loss (the arena's
compressive memory), and under 2-process DDP; a batch it does not divide, or a module with its own training step,
is refused in one line."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2",
          "--trainer.precision", "32-true", "--trainer.log_every_n_steps", "1", "--run.tracking", "none",
          "--trainer.accelerator", "cpu"]
TXL = [str(ROOT / "configs/transformer_xl/tiny/enwik8_12l.yaml"), "--model.init_args.model.n_layer", "2",
       "--model.init_args.model.d_model", "32", "--model.init_args.model.n_head", "2",
       "--model.init_args.model.d_head", "16", "--model.init_args.model.d_inner", "64",
       "--model.init_args.memory.mem_len", "16", "--data.init_args.batch_size", "4", "--data.init_args.tgt_len", "16"]
COMPRESSIVE = [str(ROOT / "configs/arena/tiny/compressive.yaml"), "--data.init_args.batch_size", "4"]


def _fit(tmp_path: Path, name: str, config: list[str], *extra: str, devices: int = 1):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ddp = ["--trainer.devices", str(devices), "--trainer.strategy", "ddp"] if devices > 1 else []
    done = subprocess.run([sys.executable, "-m", "repro", "fit", "-c", *config, *COMMON, *ddp,
                           "--run.curves", str(tmp_path / f"{name}.csv"),
                           "--run.checkpoint", str(tmp_path / f"{name}.ckpt"),
                           "--run.record", str(tmp_path / f"{name}.record.json"), *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    return done


def _curve(path: Path) -> dict[tuple[int, str], float]:
    return {(int(r["step"]), r["split"]): float(r["loss"]) for r in csv.DictReader(path.open())}


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
@pytest.mark.parametrize("name,config", [("txl", TXL), ("compressive", COMPRESSIVE)])
def test_chunks_give_the_losses_and_weights_of_the_whole_batch(tmp_path, name, config):
    whole = _fit(tmp_path, f"{name}1", config)
    chunked = _fit(tmp_path, f"{name}2", config, "--run.batch_chunk", "2")
    assert whole.returncode == 0 and chunked.returncode == 0, (whole.stderr + chunked.stderr)[-3000:]
    a, b = _curve(tmp_path / f"{name}1.csv"), _curve(tmp_path / f"{name}2.csv")
    assert a.keys() == b.keys() and len([k for k in a if k[1] == "train"]) == 4
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    wa, wb = _weights(tmp_path / f"{name}1.ckpt"), _weights(tmp_path / f"{name}2.ckpt")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-6, msg=k)
    assert a[(4, "train")] != a[(1, "train")]  # it trained
    records = [json.loads(p.read_text()) for p in (tmp_path / f"{name}2.record.json",)]
    assert records[0]["provenance"]["batch_chunk"] == 2  # the chunked step ran


@pytest.mark.slow
def test_chunks_under_ddp_give_the_losses_of_the_whole_batch(tmp_path):
    whole = _fit(tmp_path, "ddp1", TXL, devices=2)
    chunked = _fit(tmp_path, "ddp2", TXL, "--run.batch_chunk", "2", devices=2)
    assert whole.returncode == 0 and chunked.returncode == 0, (whole.stderr + chunked.stderr)[-3000:]
    a, b = _curve(tmp_path / "ddp1.csv"), _curve(tmp_path / "ddp2.csv")
    assert a.keys() == b.keys()
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    assert json.loads((tmp_path / "ddp2.record.json").read_text())["provenance"]["batch_chunk"] == 2
    wa, wb = _weights(tmp_path / "ddp1.ckpt"), _weights(tmp_path / "ddp2.ckpt")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-6, msg=k)
