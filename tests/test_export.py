"""Export (`repro export`, `repro.weights.hub.ExportedLM`): the folder loads back in one line in a fresh
Python process and gives the same per-token losses as the checkpoint's module; the vocabulary travels with it; a
folder naming a class outside the repository is refused; a tiny run's exported model gives that run's test loss
(slow: a real fit and test)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.cli import export as ex
from repro.cli.cli import build, load_module
from repro.weights.hub import ExportedLM

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs/transformer_xl/tiny/enwik8_12l.yaml")
SMALL = ["--model.init_args.model.n_layer", "2", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.n_head", "2", "--model.init_args.model.d_head", "16",
         "--model.init_args.model.d_inner", "64"]


def _checkpoint(path: Path) -> None:
    torch.manual_seed(0)
    model = build([TINY]).model
    for p in model.parameters():  # weights far from the initialisation, so that a wrong load shows
        p.data.normal_(0, 0.3)
    torch.save({"state_dict": model.state_dict(), "repro": {"n_token": model.n_token},
                "repro_run": {"paper": "transformer_xl", "experiment": "enwik8_12l", "profile": "tiny"}}, path)


def test_an_export_loads_in_a_fresh_process_with_the_same_losses(tmp_path):
    ckpt, out = tmp_path / "a.ckpt", tmp_path / "exported"
    _checkpoint(ckpt)
    ex.main(["-c", TINY, "--ckpt", str(ckpt), "--out", str(out)])
    assert {"config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    module, dm = load_module([TINY], str(ckpt))
    x = torch.randint(0, module.n_token, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h, _ = module(x[:, :-1], None, module.eval_memory)
        want = module.model.nll(h, x[:, 1:])
    torch.save(x, tmp_path / "x.pt")
    script = (f"import torch; from repro.weights.hub import ExportedLM; lm = ExportedLM.from_pretrained({str(out)!r});"
              f"m = lm.lm.eval(); x = torch.load({str(tmp_path / 'x.pt')!r});"
              "h, _ = m(x[:, :-1], None, m.eval_memory); nll = m.model.nll(h, x[:, 1:]);"
              f"torch.save(nll.detach(), {str(tmp_path / 'nll.pt')!r}); print(len(lm.symbols), lm.run['experiment'])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    got = torch.load(tmp_path / "nll.pt")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert done.stdout.splitlines()[-1].split() == [str(len(dm.corpus.vocab)), "enwik8_12l"]
    config = json.loads((out / "config.json").read_text())
    assert config["symbols"] == list(dm.corpus.vocab.symbols)
    assert config["module_class"] == "papers.transformer_xl.module.TransformerXLLM"


def test_a_folder_naming_a_class_outside_the_repository_is_refused(tmp_path):
    ckpt, out = tmp_path / "a.ckpt", tmp_path / "exported"
    _checkpoint(ckpt)
    ex.export([TINY], str(ckpt), out)
    config = json.loads((out / "config.json").read_text())
    config["module_class"] = "os.system"
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        ExportedLM.from_pretrained(out)
    assert "must be one of this repository's" in str(err.value)


def test_a_missing_checkpoint_is_one_line_and_writes_nothing(tmp_path):
    with pytest.raises(SystemExit) as err:
        ex.main(["-c", TINY, "--ckpt", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "out")])
    assert str(err.value.code) == f"error: {tmp_path / 'none.ckpt'} does not exist"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_tiny_runs_export_gives_its_test_loss_in_a_fresh_process(tmp_path):
    env_cmd = [sys.executable, "-m", "repro"]
    ckpt = tmp_path / "run.ckpt"
    common = ["--run.tracking", "none"]
    fit = subprocess.run([*env_cmd, "fit", "-c", TINY, *SMALL, "--trainer.max_steps", "20",
                          "--run.checkpoint", str(ckpt), *common], capture_output=True, text=True, cwd=ROOT)
    assert fit.returncode == 0, fit.stderr[-2000:]
    record = tmp_path / "test.json"
    test = subprocess.run([*env_cmd, "test", "-c", TINY, *SMALL, "--ckpt_path", str(ckpt), "--run.record",
                           str(record), "--trainer.limit_test_batches", "5", "--trainer.precision", "32-true",
                           *common], capture_output=True,
                          text=True, cwd=ROOT)
    assert test.returncode == 0, test.stderr[-2000:]
    rec = json.loads(record.read_text())
    loss = next(v for k, v in rec["metrics"].items() if k == "test/loss")
    out = tmp_path / "exported"
    small_cfg = tmp_path / "small.yaml"
    small_cfg.write_text("model:\n  init_args:\n    model: {n_layer: 2, d_model: 32, n_head: 2, d_head: 16, "
                         "d_inner: 64}\n")
    ex.main(["-c", TINY, "-c", str(small_cfg), "--ckpt", str(ckpt), "--out", str(out)])
    script = f"""
import json
from repro.cli.commands import data_module
from repro.metrics import scored
from repro.weights.hub import ExportedLM
import torch
m = ExportedLM.from_pretrained({str(out)!r}).lm.eval()
dm = data_module([{TINY!r}])
dm.setup("test")
m._eval_start("test")
with torch.inference_mode():
    for k, batch in enumerate(dm.test_dataloader()):
        if k == 5:
            break
        m._eval_step("test", batch)
print(json.dumps(float(scored(m.nll_metrics["test"])["mean_nll"])))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    # the run's test in float32, as the exported weights are evaluated here
    assert json.loads(done.stdout.strip().splitlines()[-1]) == pytest.approx(loss, abs=1e-6)


def test_the_export_is_logged_as_artifacts_of_its_run(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = MlflowClient()
    run = client.create_run(client.create_experiment("transformer_xl", artifact_location=str(tmp_path / "art")))
    ckpt = tmp_path / "a.ckpt"
    _checkpoint(ckpt)
    state = torch.load(ckpt, weights_only=True)
    state["repro_run"]["mlflow_run"] = run.info.run_id
    torch.save(state, ckpt)
    ex.main(["-c", TINY, "--ckpt", str(ckpt), "--out", str(tmp_path / "exported"), "--mlflow"])
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "exported")}
    assert {"exported/config.json", "exported/model.safetensors"} <= logged
    _checkpoint(ckpt)  # no run named: --mlflow is refused in one line
    with pytest.raises(SystemExit) as err:
        ex.main(["-c", TINY, "--ckpt", str(ckpt), "--out", str(tmp_path / "exported2"), "--mlflow"])
    assert "names no MLflow run" in str(err.value.code) and not (tmp_path / "exported2").exists()
