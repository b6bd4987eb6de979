"""Export a trained checkpoint to the shared format (`repro.weights.hub.ExportedLM`): settings, safetensors weights
and vocabulary in one folder, optionally logged as an artifact of its MLflow run and pushed to the Hugging Face Hub.

    repro export -c configs/transformer_xl/tiny/enwik8_12l.yaml --ckpt A.ckpt --out exported/A
    repro export -c CONFIG --ckpt A.ckpt --out exported/A --mlflow --push-to org/name

Follows `repro test`'s loading (`repro.cli.cli.load_module`: the config the checkpoint was trained with, its
vocabulary checked against the data's) and `huggingface_hub`'s `save_pretrained`/`push_to_hub`. Differs from a
Lightning checkpoint: no optimiser state, memory or random state (what resuming needs); what a user of the trained
model needs instead: the module's own hyper-parameters, the vocabulary, and what the run was. The folder is written
beside and renamed into place, so that it is either absent or complete.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from repro.cli.cli import load_module
from repro.weights.hub import ExportedLM


def exported(configs: list[str], ckpt: str) -> ExportedLM:
    """The checkpoint's module as an `ExportedLM`, its weights and vocabulary with it."""
    module, dm = load_module(configs, ckpt)
    corpus = getattr(dm, "corpus", None)
    symbols = list(corpus.vocab.symbols) if corpus is not None and hasattr(corpus, "vocab") else None
    tok = getattr(dm, "tokenizer_name", None)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    run = dict(state.get("repro_run") or {})
    info = {k: run.get(k) for k in ("paper", "experiment", "profile", "mlflow_run") if run.get(k) is not None}
    info["corpus"] = getattr(dm, "corpus_name", None)
    out = ExportedLM(module_class=f"{type(module).__module__}.{type(module).__qualname__}",
                     hparams=_plain(dict(module.hparams)), symbols=symbols,
                     tokenizer=tok if isinstance(tok, str) else None, run=info)
    out.lm.load_state_dict(module.state_dict())
    return out.eval()


def _plain(value):
    """Tuples as lists and nested dicts copied: what `config.json` holds."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def export(configs: list[str], ckpt: str, out: str | os.PathLike) -> Path:
    """Write the export folder `out` (atomically: built beside it, then renamed into place)."""
    out = Path(out)
    model = exported(configs, ckpt)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def log_to_mlflow(out: Path, run_id: str) -> None:
    """The export folder as artifacts (`exported/`) of the training run `run_id` (the tracking URI of the
    environment, as `repro fit` logs)."""
    from mlflow.tracking import MlflowClient  # heavy: MLflow, only with --mlflow

    MlflowClient().log_artifacts(run_id, str(out), artifact_path="exported")


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="repro export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", action="append", required=True, help="the config the checkpoint trained with")
    ap.add_argument("--ckpt", required=True, help="the trained checkpoint (A.ckpt)")
    ap.add_argument("--out", required=True, help="the folder to write")
    ap.add_argument("--mlflow", action="store_true", help="log the folder as artifacts of the checkpoint's run")
    ap.add_argument("--push-to", help="a Hugging Face Hub repository (org/name) to push the folder to")
    args = ap.parse_args(argv)
    for path in [*args.config, args.ckpt]:
        if not Path(path).is_file():
            raise SystemExit(f"error: {path} does not exist")
    if args.mlflow and not (torch.load(args.ckpt, map_location="cpu", weights_only=True).get("repro_run") or {}
                            ).get("mlflow_run"):
        raise SystemExit(f"error: {args.ckpt} names no MLflow run (trained with --run.tracking none): drop --mlflow")
    try:
        out = export(args.config, args.ckpt, args.out)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    with contextlib.redirect_stdout(io.StringIO()):  # the mixin's own "Loading weights from local directory"
        model = ExportedLM.from_pretrained(out)  # what a user will load: checked before anything is said or sent
    if args.mlflow:
        log_to_mlflow(out, model.run["mlflow_run"])
    if args.push_to:
        model.push_to_hub(args.push_to)
    files = sorted(p.name for p in out.iterdir())
    print(f"exported {args.ckpt} to {out} ({', '.join(files)}): load with "
          f"`ExportedLM.from_pretrained({str(out)!r})` (repro.weights.hub)", flush=True)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
