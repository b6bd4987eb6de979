"""`repro runs`: the experiments of a DVC stage's group, trained and tested in as few processes as possible.

This module imports neither torch nor Lightning at the top: with `--jobs N` the parent process only shares the
experiments among N worker processes (`repro runs … --jobs 1`), which import them once each.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from repro.cli.disk import check, fits_of
from repro.cli.rehearsal_configs import config_overrides
from repro.tracking import experiment_id


def run_spec(spec: str) -> tuple[str, str | None, int | None, str]:
    """`CONFIG[+VARIANT][@SEED]` → (config name, variant, seed, experiment name). The experiment is the config name,
    then `_VARIANT`, then `.seedSEED`: `lra_listops+mgk1@2` is config `lra_listops` with `model.init_args.variant
    mgk1`, seed 2, experiment `lra_listops_mgk1.seed2`."""
    m = re.fullmatch(r"([A-Za-z0-9_.-]+?)(?:\+([A-Za-z0-9_]+))?(?:@(\d+))?", spec)
    if not m:
        raise ValueError(f"run spec {spec!r} is not CONFIG[+VARIANT][@SEED] (e.g. wt103_base, char_txl@2, "
                         "lra_listops+mgk1@1)")
    config, variant, seed = m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None
    exp = config + (f"_{variant}" if variant else "") + (f".seed{seed}" if seed is not None else "")
    return config, variant, seed, exp


def group_dirs(paper: str, profile: str, group: str) -> tuple[Path, Path, Path]:
    """(checkpoints, records, curves) folders of a group: the outputs of its DVC stage."""
    return (Path("checkpoints") / paper / profile / group, Path("results") / paper / "runs" / profile / group,
            Path("results") / paper / "curves" / profile / group)


def runs_steps(paper: str, profile: str, group: str, specs: list[str], *, tests: str = "eval",
               configs_root: str = "configs", rehearsal: bool = False
               ) -> list[tuple[list[str], tuple[str, str, str] | None]]:
    """The steps of `repro runs` (see `run_group`): per spec, a fit step and its test steps; the last step of each
    spec carries the after-run arguments (config, checkpoint, experiment). `rehearsal` composes the rehearsal
    configs (`repro.cli.rehearsal_configs.config_overrides`: 2 training batches, a few evaluation batches) after each
    step's own."""
    base = Path(configs_root) / paper / profile
    ckpt_dir, rec_dir, curve_dir = group_dirs(paper, profile, group)
    kinds = [t.split(":", 1) if ":" in t else [t, ""] for t in tests.split(",") if t]
    if not kinds or any(k not in ("train", "eval") for k, _ in kinds):
        raise ValueError(f"--tests is a comma-separated list of train|eval[:SUFFIX], got {tests!r}")
    out = []
    for spec in specs:
        config, variant, seed, exp = run_spec(spec)
        cfg = base / f"{config}.yaml"
        if not cfg.exists():
            raise ValueError(f"run spec {spec!r}: no config {cfg}")
        extra = (["--model.init_args.variant", variant] if variant else []) + \
            (["--seed_everything", str(seed)] if seed is not None else [])
        caps = config_overrides(cfg) if rehearsal else []
        ckpt = ckpt_dir / f"{exp}.ckpt"
        # --run.resume: a group stopped mid-fit (Ctrl-C, SIGTERM, a killed job) continues from EXP.last.ckpt
        out.append((["fit", "-c", str(cfg), *caps, *extra, "--run.experiment", exp, "--run.checkpoint", str(ckpt),
                     "--run.resume", "true",
                     "--run.record", str(rec_dir / f"{exp}.fit.json"), "--run.curves", str(curve_dir / f"{exp}.csv")],
                    None))
        for kind, suffix in kinds:
            name = f"{exp}.{suffix}" if suffix else exp
            cfgs = ["-c", str(cfg)]
            if kind == "eval" and (base / f"{config}.eval.yaml").exists():
                cfgs += ["-c", str(base / f"{config}.eval.yaml")]
            out.append((["test", *cfgs, *caps, *extra, "--run.experiment", name, "--ckpt_path", str(ckpt),
                         "--run.record", str(rec_dir / f"{name}.test.json")], None))
        out[-1] = (out[-1][0], (str(cfg), str(ckpt), exp, tuple(caps[1::2])))
    return out


