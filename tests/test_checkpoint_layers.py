"""`repro fit --run.checkpoint_layers true`: activation checkpointing of Transformer-XL's layers (each layer's
activations recomputed in the backward pass, the random state with them). Against the same fit without it: the
same per-step training losses and final weights, with dropout on (the recomputation draws the same masks); the
tensors a training forward keeps for its backward, fewer with it; a model with a layer loop of its own refuses it in
one line."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from papers.transformer_xl.model import TransformerXL, TransformerXLConfig

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs/transformer_xl/tiny/enwik8_12l.yaml")
SMALL = ["--model.init_args.model.n_layer", "3", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.n_head", "2", "--model.init_args.model.d_head", "16",
         "--model.init_args.model.d_inner", "64", "--model.init_args.model.dropout", "0.1",
         "--model.init_args.memory.mem_len", "16", "--data.init_args.batch_size", "4", "--data.init_args.tgt_len", "16",
         "--trainer.max_steps", "4", "--trainer.limit_val_batches", "0", "--trainer.log_every_n_steps", "1",
         "--trainer.precision", "32-true", "--run.tracking", "none"]


def _fit(tmp_path, name, *extra, config=TINY, small=SMALL):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "repro", "fit", "-c", config, *small, "--run.curves",
                           str(tmp_path / f"{name}.csv"), "--run.checkpoint", str(tmp_path / f"{name}.ckpt"), *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_checkpointed_layers_give_the_same_losses_and_weights(tmp_path):
    plain, ckpt = _fit(tmp_path, "plain"), _fit(tmp_path, "ckpt", "--run.checkpoint_layers", "true")
    assert plain.returncode == 0 and ckpt.returncode == 0, (plain.stderr + ckpt.stderr)[-3000:]
    a = [float(r["loss"]) for r in csv.DictReader((tmp_path / "plain.csv").open())]
    b = [float(r["loss"]) for r in csv.DictReader((tmp_path / "ckpt.csv").open())]
    assert len(a) == 4 and b == pytest.approx(a, rel=1e-6)
    wa = torch.load(tmp_path / "plain.ckpt", weights_only=True)["state_dict"]
    wb = torch.load(tmp_path / "ckpt.ckpt", weights_only=True)["state_dict"]
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-7, msg=k)


def test_checkpointed_layers_keep_fewer_tensors_for_the_backward():
    """The tensors a training forward keeps for its backward (saved-tensor hooks), with and without: fewer bytes."""
    torch.manual_seed(0)
    cfg = TransformerXLConfig(n_layer=4, d_model=64, n_head=4, d_head=16, d_inner=256, n_token=100, dropout=0.1)
    model = TransformerXL(cfg).train()
    tokens = torch.randint(0, 100, (4, 64))

    def saved_bytes(on: bool) -> int:
        model.checkpoint_layers = on
        seen: dict[int, int] = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            h, _ = model(tokens, None, mem_len=32)
            loss = model.nll(h, tokens).mean()
        kept = sum(seen.values())  # what the forward keeps until the backward
        loss.backward()
        return kept

    plain, checkpointed = saved_bytes(False), saved_bytes(True)
    assert checkpointed < 0.6 * plain, (checkpointed, plain)
