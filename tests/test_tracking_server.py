"""The tracking server of docs/tracking.md, as documented: its `mlflow server` command line, started on the
loopback interface with a SQL backend and an artifact store it serves over HTTP; a 2-process DDP fit sent to it
(`MLFLOW_TRACKING_URI`) lands as one run with its metrics and artifacts."""

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs/transformer_xl/tiny/enwik8_12l.yaml")
SMALL = ["--model.init_args.model.n_layer", "1", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.n_head", "2", "--model.init_args.model.d_head", "16",
         "--model.init_args.model.d_inner", "64", "--model.init_args.memory.mem_len", "16",
         "--data.init_args.batch_size", "4", "--data.init_args.tgt_len", "16", "--trainer.max_steps", "4",
         "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1", "--trainer.precision", "32-true"]


def documented_command() -> str:
    text = (ROOT / "docs/tracking.md").read_text()
    (command,) = re.findall(r"^mlflow server .*$", text, flags=re.M)
    return command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_documented_server_command_parses():
    args = shlex.split(documented_command())
    assert args[:2] == ["mlflow", "server"] and "--backend-store-uri" in args and "--artifacts-destination" in args


@pytest.mark.slow
def test_a_two_process_fit_lands_once_on_the_tracking_server(tmp_path):
    from mlflow.tracking import MlflowClient

    port = _free_port()
    command = (documented_command().replace("$TRACKING_DIR", str(tmp_path / "server"))
               .replace("--host 0.0.0.0", "--host 127.0.0.1").replace("--port 5000", f"--port {port}"))
    (tmp_path / "server").mkdir()
    server = subprocess.Popen(shlex.split(command), cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if urllib.request.urlopen(f"{uri}/health", timeout=2).read() == b"OK":
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the tracking server did not answer within 60 s")
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        work = tmp_path / "work"
        work.mkdir()
        fit = subprocess.run([sys.executable, "-m", "repro", "fit", "-c", TINY, *SMALL, "--trainer.accelerator", "cpu",
                              "--trainer.devices", "2", "--trainer.strategy", "ddp"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=900)
        assert fit.returncode == 0, fit.stderr[-3000:]
        client = MlflowClient(uri)
        runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
        assert len(runs) == 1, [r.info.run_name for r in runs]
        run = runs[0]
        assert run.info.status == "FINISHED" and run.data.tags.get("subcommand") == "fit"
        assert len(client.get_metric_history(run.info.run_id, "val/loss")) == 2  # validations at steps 2 and 4
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "record-fit.json"} <= artifacts, artifacts
        assert not (work / "mlflow.db").exists() and not (work / "mlruns").exists()  # nothing written beside the run
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
