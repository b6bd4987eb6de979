"""The rehearsal of the paper profile: every paper stage run offline, at the papers' model sizes, for a few steps.

`repro rehearse` proves that `dvc repro` of the paper profile works before anyone spends GPU-days on it:
the real download code fetches every source from a local mirror of miniature files in the real formats
(`repro.ops.mirror`, served on 127.0.0.1), the real data, training, evaluation, benchmark and table code runs
every paper config at its paper size and with its protocol, and what shrinks is only how much is trained and
measured: `configs/rehearsal/` caps each experiment at 2 training batches and a few evaluation batches (and shrinks
batch sizes), `params.rehearsal.yaml` shortens the benchmark sweeps and the LRA seed lists.

It runs in a scratch copy of the repository (`--workdir`, default `.rehearsal/`): the committed tables, `dvc.lock`
and `mlflow.db` of the real profiles are never touched. Its records carry `rehearsal: true` and its tables label
those cells "rehearsal", never as results. The stages run one by one in DVC's order, upstream first
(`repro.cli.rehearsal_plan`), and a stage's checkpoints leave the scratch workspace once the stages that read them
have run (`--keep-checkpoints` keeps them): the whole rehearsal then fits in about half the disk. Its summary
(`<workdir>/summary.json`) lists each stage's seconds, exit code, peak RSS (the largest process of the stage,
`repro.ops.rss`; each rank's for the DDP fits) and the scratch folder's peak disk; the run of every stage also
writes it to `results/rehearsal/summary.json`, with the hashes of the code and configs it ran, to be committed
(`repro.cli.rehearsal_record`).

    repro rehearse                      # every stage of the four papers and the arena, then the DDP fits
    repro rehearse --status             # per paper, how many steps are stale and why (nothing runs)
    repro rehearse --stale              # only the stale steps (with their upstream stages), merged into the record
    repro rehearse --subset ci          # one full-size experiment per paper, download → table (CI)
    repro rehearse --stages 'txl_*'     # some stages (DVC globs), with their upstream stages
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import yaml

from repro.cli import rehearsal_plan, rehearsal_record
from repro.cli.disk import check, fits_in_child
from repro.cli.estimate import estimates_in_child

# the configs that turn a paper experiment into its rehearsal; `repro runs --rehearsal true` composes them too, and
# they live below both commands (`repro.cli.runs` imports them, and this module imports `repro.cli.runs`)
from repro.cli.rehearsal_configs import config_overrides
from repro.cli.rehearsal_plan import DDP_RUNS, drop_checkpoints, merged_params
from repro.cli.runs import runs_parser, runs_steps
from repro.io import atomic_write_json
from repro.ops import mirror
from repro.ops.rss import run_measured

# One experiment per paper at its full size, from download to table (`--subset ci`): the stages in order. The
# tables stages run with `-s` (single item): their inputs are the runs above, not every group of the paper.
CI_SUBSET = [
    "txl_data", "txl_run@ptb", "txl_tables",
    "mgk_data", "mgk_lra@listops", "mgk_tables",
    "lamemo_data", "lamemo_run@text8_lamemo", "lamemo_tables",
    "infinity_former_sort@sort_4000", "infinity_former_gpt2@wt103", "infinity_former_tables",
]


def _repo_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                         capture_output=True).stdout.decode()
    return [f for f in out.split("\0") if f]


def make_workspace(root: Path, ws: Path) -> None:
    """A scratch copy of the repository (tracked and untracked-but-not-ignored files, as they are now), with the
    paper profile's parameters merged with the rehearsal's, its own git and DVC state. Paper-profile records that
    the copy brings along are removed so that every cell comes from this rehearsal."""
    if ws.exists():
        shutil.rmtree(ws)
    ws.mkdir(parents=True)
    for rel in _repo_files(root):
        src = root / rel
        if not src.is_file() or rel.startswith(".rehearsal/"):
            continue
        dst = ws / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    for stale in ws.glob("results/*/runs/paper"):
        shutil.rmtree(stale)
    (ws / "params.yaml").write_text(
        "# written by `repro rehearse`: params.paper.yaml merged with params.rehearsal.yaml\n"
        + yaml.safe_dump(merged_params(root), sort_keys=False, width=120))
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    # paper-size checkpoints (up to 10 GB each with Adam's state) would be stored twice, in the workspace and in
    # DVC's cache: hardlink them (the first full rehearsal filled 33 GB of disk with copies before this)
    (ws / ".dvc" / "config.local").write_text('[cache]\n    type = "hardlink,copy"\n')


def runs_stages(root: Path, params: dict) -> dict[str, list[str]]:
    """Every stage of `dvc.yaml` whose command is `repro runs`, by DVC's name for it (`txl_run@lm`), with that
    command's arguments after `repro runs`, each `${…}` filled from `params` as DVC fills it (`foreach` over a
    dictionary: `${key}`, `${item}`; booleans as `true`/`false`)."""
    def value(path: str):
        node = params
        for part in path.split("."):
            node = node[part]
        return node

    def text(v) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    def fill(cmd: str, local: dict) -> str:
        return re.sub(r"\$\{([\w.]+)\}", lambda m: text(local[m[1]] if m[1] in local else value(m[1])), cmd)

    out = {}
    for name, stage in (yaml.safe_load((root / "dvc.yaml").read_text())["stages"] or {}).items():
        if "foreach" in stage:
            items = value(re.fullmatch(r"\$\{([\w.]+)\}", stage["foreach"])[1])
            pairs = items.items() if isinstance(items, dict) else enumerate(items)
            commands = {f"{name}@{key}": fill(stage["do"]["cmd"], {"key": key, "item": item}) for key, item in pairs}
        else:
            commands = {name: fill(stage["cmd"], {})}
        for stage_name, cmd in commands.items():
            args = shlex.split(cmd)
            if args[:2] == ["repro", "runs"]:
                out[stage_name] = args[2:]
    return out


def _tree_bytes(folder: Path) -> int:
    """Bytes of the files under `folder`, each inode once (DVC's cache and a shared .last.ckpt are hard links)."""
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _, files in os.walk(folder):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


class DiskPeak:
    """The most the scratch folder held (`_tree_bytes`, sampled every `every` seconds in a thread) since the last
    `take()`, and since it started (`overall`): a stage's disk as its checkpoints come and go."""

    def __init__(self, folder: Path, every: float = 1.0):
        self.folder, self.every = folder, every
        self.since = self.overall = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        try:
            n = _tree_bytes(self.folder)
        except OSError:  # a file deleted while it was walked: the next sample counts
            return
        self.since, self.overall = max(self.since, n), max(self.overall, n)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> DiskPeak:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def take(self) -> int:
        """The peak since the last call, in bytes; the next period starts at what the folder holds now."""
        self._sample()
        peak, self.since = self.since, 0
        self._sample()
        return peak


def check_disk(root: Path, work: Path, plan: list[str], schedule: list[list[str]], *, ddp: bool,
               params: dict, keep_ddp: bool = False, ddp_runs: list[tuple[str, str]] = DDP_RUNS) -> int:
    """Refuse in one line, before the rehearsal creates anything, when the disk of `work` cannot hold what it
    keeps at its fullest: the checkpoints of the `repro runs` stages of the plan, in its order, each stage's
    dropped as `schedule` says (`repro.cli.rehearsal_plan.drops`: after the stage whose list names it), then those
    of each DDP fit (dropped after it unless `keep_ddp`), at the models' sizes (`repro.cli.disk`; sized in a child
    process, this one stays without torch for the hours the stages run), and the workspace's copy of the
    repository. A workspace left by an earlier rehearsal is deleted first, so its bytes count as free. Returns the
    need in bytes."""
    commands = runs_stages(root, params)
    groups, jobs = [], 1  # the fit command lines of each stage of the plan (its fits run side by side), then DDP's
    for name in plan:
        if name not in commands:
            groups.append([])
            continue
        a = runs_parser().parse_args(commands[name])
        jobs = max(jobs, min(a.jobs, len(a.specs)))
        groups.append([step for step, _ in runs_steps(a.paper, a.profile, a.group, a.specs, tests=a.tests,
                                                      rehearsal=True, configs_root=str(root / "configs"))])
    pos = {n: i for i, n in enumerate(plan)}
    drops = [[pos[n] for n in names] for names in schedule]
    if ddp:
        for paper, config in ddp_runs:
            cfg = root / "configs" / paper / "paper" / f"{config}.yaml"
            drops.append([] if keep_ddp else [len(groups)])
            groups.append([["fit", "-c", str(cfg), *config_overrides(cfg, root=root)]])
    ws = work / "repo"

    def in_workspace(path: str) -> str:
        p = Path(path)
        return str(ws / (p.relative_to(root) if p.is_absolute() else p))

    fits = [[replace(f, checkpoint=in_workspace(f.checkpoint)) for f in group]
            for group in fits_in_child(groups, cwd=root)]
    copy = sum((root / rel).stat().st_size for rel in _repo_files(root)
               if (root / rel).is_file() and not rel.startswith(".rehearsal/"))
    return check(f"repro rehearse ({sum(map(len, fits))} fits)", fits, jobs=jobs, extra=copy,
                 extra_what=f"{copy / 1e9:.1f} GB for the workspace's copy of the repository (the mirror and the "
                            "data come on top)",
                 reclaimed=_tree_bytes(ws) if ws.exists() else 0, where=work, drops=drops)


def fit_steps(root: Path, params: dict, names: list[str], ddp_runs: list[tuple[str, str]]) -> dict[str, list]:
    """{step: its fit command lines} for the `repro runs` stages among `names` (with the rehearsal's caps) and the DDP
    fits: what `repro.cli.estimate` sizes for the record."""
    commands = runs_stages(root, params)
    out = {}
    for name in names:
        if name in commands:
            a = runs_parser().parse_args(commands[name])
            out[name] = [step for step, _ in runs_steps(a.paper, a.profile, a.group, a.specs, tests=a.tests,
                                                         rehearsal=True)]
    for paper, config in ddp_runs:
        cfg = Path("configs") / paper / "paper" / f"{config}.yaml"
        out[f"ddp:{paper}/{config}"] = [["fit", "-c", str(cfg), *config_overrides(root / cfg, root=Path("."))]]
    return out


def stage_command(name: str) -> list[str]:
    """The command that runs one stage of the plan in the workspace: that stage alone (`-s`), its upstream stages
    being earlier in the plan (`repro.cli.rehearsal_plan`)."""
    return ["dvc", "repro", "-s", name]


def run_stages(plan: list[str], ws: Path, env: dict, *, keep_going: bool, drop: dict[str, list[str]] | None = None,
               disk: DiskPeak | None = None, on_step=None) -> list[dict]:
    """Run the plan's stages in order; one summary entry per stage: its seconds, exit code, peak RSS (MiB, the
    largest process of the stage: `repro.ops.rss.run_measured`) and, with `disk`, the scratch folder's peak during
    it (MB). `drop`: after a stage, the checkpoint folders (relative to the workspace) to delete then
    (`repro.cli.rehearsal_plan.drop_checkpoints`). `on_step(entry)` is called as each stage ends (the record of a
    rerun is written there, so that an interrupted rehearsal keeps its finished stages). Stops after a failed stage
    unless `keep_going`."""
    summary = []
    for name in plan:
        print(f"rehearse: {name}", flush=True)
        if disk is not None:
            disk.take()
        done = run_measured(stage_command(name), cwd=ws, env=env)
        entry = {"stage": name, "seconds": round(done.seconds), "exit": done.returncode,
                 "peak_rss_mb": round(done.peak_rss_mb)}
        if disk is not None:
            entry["disk_peak_mb"] = round(disk.take() / 1e6)
        freed = drop_checkpoints(ws, (drop or {}).get(name, []))
        summary.append(entry)
        if on_step is not None:
            on_step(summary)
        print(f"rehearse: {name} {'done' if not done.returncode else 'FAILED'} in {done.seconds:.0f} s, "
              f"peak RSS {done.peak_rss_mb / 1024:.1f} GiB"
              + (f", scratch disk {entry['disk_peak_mb'] / 1e3:.1f} GB" if disk is not None else "")
              + (f"; {freed / 1e9:.1f} GB of checkpoints dropped" if freed else ""), flush=True)
        if done.returncode and not keep_going:
            break
    return summary


def ddp_fit(ws: Path, env: dict, paper: str, config: str, out: Path) -> tuple[dict, float]:
    """A paper-size experiment of the rehearsal in 2 processes (DDP over gloo on the CPU, as on a GPU node: each rank
    holds its shard of the memory streams); returns its fit record and the command's peak RSS (MiB)."""
    cfg = Path("configs") / paper / "paper" / f"{config}.yaml"
    record = out / f"{paper}.{config}.ddp.fit.json"
    cmd = ["repro", "fit", "-c", str(cfg), *config_overrides(cfg), "--trainer.accelerator", "cpu",
           "--trainer.devices", "2", "--trainer.strategy", "ddp", "--run.tracking", "none",
           "--run.record", str(record)]
    done = run_measured(cmd, cwd=ws, env={**env, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise RuntimeError(f"exit {done.returncode}")
    return json.loads(record.read_text()), done.peak_rss_mb


def stage_environment(base: dict, mirror_env: dict, *, ws: Path, data: Path) -> dict:
    """The environment of every stage and DDP fit of a rehearsal: downloads from the mirror (`mirror_env`), data in
    the scratch folder, the workspace's own tracking database and code."""
    env = {**base, **mirror_env, "REPRO_DATA": str(data), "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}",
           "DVC_NO_ANALYTICS": "1",
           # glibc's own allocator policy, benchmarks and DDP ranks included: keeping freed memory raised the
           # stages' peaks by up to a third (`repro.ops.allocator`)
           "REPRO_MALLOC": "system",
           # the copy's code, not the checkout's: an editable install would otherwise run whatever the checkout
           # holds when each stage starts (edits made during a long rehearsal included)
           "PYTHONPATH": os.pathsep.join([str(ws), *filter(None, [base.get("PYTHONPATH")])])}
    env.pop("REPRO_TEST_DATA", None)
    return env


def ddp_checkpoints(paper: str) -> str:
    """The folder of a DDP fit's checkpoint in the workspace: its config's default (`repro.cli.checkpoints.
    default_checkpoint`; the rehearsal's own profile folder), which nothing reads after the fit."""
    return str(Path("checkpoints") / paper / "rehearsal")


def rehearse(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="repro rehearse", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=".rehearsal", help="scratch folder: the repository copy, the mirror, data")
    ap.add_argument("--subset", choices=["all", "ci"], default="all",
                    help="all: every stage; ci: one full-size experiment per paper, download to table")
    ap.add_argument("--stages", nargs="*",
                    help="only these stages (shell globs over `dvc stage list` names) and the stages upstream of them")
    ap.add_argument("--stale", action="store_true",
                    help=f"only the steps whose inputs changed since {rehearsal_record.SUMMARY} (with the stages "
                         "upstream of them); their entries replace the old ones there")
    ap.add_argument("--status", action="store_true",
                    help="print, per paper, how many steps are stale and why, and run nothing")
    ap.add_argument("--ddp", choices=["auto", "yes", "no"], default="auto",
                    help="2-process DDP (gloo) fits of each paper's main model (auto: with --subset all)")
    ap.add_argument("--keep-going", action="store_true", help="run every stage even after one failed")
    ap.add_argument("--keep-checkpoints", action="store_true",
                    help="keep every stage's checkpoints in the workspace (default: each stage's are deleted once "
                         "the stages that read them have run)")
    ap.add_argument("--jobs", type=int, help="worker processes per group (default: params.rehearsal.yaml)")
    args = ap.parse_args(argv)
    if (args.stale or args.status) and (args.stages or args.subset != "all"):
        raise ValueError("--stale and --status take every stage of the record: drop --stages/--subset")

    root = Path.cwd()
    if not (root / "params.paper.yaml").exists() or not (root / "dvc.yaml").exists():
        raise ValueError(f"{root} is not the repository root (no params.paper.yaml / dvc.yaml): run `repro "
                         "rehearse` from the folder that holds dvc.yaml")
    work = (root / args.workdir).resolve()
    ws = work / "repo"
    t0 = time.time()
    params = merged_params(root)
    pipeline = rehearsal_plan.read_pipeline(root, params)
    recorded = json.loads((root / rehearsal_record.SUMMARY).read_text()) \
        if (root / rehearsal_record.SUMMARY).is_file() else {}
    ddp_runs = list(DDP_RUNS)
    if args.stale or args.status:
        stale = rehearsal_record.stale_steps(recorded, rehearsal_record.step_inputs(root, pipeline))
        if args.status:
            print("\n".join(rehearsal_record.status_lines(recorded, stale, pipeline)))
            return
        if not stale:
            print(f"rehearse: nothing is stale; every step of {rehearsal_record.SUMMARY} ran today's inputs")
            return
        plan = rehearsal_plan.with_upstream(pipeline, [n for n in pipeline.order if n in stale])
        ddp_runs = [(p, c) for p, c in DDP_RUNS if f"ddp:{p}/{c}" in stale]
        ddp = bool(ddp_runs)
        print(f"rehearse: {len(stale)} stale steps; {len(plan)} stages run (with those upstream)"
              f"{f' and {len(ddp_runs)} DDP fits' if ddp_runs else ''}", flush=True)
    else:
        ddp = args.ddp == "yes" or (args.ddp == "auto" and args.subset == "all" and not args.stages)
        if args.stages:
            matched = [n for n in pipeline.order if any(fnmatch.fnmatch(n, g) for g in args.stages)]
            if not matched:
                raise ValueError(f"--stages {' '.join(args.stages)} names no stage of dvc.yaml (`dvc stage list`)")
            plan = rehearsal_plan.with_upstream(pipeline, matched)
        elif args.subset == "ci":
            plan = list(CI_SUBSET)
        else:
            plan = list(pipeline.order)
    full = args.subset == "all" and not args.stages and ddp and not args.stale  # recorded whole
    schedule = [[] for _ in plan] if args.keep_checkpoints else rehearsal_plan.drops(pipeline, plan)
    need = check_disk(root, work, plan, schedule, ddp=ddp, params=params, keep_ddp=args.keep_checkpoints,
                      ddp_runs=ddp_runs)
    fits = f" and {len(ddp_runs)} DDP fits" if ddp else ""
    print(f"rehearse: {len(plan)} stages{fits}; the checkpoints and the workspace need "
          f"{need / 1e9:.1f} GB of disk at most", flush=True)
    print(f"rehearse: building the mirror in {work / 'mirror'}", flush=True)
    from transformers.utils import logging as hf_logging  # heavy: transformers

    hf_logging.disable_progress_bar()  # its "Writing model shards" bar while the mirror's GPT-2 is saved
    mirror.build_mirror(work / "mirror")
    # data built from this mirror's files (a rebuilt mirror has other checksums: its data start afresh)
    stamp = hashlib.sha256((work / "mirror" / "manifest.json").read_bytes()).hexdigest()[:12]
    data = work / f"data-{stamp}"
    for old in work.glob("data-*"):
        if old != data:
            shutil.rmtree(old)
    make_workspace(root, ws)
    commit = rehearsal_record.head_commit(root)
    # the inputs as the workspace holds them (edits to the checkout during a long rehearsal are not what ran)
    inputs = rehearsal_record.step_inputs(ws, pipeline)
    steps_ran = [*plan, *(f"ddp:{p}/{c}" for p, c in ddp_runs if ddp)]
    estimates = estimates_in_child({k: v for k, v in fit_steps(ws, params, plan, ddp_runs if ddp else []).items()},
                                   cwd=ws)
    if args.jobs:
        ws_params = yaml.safe_load((ws / "params.yaml").read_text())
        ws_params["jobs"] = args.jobs
        (ws / "params.yaml").write_text(yaml.safe_dump(ws_params, sort_keys=False, width=120))
    drop = {name: [out for n in names for out in rehearsal_plan.checkpoint_outs(pipeline, n)]
            for name, names in zip(plan, schedule)}
    def stamped(entries: list[dict]) -> list[dict]:
        return [rehearsal_record.stamp({**e, **({"configs": estimates[e["stage"]]} if e["stage"] in estimates
                                                 else {})}, inputs[e["stage"]]) for e in entries]

    def merged(entries: list[dict]) -> dict:
        return rehearsal_record.merge(recorded, stamped(entries), now=inputs, record={
            "commit": commit, "command": "repro rehearse " + " ".join(argv),
            "minutes": round((time.time() - t0) / 60, 1), "machine": rehearsal_record.machine()})

    def on_step(entries: list[dict]) -> None:
        """A rerun of stale steps merges each finished step into the committed record at once: a rehearsal cut
        short (a closed laptop, a session's end) keeps every step it finished."""
        if args.stale:
            atomic_write_json(root / rehearsal_record.SUMMARY, merged(entries))

    # the server lives as long as the rehearsal: a stage may train for many minutes between two downloads
    with mirror.serve(work / "mirror", idle_timeout=6 * 3600) as server, DiskPeak(work) as disk:
        env = stage_environment(dict(os.environ), mirror.environment(server.url, work / "client-cache"), ws=ws,
                                data=data)
        summary = run_stages(plan, ws, env, keep_going=args.keep_going, drop=drop, disk=disk, on_step=on_step)
        if ddp and (args.keep_going or not any(r["exit"] for r in summary)):
            (work / "ddp").mkdir(exist_ok=True)
            for paper, config in ddp_runs:
                print(f"rehearse: DDP, 2 processes: {paper}/{config}", flush=True)
                t = time.time()
                disk.take()
                peaks: dict = {}
                try:
                    rec, peak = ddp_fit(ws, env, paper, config, work / "ddp")
                    ok = rec["provenance"]["devices"] == 2
                    # the launcher's own figure misses a rank it did not wait for; the record has every rank's
                    ranks = rec["provenance"].get("peak_rss_mb_ranks") or []
                    peaks = {"peak_rss_mb": round(max([peak, *ranks])), "peak_rss_mb_ranks": ranks}
                except (RuntimeError, OSError, KeyError, ValueError) as err:
                    print(f"rehearse: DDP {paper}/{config}: {err}", flush=True)
                    ok = False
                summary.append({"stage": f"ddp:{paper}/{config}", "seconds": round(time.time() - t),
                                "exit": 0 if ok else 1, **peaks, "disk_peak_mb": round(disk.take() / 1e6)})
                on_step(summary)
                if not args.keep_checkpoints:
                    rehearsal_plan.drop_checkpoints(ws, [ddp_checkpoints(paper)])
                if not ok and not args.keep_going:
                    break
        disk_peak = disk.overall
    raw, summary = summary, stamped(summary)
    mirror_and_data = sum(_tree_bytes(p) for p in [work / "mirror", data, work / "client-cache"] if p.exists())
    failed = [r["stage"] for r in summary if r["exit"]]
    minutes = round((time.time() - t0) / 60, 1)
    record = {"minutes": minutes, "steps": len(summary), "failed": failed,
              "peak_rss_mb": max((r.get("peak_rss_mb", 0) for r in summary), default=0),
              "disk": {"need_bytes": need, "mirror_and_data_bytes": mirror_and_data, "peak_bytes": disk_peak},
              "machine": rehearsal_record.machine(), "command": "repro rehearse " + " ".join(argv),
              "commit": commit, "files": {f: d for s in steps_ran for f, d in inputs.get(s, {}).items()},
              "stages": summary}
    atomic_write_json(work / "summary.json", record)
    written = ""
    if full:  # committed with the code it ran: `repro rehearse --status` tells when a step's inputs moved on
        atomic_write_json(root / rehearsal_record.SUMMARY, record)
        written = f" and {rehearsal_record.SUMMARY}"
    elif args.stale:
        atomic_write_json(root / rehearsal_record.SUMMARY, merged(raw))
        written = f" and {rehearsal_record.SUMMARY} ({len(summary)} steps merged)"
    tables = sorted(ws.glob("results/*/*.md"))
    print(f"rehearse: {len(summary)} steps in {minutes:.1f} min, {len(failed)} failed"
          f"{': ' + ', '.join(failed) if failed else ''}; peak RSS {record['peak_rss_mb'] / 1024:.1f} GiB, scratch "
          f"disk {disk_peak / 1e9:.1f} GB; tables with the rehearsal's paper column: {ws}/results/<paper>/*.md "
          f"({len(tables)} files); summary {work / 'summary.json'}{written}", flush=True)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    rehearse(sys.argv[1:])
