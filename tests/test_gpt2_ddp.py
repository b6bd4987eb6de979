"""GPT-2 fine-tuning and evaluation with two DDP processes on the CPU, through the `repro` entry point."""

import json
import os
import subprocess
import sys

import pytest

from repro.text import cmudog, dialogue_tiny
from repro.text.tokenizer import train_bpe

# The deterministic ∞-former: sticky memories draw their sample points from each process's global generator (as
# the official code does), so with them two ranks and one process differ by the sampling noise (1.7e-5 relative
# on this set), not by a bug.
CONFIG = "configs/infinity_former/tiny/gpt2_dog_inftyformer.yaml"


def _cli(args, cwd):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=600)


@pytest.mark.slow
def test_two_ddp_processes_finetune_and_evaluate_like_one(root, tmp_path):
    data = dialogue_tiny.generate_tiny_dog(tmp_path / "dog", n_docs=2, people=2, filler=2, questions=2,
                               conversations={"train": 4, "valid": 3, "test": 1}, seed=0)
    texts = [c.document + " " + " ".join(c.utterances) for c in cmudog.read_cmu_dog(data, "train")]
    train_bpe(texts * 3, 320).save(str(tmp_path / "tok.json"))
    small = ["--data.init_args.root", str(data), "--data.init_args.tokenizer",
             f"{{kind: file, name: {tmp_path / 'tok.json'}}}", "--data.init_args.block_size", "32",
             "--model.init_args.model", "{pretrained: null, n_layer: 2, n_embd: 32, n_head: 2, n_positions: 32, "
             "dropout: 0.0}", "--run.tracking", "none", "--run.untrained", "true", "--trainer.precision", "32-true",
             "--trainer.accelerator", "cpu"]
    one = _cli(["validate", "-c", CONFIG, *small, "--run.record", str(tmp_path / "one.json")], root)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _cli(["validate", "-c", CONFIG, *small, "--trainer.devices", "2", "--trainer.strategy", "ddp",
                "--run.record", str(tmp_path / "two.json")], root)
    assert two.returncode == 0, two.stderr[-3000:]
    a = json.loads((tmp_path / "one.json").read_text())["metrics"]
    b = json.loads((tmp_path / "two.json").read_text())["metrics"]
    assert a["val/tokens"] == b["val/tokens"] > 0  # every utterance word of the split once, padding unscored
    assert b["val/loss"] == pytest.approx(a["val/loss"], rel=1e-5)
    fit = _cli(["fit", "-c", CONFIG, *small, "--trainer.devices", "2", "--trainer.strategy", "ddp",
                "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
                "--run.record", str(tmp_path / "fit.json")], root)
    assert fit.returncode == 0, fit.stderr[-3000:]
    record = json.loads((tmp_path / "fit.json").read_text())
    assert record["provenance"]["steps"] == 2 and record["provenance"]["devices"] == 2
