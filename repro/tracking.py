"""Where runs and files go, and what each MLflow run is tagged with.

Runs go to `$MLFLOW_TRACKING_URI`, or the sqlite database `mlflow.db` at the repository root, their artifacts to
`mlruns/` beside it — the root, not the working directory, so that a command run from a subdirectory writes where
one run from the root does (MLflow's default artifact location is relative to the working directory).
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from functools import cache
from pathlib import Path
from typing import Any


@cache
def repo_root() -> Path:
    """The repository that holds the working directory (the first parent with `dvc.yaml`, `configs/` and
    `repro/`), or the working directory itself outside one."""
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "dvc.yaml").is_file() and (d / "configs").is_dir() and (d / "repro").is_dir():
            return d
    return here


def hardware() -> str:
    """Where a run or a measurement ran, as its record and MLflow tag say: the GPUs, or the CPU (`cpu_model`), its
    cores and the threads used."""
    import torch  # heavy: torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return f"{n}× {torch.cuda.get_device_name(0)}"
    return f"CPU {platform.machine()} {cpu_model()} ×{os.cpu_count()} cores ({torch.get_num_threads()} threads)"


# the instruction sets that decide which CPU kernels PyTorch's matrix products take, as /proc/cpuinfo names them
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_flags() -> tuple[str | None, set[str]]:
    """The first CPU's model name (None where /proc/cpuinfo gives none) and its instruction-set flags, without
    importing torch."""
    name, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name is None:
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return name, flags


def cpu_model() -> str:
    """The CPU's model name and the instruction set PyTorch's kernels use, with its bf16 support, e.g. "AMD EPYC
    (AVX512, avx512_bf16)" or "AMD EPYC (AVX2, no bf16 instructions, bf16 products in float32)". bf16 matrix products
    take other kernels on a CPU with bf16 instructions (avx512_bf16, amx_bf16) than without, so a bf16 run repeats bit
    for bit only on a CPU of the same kind (README, "Profiles")."""
    import torch  # heavy: torch

    model, flags = cpu_flags()
    name = platform.processor() or platform.machine()
    if model and name in ("unknown", platform.machine()):
        name = model
    bf16 = [f for f in ("amx_bf16", "avx512_bf16") if f in flags] or ["no bf16 instructions"]
    from repro import precision  # heavy: torch

    if precision.installed():  # AVX2 only: bf16 autocast's products run in float32 (`repro.precision`)
        bf16.append("bf16 products in float32")
    return f"{name} ({torch.backends.cpu.get_cpu_capability()}, {', '.join(bf16)})"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def artifact_location() -> str | None:
    """Where new experiments keep their artifacts: `mlruns/` at the repository root for the default database
    (None, MLflow's default, for a tracking server of the user's)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    return (repo_root() / "mlruns").as_uri()


def experiment_id(name: str, client=None) -> str:
    """The id of the MLflow experiment `name`, created if missing (and the database with it)."""
    from mlflow.tracking import MlflowClient  # heavy: MLflow

    client = client or MlflowClient(tracking_uri())
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp is not None else client.create_experiment(name, artifact_location())


@cache
def git_commit() -> str:
    """HEAD of the repository (with `-dirty` when tracked files changed), or '' outside git."""
    try:
        def run(*a):
            return subprocess.run(["git", *a], cwd=repo_root(), capture_output=True, text=True, timeout=10)

        head = run("rev-parse", "HEAD")
        if head.returncode:
            return ""
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def run_tags(*, subcommand: str, run: dict[str, Any], seed: Any, ckpt_path: str | None) -> dict[str, str]:
    """The tags of a `repro fit|validate|test` run: what it is (paper, profile, experiment, seed, commit), the
    checkpoint it reads or writes, and the process that owns it (`mark_dead_runs`)."""
    tags = {"subcommand": subcommand, "paper": run.get("paper") or "", "profile": run.get("profile") or "",
            "experiment": run.get("experiment") or "", "seed": str(seed), "git_commit": git_commit(),
            "host": socket.gethostname(), "pid": str(os.getpid())}
    if run.get("checkpoint"):
        tags["checkpoint"] = str(Path(run["checkpoint"]).resolve())
    if ckpt_path:
        tags["ckpt_path"] = str(Path(ckpt_path).resolve())
    return tags


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (signal 0; another user's process counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def mark_dead_runs(client) -> list[str]:
    """End as KILLED the runs still RUNNING whose process (tags `host`, `pid`) no longer exists on this host — a
    SIGKILL or a power cut leaves them RUNNING forever otherwise. Returns their ids."""
    from mlflow.entities import ViewType  # heavy: MLflow

    host, dead = socket.gethostname(), []
    ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not ids:
        return dead
    for r in client.search_runs(ids, "attributes.status = 'RUNNING'", max_results=1000):
        tags = r.data.tags
        if tags.get("host") == host and tags.get("pid", "").isdigit() and int(tags["pid"]) != os.getpid() \
                and not process_alive(int(tags["pid"])):
            client.set_terminated(r.info.run_id, "KILLED")
            dead.append(r.info.run_id)
    return dead