def runs_parser():
    """The arguments of `repro runs` (`run_group`); `repro rehearse` reads the pipeline's `repro runs` commands with
    it to size their disk need."""
    ap = argparse.ArgumentParser(prog="repro runs", description=run_group.__doc__)
    ap.add_argument("--paper", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--tests", default="eval")
    ap.add_argument("--rehearsal", choices=["true", "false"], default="false",
                    help="true: the paper profile's rehearsal (configs/rehearsal/ composed after each config)")
    ap.add_argument("--after", help="module with after_run(config, checkpoint, experiment, record_dir)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="worker processes that share the experiments (each with --threads threads): small models "
                         "on a few CPU cores train faster side by side than one after the other")
    ap.add_argument("--threads", type=int, help="torch threads per worker (default: the cores divided by --jobs)")
    ap.add_argument("--queue", help=argparse.SUPPRESS)  # a worker: take the specs one by one from this file
    # a worker: first check the disk for the whole group (its SPECs) shared by this many workers (`check_disk`)
    ap.add_argument("--check-jobs", type=int, help=argparse.SUPPRESS)
    ap.add_argument("specs", nargs="*", metavar="SPEC", help="CONFIG[+VARIANT][@SEED]")
    return ap


def run_group(argv: list[str]) -> None:
    """`repro runs --paper P --profile PROFILE --group G SPEC ...`: the fit and test of every experiment of a group
    in one process per worker (the start-up, ~8 s of imports and tracking set-up, is paid once per worker; each run
    keeps its own seed, Trainer, MLflow run and record). Files: `checkpoints/P/PROFILE/G/EXP.ckpt`,
    `results/P/runs/PROFILE/G/EXP.{fit,test}.json`, `results/P/curves/PROFILE/G/EXP.csv` — the DVC stage of a group
    owns these three folders. `--tests` lists the test runs after each fit: `eval` (the config plus its
    `.eval.yaml` when there is one, the default), `train` (the training config alone), each with an optional
    `:SUFFIX` added to the experiment name. `--after MODULE` calls `MODULE.after_run(config, checkpoint,
    experiment, record_dir)` after each experiment's tests (e.g. an analysis of the trained checkpoint)."""
    args = runs_parser().parse_args(argv)
    if args.queue:
        _work_queue(args)
        return
    if not args.specs:
        runs_parser().error("give at least one SPEC")
    steps = runs_steps(args.paper, args.profile, args.group, args.specs, tests=args.tests,
                       rehearsal=args.rehearsal == "true")  # checks every spec, fails fast
    if args.jobs < 1:
        raise ValueError(f"--jobs must be ≥ 1, got {args.jobs}")
    jobs = min(args.jobs, len(args.specs))
    if jobs > 1:
        _run_workers(args, jobs)  # each worker checks the disk first
        return
    check_disk(args, [step for step, _ in steps], jobs)
    _run_specs(args, args.specs)


def check_disk(args, steps: list[list[str]], jobs: int) -> None:
    """Refuse in one line, before anything is written, when the disk cannot hold the group's checkpoints
    (`repro.cli.disk`). With workers, each worker checks before it takes an experiment (`_work_queue`): the parent,
    which only shares out the experiments, imports no torch, and sizing the models there cost 9 s per stage of
    the tiny profile (a fresh interpreter) against 1-2 s in workers that import the papers' code anyway."""
    check(f"repro runs --paper {args.paper} --profile {args.profile} --group {args.group}", fits_of(steps),
          jobs=jobs)


def _run_specs(args, specs: list[str]) -> None:
    """Train and test `specs` here, one after the other."""
    import torch  # heavy: torch

    from repro.cli.cli import run_steps  # heavy: Lightning

    if args.threads:
        torch.set_num_threads(args.threads)
    after = importlib.import_module(args.after).after_run if args.after else None
    rec_dir = str(group_dirs(args.paper, args.profile, args.group)[1])
    lines: list[str] = []
    for step, post in runs_steps(args.paper, args.profile, args.group, specs, tests=args.tests,
                                 rehearsal=args.rehearsal == "true"):
        lines += run_steps([shlex.join(step)], quiet=True)
        if post is not None:
            if after is not None:  # what the analysis prints joins the experiment's line
                with contextlib.redirect_stdout(io.StringIO()) as said:
                    # a rehearsal's analysis runs with the rehearsal's configs too (e.g. fewer batches)
                    after(*post[:3], rec_dir, **({"overrides": list(post[3])} if post[3] else {}))
                lines += [f"{args.after.rsplit('.', 1)[-1]}: {text}" for text in said.getvalue().splitlines() if text]
            # one line per experiment: its runs' summaries, the experiment's name said once
            exp = post[2]
            parts = [line.replace(f" {args.profile}/{exp}", "", 1) for line in lines]
            print(f"{exp}: " + " | ".join(parts), flush=True)
            lines = []


def _next_spec(queue: Path) -> str | None:
    """Take the first spec off the queue file (under an exclusive lock), or None when it is empty."""
    with open(queue, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        lines = [line for line in f.read().splitlines() if line.strip()]
        if not lines:
            return None
        f.seek(0)
        f.truncate()
        f.write("".join(line + "\n" for line in lines[1:]))
        return lines[0]


def _work_queue(args) -> None:
    if args.check_jobs:
        steps = runs_steps(args.paper, args.profile, args.group, args.specs, tests=args.tests,
                           rehearsal=args.rehearsal == "true")
        try:
            check_disk(args, [step for step, _ in steps], args.check_jobs)
        except ValueError as err:  # the parent says it, once (`_run_workers`)
            Path(args.queue).with_name("refused").write_text(str(err))
            raise SystemExit(3) from None
    while (spec := _next_spec(Path(args.queue))) is not None:  # each experiment prints its own summary line
        _run_specs(args, [spec])


def _prepare_tracking(experiment: str) -> None:
    """Create the MLflow database and the paper's experiment before the workers start: two workers that both find
    them missing would race to create them (sqlite schema set-up, unique experiment names)."""
    experiment_id(experiment)


def _run_workers(args, jobs: int) -> None:
    """Share the specs among `jobs` worker processes: each takes the next spec from a queue file when it is free
    (in the order given: list the longest first), so that the workers finish together. Their output is streamed
    with a `[k]` prefix; the group fails if any worker failed (after all have finished, so that no run is cut
    half-way)."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // jobs)
    _prepare_tracking(args.paper)
    fixed = ["--paper", args.paper, "--profile", args.profile, "--group", args.group, "--tests", args.tests,
             "--rehearsal", args.rehearsal,
             *(["--after", args.after] if args.after else [])]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    tmp = tempfile.TemporaryDirectory(prefix="repro-runs-")
    queue = Path(tmp.name) / "queue"
    queue.write_text("".join(spec + "\n" for spec in args.specs))
    if sys.stdout.isatty():  # a person waiting for the first line; a log (`dvc repro`) shows the command above
        print(f"repro runs: {len(args.specs)} experiments, {jobs} workers of {threads} thread"
              f"{'s' * (threads > 1)}", flush=True)
    procs = []
    for _ in range(jobs):
        cmd = [sys.executable, "-m", "repro", "runs", *fixed, "--jobs", "1", "--threads", str(threads),
               "--queue", str(queue), "--check-jobs", str(jobs), *args.specs]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))

    def pump(k: int, stream) -> None:
        for line in stream:
            sys.stdout.write(f"[{k}] {line}")
            sys.stdout.flush()

    pumps = [threading.Thread(target=pump, args=(k, p.stdout), daemon=True) for k, p in enumerate(procs)]
    for t in pumps:
        t.start()
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:  # Ctrl-C reached the workers too: each saves its last checkpoint and stops
        codes = [p.wait() for p in procs]
        for t in pumps:
            t.join()
        tmp.cleanup()
        raise SystemExit("repro runs: interrupted; run the same command again to continue from the last "
                         "checkpoints") from None
    for t in pumps:
        t.join()
    refused = queue.with_name("refused")
    refusal = refused.read_text() if refused.exists() else None
    tmp.cleanup()
    if refusal is not None:  # a worker found too little disk before it wrote anything (`check_disk`)
        raise ValueError(refusal)
    failed = [k for k, c in enumerate(codes) if c]
    if failed:
        raise SystemExit(f"repro runs: worker(s) {failed} failed (exit codes {[codes[k] for k in failed]}); "
                         "see their [k]-prefixed output above")
